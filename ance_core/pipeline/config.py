"""The configs of every stage (each room's config.py), composed into the pipeline config and the comparison's
(ance_core/pipeline/loading.py reads them from YAML or JSON).

Frozen and `extra="forbid"`: a typo in a YAML file or the Prefect UI form is refused before any work starts.
The defaults: SciFact, all-MiniLM-L6-v2, a BM25 warm-up then one ANCE round on a 2-core CPU (the `demo` recipe sets
SimANS rounds and lr 4e-5 over them: ance_core/pipeline/recipes.py).
"""

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from ance_core.compression.config import CompressConfig
from ance_core.data.config import DataConfig
from ance_core.modeling.config import ModelConfig
from ance_core.negatives.config import InferencerConfig, MiningConfig, SamplerName, WarmupMiningConfig, ranking_with
from ance_core.negatives.samplers import get_sampler
from ance_core.pipeline.report import Selection
from ance_core.retention import RetentionConfig
from ance_core.retrieval.config import BM25Config, EncodeConfig, EvalConfig, ExecutionConfig, IndexConfig
from ance_core.stage_config import StageConfig
from ance_core.training.config import AnceTrainConfig, DevCheckConfig, TrainConfig


def start_checkpoint_refusal(start: str) -> str:
    return (f"selection cv with start_checkpoint {start}: a model trained before has seen the other folds' dev "
            "queries (it was trained on them), so their pooled scores would favour it; retrain with selection best "
            "or one-se")


def _a_folder(value: str) -> str:
    if not value.strip():  # (Path("") is the current folder)
        raise ValueError("empty: the stages would be written into the current folder; give a folder (e.g. work)")
    return value


WorkDir = Annotated[str, AfterValidator(_a_folder)]


