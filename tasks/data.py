from prefect import task

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import DataConfig
from ance_core.data import dataset_digest, load_dataset, resolve_dataset, save_tables
from tasks.common import TASK_DEFAULTS


@task(name="prepare-data", **TASK_DEFAULTS)
def prepare_data(cfg: DataConfig, work_dir: str) -> ArtifactRef:
    """Resolve, validate and store the dataset as parquet tables, keyed by its content digest."""
    folder = resolve_dataset(cfg.dataset, cfg.data_home, cfg.download)
    inputs = {"content": dataset_digest(folder)}
    # The key holds the content, not where it was found: the same data from another path is the same stage.
    key_cfg = {"format": cfg.format}
    return run_stage(work_dir, "data", key_cfg, inputs, lambda out: save_tables(load_dataset(folder, cfg.format), out))
