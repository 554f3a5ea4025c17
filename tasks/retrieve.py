from ance_core.artifacts import POSITIVE_SCORES, RUN, ArtifactRef, run_stage
from ance_core.data.dataset import Dataset, read_tables
from ance_core.negatives.randomness import round_sample
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.search import QUERY_CHUNK, write_dense_run
from tasks.common import progress_artifact, stage_task


def search_key(cfg: IndexConfig) -> dict:
    """What of the index config changes a run's results: the query-time parameters of an approximate index (not where
    it is searched; nothing for a flat one, whose key stays what it was)."""
    params = {"ivf": {"nprobe": cfg.nprobe}, "hnsw": {"ef_search": cfg.ef_search}, "flat": {}}[cfg.type]
    params |= {"gpu_float16": True} if cfg.gpu_float16 else {}  # scores from float16 vectors (on a GPU)
    return {"search": params} if params else {}


def ranked_queries(tables: Dataset, split: str, sample: dict | None, positives: dict | None = None):
    """The queries of a split a ranking stage ranks: all, a mining round's sample of those with a positive
    (`MiningConfig.sample`: {queries, seed, round}; `positives`: the split's, when the caller holds them), or the ones
    named ({query_ids}: the negatives analysis's)."""
    queries = tables.split_queries(split)
    if sample is None:
        return queries
    if "query_ids" in sample:
        chosen = sample["query_ids"]
    else:
        positives = tables.positives(split) if positives is None else positives
        chosen = round_sample(list(positives), sample["queries"], sample["seed"], sample["round"])
    return queries[queries["query_id"].isin(chosen)].reset_index(drop=True)


@stage_task("dense-run")
def dense_run(checkpoint: ArtifactRef, index: ArtifactRef, data: ArtifactRef, split: str, top_k: int,
              encode_cfg: EncodeConfig, index_cfg: IndexConfig, work_dir: str, sample: dict | None = None
              ) -> ArtifactRef:
    """ANN top-k for the queries of a split (or a mining round's `sample` of them) with a checkpoint and its index,
    and the positives' scores, written as the queries are searched (a row group per chunk of queries)."""

    def build(out):
        tables = read_tables(data.path, corpus_columns=["doc_id"])  # not the passages' text
        positives = tables.positives(split)  # (500k queries' sets: built once)
        queries = ranked_queries(tables, split, sample, positives)
        bar = progress_artifact(len(queries), f"retrieving the top {top_k} of {len(queries):,} '{split}' queries") \
            if len(queries) > QUERY_CHUNK else None  # a run of several chunks (a round's training queries at scale)
        write_dense_run(checkpoint.path, index.path, queries, top_k, positives, out / RUN, out / POSITIVE_SCORES,
                        encode_cfg, index_cfg, progress=bar)
        return {"queries": len(queries), "depth": top_k}

    config = {"split": split, "top_k": top_k, "encode": encode_cfg} | search_key(index_cfg)
    config |= {"sample": sample} if sample is not None else {}
    inputs = {"checkpoint": checkpoint.digest, "index": index.digest, "data": data.digest}
    return run_stage(work_dir, "retrieve", config, inputs, build)
