"""The dev check's cost and its agreement with the full-corpus dev nDCG@10 (issue 40; training/devcheck.py): for each
trained model of finished pipeline runs, the check's score over the candidate set its stage would use (BM25's and
the starting model's dev rankings, `--depths` deep, with the positives), at the model's passage length and at
`--lengths`, against the model's full-corpus dev nDCG@10 from the run's report; the seconds of each check and the
passages it encodes.

    python bench/devcheck.py <work folder> [<work folder> ...] --depths 20 50 100 --lengths 0 128

(`0`: the model's own length, as the evaluation encodes.) Prints one row per (run, model, depth, length), then per
(depth, length) the mean and largest absolute difference, the mean seconds and passages.
"""

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from ance_core.artifacts import RUN
from ance_core.data.corpus import read_corpus_rows
from ance_core.data.dataset import read_tables
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.retrieval.config import EncodeConfig
from ance_core.training.devcheck import DevCheck, candidate_pairs


def newest_report(work: Path) -> dict:
    reports = sorted((work / "reports").glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    if not reports:
        raise SystemExit(f"{work}: no pipeline report (reports/*/results.json)")
    return json.loads(reports[-1].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("works", nargs="+", type=Path)
    parser.add_argument("--depths", type=int, nargs="+", default=[20, 50, 100])
    parser.add_argument("--lengths", type=int, nargs="+", default=[0, 128], help="passage tokens; 0: the model's")
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    rows = []
    print(f"{'run':12} {'model':16} {'depth':>5} {'len':>4} {'passages':>8} {'check':>7} {'full':>7} {'diff':>7} "
          f"{'s':>6}")
    for work in args.works:
        report = newest_report(work)
        stage = {(s["for"], s["stage"]): s["path"] for s in report["stages"]}
        full = {r["model"]: r["dev_ndcg_at_10"] for r in report["results"] if "dev_ndcg_at_10" in r}
        data = Path(stage[("data", "prepare")])
        tables = read_tables(data, corpus_columns=[])
        split = report["dev_split"]
        queries, qrels = tables.split_queries(split), tables.split_qrels(split)
        started = report.get("started_from") or {}
        for label, start in started.items():
            checkpoint = stage.get((label, "train"))
            if checkpoint is None or label not in full:
                continue
            model, tokenizer, meta = load_checkpoint(checkpoint, pick_device())
            ranked = [pd.read_parquet(Path(stage[key], RUN)) for key in (("BM25", "bm25-dev"), (start, "retrieve-dev"))]
            for depth in args.depths:
                pairs = candidate_pairs(ranked, qrels, depth)
                passages = read_corpus_rows(data, sorted(set(pairs["doc_id"])))
                for length in args.lengths:
                    check = DevCheck(pairs, queries, qrels, passages, EncodeConfig(), True, length or None)
                    started_at = time.perf_counter()
                    score = check.score(model, tokenizer, meta)
                    seconds = time.perf_counter() - started_at
                    row = {"run": work.parent.name if work.name == "work" else work.name, "model": label,
                           "start": start, "depth": depth, "length": length or meta.passage_max_length,
                           "passages": len(check.passages), "check": score, "full": full[label],
                           "seconds": round(seconds, 1)}
                    rows.append(row)
                    print(f"{row['run'][:12]:12} {label[:16]:16} {depth:5d} {row['length']:4d} {row['passages']:8d} "
                          f"{score:7.4f} {full[label]:7.4f} {score - full[label]:+7.4f} {seconds:6.1f}", flush=True)
    table = pd.DataFrame(rows)
    if table.empty:
        raise SystemExit("no trained model with a dev score in these runs")
    table["abs"] = (table["check"] - table["full"]).abs()
    print("\nper setting: mean |check - full|, largest, mean seconds, mean passages, models")
    for (depth, length), part in table.groupby(["depth", "length"]):
        print(f"depth {depth:3d} len {length:3d}: {part['abs'].mean():.4f} {part['abs'].max():.4f} "
              f"{part['seconds'].mean():6.1f} s {part['passages'].mean():7.0f} {len(part)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
