"""Stage chains run for one checkpoint, shared by the flows.

`refresh_negatives`: the inferencer's work (ANCE Fig. 2, right): encode the corpus, build the index, retrieve the
training queries' top-k and mine negatives from it (synchronous rounds, the asynchronous trainer's background
refreshes, the `refresh-negatives` flow). `evaluate_stages`: encode, index, retrieve and evaluate on a split (every
flow that reports a checkpoint's metrics)."""

from ance_core.artifacts import ArtifactRef
from ance_core.config import EncodeConfig, IndexConfig, MiningConfig
from ance_core.errors import AnceError
from ance_core.samplers import DENSE, SPARSE
from tasks.common import run_task
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.retrieve import dense_run


def refresh_negatives(checkpoint: ArtifactRef, data: ArtifactRef, split: str, encode: EncodeConfig,
                      index: IndexConfig, mining: MiningConfig, round_: int, work_dir: str,
                      bm25: ArtifactRef | None = None) -> dict[str, ArtifactRef]:
    """Negatives for a round with the configured sampler; every step is a cached, retried task.

    Dense samplers (ance, simans): encode -> index -> retrieve -> mine with the checkpoint. BM25 samplers mine from
    `bm25` (a BM25 run of the split, at least `mining.depth` deep); random and in-batch samplers need no ranking."""
    refs: dict[str, ArtifactRef] = {}
    ranking = None
    if mining.sampler in DENSE:
        refs["encode"] = run_task(encode_corpus, checkpoint, data, encode, work_dir)
        refs["index"] = run_task(build_index, refs["encode"], work_dir)
        ranking = refs["retrieve"] = run_task(dense_run, checkpoint, refs["index"], data, split, mining.depth, encode,
                                              index, work_dir)
    elif mining.sampler in SPARSE:
        if bm25 is None:
            raise AnceError(f"sampler '{mining.sampler}' mines from a BM25 run, and none was given")
        ranking = bm25
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
