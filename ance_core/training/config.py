"""The trainer's config: a training stage's optimizer, batch, lengths, precision, checkpoints and processes."""

from typing import Literal

from pydantic import Field, SerializationInfo, model_serializer, model_validator

from ance_core.modeling.config import Precision
from ance_core.stage_config import KEY_DUMP, SEED_MAX, SPARSE_DUMP, StageConfig

# when checkpoints are taken: not what the stage computes (a resumed run ends with the weights of an uninterrupted one)
CADENCE = ("checkpoint_seconds", "checkpoint_every")
# how the step runs, not what it computes: DataLoader workers, torch.compile and the padding of its shapes
NOT_IN_KEY = (*CADENCE, "loader_workers", "compile", "pad_multiple")


class TrainConfig(StageConfig):
    """NLL over 1 positive + n mined negatives per query (ANCE eq. 5), optionally with in-batch negatives."""

    UNSAID = {"grad_cache_chunk": None, "distill_weight": 1.0, "ema_decay": None, "compile": False,
              "pad_multiple": None, "hidden_dropout": None}  # (added after stage keys existed:
    # left out at these values)

    epochs: int = Field(1, ge=1, description="Passes over the mined (query, positive) pairs")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps; overrides epochs when set")
    batch_size: int = Field(16, ge=1, description="Queries per micro-batch")
    grad_accumulation: int = Field(1, ge=1, description="Micro-batches of batch_size queries per optimizer step, "
                                   "their gradients averaged (in-batch negatives stay within a micro-batch)")
    learning_rate: float = Field(2e-5, gt=0, description="Peak learning rate, reached at the end of the schedule's "
                                 "warm-up (the demo and full recipes: 4e-5, chosen on dev splits)")
    weight_decay: float = Field(0.01, ge=0, description="Decoupled weight decay (AdamW, LAMB)")
    optimizer: Literal["adamw", "lamb"] = Field("adamw", description="AdamW, or LAMB (layer-wise adaptive rates, "
                                                "for large batches)")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Share of the steps over which the learning rate "
                                "rises linearly from 0 (schedule continuous: of all the stages' steps)")
    max_grad_norm: float = Field(2.0, gt=0, description="Gradients clipped to this global L2 norm")
    in_batch_negatives: bool = Field(True, description="Also contrast each query with the other queries' passages "
                                     "of its batch (a labelled positive of the query is never its negative)")
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
    hidden_dropout: float | None = Field(
        None, ge=0, lt=1, description="Hidden-state dropout while training (after the embeddings, each attention "
        "output and each feed-forward layer); null: the model's own (0.1 for BERT models). The demo recipe sets 0 "
        "(chosen on the dev split): a CPU training step 1.17x faster")
    precision: Precision = Field("auto", description="auto: bf16 on a CPU with bf16 in hardware (AVX512-BF16, AMX) "
                                 "and on CUDA GPUs that have it (else fp16), fp32 on other CPUs. fp16: CUDA only")
    seed: int = Field(42, ge=0, le=SEED_MAX,
                      description="Batch order and dropout (each ANCE round derives its own from it)")
    checkpoint_seconds: float = Field(
        600, ge=0, repr=False, description="Seconds of training between resumable checkpoints (0: none by time). The "
        "training pauses only to copy the state to CPU memory (BERT-base with its Adam moments: 1.3 GB), which a "
        "background thread writes while training goes on; every 10 minutes, a crash loses at most 10 minutes of work "
        "and the pauses cost under 1% (2-4 s a copy on a 2-core CPU machine). Under DDP rank 0 reads the clock and "
        "every rank checkpoints at the same step. Not in the stage's cache key")
    checkpoint_every: int = Field(
        0, ge=0, repr=False, description="Optimizer steps between resumable checkpoints (0: none by steps); with "
        "checkpoint_seconds too, whichever comes first. Not in the stage's cache key")
    world_size: int = Field(
        1, ge=1, description="Training processes (torch.distributed DDP, started by torchrun on this machine: gloo on "
        "CPU, nccl with one GPU per process). batch_size stays the queries per step over all of them, and in-batch "
        "negatives span them, so N processes train the objective of one")
    grad_cache_chunk: int | None = Field(
        None, ge=1, description="Cached in-batch negatives (GradCache, Gao et al. 2021; sentence-transformers' "
        "CachedMultipleNegativesRankingLoss): each micro-batch is encoded this many queries (and their passages) at a "
        "time, first without keeping activations, then again chunk by chunk to carry the whole batch's loss gradient "
        "into the weights. The loss, its in-batch negatives and its gradient are those of the whole batch, with the "
        "activation memory of one chunk: batch_size can grow to 64-256 on a CPU. About 1.3-1.5x the compute of a plain "
        "step. Unset: the batch is encoded at once")
    distill_weight: float = Field(
        1.0, ge=0, description="Weight of the KL term toward a teacher's scores of each query's group, when its "
        "negatives carry them (mining.teacher): loss = NLL + distill_weight x KL")
    ema_decay: float | None = Field(
        None, gt=0, lt=1, description="Weight averaging: an exponential moving average of the weights over the "
        "stage's steps (shadow = d x shadow + (1 - d) x weights after step t, d = min(decay, (1 + t) / (10 + t)), "
        "from the first step's weights), which becomes the stage's model at its end; unset: the last step's weights. "
        "Kept with the optimizer's state, so a resumed stage ends with the same average. Dev checks and async "
        "snapshots see the raw weights")
    loader_workers: int = Field(
        0, ge=0, repr=False, description="DataLoader worker processes that pad each step's micro-batches from the "
        "pre-tokenized texts (0: the training thread does it; 1-2 on a GPU keep the next steps ready). Not part of "
        "the stage's cache key: any number trains the same weights")
    compile: bool = Field(
        False, repr=False, description="torch.compile the encoder's forward and backward (inductor; on CUDA "
        "mode='reduce-overhead': each shape's step is a captured CUDA graph, for steps whose kernel launches outrun "
        "the GPU; with grad_accumulation > 1 without CUDA graphs: 3.9-5x the steps/s of MiniLM at 64 queries on "
        "an H200). Each new shape compiles once (40-60 s a model on the H200, about a minute for the tests' tiny "
        "model on a 2-core CPU), so batches are padded to pad_multiple tokens. One training process "
        "without grad_cache_chunk. Not in the stage's cache key: the same objective, other rounding")
    pad_multiple: int | None = Field(
        None, ge=1, repr=False, description="Pad each micro-batch's token length up to a multiple of this (never past "
        "the longest text of the stage), so few shapes recur; unset: 32 with compile, else to the batch's longest "
        "(padding is masked: the same embeddings). Not in the stage's cache key")

    @property
    def padding_multiple(self) -> int | None:
        """The multiple micro-batches are padded to: pad_multiple, or 32 when compiled."""
        return self.pad_multiple if self.pad_multiple is not None else 32 if self.compile else None

    @model_validator(mode="after")
    def _compile_runs_one_plain_process(self):
        if self.compile and (self.world_size > 1 or self.grad_cache_chunk is not None):
            raise ValueError("compile runs one training process without grad_cache_chunk (world_size "
                             f"{self.world_size}, grad_cache_chunk {self.grad_cache_chunk}): unset one of them")
        return self

    @model_validator(mode="after")
    def _a_query_per_process(self):
        if self.batch_size < self.world_size:
            raise ValueError(f"batch_size {self.batch_size} is below world_size {self.world_size}: each process needs "
                             "at least one query of the micro-batch (batch_size is the queries per step over all "
                             "processes)")
        return self

    @model_serializer(mode="wrap")
    def _one_process_unsaid(self, handler, info: SerializationInfo):
        """world_size 1 is left out of the dump a cache key is made of (KEY_DUMP), as the UNSAID options are: the cache
        keys of one-process stages stay those they had before it existed (N > 1 is in them: the same objective, other
        rounding). Left out of it too, since they do not change the result: the checkpoint cadence and
        `loader_workers` (how batches are built, not what is trained). (The pydantic repr, which a stage key holds
        when the config is nested in a dict, leaves them out too: `repr=False`.)"""
        data = handler(self)
        if info.context in (KEY_DUMP, SPARSE_DUMP):
            self.drop_unsaid(data)
            if data.get("world_size") == 1:
                del data["world_size"]
        if info.context == KEY_DUMP:
            for name in NOT_IN_KEY:
                data.pop(name, None)
        return data


