"""Mining at MS MARCO's query count (issue 28): `tasks.mine.mine_queries`, the whole of it (reading each part's rows of
the run and of the positives' scores, sampling, the table), over a synthetic dense run of N queries x depth, in the
parts of MINE_CHUNK queries `mine_negatives` mines them in. One positive per query, ranked or not; a corpus of
`--corpus` ids (the fallback's). The run is written as retrieval writes it (`RunWriter`: query-id order, small row
groups); `--old-layout` writes it as before issue 28 (queries in random order, a row group per 50,000 queries) to show
what reading an earlier run costs. Prints wall and CPU ms per query for each sampler (CPU: this process's, Arrow's
reading threads included), and the share of the wall time that reading the parts' rows alone takes.
    python bench/mining.py [--queries 500000] [--depth 200] [--corpus 1000000] [--samplers ance simans]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ance_core.artifacts import POSITIVE_SCORES, RUN, ArtifactRef
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.mining import sorted_ids
from ance_core.retrieval.search import QUERY_CHUNK, RunWriter
from tasks.mine import MINE_CHUNK, mine_queries, ranking_rows


class OldLayout(RunWriter):
    """A run as written before issue 28: one row group per chunk of queries, in the order they came."""

    def write(self, part: pa.Table) -> None:
        self.writer = self.writer or pq.ParquetWriter(self.path, part.schema)
        self.writer.write_table(part, row_group_size=len(part))


def synthetic_run(folder: Path, query_ids: list[str], depth: int, doc_ids: pa.Array, old_layout: bool,
                  seed: int = 0) -> dict[str, set[str]]:
    """A dense-retrieval folder (run.parquet, positive_scores.parquet) of `depth` random documents per query, scores
    decreasing with rank; returns the positives (one per query, ranked about half the time)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(query_ids)) if old_layout else np.arange(len(query_ids))
    writer = OldLayout if old_layout else RunWriter
    positives = {}
    with writer(folder / RUN) as runs, writer(folder / POSITIVE_SCORES) as scores:
        for start in range(0, len(order), QUERY_CHUNK):
            part = [query_ids[i] for i in order[start:start + QUERY_CHUNK]]
            docs = rng.integers(0, len(doc_ids), (len(part), depth))
            score = 100 - np.sort(rng.random((len(part), depth), dtype=np.float32), axis=1) * 10  # (n, depth)
            ranked = rng.random(len(part)) < 0.5  # the positive: one of the run's, or a document it did not rank
            positive = np.where(ranked, docs[np.arange(len(part)), rng.integers(0, depth, len(part))],
                                rng.integers(0, len(doc_ids), len(part)))
            positive_ids = pc.take(doc_ids, pa.array(positive)).to_pylist()
            positives.update({q: {d} for q, d in zip(part, positive_ids, strict=True)})
            runs.write(pa.table({"query_id": pa.array(np.repeat(np.asarray(part, dtype=object), depth), pa.string()),
                                 "doc_id": pc.take(doc_ids, pa.array(docs.reshape(-1))),
                                 "rank": pa.array(np.tile(np.arange(1, depth + 1), len(part))),
                                 "score": pa.array(score.reshape(-1)),
                                 "window": pa.array(np.zeros(len(part) * depth, dtype=np.int64))}))
            scores.write(pa.table({"query_id": pa.array(part, pa.string()), "doc_id": pa.array(positive_ids),
                                   "score": pa.array(rng.normal(95, 2, len(part)).astype(np.float32)),
                                   "window": pa.array(np.zeros(len(part), dtype=np.int64))}))
    return positives


def mine_all(sampler: str, depth: int, positives: dict[str, set[str]], ref: ArtifactRef, corpus_ids) -> tuple:
    """(seconds of mine_queries over all the parts, its CPU seconds (this process, all threads), seconds reading their
    rows alone, pairs, fallback negatives)."""
    cfg = MiningConfig(sampler=sampler, top_k=depth)
    query_ids = sorted(positives)
    parts = [query_ids[i:i + MINE_CHUNK] for i in range(0, len(query_ids), MINE_CHUNK)]
    mine_queries(cfg, {q: positives[q] for q in parts[0]}, 1, {"dense": ref}, None, positives, corpus_ids, None,
                 parts[0])  # once before timing (the reading too): Arrow's and numpy's first calls set things up (~1 s)
    started = time.perf_counter()
    for part in parts:
        ranking_rows(Path(ref.path, RUN), part)
        ranking_rows(Path(ref.path, POSITIVE_SCORES), part)
    reading = time.perf_counter() - started
    started, cpu, pairs, fallback = time.perf_counter(), time.process_time(), 0, 0
    for part in parts:
        table = mine_queries(cfg, {q: positives[q] for q in part}, 1, {"dense": ref}, None, positives, corpus_ids,
                             None, part)
        pairs, fallback = pairs + len(table), fallback + int(table["fallback"].sum())
    return time.perf_counter() - started, time.process_time() - cpu, reading, pairs, fallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=500_000)
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--corpus", type=int, default=1_000_000, help="document ids (MS MARCO: 8,841,823)")
    parser.add_argument("--samplers", nargs="+", default=["ance", "simans"])
    parser.add_argument("--old-layout", action="store_true", help="the run as written before issue 28")
    args = parser.parse_args()
    doc_ids = pa.array([f"d{j}" for j in range(args.corpus)])
    query_ids = sorted(f"q{i}" for i in range(args.queries))  # the order retrieval writes them in
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        positives = synthetic_run(Path(tmp), query_ids, args.depth, doc_ids, args.old_layout)
        corpus_ids = sorted_ids(doc_ids.to_pylist())
        print(f"synthetic run of {args.queries:,} queries x {args.depth} ({'old' if args.old_layout else 'new'} "
              f"layout) and {args.corpus:,} corpus ids in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        ref = ArtifactRef(tmp, "synthetic")
        rows = [(s, *mine_all(s, args.depth, positives, ref, corpus_ids)) for s in args.samplers]
    print(f"\n{args.queries:,} queries x depth {args.depth}, 1 positive per query, parts of {MINE_CHUNK:,} queries, "
          f"{args.corpus:,} corpus ids, {'old' if args.old_layout else 'new'} run layout")
    print(f"{'sampler':8} {'seconds':>8} {'ms/query':>9} {'CPU ms/query':>13} {'reading':>8} {'pairs':>9} "
          f"{'fallback':>9}")
    for sampler, seconds, cpu, reading, pairs, fallback in rows:
        print(f"{sampler:8} {seconds:8.1f} {1000 * seconds / args.queries:9.4f} {1000 * cpu / args.queries:13.4f} "
              f"{reading / seconds:7.0%} {pairs:9d} {fallback:9d}")


if __name__ == "__main__":
    main()
