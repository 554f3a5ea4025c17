"""What an evaluation adds to the MLflow store, at the 2M rehearsal's dev evaluation shape (issue 43).

One evaluation stage's folder as the pipeline writes it (`write_trec`: `qid Q0 docid rank score tag`, scores to six
decimals, ids of the rehearsal's collection, `d<n>` of 2M passages and `q<n>`), --queries x --hits, logged by
`tracking.run.log_evaluation` (the pipeline's own call: the TREC run gzipped) to an embedded MLflow store; the same
folder logged as it is (the code before issue 43) for comparison. Prints the bytes each adds to the store's artifacts
and the seconds each call took, and checks that the gzipped run reads back as the same ranking (`read_trec`).
    python bench/mlflow_store.py [--queries 2000] [--hits 1000] [--passages 2000000]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ance_core.retrieval.search import read_trec, write_trec
from tracking.client import Tracker
from tracking.run import RUN_TREC, log_evaluation


def ranking(queries: int, hits: int, passages: int, seed: int = 0) -> pd.DataFrame:
    """Each query's `hits` distinct documents with descending inner-product-like scores (a dense model's spread)."""
    rng = np.random.default_rng(seed)
    docs = np.stack([rng.choice(passages, hits, replace=False) for _ in range(queries)])
    scores = -np.sort(-rng.normal(0.3, 0.08, (queries, hits)), axis=1)
    return pd.DataFrame({"query_id": np.repeat([f"q{i}" for i in range(queries)], hits),
                         "doc_id": [f"d{d}" for d in docs.reshape(-1)],
                         "rank": np.tile(np.arange(1, hits + 1), queries), "score": scores.reshape(-1)})


def store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--hits", type=int, default=1000)
    parser.add_argument("--passages", type=int, default=2_000_000)
    args = parser.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the store measured here, not one the shell names
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-store-") as folder:
        print(json.dumps(measure(Path(folder), args.queries, args.hits, args.passages)))


def measure(root: Path, queries: int, hits: int, passages: int) -> dict:
    stage = root / "evaluate"
    stage.mkdir()
    run = ranking(queries, hits, passages)
    write_trec(run, stage / RUN_TREC, "dense")
    (stage / "metrics.json").write_text(json.dumps({"ndcg_at_10": 0.5}))
    tracker = Tracker(root / "work", "bench-mlflow-store")
    parent = tracker.start_run("bench")
    report = {"queries": queries, "hits": hits, "trec_bytes": (stage / RUN_TREC).stat().st_size}
    artifacts = root / "work" / "mlartifacts"
    for name, log in (("gzipped", lambda r: log_evaluation(tracker, r, stage, "evaluation")),
                      ("plain", lambda r: tracker.log_artifacts(r, stage, "evaluation"))):
        before = store_bytes(artifacts) if artifacts.exists() else 0
        child = tracker.start_run(name, parent_id=parent)
        started = time.perf_counter()
        log(child)
        report[f"{name}_seconds"] = round(time.perf_counter() - started, 2)
        tracker.end_run(child)
        report[f"{name}_store_bytes"] = store_bytes(artifacts) - before
    tracker.end_run(parent)
    logged = next(artifacts.rglob(f"{RUN_TREC}.gz"))
    back = read_trec(logged).sort_values(["query_id", "rank"], ignore_index=True)
    want = run.sort_values(["query_id", "rank"], ignore_index=True)
    assert back["doc_id"].tolist() == want["doc_id"].tolist(), "the gzipped run reads back as the same ranking"
    report["ratio"] = round(report["plain_store_bytes"] / report["gzipped_store_bytes"], 2)
    return report


if __name__ == "__main__":
    main()
