from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ance_core.artifacts import NEGATIVES, PROFILE, RUN, STATS, ArtifactRef, run_stage, write_json
from ance_core.data.dataset import read_tables
from ance_core.errors import warn
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.negatives.analysis import (
    negative_stats,
    negatives_above_positive,
    query_sample,
    score_profile,
    scored_pairs,
)
from ance_core.negatives.mining import fallback_stats
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.encode import encode_queries
from ance_core.retrieval.index import SearchIndex
from ance_core.retrieval.search import score_pairs
from tasks.common import run_task, stage_task
from tasks.retrieve import dense_run

SAMPLE_QUERIES, SAMPLE_SEED, DEPTH = 200, 0, 100
# The share of negatives scored above their positive is measured on at most this many queries' pairs (a fixed sample):
# all of them before, which re-encoded every training query (4.5 min of 500k queries with the tests' tiny model)
ABOVE_POSITIVE_QUERIES = 10_000
# Share of training negatives the starting model scores above their positive beyond which the run warns
# (docs/commands.md, "A warning sign of false negatives").
ABOVE_POSITIVE_WARNING = 0.25


@stage_task("negative-stats")
def negatives_analysis(negatives: ArtifactRef, run: ArtifactRef, data: ArtifactRef, split: str, work_dir: str,
                       start: dict[str, ArtifactRef] | None = None) -> ArtifactRef:
    """How the negatives a model trained on relate to its own ranking (ance_core/negatives/analysis.py), on a fixed
    query sample; how many of them came from the mining fallback; and, with the model training `start`ed from (its
    checkpoint and index), how many of them that model scored above their positive (a false-negative warning sign)."""

    def build(out):
        tables = read_tables(data.path, corpus_columns=[])  # the queries and qrels: no passage is read
        positives = tables.relevant(split)  # the model's own top negatives exclude every relevant document
        table = pd.read_parquet(Path(negatives.path, NEGATIVES))
        sample = query_sample(table["query_id"], SAMPLE_QUERIES, SAMPLE_SEED)
        # the sample's rows of the model's ranking only (at 500k training queries the run is 10^8 rows: 4 GB read
        # whole into pandas), filtered as each row group is read
        ranking = pq.read_table(Path(run.path, RUN), filters=[("query_id", "in", sample)]).to_pandas()
        stats = negative_stats(table, ranking.astype({"query_id": str, "doc_id": str}), positives, sample, DEPTH)
        stats |= fallback_stats(table)
        if start is not None:
            scored = table[table["query_id"].isin(query_sample(table["query_id"], ABOVE_POSITIVE_QUERIES,
                                                               SAMPLE_SEED))]
            scores = score_pairs(start["checkpoint"].path, start["index"].path, tables.queries, scored_pairs(scored))
            stats |= negatives_above_positive(scored, scores)
            if stats["above_positive"] is not None and stats["above_positive"] > ABOVE_POSITIVE_WARNING:
                warn(f"{100 * stats['above_positive']:.0f}% of the training negatives in {negatives.path} score above "
                     f"their positive under the model training starts from (more than "
                     f"{100 * ABOVE_POSITIVE_WARNING:.0f}%): many are likely unlabelled relevant documents (false "
                     "negatives); consider the false-negative controls (mining.skip_top, mining.margin), or "
                     "data.train_min_relevance on graded qrels")
        write_json(out / STATS, stats)
        return stats

    config = {"split": split, "sample": SAMPLE_QUERIES, "seed": SAMPLE_SEED, "depth": DEPTH}
    if start is not None:
        config["above_positive_queries"] = ABOVE_POSITIVE_QUERIES
    inputs = {"negatives": negatives.digest, "run": run.digest, "data": data.digest}
    if start is not None:
        inputs |= {"start_checkpoint": start["checkpoint"].digest, "start_index": start["index"].digest}
    return run_stage(work_dir, "negative-stats", config, inputs, build)


def analyse_negatives(negatives: ArtifactRef, checkpoint: ArtifactRef, index: ArtifactRef, data: ArtifactRef,
                      split: str, encode: EncodeConfig, index_cfg: IndexConfig, work_dir: str,
                      start: dict[str, ArtifactRef] | None = None, ranking: ArtifactRef | None = None) -> ArtifactRef:
    """`negatives_analysis` of the negatives a model trained on, against its own ranking of the training queries:
    `ranking` when the next round's mining made one with this model (all its queries), else a ranking of the analysis's
    sampled queries only (ranking every training query for 200 of them took as long as a refresh's retrieval: 500k
    queries at MS MARCO's shape); and against the model it started from (`start`, its checkpoint and index)."""
    if ranking is None:
        sample = query_sample(pd.read_parquet(Path(negatives.path, NEGATIVES), columns=["query_id"])["query_id"],
                              SAMPLE_QUERIES, SAMPLE_SEED)
        ranking = run_task(dense_run, checkpoint, index, data, split, DEPTH, encode, index_cfg, work_dir,
                           {"query_ids": sample})
    start = {k: start[k] for k in ("checkpoint", "index")} if start is not None else None
    return run_task(negatives_analysis, negatives, ranking, data, split, work_dir, start)


PROFILE_QUERIES = 10


@stage_task("score-profile")
def score_profile_task(checkpoint: ArtifactRef, index: ArtifactRef, data: ArtifactRef, split: str,
                       work_dir: str) -> ArtifactRef:
    """Top-100 score profile of a checkpoint for a fixed sample of queries (ance_core/negatives/analysis.py)."""

    def build(out):
        queries = read_tables(data.path, corpus_columns=[]).split_queries(split)
        sample = query_sample(queries["query_id"], PROFILE_QUERIES, SAMPLE_SEED)
        texts = queries.set_index("query_id").loc[sample, "text"].tolist()
        model, tokenizer, meta = load_checkpoint(checkpoint.path, pick_device())
        q = encode_queries(model, tokenizer, texts, meta, EncodeConfig())
        flat = SearchIndex(index.path, IndexConfig(device="cpu", backend="faiss"))  # the model's flat index
        np.save(out / PROFILE, score_profile(q, flat.all_vectors(), DEPTH))  # its vectors: the exact embeddings
        return {"queries": len(sample)}

    inputs = {"checkpoint": checkpoint.digest, "index": index.digest, "data": data.digest}
    return run_stage(work_dir, "score-profile", {"split": split, "queries": PROFILE_QUERIES, "depth": DEPTH}, inputs,
                     build)
