"""Stage chains run for one checkpoint, shared by the flows.

`refresh_negatives`: the inferencer's work (ANCE Fig. 2, right): encode the corpus, build the index, retrieve the
training queries' top-k and mine negatives from it (synchronous rounds, the asynchronous trainer's background
refreshes, the `refresh-negatives` flow). `evaluate_stages`: encode, index, retrieve and evaluate on a split (every
flow that reports a checkpoint's metrics)."""

from ance_core.artifacts import ArtifactRef
from ance_core.errors import AnceError
from ance_core.modeling.model import read_meta
from ance_core.negatives.config import MiningConfig
from ance_core.retrieval.config import BM25Config, EncodeConfig, EvalConfig, ExecutionConfig, IndexConfig
from ance_core.training.config import TrainConfig
from tasks.bm25 import bm25_run
from tasks.common import run_task
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.retrieve import dense_run


def refresh_negatives(checkpoint: ArtifactRef | None, data: ArtifactRef, split: str, encode: EncodeConfig,
                      index: IndexConfig, mining: MiningConfig, round_: int, work_dir: str,
                      bm25: BM25Config = BM25Config(), scorer: dict[str, ArtifactRef] | None = None,
                      execution: ExecutionConfig = ExecutionConfig(), train: TrainConfig | None = None
                      ) -> dict[str, ArtifactRef]:
    """Negatives for a round (the warm-up is round 0) with the configured sampler; every step is a cached, retried
    task. `train`: the config of the stage that trains on them (a draw of negatives per epoch: tasks/mine.py).

    The sampler's registry entry says which rankings it mines: `dense` (ance, simans): encode -> index -> retrieve
    with the checkpoint; `bm25`: a BM25 run of the split; both `mining.depth` deep, then mine. With `mining.margin`,
    BM25 candidates are scored by `scorer` (a checkpoint and its index). Random and in-batch samplers need no ranking
    (nor a checkpoint)."""
    refs: dict[str, ArtifactRef] = {}
    spec = mining.spec
    if spec.needs_model:
        refs["encode"] = run_task(encode_corpus, checkpoint, data, encode, work_dir, execution)
        refs["index"] = run_task(build_index, refs["encode"], work_dir, index)
        refs["retrieve"] = run_task(dense_run, checkpoint, refs["index"], data, split, mining.depth, encode, index,
                                    work_dir, mining.sample(round_))
    if spec.uses_bm25:
        refs["bm25"] = run_task(bm25_run, data, bm25.scoring(), split, mining.depth, work_dir,
                               mining.sample(round_))
        if mining.margin is not None and scorer is None:
            raise AnceError(f"mining.margin with sampler '{mining.sampler}' needs a model to score the BM25 candidates "
                            "(the warm-up uses the starting model)")
    maxp = scorer is not None and read_meta(scorer["checkpoint"].path).document_mode == "maxp"
    # the scorer ranks nothing here: it scores what BM25 found (margin), and finds MaxP documents' best windows
    scorer = scorer if not spec.needs_model and (maxp or mining.margin is not None) else None
    rankings = {name: refs[stage] for name, stage in (("dense", "retrieve"), ("bm25", "bm25")) if stage in refs}
    refs["mine"] = run_task(mine_negatives, rankings, data, split, mining, round_, work_dir,
                            {k: scorer[k] for k in ("checkpoint", "index")} if scorer else None, train)
    return refs


def evaluate_stages(checkpoint: ArtifactRef, data: ArtifactRef, split: str, evaluation: EvalConfig,
                    encode: EncodeConfig, index: IndexConfig, work_dir: str, built: ArtifactRef | None = None,
                    dev_split: str | None = None, execution: ExecutionConfig = ExecutionConfig()
                    ) -> dict[str, ArtifactRef]:
    """encode -> index -> retrieve -> evaluate; `built` reuses an index already made from this checkpoint. With
    `dev_split`, the same index also answers the dev queries (`retrieve-dev`, `evaluate-dev`)."""
    refs = {}
    if built is None:
        refs["encode"] = run_task(encode_corpus, checkpoint, data, encode, work_dir, execution)
        built = refs["index"] = run_task(build_index, refs["encode"], work_dir, index.exact())
    top_k, index = evaluation.top_k, index.exact()  # `built` is the exact flat index: searched as one
    refs["retrieve"] = run_task(dense_run, checkpoint, built, data, split, top_k, encode, index, work_dir)
    refs["evaluate"] = run_task(evaluate, refs["retrieve"], data, split, work_dir, evaluation)
    if dev_split is not None and dev_split != split:
        refs["retrieve-dev"] = run_task(dense_run, checkpoint, built, data, dev_split, top_k, encode, index, work_dir)
        refs["evaluate-dev"] = run_task(evaluate, refs["retrieve-dev"], data, dev_split, work_dir, evaluation)
    return refs
