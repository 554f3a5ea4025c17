"""The config of each stage (data, model, training, encoding, index, mining, evaluation, compression), composed by
ance_core.config into the pipeline's and the comparison's configs; import them from there.

Frozen and `extra="forbid"`: a typo in a YAML file or the Prefect UI form is refused before any work starts.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from ance_core.samplers import NAMES, SAMPLERS, WITHOUT_MODEL, Sampler

Precision = Literal["auto", "fp32", "bf16", "fp16"]


class StageConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DataConfig(StageConfig):
    """Which dataset, where it lives, and which qrels splits train and evaluate."""

    dataset: str = Field("scifact", description="Name under the data home, or a path to a dataset folder")
    format: Literal["auto", "beir", "msmarco"] = "auto"
    data_home: str | None = Field(None, description="Default: $ANCE_DATA_HOME, else ~/.cache/ance/data")
    download: bool = Field(True, description="Download the public BEIR archive when the dataset is missing")
    train_split: str = "train"
    eval_split: str = "test"
    dev_split: str = Field("dev", description="The split that picks the run's result (its best checkpoint) and the "
                           "champion; recipes are chosen on it, never on eval_split")
    dev_fraction: float = Field(
        0.2, ge=0, lt=1, description="When the dataset has no `dev_split`: this share of the train split's queries "
        "(those with a positive) moves into it, chosen by dev_seed, and is no longer trained on. 0: no dev split, and "
        "the run's result is its last model")
    dev_seed: int = Field(0, description="Which train queries become the carved dev split")
    train_min_relevance: int | Literal["auto"] = Field(
        "auto", description="Lowest relevance grade of the train split that is a training positive. auto: the top "
        "grade on graded qrels (two or more positive grades), else 1. Lower grades are never sampled as negatives")

    @model_validator(mode="after")
    def _grade_is_positive(self) -> "DataConfig":
        if self.train_min_relevance != "auto" and self.train_min_relevance < 1:
            raise ValueError(f"train_min_relevance must be 'auto' or a grade >= 1, got {self.train_min_relevance}")
        return self

    @model_validator(mode="after")
    def _dev_is_its_own_split(self) -> "DataConfig":
        if self.dev_split == self.train_split:
            raise ValueError(f"dev_split and train_split are both '{self.train_split}': model selection on the "
                             "training queries would always pick the last model")
        if self.dev_split == self.eval_split:
            raise ValueError(f"dev_split and eval_split are both '{self.eval_split}': the evaluation split would "
                             "choose the run's result; name the dev split otherwise (e.g. dev_split: train-dev, carved "
                             "from the train split when the dataset has no split of that name)")
        return self


class BM25Config(StageConfig):
    """bm25s with a Snowball stemmer; title and text are indexed together."""

    k1: float = Field(0.9, gt=0)
    b: float = Field(0.4, ge=0, le=1)
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"
    top_k: int = Field(1000, ge=1, description="Depth of the evaluation run")


class ModelConfig(StageConfig):
    """BERT-Siamese (ANCE eq. 1-3): shared encoder -> pooled vector -> Linear(h, h) -> LayerNorm, dot product."""

    name: str = Field("minilm", description="'minilm', any Hugging Face model id, or a local path")
    pooling: Literal["mean", "cls"] = "mean"
    init_temperature: float = Field(
        0.05,
        gt=0,
        description="Head initialisation: identity projection and LayerNorm gain sqrt(1/(T*h)), so q.d of a "
        "fresh head equals the centred cosine of the pooled vectors divided by T",
    )
    query_max_length: int = Field(64, ge=8)
    passage_max_length: int = Field(256, ge=8, description="Tokens of a passage: the document's first (firstp) or "
                                    "each of its windows (maxp)")
    document_mode: Literal["firstp", "maxp"] = Field(
        "firstp", description="firstp: a document is its first passage_max_length tokens. maxp (ANCE §5, document "
        "ranking): its windows of passage_max_length tokens (at most max_passages) are each encoded and indexed, and "
        "it scores as its best window, in retrieval and in mining (a document is one negative, by its best window)")
    max_passages: int = Field(4, ge=1, description="maxp: windows per document (ANCE: 4 of 512 tokens)")


class TrainConfig(StageConfig):
    """NLL over 1 positive + n mined negatives per query (ANCE eq. 5), optionally with in-batch negatives."""

    epochs: int = Field(1, ge=1, description="Passes over the mined (query, positive) pairs")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps; overrides epochs when set")
    batch_size: int = Field(16, ge=1, description="Queries per micro-batch")
    grad_accumulation: int = Field(1, ge=1)
    learning_rate: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    optimizer: Literal["adamw", "lamb"] = "adamw"
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_grad_norm: float = Field(2.0, gt=0)
    in_batch_negatives: bool = True
    hardest_in_batch: int | None = Field(
        None, ge=1, description="Keep only each query's n highest-scoring in-batch negatives (the nce sampler sets it)")
    query_max_length: int | None = Field(None, ge=8, description="Query tokens; default: the model's "
                                         "(model.query_max_length)")
    passage_max_length: int | None = Field(128, ge=8, description="Passage tokens; unset: the model's encoding "
                                           "length (model.passage_max_length)")
    attention_dropout: float | None = Field(
        0.0, ge=0, lt=1, description="Attention-probability dropout while training; null: the model's own (0.1 for "
        "BERT models). 0 (the default, chosen on the dev split) trains 1.1-2.3x faster on CPU: no random mask over "
        "every attention matrix")
    precision: Precision = "auto"
    seed: int = 42
    checkpoint_every: int = Field(50, ge=0, description="Optimizer steps between resumable checkpoints; 0 = end only")
    world_size: int = Field(
        1, ge=1, description="Training processes (torch.distributed DDP, started by torchrun on this machine: gloo on "
        "CPU, nccl with one GPU per process). batch_size stays the queries per step over all of them, and in-batch "
        "negatives span them, so N processes train the objective of one")

    @model_validator(mode="after")
    def _a_query_per_process(self):
        if self.batch_size < self.world_size:
            raise ValueError(f"batch_size {self.batch_size} is below world_size {self.world_size}: each process needs "
                             "at least one query of the micro-batch (batch_size is the queries per step over all "
                             "processes)")
        return self

    @model_serializer(mode="wrap")
    def _one_process_unsaid(self, handler):
        """world_size 1 is left out of the dump: the cache keys of one-process stages stay those they had before it
        existed (N > 1 is in them: the same objective, other rounding)."""
        data = handler(self)
        if data.get("world_size") == 1:
            del data["world_size"]
        return data


class AnceTrainConfig(TrainConfig):
    """An ANCE round's training (`ance`): TrainConfig with 2 epochs per round by default (chosen on the dev split), so
    a config that sets only some of its fields (`ance: {learning_rate: 3e-5}`) keeps them."""

    epochs: int = Field(2, ge=1, description="Passes over the round's mined (query, positive) pairs")


class EncodeConfig(StageConfig):
    """Corpus/query encoding: length-sorted dynamic padding, streamed to .npy shards."""

    batch_size: int = Field(64, ge=1)
    shard_size: int = Field(50_000, ge=1, description="Documents per shard: each is its own task (on the execution "
                            "runner) and .npy file (bounds memory); MaxP writes a row per window")
    precision: Precision = "auto"


class ExecutionConfig(StageConfig):
    """Where the corpus-encoding shard tasks run. Not part of any stage's cache key: the results do not depend on it
    (tests/test_scale.py checks that Ray's are byte-identical to local ones)."""

    task_runner: Literal["local", "ray"] = Field(
        "local", description="local: the shards one after another in the flow's process (nothing to start). ray: "
        "prefect-ray's RayTaskRunner, one Ray task per shard")
    address: str | None = Field(
        None, description="An existing Ray cluster (auto, or ray://<head>:10001); unset: start a local Ray of "
        "`workers` workers in the run's process. A remote cluster's workers need this project installed and work_dir "
        "on storage they share")
    workers: int = Field(2, ge=1, description="Shard tasks a local Ray runs at once")
    threads_per_worker: int = Field(1, ge=1, description="CPU threads of each shard task (Ray num_cpus, torch threads)")
    gpus_per_task: float = Field(0, ge=0, description="ray: GPUs reserved per shard task (1 on GPU workers)")


class IndexConfig(StageConfig):
    """The faiss index the training rounds mine from: exact IndexFlatIP (the paper's, the default) or an approximate
    IVF-Flat or HNSW one, in `shards` parts searched together (faiss IndexShards); on the GPU when faiss-gpu and CUDA
    are present (one part per GPU). Evaluation always searches an exact flat index."""

    type: Literal["flat", "ivf", "hnsw"] = Field(
        "flat", description="flat: exact inner product (the paper's); ivf: IVF-Flat, nprobe of nlist lists; hnsw: "
        "HNSW graph (CPU only). Used for mining in the rounds; evaluation searches a flat index")
    shards: int = Field(1, ge=1, description="Index parts searched together (faiss IndexShards): one per GPU on GPU "
                        "machines, threads in one process on CPU; a flat index gives the same results")
    nlist: int | None = Field(None, ge=1, description="ivf: inverted lists; unset: 4 * sqrt(vectors), at least 39 "
                              "vectors per list")
    nprobe: int = Field(32, ge=1, description="ivf: lists searched per query")
    hnsw_m: int = Field(32, ge=4, description="hnsw: graph neighbours per vector")
    ef_search: int = Field(128, ge=1, description="hnsw: search breadth (at least the k searched for)")
    device: Literal["auto", "cpu", "gpu"] = "auto"
    search_batch_size: int = Field(4096, ge=1, description="Queries per faiss search call (BLAS-sized)")

    def exact(self) -> "IndexConfig":
        """The flat index of the same placement (evaluation's)."""
        return self.model_copy(update={"type": "flat"})


SamplerName = Literal[NAMES]  # the registry's (ance_core/samplers.py)


def _ranking_with(ranking: str, only: bool = False) -> str:
    """The samplers that mine `ranking` (only it, with `only`), for messages: "ance or simans"."""
    return " or ".join(s.name for s in SAMPLERS.values()
                       if (s.rankings == (ranking,) if only else ranking in s.rankings))


def _sampler_options(names: tuple[str, ...]) -> str:
    return "; ".join(f"{name}: {SAMPLERS[name].about}" for name in names)


class MiningConfig(StageConfig):
    """Which negatives a training stage gets (ance_core/samplers.py). `ance` (the paper's): top-k of the current
    model's ANN retrieval minus all labelled positives, n sampled uniformly (ANCE eq. 10)."""

    sampler: SamplerName = Field("ance", description=_sampler_options(NAMES))
    top_k: int | None = Field(None, ge=1, description="Ranked candidates; default: the sampler's (" + ", ".join(
        f"{s.name} {s.default_depth}" for s in SAMPLERS.values() if s.default_depth) + ")")
    num_negatives: int = Field(1, ge=1, description="Negatives per (query, positive) pair; the paper uses 1. "
                               "nce: the in-batch negatives kept per query")
    seed: int = 42
    simans_a: float = Field(0.5, gt=0, description="SimANS density a (the paper: 0.5)")
    simans_b: float = Field(0.0, description="SimANS peak offset b: the mode sits at s(q,d+) + b (the paper: 0)")
    skip_top: int = Field(0, ge=0, description="False-negative control: never sample the top r ranks")
    margin: float | None = Field(
        None, ge=0, lt=1, description="False-negative control: drop candidates scoring above (1 - m)·s(q,d+). For "
        "the warm-up's BM25 candidates the scores are the starting (pretrained) model's")

    @property
    def spec(self) -> Sampler:
        return SAMPLERS[self.sampler]

    @property
    def depth(self) -> int | None:
        """The ranking depth the sampler mines from (None: it mines no ranking)."""
        return self.spec.depth(self.top_k)


class WarmupMiningConfig(MiningConfig):
    """The warm-up's negatives (`bm25_negatives`): MiningConfig with BM25 as its default sampler, so a config that sets
    only some of its fields (`bm25_negatives: {num_negatives: 2}`) keeps mining BM25 negatives."""

    sampler: SamplerName = Field("bm25", description="There is no trained model to rank with yet: "
                                 + _sampler_options(WITHOUT_MODEL))


class EvalConfig(StageConfig):
    top_k: int = Field(1000, ge=1, description="Retrieval depth of the evaluation run")


CompressMethod = Literal["conae", "pca", "truncate"]
IndexType = Literal["flat", "hnsw", "ivfpq"]


class CompressConfig(StageConfig):
    """ConAE (paper 002) and its baselines: compress a trained model's frozen embeddings from h to L dimensions.

    ConAE: a linear encoder per side (h -> L) and one decoder (L -> h), trained on the training queries with
    KL(teacher softmax over its top-k || compressed softmax) + lam (L_q + L_d) (eq. 3, 5-7). PCA is fitted on the
    document embeddings; `truncate` keeps the first L dimensions. Each (method, L) is indexed with every
    `index_types` entry and evaluated; the teacher's own vectors are indexed the same way for the full-dimension rows.
    """

    methods: list[CompressMethod] = Field(["conae", "pca", "truncate"], min_length=1)
    dims: list[int] = Field([256, 128, 64], min_length=1,
                            description="Compressed dimensions L; those not below the model's h are skipped")
    index_types: list[IndexType] = Field(["flat"], min_length=1,
                                         description="flat (exact inner product), hnsw, ivfpq (approximate)")
    top_k: int = Field(100, ge=2, description="The teacher's candidates per training query (D_top)")
    lam: float = Field(0.1, ge=0, description="Weight of the decoder's margin losses L_q and L_d (next to L_KL)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    batch_size: int = Field(128, ge=1)
    epochs: int = Field(100, ge=1, description="Passes over the training queries")
    only_kl: bool = Field(False, description="Ablation 'ConAE w/o Decoder' (Table 3): train with L_KL only; no "
                          "decoder is built")
    no_kl: bool = Field(False, description="Ablation 'ConAE w/o KL' (Table 3): train with L_q + L_d only")
    seed: int = 42
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
        for name in ("methods", "dims", "index_types"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists one twice: {values}")
        return self


class InferencerConfig(StageConfig):
    """Where the asynchronous trainer's refreshes run (`refresh: async`; ANCE Fig. 2). Not part of any stage's cache
    key: the negatives do not depend on it."""

    mode: Literal["thread", "deployment"] = Field(
        "thread", description="thread: in the trainer's process (one machine; with two GPUs the inferencer takes the "
        "last one). deployment: each refresh is a flow run of `deployment` on its own work pool (the paper's 1:1 "
        "trainer/inferencer allocation); needs a Prefect server, the deployment and work_dir on storage both workers "
        "share")
    deployment: str = Field("refresh-negatives/refresh-negatives", description="deployment: the inferencer's "
                            "deployment, '<flow name>/<deployment name>' (prefect.yaml: refresh-negatives on the "
                            "infer pool)")
    retries: int = Field(2, ge=0, description="deployment: flow runs started again for a refresh whose flow run "
                         "failed, crashed or lost its worker")
    poll_seconds: float = Field(5.0, gt=0, description="deployment: how often the trainer reads its refresh flow runs")
    timeout_s: float | None = Field(None, gt=0, description="deployment: a refresh flow run not finished this long "
                                    "after the trainer began to follow it (queue time included; again from zero "
                                    "when the trainer resumes) is cancelled and started again; unset: no limit (a "
                                    "lost worker is still noticed from its missed heartbeats)")
