"""Stage chains run for one checkpoint, shared by the flows.

`refresh_negatives`: the inferencer's work (ANCE Fig. 2, right): encode the corpus, build the index, retrieve the
training queries' top-k and mine negatives from it (synchronous rounds, the asynchronous trainer's background
refreshes, the `refresh-negatives` flow). `evaluate_stages`: encode, index, retrieve and evaluate on a split (every
flow that reports a checkpoint's metrics)."""

from ance_core.artifacts import ArtifactRef
from ance_core.config import DENSE, SPARSE, BM25Config, EncodeConfig, IndexConfig, MiningConfig
from ance_core.errors import AnceError
from tasks.bm25 import bm25_run
from tasks.common import run_task
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.retrieve import dense_run


def refresh_negatives(checkpoint: ArtifactRef | None, data: ArtifactRef, split: str, encode: EncodeConfig,
                      index: IndexConfig, mining: MiningConfig, round_: int, work_dir: str,
                      bm25: BM25Config = BM25Config()) -> dict[str, ArtifactRef]:
    """Negatives for a round (the warm-up is round 0) with the configured sampler; every step is a cached, retried
    task.

    Dense samplers (ance, simans): encode -> index -> retrieve -> mine with the checkpoint. BM25 samplers: a BM25 run
    of the split, `mining.depth` deep -> mine. Random and in-batch samplers need no ranking (nor a checkpoint)."""
    refs: dict[str, ArtifactRef] = {}
    ranking = None
    if mining.sampler in DENSE:
        if checkpoint is None:
            raise AnceError(f"sampler '{mining.sampler}' ranks with a trained model, and there is none yet")
        refs["encode"] = run_task(encode_corpus, checkpoint, data, encode, work_dir)
        refs["index"] = run_task(build_index, refs["encode"], work_dir)
        ranking = refs["retrieve"] = run_task(dense_run, checkpoint, refs["index"], data, split, mining.depth, encode,
                                              index, work_dir)
    elif mining.sampler in SPARSE:
        ranking = refs["bm25"] = run_task(bm25_run, data, bm25, split, mining.depth, work_dir)
    refs["mine"] = run_task(mine_negatives, ranking, data, split, mining, round_, work_dir)
    return refs


def evaluate_stages(checkpoint: ArtifactRef, data: ArtifactRef, split: str, top_k: int, encode: EncodeConfig,
                    index: IndexConfig, work_dir: str, built: ArtifactRef | None = None) -> dict[str, ArtifactRef]:
    """encode -> index -> retrieve -> evaluate; `built` reuses an index already made from this checkpoint."""
    refs = {}
    if built is None:
        refs["encode"] = run_task(encode_corpus, checkpoint, data, encode, work_dir)
        built = refs["index"] = run_task(build_index, refs["encode"], work_dir)
    refs["retrieve"] = run_task(dense_run, checkpoint, built, data, split, top_k, encode, index, work_dir)
    refs["evaluate"] = run_task(evaluate, refs["retrieve"], data, split, work_dir)
    return refs
