from pathlib import Path

from ance_core.artifacts import RUN, ArtifactRef, run_stage
from ance_core.data.corpus import corpus_chunks
from ance_core.data.dataset import read_tables
from ance_core.retrieval.bm25 import BM25, INDEX_CHUNK, NONOCCURRENCE
from ance_core.retrieval.config import BM25Config
from ance_core.retrieval.search import write_run
from tasks.common import stage_task
from tasks.retrieve import ranked_queries


def bm25_index(data: ArtifactRef, cfg: BM25Config, work_dir: str) -> Path:
    """The BM25 index of a data stage's corpus: built once (the stage folder bm25-index/<key>, not a task of its own:
    the runs that need it build it) and memory-mapped by every BM25 run after it. At 2M passages an index takes
    minutes to build; a pipeline run searches it for the test split, the dev split and the warm-up's negatives. The
    corpus is read and indexed a chunk of passages at a time."""

    def build(out):
        return BM25.build(corpus_chunks(data.path, INDEX_CHUNK), cfg, spill=out).save(out)

    return Path(run_stage(work_dir, "bm25-index", {"bm25": cfg.scoring()}, {"data": data.digest}, build).path)


@stage_task("bm25-run")
def bm25_run(data: ArtifactRef, cfg: BM25Config, split: str, top_k: int, work_dir: str, sample: dict | None = None
             ) -> ArtifactRef:
    """BM25 top-k for the queries of a split (or a mining round's `sample` of them): the baseline run, or the
    candidates for BM25 negatives. `cfg.top_k` is not read (`top_k` is the depth): callers that mine pass
    `cfg.scoring()`, so that the evaluation's depth is in no key of the training chain."""

    def build(out):
        index = bm25_index(data, cfg, work_dir)
        tables = read_tables(data.path, corpus_columns=[])  # the passages are in the index
        # the run in query-id order
        queries = ranked_queries(tables, split, sample).sort_values("query_id", kind="stable")
        run = BM25.load(index, cfg).search(queries, top_k)
        write_run(run, out / RUN)
        return {"queries": int(run["query_id"].nunique()), "depth": top_k}

    config = {"bm25": cfg.scoring(), "split": split, "top_k": top_k}
    config |= {"sample": sample} if sample is not None else {}
    config |= {"unmatched": 0} if cfg.method in NONOCCURRENCE else {}  # (their documents that match no term score 0
    # since session 35: these methods' runs only are built again)
    return run_stage(work_dir, "bm25", config, {"data": data.digest}, build)
