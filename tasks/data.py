from pathlib import Path

from ance_core.artifacts import ArtifactRef, read_manifest, run_stage
from ance_core.data.config import DataConfig
from ance_core.data.dataset import load_corpus, load_dataset, positive_grades, save_tables
from ance_core.data.sources import dataset_digest, resolve_dataset
from ance_core.data.splits import with_dev_split, with_training_grades
from ance_core.errors import AnceError
from tasks.common import stage_task


def _dataset_content(inputs: dict) -> str | None:
    """The cache key holds the dataset's bytes, not only its name: an edited file is read again."""
    cfg: DataConfig = inputs["cfg"]
    try:
        return dataset_digest(resolve_dataset(cfg.dataset, cfg.data_home, download=False))
    except AnceError:  # not there yet (the task downloads it): nothing to key on, so run
        return None


@stage_task("prepare-data", extra_key=_dataset_content)
def prepare_data(cfg: DataConfig, work_dir: str) -> ArtifactRef:
    """Resolve, validate and store the dataset as parquet tables (with the dev split carved from the train split when
    the dataset has none), keyed by its content digest."""
    folder = resolve_dataset(cfg.dataset, cfg.data_home, cfg.download)
    inputs = {"content": dataset_digest(folder)}
    # The key holds the content, not where it was found: the same data from another path is the same stage.
    key_cfg = {"format": cfg.format, "dev": [cfg.train_split, cfg.dev_split, cfg.dev_fraction, cfg.dev_seed],
               "train_min_relevance": cfg.train_min_relevance} | ({"dev_fold": cfg.dev_fold} if cfg.dev_fold else {})
    if cfg.train_min_relevance == "auto" and len(positive_grades(folder, cfg.train_split, cfg.format)) > 1:
        key_cfg["grades_rule"] = "query-top"  # each query's own top grade since issue 30 (the split's top before)

    def build(out):
        # the corpus is written as it is read: its text is never held whole
        dataset = with_dev_split(load_dataset(folder, cfg.format, corpus_to=out / "corpus.parquet"), cfg.train_split,
                                 cfg.dev_split, cfg.dev_fraction, cfg.dev_seed, cfg.dev_fold)
        return save_tables(with_training_grades(dataset, cfg.train_split, cfg.train_min_relevance), out,
                           corpus_written=True)

    return run_stage(work_dir, "data", key_cfg, inputs, build)


def stage_data_config(stage: str | Path | None, dataset: str) -> DataConfig:
    """`dataset`'s DataConfig under the settings a data stage folder's key holds (`prepare_data`'s key, read back), so
    that preparing it again reuses that stage (`ance search --hybrid` reads the data stage its index was encoded from:
    under the defaults, a model trained with dev_fraction 0.3 got a second copy of the collection and a second BM25
    index, which no run records and gc removed an hour later); the defaults when the stage does not say (None, a corpus
    stage, a folder gone)."""
    try:
        config = read_manifest(stage)["config"]
        train, dev, fraction, seed = config["dev"]
        return DataConfig(dataset=dataset, download=False, format=config["format"], train_split=train, dev_split=dev,
                          dev_fraction=fraction, dev_seed=seed, dev_fold=config.get("dev_fold", 0),
                          train_min_relevance=config["train_min_relevance"])
    except (OSError, KeyError, TypeError, ValueError):  # (no stage: Path(None), a TypeError)
        return DataConfig(dataset=dataset, download=False)


def prepare_corpus(folder: Path, work_dir: str, fmt: str = "auto") -> ArtifactRef:
    """A dataset folder's corpus alone, stored as the data stage stores it (corpus.parquet): what BM25 needs to search
    a corpus that comes without queries or qrels (`ance search --hybrid`). Keyed by the folder's content."""

    def build(out):  # (the corpus written as it is read: its text is never held whole)
        return {"documents": len(load_corpus(folder, fmt, corpus_to=out / "corpus.parquet"))}

    return run_stage(work_dir, "corpus", {"format": fmt}, {"content": dataset_digest(folder)}, build)
