from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import EncodeConfig
from ance_core.data import read_tables
from ance_core.encode import encode_corpus as core_encode_corpus
from tasks.common import stage_task


@stage_task("encode-corpus")
def encode_corpus(checkpoint: ArtifactRef, data: ArtifactRef, cfg: EncodeConfig, work_dir: str) -> ArtifactRef:
    """Encode every passage with a checkpoint into .npy shards."""
    inputs = {"checkpoint": checkpoint.digest, "data": data.digest}
    build = lambda out: core_encode_corpus(checkpoint.path, read_tables(data.path).corpus, cfg, out)  # noqa: E731
    return run_stage(work_dir, "encode", cfg, inputs, build)
