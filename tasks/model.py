from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model
from tasks.common import stage_task


@stage_task("init-model")
def init_checkpoint(cfg: ModelConfig, work_dir: str) -> ArtifactRef:
    """The starting checkpoint: pretrained encoder plus a freshly initialised projection head."""
    return run_stage(work_dir, "model", cfg, {}, lambda out: init_model(cfg, out))
