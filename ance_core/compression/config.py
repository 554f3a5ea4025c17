"""The compression stage's config: ConAE (paper 002) and its baselines, the compressed indexes, the latency."""

from typing import Literal

from pydantic import Field, model_validator

from ance_core.stage_config import SEED_MAX, StageConfig

CompressMethod = Literal["conae", "pca", "truncate"]


IndexType = Literal["flat", "hnsw", "ivfpq"]


class CompressConfig(StageConfig):
    """ConAE (paper 002) and its baselines: compress a trained model's frozen embeddings from h to L dimensions.

    ConAE: a linear encoder per side (h -> L) and one decoder (L -> h), trained on the training queries with
    KL(teacher softmax over its top-k || compressed softmax) + lam (L_q + L_d) (eq. 3, 5-7). PCA is fitted on the
    document embeddings, streamed over the encode shards (a float64 mean and h x h covariance, then its
    eigendecomposition: O(h^2) memory, not the corpus); `truncate` keeps the first L dimensions. Each (method, L) is
    indexed with every `index_types` entry and evaluated; the teacher's own vectors are indexed the same way for the
    full-dimension rows.
    """

    methods: list[CompressMethod] = Field(["conae", "pca", "truncate"], min_length=1, description="conae (the "
                                          "paper's autoencoder), and its baselines pca and truncate")
    dims: list[int] = Field([256, 128, 64], min_length=1,
                            description="Compressed dimensions L; those not below the model's h are skipped")
    index_types: list[IndexType] = Field(["flat"], min_length=1,
                                         description="flat (exact inner product), hnsw, ivfpq (approximate)")
    top_k: int = Field(100, ge=2, description="The teacher's candidates per training query (D_top)")
    lam: float = Field(0.1, ge=0, description="Weight of the decoder's margin losses L_q and L_d (next to L_KL)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    batch_size: int = Field(128, ge=1, description="ConAE's training queries per step")
    epochs: int = Field(100, ge=1, description="Passes over the training queries")
    only_kl: bool = Field(False, description="Ablation 'ConAE w/o Decoder' (Table 3): train with L_KL only; no "
                          "decoder is built")
    no_kl: bool = Field(False, description="Ablation 'ConAE w/o KL' (Table 3): train with L_q + L_d only")
    seed: int = Field(42, ge=0, le=SEED_MAX, description="ConAE's initialisation and batch order")
    hnsw_m: int = Field(32, ge=2, description="HNSW: links per node")
    hnsw_ef_search: int = Field(128, ge=1, description="HNSW: candidate list size at search time")
    ivf_nlist: int | None = Field(None, ge=1, description="IVF-PQ: inverted lists; default 4 sqrt(n), at most n/39")
    ivf_nprobe: int = Field(16, ge=1, description="IVF-PQ: lists visited per query")
    pq_dims_per_code: int = Field(4, ge=1, description="IVF-PQ: vector dimensions per 8-bit code (h=384: 96 bytes)")
    latency_batch: int = Field(64, ge=1, description="Queries per search call for the batched latency")

    @model_validator(mode="after")
    def _check(self) -> "CompressConfig":
        if self.only_kl and self.no_kl:
            raise ValueError("only_kl and no_kl together leave no loss to train with; set one of them")
        if min(self.dims) < 1:
            raise ValueError(f"dims must be positive, got {self.dims}")
        if "ivfpq" in self.index_types and (odd := [d for d in self.dims if d % self.pq_dims_per_code]):
            raise ValueError(f"pq_dims_per_code {self.pq_dims_per_code} does not divide dims {odd} (IVF-PQ codes "
                             f"pq_dims_per_code dimensions per byte); give a divisor of each, or leave ivfpq out of "
                             "index_types")
        for name in ("methods", "dims", "index_types"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists one twice: {values}")
        return self

