"""The inferencer's work for one checkpoint (ANCE Fig. 2, right): encode the corpus, build the index, retrieve the
training queries' top-k and mine negatives from it. Shared by the synchronous rounds, the asynchronous trainer's
background refreshes and the `refresh-negatives` flow."""

from ance_core.artifacts import ArtifactRef
from ance_core.config import EncodeConfig, IndexConfig, MiningConfig
from tasks.common import run_task
from tasks.encode import encode_corpus
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.retrieve import dense_run


def refresh_negatives(checkpoint: ArtifactRef, data: ArtifactRef, split: str, encode: EncodeConfig,
                      index: IndexConfig, mining: MiningConfig, round_: int, work_dir: str) -> dict[str, ArtifactRef]:
    """encode -> index -> retrieve -> mine with one checkpoint; every step is a cached, retried task."""
    emb = run_task(encode_corpus, checkpoint, data, encode, work_dir)
    built = run_task(build_index, emb, work_dir)
    run = run_task(dense_run, checkpoint, built, data, split, mining.top_k, encode, index, work_dir)
    negatives = run_task(mine_negatives, run, data, split, mining, round_, work_dir)
    return {"encode": emb, "index": built, "retrieve": run, "mine": negatives}
