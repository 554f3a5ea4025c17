from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.retrieval.approximate import ivf_storage
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.index import build_index as core_build_index
from ance_core.retrieval.index import encoding_shape
from tasks.common import stage_task


def index_key(cfg: IndexConfig) -> dict:
    """What changes an index's contents: its type, parts and build parameters (not where it is searched)."""
    if cfg.type == "flat" and cfg.shards == 1:
        return {"type": "flat_ip"}  # the key of every flat index before index.type existed
    params = {"ivf": ("nlist",), "hnsw": ("hnsw_m",), "flat": ()}[cfg.type]
    if cfg.type == "ivf" and cfg.ivf_storage != "flat":  # (flat storage: the key IVF indexes always had)
        params += ("ivf_storage",)
    return {"type": cfg.type, "shards": cfg.shards} | {name: getattr(cfg, name) for name in params}


@stage_task("build-index")
def build_index(embeddings: ArtifactRef, work_dir: str, cfg: IndexConfig = IndexConfig()) -> ArtifactRef:
    """A faiss index over the encoded corpus: exact IndexFlatIP by default, or `cfg.type` in `cfg.shards` parts.
    `ivf_storage: auto` is resolved from the encoding's shape first, so the key names what is built (auto's float32
    lists keep the key IVF indexes always had; its sq8 is an explicit sq8's)."""
    if cfg.type == "ivf" and cfg.ivf_storage == "auto":
        cfg = cfg.model_copy(update={"ivf_storage": ivf_storage(cfg, *encoding_shape(embeddings.path))})
    return run_stage(work_dir, "index", index_key(cfg), {"embeddings": embeddings.digest},
                     lambda out: core_build_index(embeddings.path, out, cfg))
