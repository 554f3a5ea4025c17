from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.index import build_index as core_build_index
from tasks.common import stage_task


def index_key(cfg: IndexConfig) -> dict:
    """What changes an index's contents: its type, parts and build parameters (not where it is searched)."""
    if cfg.type == "flat" and cfg.shards == 1:
        return {"type": "flat_ip"}  # the key of every flat index before index.type existed
    params = {"ivf": ("nlist",), "hnsw": ("hnsw_m",), "flat": ()}[cfg.type]
    if cfg.type == "ivf" and cfg.ivf_storage != "flat":  # (flat storage: the key IVF indexes always had; auto is
        params += ("ivf_storage",)  # resolved from the encoding's size, which the key holds through its digest)
    return {"type": cfg.type, "shards": cfg.shards} | {name: getattr(cfg, name) for name in params}


@stage_task("build-index")
def build_index(embeddings: ArtifactRef, work_dir: str, cfg: IndexConfig = IndexConfig()) -> ArtifactRef:
    """A faiss index over the encoded corpus: exact IndexFlatIP by default, or `cfg.type` in `cfg.shards` parts."""
    return run_stage(work_dir, "index", index_key(cfg), {"embeddings": embeddings.digest},
                     lambda out: core_build_index(embeddings.path, out, cfg))
