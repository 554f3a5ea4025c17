from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.index import build_index as core_build_index
from tasks.common import stage_task


@stage_task("build-index")
def build_index(embeddings: ArtifactRef, work_dir: str) -> ArtifactRef:
    """A faiss IndexFlatIP over the encoded corpus."""
    return run_stage(work_dir, "index", {"type": "flat_ip"}, {"embeddings": embeddings.digest},
                     lambda out: core_build_index(embeddings.path, out))