class PipelineConfig(StageConfig):
    """BM25 warm-up -> K ANCE rounds (encode -> index -> mine -> train) -> evaluation after every stage."""

    UNSAID = {"dev_check": DevCheckConfig(), "hybrid": True, "warmup_only": False, "selection": "best"}  # (added
    # after configs had digests: left out at these values)

    data: DataConfig = Field(DataConfig(), description="The dataset (a name under the data home, or a path) and its "
                             "splits: train, the dev split that chooses, the eval split reported")
    model: ModelConfig = Field(ModelConfig(), description="The pretrained encoder, its pooling, lengths and prefixes")
    bm25: BM25Config = Field(BM25Config(), description="BM25: the baseline row, the warm-up's candidates, the hybrid "
                             "row's sparse side")
    bm25_negatives: WarmupMiningConfig = Field(WarmupMiningConfig(), description="The warm-up's negatives (bm25, "
                                               "random, bm25+random, in-batch or nce: there is no trained model yet)")
    warmup: TrainConfig = Field(TrainConfig(), description="The BM25 warm-up's training (on bm25_negatives)")
    encode: EncodeConfig = Field(EncodeConfig(), description="Corpus and query encoding")
    execution: ExecutionConfig = Field(ExecutionConfig(), description="Where mapped tasks (encoding shards) run: "
                                       "in the flow's process or on Ray")
    index: IndexConfig = Field(IndexConfig(), description="The faiss index the rounds mine from")
    mining: MiningConfig = Field(MiningConfig(), description="The ANCE rounds' negatives (the sampler and its "
                                 "options)")
    ance: AnceTrainConfig = Field(AnceTrainConfig(), description="Each ANCE round's training")
    eval: EvalConfig = Field(EvalConfig(), description="Evaluation: depth of the ranked lists scored")
    dev_check: DevCheckConfig = Field(
        DevCheckConfig(), description="Dev evaluation inside each training stage (the warm-up and synchronous rounds): "
        "its best check kept as the stage's model, a stage that stopped improving ended early (off by default: "
        "per_epoch 0)")
    hybrid: bool = Field(True, description="A hybrid row in the results: the best dense model on the dev split fused "
                         "with BM25 (reciprocal-rank fusion or a convex combination of per-query normalised scores, "
                         "chosen on the dev split), a candidate for the run's result like any model")
    selection: Selection = Field(
        "best", description="How the run's result is chosen on the dev split among its models (the starting one and "
        "the hybrid row included). best: the best dev nDCG@10 (on a tie a dense model before a hybrid row, then the "
        "later trained). one-se: the simplest model (the earliest trained, "
        "a dense model before its hybrid row) within one standard error of the best dev nDCG@10, the error that of "
        "their per-query difference, so that a lead within the noise of a small dev split does not displace a "
        "simpler model (measured on seven collections: no better on test than best, RESULTS.md). cv: "
        "cross-validation for a dev split too small to decide (a dozen queries): the run runs once more per other "
        "dev fold (data.dev_fold 1 .. floor(1 / data.dev_fraction) - 1, each a trial run in MLflow) and chooses on "
        "each model's dev nDCG@10 pooled over every fold's dev queries; about floor(1 / dev_fraction) times the "
        "pipeline's time; not with start_checkpoint")
    rounds: int = Field(1, ge=0, le=1000, description="ANCE rounds after the BM25 warm-up")
    warmup_only: bool = Field(False, description="Train and evaluate the warm-up only, planned as in the whole run "
                              "(with schedule: continuous its learning-rate schedule spans the rounds it would have: "
                              "the same warm-up, cached for the whole run); the recipe search's first rung")
    schedule: Literal["per-stage", "continuous"] = Field(
        "continuous", description="per-stage: each training stage warms up and decays its own learning rate. "
        "continuous: the warm-up and the rounds are one run: one learning-rate schedule over all their steps (warm-up "
        "over warmup.warmup_ratio of them, then linear decay to zero), each stage continuing the previous one's "
        "optimizer state; each stage keeps its own base learning rate. With refresh: async the rounds are one run "
        "of their own, so only the warm-up follows this")
    refresh: Literal["sync", "async"] = Field(
        "sync",
        description="sync: each round waits for its negatives (reproducible). async (ANCE Fig. 2): one continuous "
        "training run; the index is refreshed in the background from each round's checkpoint and the new "
        "negatives are swapped in as soon as they are ready",
    )
    max_staleness: int | None = Field(
        None, ge=1, description="async only: the trainer waits when its negatives come from a checkpoint more than "
        "this many steps old and fresher ones are being mined; unset = never wait")
    inferencer: InferencerConfig = Field(InferencerConfig(), description="async only: where the refreshes run (a "
                                         "thread of the trainer, or flow runs of a deployment on their own workers)")
    work_dir: WorkDir = Field("work", description="Stage outputs live in <work_dir>/<stage>/<digest>/")
    start_checkpoint: str | None = Field(
        None, description="Start the ANCE rounds from this trained checkpoint instead of a BM25 warm-up (retrain): "
        "its folder, or a registered model's URI, models:/<name>@<alias> or models:/<name>/<version> (downloaded "
        "into <work_dir>/champion/)")
    compression: CompressConfig | None = Field(
        None, description="Compress the final model's embeddings at the end (ConAE, PCA, truncation; unset = skip)")
    retention: RetentionConfig = Field(RetentionConfig(), description="What the work folder keeps after the run: "
                                       "the last N runs' stages, the last N refreshes' encodings and indexes (unset: "
                                       "everything; `ance gc` applies the same rules)")

    @model_validator(mode="after")
    def _folds_to_pool(self) -> "PipelineConfig":
        if self.selection != "cv":
            return self
        if self.data.dev_split is None:
            raise ValueError("selection cv chooses on dev folds carved from the training queries, and data.dev_split "
                             "is null (name the dev split, e.g. dev)")
        if not 0 < self.data.dev_fraction <= 0.5:
            raise ValueError(f"selection cv carves two or more dev folds of data.dev_fraction from the training "
                             f"queries; data.dev_fraction is {self.data.dev_fraction} (0.5 or less: e.g. 0.25 for 4 "
                             "folds; each fold is a whole run)")
        if self.data.dev_fold:
            raise ValueError(f"selection cv runs every dev fold itself; data.dev_fold {self.data.dev_fold}: leave it 0")
        if self.start_checkpoint:
            raise ValueError(start_checkpoint_refusal(self.start_checkpoint))
        return self

    @model_validator(mode="after")
    def _async_needs_a_dense_sampler(self) -> "PipelineConfig":
        if self.refresh == "async" and self.rounds and not self.mining.spec.needs_model:
            raise ValueError(f"refresh 'async' refreshes the model's own ANN negatives; mining.sampler "
                             f"'{self.mining.sampler}' does not use them (use {ranking_with('dense')}, or refresh: "
                             "sync)")
        return self

    @model_validator(mode="after")
    def _async_trains_one_sample(self) -> "PipelineConfig":
        if self.refresh == "async" and self.rounds > 1 and self.mining.queries is not None:
            raise ValueError(f"mining.queries ({self.mining.queries}) draws other training queries each round, but "
                             "refresh 'async' trains one run on the first round's (query, positive) rows and swaps "
                             "only their negatives; unset mining.queries, or use refresh: sync")
        return self

    @model_validator(mode="after")
    def _inferencer_is_async(self) -> "PipelineConfig":
        if self.inferencer.mode == "deployment" and self.refresh != "async":
            raise ValueError("inferencer.mode 'deployment' runs the refreshes of refresh: async; with refresh "
                             f"'{self.refresh}' each round mines in the flow itself (set refresh: async, or leave "
                             "inferencer.mode: thread)")
        return self

    @model_validator(mode="after")
    def _margin_needs_scores(self) -> "PipelineConfig":
        if self.mining.spec.uses_bm25 and self.mining.margin is not None:
            raise ValueError(f"mining.margin with the rounds' sampler '{self.mining.sampler}' has no model scores for "
                             "its BM25 candidates (the warm-up's bm25_negatives.margin uses the starting model's)")
        return self

    @model_validator(mode="after")
    def _maxp_trains_on_whole_windows(self) -> "PipelineConfig":
        if self.model.document_mode != "maxp":
            return self
        if refusal := maxp_refusal(self, self.model.passage_max_length, warmup=True):
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _a_teacher_is_used(self) -> "PipelineConfig":
        for mining, train in (("bm25_negatives", "warmup"), ("mining", "ance")):
            if getattr(self, mining).teacher is not None and getattr(self, train).distill_weight == 0:
                raise ValueError(f"{mining}.teacher is set but {train}.distill_weight is 0: its scores would be "
                                 f"computed and not trained on; set {train}.distill_weight > 0 or unset the teacher")
        return self

    @model_validator(mode="after")
    def _warmup_only_has_a_warmup(self) -> "PipelineConfig":
        if self.warmup_only and self.start_checkpoint:
            raise ValueError("warmup_only trains the BM25 warm-up only, and a start_checkpoint run has none (its "
                             "rounds start from the checkpoint); unset one of them")
        return self

    @model_validator(mode="after")
    def _dev_checks_in_one_process(self) -> "PipelineConfig":
        if self.dev_check.active:
            for name in ("warmup", "ance"):
                if getattr(self, name).world_size > 1:
                    raise ValueError(f"dev_check scores the model in one training process, but {name}.world_size is "
                                     f"{getattr(self, name).world_size}; set dev_check.per_epoch: 0")
            if self.data.dev_split is None:
                raise ValueError("dev_check scores the dev split, and data.dev_split is null; set "
                                 "dev_check.per_epoch: 0 or name a dev split")
            for name in ("warmup", "ance"):
                if getattr(self, name).ema_decay is not None and self.dev_check.keep_best:
                    raise ValueError(f"dev_check keeps a stage's best step's weights, {name}.ema_decay their "
                                     "average: set one of them (or dev_check.keep_best: false)")
        return self

    @model_validator(mode="after")
    def _splits_differ(self) -> "PipelineConfig":
        if self.data.train_split == self.data.eval_split:
            raise ValueError(
                f"data.train_split and data.eval_split are both '{self.data.train_split}': "
                "training on the evaluation split would report leaked metrics"
            )
        return self


