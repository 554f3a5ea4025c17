"""Which negatives a training stage gets (the sampler registry's names) and where the asynchronous refreshes run."""

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ance_core.negatives.samplers import NAMES, SAMPLERS, WITHOUT_MODEL, Sampler
from ance_core.stage_config import SEED_MAX, StageConfig

SamplerName = Literal[NAMES]  # the registry's (ance_core/negatives/samplers.py)


def ranking_with(ranking: str, only: bool = False) -> str:
    """The samplers that mine `ranking` (only it, with `only`), for messages: "ance or simans"."""
    return " or ".join(s.name for s in SAMPLERS.values()
                       if (s.rankings == (ranking,) if only else ranking in s.rankings))


def _sampler_options(names: tuple[str, ...]) -> str:
    return "; ".join(f"{name}: {SAMPLERS[name].about}" for name in names)


class TeacherConfig(StageConfig):
    """A teacher whose scores of each query's mined group (positive and negatives) training distils from
    (negatives/teacher.py): a KL term beside the contrastive loss (train.distill_weight)."""

    model: str = Field(description="Hugging Face id or local path: a cross-encoder (a sequence-classification model "
                       "with one output, e.g. the MS MARCO MiniLM cross-encoders) or a bi-encoder (mean-pooled, "
                       "cosine: sentence-transformers' models; 'minilm' is all-MiniLM-L6-v2), or a checkpoint this "
                       "pipeline trained (a folder with ance_model.json: its own embeddings' inner product, its "
                       "prefixes)")
    kind: Literal["auto", "cross-encoder", "bi-encoder"] = Field(
        "auto", description="auto: a cross-encoder when the model's architecture is a sequence classifier")
    temperature: float = Field(1.0, gt=0, description="The teacher's scores are divided by it before the softmax "
                               "over a query's group (cross-encoder logits: 1; a bi-encoder's cosines: ~0.05)")
    max_length: int = Field(256, ge=8, description="Tokens of a (query, passage) input (cross-encoder) or a text "
                            "(bi-encoder); a MaxP document is scored by its beginning")
    pooling: Literal["mean", "cls"] = Field("mean", description="bi-encoder: how token states become a vector "
                                            "(sentence-transformers' MiniLM and E5: mean; BGE: cls)")
    query_prefix: str = Field("", description="bi-encoder: put before each query (E5: 'query: ')")
    passage_prefix: str = Field("", description="bi-encoder: put before each passage (E5: 'passage: ')")
    batch_size: int = Field(32, ge=1, repr=False, description="Pairs per forward pass; not in the stage's key")

    NOT_IN_KEY = ("batch_size",)


class MiningConfig(StageConfig):
    """Which negatives a training stage gets (negatives/samplers.py). `ance` (the paper's): top-k of the current model's
    ANN retrieval minus all labelled positives, n sampled uniformly (ANCE eq. 10)."""

    UNSAID = {"queries": None, "teacher": None, "judged_only": False}  # (options added after stage keys existed:
    # left out while unset)

    sampler: SamplerName = Field("ance", description=_sampler_options(NAMES))
    top_k: int | None = Field(None, ge=1, description="Ranked candidates; default: the sampler's (" + ", ".join(
        f"{s.name} {s.default_depth}" for s in SAMPLERS.values() if s.default_depth) + ")")
    num_negatives: int = Field(1, ge=1, description="Negatives per (query, positive) pair; ANCE uses 1 (SimANS 15 "
                               "on its public datasets, 5 on Bing; groups of 3 tied with 1 on SciFact's dev, "
                               "RESULTS.md). "
                               "nce: the in-batch negatives kept per query")
    seed: int = Field(42, ge=0, le=SEED_MAX,
                      description="The draws of the negatives (each round derives its own from it)")
    simans_a: float = Field(0.5, gt=0, description="SimANS density a (the paper: 0.5)")
    simans_b: float = Field(0.0, description="SimANS peak offset b: the mode sits at s(q,d+) + b, as in the paper's "
                            "eq. 4 (the paper: 0; its authors' code subtracts b, so their b 1.0 for NQ is -1.0 here). "
                            "a and b are on this model's score scale (inner products of a temperature-0.05 head)")
    skip_top: int = Field(0, ge=0, description="False-negative control: never sample the top r ranks")
    margin: float | None = Field(
        None, ge=0, lt=1, description="False-negative control: drop candidates scoring above s(q,d+) - m·|s(q,d+)|. "
        "For the warm-up's BM25 candidates the scores are the starting (pretrained) model's")
    judged_only: bool = Field(
        False, description="Pooled judgments (TREC's qrels, which list the documents judged non-relevant with grade "
        "0): a query whose qrels judge documents non-relevant draws its negatives only from those among its "
        "candidates, never from its unjudged top hits, which in a pool of strong systems' results are often "
        "relevant passages no one judged. Queries without such rows mine as before; a pair left with too few takes "
        "the fallback")
    queries: int | None = Field(
        None, ge=1, description="Mine (and so train on) a seeded sample of this many of the split's training queries, "
        "drawn again each round; unset: all of them. A stage of S steps of B queries trains on at most S·B: at MS "
        "MARCO's 500k training queries, BM25 over all of them for a warm-up of a few hundred steps takes hours")

    teacher: TeacherConfig | None = Field(
        None, description="Distillation: a teacher scores each query's group of positive and negatives, and training "
        "adds KL(teacher || student) over the group (weight train.distill_weight). Unset: no teacher")

    @model_validator(mode="after")
    def _a_teacher_needs_a_group(self) -> "MiningConfig":
        if self.teacher is not None and not SAMPLERS[self.sampler].mines:
            raise ValueError(f"teacher: sampler '{self.sampler}' mines no negatives, so there is no group of "
                             "candidates for the teacher to score; use a mined sampler (ance, simans, bm25, ...)")
        return self

    @model_validator(mode="after")
    def _judged_needs_a_ranking(self) -> "MiningConfig":
        if self.judged_only and not SAMPLERS[self.sampler].rankings:
            raise ValueError(f"judged_only: sampler '{self.sampler}' draws from no ranking, so there are no "
                             "candidates to keep to the judged ones; use a ranked sampler (ance, simans, bm25, ...)")
        return self

    def sample(self, round_: int) -> dict | None:
        """What a ranking stage needs to rank only this round's queries (None: all of them)."""
        return None if self.queries is None else {"queries": self.queries, "seed": self.seed, "round": round_}

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

    sampler: Literal[WITHOUT_MODEL] = Field("bm25", description="There is no trained model to rank with yet: "
                                            + _sampler_options(WITHOUT_MODEL))  # (the UI's choices: these only)

    @field_validator("sampler", mode="before")
    @classmethod
    def _no_model_yet(cls, sampler: Any) -> Any:
        if isinstance(sampler, str) and sampler in SAMPLERS and SAMPLERS[sampler].needs_model:
            raise ValueError(f"'{sampler}' mines with the model being trained, and the warm-up has none yet; use "
                             f"{' or '.join(WITHOUT_MODEL)}")
        return sampler


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

