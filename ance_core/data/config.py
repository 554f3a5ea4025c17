"""The data stage's config: which dataset, where it lives, its splits (the carved dev split, the training grades)."""

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ance_core.data.splits import fold_count
from ance_core.stage_config import StageConfig

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a collection's name in the registry (`name`)


class DataConfig(StageConfig):
    """Which dataset, where it lives, and which qrels splits train and evaluate."""

    UNSAID = {"name": None, "dev_fold": 0}  # (added after stage keys existed)
    NOT_IN_KEY = ("name",)  # the registry's name for the collection: nothing a stage builds depends on it

    dataset: str = Field("scifact", description="Name under the data home, or a path to a dataset folder")
    name: str | None = Field(
        None, repr=False,
        description="The collection's name in the MLflow registry: its models are versions of `ance-<name>`, one "
        "champion per name; letters, digits, '.', '_' and '-', starting with a letter or digit. Default: the dataset "
        "folder's name (two collections in folders of the same name need names of their own)")
    format: Literal["auto", "beir", "msmarco"] = Field(
        "auto", description="auto: from the folder's files; beir (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) or "
        "msmarco (collection.tsv)")
    data_home: str | None = Field(None, description="Default: $ANCE_DATA_HOME, else ~/.cache/ance/data")
    download: bool = Field(True, description="Download the public BEIR archive when the dataset is missing")
    train_split: str = Field("train", description="The qrels split whose queries train (qrels/<split>.tsv)")
    eval_split: str = Field("test", description="The split the results table reports (test): read, never "
                            "chosen on")
    dev_split: str | None = Field("dev", description="The split that picks the run's result (its best checkpoint) "
                                  "and the champion; recipes are chosen on it, never on eval_split. null: none (the "
                                  "run's result is its last model)")
    dev_fraction: float = Field(
        0.2, ge=0, lt=1, description="When the dataset has no `dev_split`: this share of the train split's queries "
        "(those with a positive) moves into it, chosen by dev_seed, and is no longer trained on. 0: no dev split, and "
        "the run's result is its last model")
    dev_seed: int = Field(0, description="Which train queries become the carved dev split")
    dev_fold: int = Field(
        0, ge=0, description="Which block of dev_fraction is carved: a query is in fold i when its seeded hash is in "
        "[i * dev_fraction, (i + 1) * dev_fraction), so fold 0 is the default dev split and folds 0 .. "
        "floor(1 / dev_fraction) - 1 hold disjoint dev splits (all the training queries when 1 / dev_fraction is "
        "whole): runs over them are cross-validation, for collections too small for one dev split to decide "
        "(selection: cv runs them itself)")
    train_min_relevance: int | Literal["auto"] = Field(
        "auto", description="Lowest relevance grade of the train split that is a training positive. auto: each "
        "query's own top grade (on binary qrels: every positive). Lower grades are never sampled as negatives")

    @property
    def collection(self) -> str:
        """The name the registry knows the collection by (`name`, else the dataset folder's name)."""
        folder = Path(self.dataset).expanduser()
        return self.name or (folder.name if folder.name not in ("", ".", "..") else folder.resolve().name)

    @field_validator("name")
    @classmethod
    def _registry_name(cls, name: str | None) -> str | None:
        if name is not None and not NAME.fullmatch(name):
            raise ValueError("a collection's name is letters, digits, '.', '_' and '-', starting with a letter or "
                             "digit (it names the registered model ance-<name>)")
        return name

    @model_validator(mode="after")
    def _grade_is_positive(self) -> "DataConfig":
        if self.train_min_relevance != "auto" and self.train_min_relevance < 1:
            raise ValueError(f"train_min_relevance must be 'auto' or a grade >= 1, got {self.train_min_relevance}")
        return self

    @model_validator(mode="after")
    def _fold_fits(self) -> "DataConfig":
        if self.dev_fold and (self.dev_split is None or self.dev_fraction == 0):
            raise ValueError(f"dev_fold {self.dev_fold} chooses a fold of the carved dev split, and there is none "
                             f"({'dev_split is null' if self.dev_split is None else 'dev_fraction is 0'})")
        if self.dev_fold >= max(fold_count(self.dev_fraction), 1):
            raise ValueError(f"dev_fold {self.dev_fold} with dev_fraction {self.dev_fraction}: folds of that size are "
                             f"0 to {fold_count(self.dev_fraction) - 1}")
        return self

    @model_validator(mode="after")
    def _dev_is_its_own_split(self) -> "DataConfig":
        if self.dev_split is None:
            return self
        if self.dev_split == self.train_split:
            raise ValueError(f"dev_split and train_split are both '{self.train_split}': model selection on the "
                             "training queries would always pick the last model")
        if self.dev_split == self.eval_split:
            raise ValueError(f"dev_split and eval_split are both '{self.eval_split}': the evaluation split would "
                             "choose the run's result; name the dev split otherwise (e.g. dev_split: train-dev, carved "
                             "from the train split when the dataset has no split of that name)")
        return self