def _said(section: str) -> str | None:
    """The description of a pipeline config's section, for a config that has the same section."""
    return PipelineConfig.model_fields[section].description


class CompareConfig(StageConfig):
    """The same model, data, seed and training budget with each sampler, all from one BM25 warm-up checkpoint (the
    paper's "BM25 -> *", ANCE Table 1): one training stage per sampler, then evaluation and the analyses."""

    samplers: list[SamplerName] = Field(
        ["random", "bm25", "bm25+random", "in-batch", "nce", "ance", "simans"], min_length=1,
        description="The samplers to compare, each trained with `ance` from the warm-up checkpoint")
    data: DataConfig = Field(DataConfig(), description=_said("data"))
    model: ModelConfig = Field(ModelConfig(), description=_said("model"))
    bm25: BM25Config = Field(BM25Config(), description=_said("bm25"))
    bm25_negatives: WarmupMiningConfig = Field(WarmupMiningConfig(), description="The warm-up's negatives")
    warmup: TrainConfig = Field(TrainConfig(), description="The BM25 warm-up every sampler starts from")
    encode: EncodeConfig = Field(EncodeConfig(), description=_said("encode"))
    execution: ExecutionConfig = Field(ExecutionConfig(), description=_said("execution"))
    index: IndexConfig = Field(IndexConfig(), description=_said("index"))
    mining: MiningConfig = Field(MiningConfig(), description="Shared mining options (num_negatives, seed, SimANS a "
                                 "and b, false-negative controls); `sampler` and `top_k` are set per sampler")
    ance: AnceTrainConfig = Field(AnceTrainConfig(), description="The training budget every sampler gets")
    eval: EvalConfig = Field(EvalConfig(), description=_said("eval"))
    work_dir: WorkDir = Field("work", description="Stage outputs live in <work_dir>/<stage>/<digest>/")

    @model_validator(mode="after")
    def _check(self) -> "CompareConfig":
        if len(set(self.samplers)) != len(self.samplers):
            raise ValueError(f"samplers lists one twice: {self.samplers}")
        self.as_pipeline()  # the warm-up's checks (splits differ, a warm-up sampler that needs no model)
        for sampler in self.samplers:  # each sampler's options, before any stage trains (not after the first ones)
            self.sampler_mining(sampler)
        return self

    def sampler_mining(self, sampler: str) -> MiningConfig:
        """The shared `mining` options with `sampler` (and `top_k` only for the samplers that rank with the model),
        validated as a whole: an option the sampler cannot take (`teacher` without a group of mined negatives) is
        refused naming the sampler. (`margin` with a BM25 sampler is taken: the warm-up scores its candidates.)"""
        fields = self.mining.model_dump() | {"sampler": sampler,
                                             "top_k": self.mining.top_k if get_sampler(sampler).needs_model else None}
        try:
            return MiningConfig.model_validate(fields)
        except ValidationError as e:
            reasons = "; ".join(map(validation_message, e.errors()))
            raise ValueError(f"samplers: '{sampler}' cannot take the shared mining options: {reasons}") from None

    def as_pipeline(self) -> PipelineConfig:
        """The pipeline config of the warm-up (shared stages, shared cache)."""
        fields = {k: getattr(self, k) for k in ("data", "model", "bm25", "bm25_negatives", "warmup", "encode", "index",
                                                 "mining", "ance", "eval", "work_dir")}
        return PipelineConfig(**fields, rounds=0)


