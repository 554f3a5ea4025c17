"""Named training recipes: overrides of the pipeline config's defaults, each chosen on the dev split (RESULTS.md:
the search log, the three-seed tables and the paired comparisons).

- `demo` (`make demo`, `ance demo`; under 10 min on a 2-core CPU with bf16 for SciFact, the environment included:
  README.md): the defaults with SimANS negatives in the ANCE round, a learning rate of 4e-5 in both stages and no
  hidden-state dropout while training. SimANS beat ANCE-uniform on the dev split under each of three seeds (+0.015
  nDCG@10 on average); the pipeline's own default sampler stays `ance`, the paper's method, so a config that names no
  sampler trains ANCE. The learning rate was chosen on the dev splits of SciFact, CISI and NPL together (issue 30's
  search: RESULTS.md); the pipeline's own default stays 2e-5. Without hidden dropout a CPU step is 1.17x faster and
  SciFact's dev split read +0.005 (dense round) and +0.010 (the run's result) on average over two seeds (RESULTS.md);
  the pipeline's own default keeps the model's dropout (not measured on the other recipes).
- `full` (`make quality`, `ance demo --recipe full`): 2 SimANS rounds, 2 epochs per stage (dev search run s6), with
  the demo's learning rate of 4e-5 (taken from the demo's search, not searched on `full` itself).
- `full-maxp` (`ance demo --recipe full-maxp`): `full` with MaxP documents (up to 4 windows of 256 tokens each
  encoded and indexed, a document scored by its best window; ANCE §5) and training on whole 256-token windows instead
  of 128-token passages: ahead of `full` on SciFact's dev split under each of three seeds (RESULTS.md), for about
  twice its time. Passages shorter than 128 tokens train and encode as in `full`.
- `auto` (`ance run --recipe auto`, `ance tune`): no fixed config; a search on the collection's own dev split over
  variants of `demo` (learning rate, which graded positives train, warm-up epochs: pipeline/tune.py), its winner
  trained (flows/tune.py).
"""

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ance_core.errors import AnceError
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import load_config, read_config_file

RECIPES: dict[str, dict[str, Any]] = {
    "demo": {"mining": {"sampler": "simans"}, "warmup": {"learning_rate": 4e-5, "hidden_dropout": 0.0},
             "ance": {"learning_rate": 4e-5, "hidden_dropout": 0.0}},
    "full": {"rounds": 2, "warmup": {"epochs": 2, "learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5},
             "mining": {"sampler": "simans"}},
    "full-maxp": {"rounds": 2, "warmup": {"epochs": 2, "learning_rate": 4e-5, "passage_max_length": None},
                  "ance": {"learning_rate": 4e-5, "passage_max_length": None}, "mining": {"sampler": "simans"},
                  "model": {"document_mode": "maxp"}},
}


AUTO = "auto"  # chosen per collection on its dev split by a recipe search (flows/tune.py), not a fixed config

# where each recipe was chosen, for `ance recipes` (the figures: RESULTS.md)
CHOSEN = {
    "demo": "SimANS rounds over ANCE-uniform on SciFact's dev split (three seeds); lr 4e-5 on the dev splits of "
            "SciFact, CISI and NPL together (issue 30). Use it for training sets of a few dozen queries and more",
    "full": "2 rounds and 2 epochs per stage on SciFact's dev split, with demo's learning rate (not searched on full "
            "itself). For training sets of hundreds of queries: on a few dozen its rounds fell below the warm-up",
    "full-maxp": "full with MaxP documents and whole-window training, against full on SciFact's dev split (three "
                 "seeds, each ahead). For documents longer than the model's 256 tokens; about twice full's time",
    AUTO: "no fixed config: `ance run --recipe auto` searches variants of demo (learning rate, graded positives, "
          "warm-up epochs) on the dataset's own dev split, then trains the winner (`ance tune` searches only)",
}


def _text(value: Any) -> str:
    """A setting's value as `--set` reads it back (None: YAML's null)."""
    return "null" if value is None else str(value)


def recipe_sets(name: str) -> list[str]:
    """A recipe's overrides of the pipeline's defaults as `--set` arguments."""

    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for key, sub in value.items() for s in flat(f"{prefix}{key}.", sub)]
        return [f"{prefix[:-1]}={_text(value)}"]

    return flat("", RECIPES[name]) if name in RECIPES else []


def recipe_drift(config: PipelineConfig, name: str) -> list[str]:
    """The overrides of recipe `name` that `config` does not hold, as `path=recipe value (the config: value)`."""
    drift = []
    for setting in recipe_sets(name):
        path, value = setting.split("=", 1)
        if _text(node := _at(config, path)) != value:
            drift.append(f"{path}={value} (the config: {_text(node)})")
    return drift


def form_rebased(config: PipelineConfig, name: str, form: str) -> tuple[PipelineConfig, list[str]]:
    """`config` as a Prefect run form sent it, with recipe `name`'s settings in place of recipe `form`'s when it holds
    every setting in which the two differ at `form`'s value: the form opens with `form`'s values (its default) and
    cannot leave a setting unset, so choosing `name` elsewhere in the form (tune.recipe) and leaving the config as it
    opened ran `form`'s recipe under `name`'s label. A config that holds any of those settings otherwise (`ance tune
    --recipe full`: built from `name`, or a form whose user changed one) is returned as it is. Also the settings taken,
    as `path=value`."""
    theirs, ours = recipe_config(name), recipe_config(form)
    paths = dict.fromkeys(s.split("=", 1)[0] for s in recipe_sets(form) + recipe_sets(name))
    differ = [p for p in paths if _text(_at(theirs, p)) != _text(_at(ours, p))]
    if not differ or any(_text(_at(config, p)) != _text(_at(ours, p)) for p in differ):
        return config, []
    sets = [f"{p}={_text(_at(theirs, p))}" for p in differ]
    return load_config(None, PipelineConfig, sets, base=config.model_dump(mode="json")), sets


def _at(config: PipelineConfig, path: str) -> Any:
    node: Any = config  # (its attributes: the values as the config holds them, not as a dump writes them)
    for key in path.split("."):
        node = getattr(node, key)
    return node


def recipe_config(name: str, sets: Sequence[str] = (), path: str | Path | None = None, **overrides: Any
                  ) -> PipelineConfig:
    """The pipeline config of a recipe, with a config file's sections (`path`) merged over it, top-level `overrides`
    (e.g. work_dir), and then `--set` overrides (`key.sub=value`, pipeline/config.py `apply_sets`) on top."""
    if name == AUTO:
        raise AnceError("recipe 'auto' is chosen on the dataset's dev split by a search: `ance run --recipe auto` "
                        f"(or `ance tune`); here choose one of {', '.join(RECIPES)}")
    if name not in RECIPES:
        raise AnceError(f"unknown recipe '{name}'; choose one of {', '.join(RECIPES)} (or `ance run --recipe auto`)")
    base = copy.deepcopy(RECIPES[name])
    if path is None:
        return load_config(None, PipelineConfig, sets, base=base | overrides)
    for section, value in read_config_file(path).items():
        if isinstance(value, dict) and isinstance(base.get(section), dict):
            base[section] = base[section] | value
        else:
            base[section] = value
    try:
        return load_config(None, PipelineConfig, sets, base=base | overrides)
    except AnceError as e:  # the file's name, as a config file's own errors give it
        raise AnceError(f"{path} (over recipe '{name}'): {e}") from None