class AnceTrainConfig(TrainConfig):
    """An ANCE round's training (`ance`): TrainConfig with 2 epochs per round by default (chosen on the dev split), so
    a config that sets only some of its fields (`ance: {learning_rate: 3e-5}`) keeps them."""

    epochs: int = Field(2, ge=1, description="Passes over the round's mined (query, positive) pairs")



class DevCheckConfig(StageConfig):
    """Dev evaluation inside each training stage (`dev_check`): a few times an epoch the dev queries are scored on a
    fixed candidate set, the stage's best check is kept as its model, and a stage whose dev score stopped rising ends
    early (with schedule: continuous the stages after it keep their planned place in the schedule). The candidates of
    each dev query: BM25's top `depth`, the stage's starting model's top `depth` and the query's relevant documents;
    only their passages are encoded at a check (never more than the corpus). On the
    starting model the candidate-set nDCG@10 is its full-corpus one (its own top `depth` are in the set); on a trained
    model it is the nDCG@10 of re-ranking that set (RESULTS.md: its agreement with the full-corpus score)."""

    per_epoch: int = Field(0, ge=0, description="Checks per epoch of each training stage, and one at its last step "
                           "(0: none; the stage's model is its last step's)")
    patience: int | None = Field(2, ge=1, description="End a stage early once this many checks in a row have not "
                                 "beaten its best (null: never)")
    depth: int = Field(100, ge=10, description="Candidates per dev query from BM25 and from the starting model each "
                       "(at least 10: the starting model's own top 10, whose nDCG@10 the set keeps)")
    passage_max_length: int | None = Field(
        None, ge=8, description="Passage tokens a check encodes (FirstP); unset: the model's, as the evaluation "
        "encodes. Fewer tokens make a check cheaper and its score further from the full-corpus one (RESULTS.md)")
    keep_best: bool = Field(True, description="The stage's model is its best check's (the starting model when no check "
                            "beat it); false: its last step's")

    def start_score(self, evaluated: float) -> float | None:
        """The starting model's score a stage's checks must beat: its dev evaluation's, when a check scores as the
        evaluation does; None with `passage_max_length` (the stage's first check scores it as its later ones: a
        shorter check overstates a trained model, RESULTS.md, and a stage that made the model worse would be kept)."""
        return evaluated if self.passage_max_length is None else None

    @property
    def active(self) -> bool:
        return self.per_epoch > 0

    def every(self, steps_per_epoch: int) -> int:
        """Optimizer steps between checks."""
        return max(1, round(steps_per_epoch / self.per_epoch))
