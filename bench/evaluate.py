"""An evaluation's metrics (retrieval/evaluate.py `per_query_metrics`): the run and qrels handed to trec_eval as nested
dicts built from plain lists, against ir_measures given the DataFrames (the code before), on one synthetic run of
the shape every evaluation has (--queries x --depth hits, string ids as the pipeline's parquet runs hold them), in one
run; the values compared, the ratio printed.

    python bench/evaluate.py [--queries 300] [--depth 1000]
"""

import argparse
import time

import ir_measures
import numpy as np
import pandas as pd

from ance_core.retrieval.evaluate import _NAMES, MEASURES, per_query_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--depth", type=int, default=1000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    docs = np.arange(args.depth * 5)
    run = pd.DataFrame([(f"q{q}", f"d{d}", s) for q in range(args.queries)
                        for d, s in zip(rng.choice(docs, args.depth, replace=False),
                                        np.sort(rng.random(args.depth))[::-1], strict=True)],
                       columns=["query_id", "doc_id", "score"]).astype({"query_id": "string", "doc_id": "string",
                                                                        "score": "float32"})
    qrels = pd.DataFrame([(f"q{q}", f"d{d}", 1) for q in range(args.queries) for d in rng.choice(docs, 3)],
                         columns=["query_id", "doc_id", "relevance"]).drop_duplicates(["query_id", "doc_id"])
    started = time.perf_counter()
    before = {(m.query_id, _NAMES[str(m.measure)]): m.value for m in ir_measures.iter_calc(
        list(MEASURES.values()), qrels, run.astype({"score": float}))}
    old = time.perf_counter() - started
    started = time.perf_counter()
    now = per_query_metrics(run, qrels).set_index("query_id")
    new = time.perf_counter() - started
    assert all(abs(now.loc[q, name] - value) < 1e-12 for (q, name), value in before.items()), "values differ"
    print(f"{args.queries} queries x {args.depth} hits: ir_measures on the DataFrames {old:.2f} s, "
          f"per_query_metrics {new:.2f} s (the same values): {old / new:.1f}x faster")


if __name__ == "__main__":
    main()