def negatives_needed(config: PipelineConfig | CompareConfig) -> int:
    """How many negatives a pair needs from the corpus in this run: the most any of its mined samplers draws (0 when
    none mines: in-batch and nce negatives are other queries' passages)."""
    compare = isinstance(config, CompareConfig)
    warmup = compare or not config.start_checkpoint  # (a retrain starts from its checkpoint: no warm-up)
    samplers = [(config.bm25_negatives, config.bm25_negatives.sampler)] * warmup
    rounds = config.samplers if compare else [config.mining.sampler] * (bool(config.rounds) and not config.warmup_only)
    samplers += [(config.mining, sampler) for sampler in rounds]
    return max((mining.num_negatives for mining, sampler in samplers if get_sampler(sampler).mines), default=0)


def validation_message(err: dict) -> str:
    """One error of a ValidationError, without pydantic's prefix to a validator's own message."""
    return err["msg"].removeprefix("Value error, ")


def maxp_refusal(c: PipelineConfig, window: int, warmup: bool) -> str | None:
    """What a config cannot do with a MaxP model (one vector per window of `window` tokens; `warmup`: the run trains
    a warm-up too), or None: train on cut windows, mine with a sampler that does not rank with the model, compress."""
    for name in ("warmup", "ance")[0 if warmup else 1:]:
        length = getattr(c, name).passage_max_length
        if length is not None and length < window:
            return (f"document_mode maxp trains on whole windows of model.passage_max_length ({window}) tokens, but "
                    f"{name}.passage_max_length is {length}; set {name}.passage_max_length: null")
    if c.rounds and c.mining.spec.rankings != ("dense",):
        return (f"document_mode maxp: the rounds' sampler '{c.mining.sampler}' mines candidates the model did not "
                f"rank, so it cannot tell each document's best window; use {ranking_with('dense', only=True)}")
    if c.compression is not None:
        return "compression of a maxp model (one vector per window) is not supported; unset compression or use " \
               "document_mode firstp"
    return None
