"""The run's result under each selection rule (`selection`: best, one-se), re-chosen from finished runs' stored dev
evaluations (each model's per-query dev nDCG@10), then its test nDCG@10 read (issue 40). Nothing is trained or
encoded: the runs' own evaluation folders are read, and the choice is made by the pipeline's own functions
(ance_core/pipeline/report.py: `select_model`, `one_se`).

    python bench/selection.py <work folder> [<work folder> ...] [--runs RUN.json ...] [--json out.json]

A work folder holds a recipe search (`ance tune`): its chosen recipe's whole trials are read, as bench/tune_results.py
reads them. `--runs`: files holding what an `ance run --json` printed (its last line), e.g. more seeds of the chosen
recipe, each as FILE or FILE:SEED (the label it is listed by; else the file's name), filed under its work folder's
collection. The rules choose on dev only; test is read after.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tune_results import newest  # noqa: E402  (bench/tune_results.py)

from ance_core.artifacts import ArtifactRef  # noqa: E402
from ance_core.pipeline.report import DEV_KEY, one_se, read_per_query, select_model  # noqa: E402


def rechoose(run: dict) -> dict:
    """One finished run (its `results` rows and `stages`): the model each rule chooses and its test nDCG@10."""
    rows = {r["model"]: r for r in run["results"]}
    dev_paths = {s["for"]: s["path"] for s in run["stages"] if s["stage"] == "evaluate-dev"}
    candidates = [m for m in rows if m != "BM25" and m in dev_paths and DEV_KEY in rows[m]]
    per_query = {m: read_per_query(ArtifactRef(dev_paths[m], "")) for m in candidates}
    if "zero-shot" not in rows or any(v is None for v in per_query.values()):
        raise SystemExit(f"{run.get('report_dir')}: a run from a pretrained model with per-query dev evaluations is "
                         "needed (a retrain has no zero-shot row; evaluations before per_query.parquet have none)")
    best = select_model(run["results"], candidates)
    chosen, gap, se = one_se(best, candidates, per_query)
    return {"best": best, "best_test": rows[best]["ndcg_at_10"], "one_se": chosen,
            "one_se_test": rows[chosen]["ndcg_at_10"], "gap": gap, "se": se,
            "dev_queries": len(per_query[best]), "bm25": rows["BM25"]["ndcg_at_10"],
            "zero_shot": rows["zero-shot"]["ndcg_at_10"]}


def search_runs(work: Path) -> list[dict]:
    search = json.loads(newest(work, "tune", "tune.json").read_text())
    trials = [t for t in search["trials"] if t["candidate"] == search["winner"] and t["full"]]
    return [json.loads(Path(t["path"], "trial.json").read_text()) | {"seed_label": t["seed"]} for t in trials]


def collection_of(work: Path) -> str:
    """A work folder's collection: the folder holding it when it is named `work` (<collection>/work), else its own
    name."""
    return work.parent.name if work.name == "work" else work.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("works", nargs="*", type=Path)
    parser.add_argument("--runs", nargs="*", default=[])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found: dict[str, list[dict]] = {}
    for work in args.works:
        for run in search_runs(work):
            found.setdefault(collection_of(work), []).append(rechoose(run) | {"seed": run["seed_label"]})
    for spec in args.runs:
        path, _, label = spec.partition(":")
        run = json.loads(Path(path).read_text().strip().splitlines()[-1])
        found.setdefault(collection_of(Path(run["report_dir"]).parents[1]), []).append(
            rechoose(run) | {"seed": label or Path(path).stem})
    for collection, runs in found.items():
        first = runs[0]
        print(f"\n## {collection}: BM25 {first['bm25']:.4f}, zero-shot {first['zero_shot']:.4f}, "
              f"{first['dev_queries']} dev queries")
        for r in runs:
            floor = max(r["bm25"], r["zero_shot"]) - 1e-12
            print(f"  seed {r['seed']}: best on dev {r['best']} -> test {r['best_test']:.4f}"
                  f"{'' if r['best_test'] >= floor else ' (below max(BM25, zero-shot))'}; one-se {r['one_se']} "
                  f"(best's lead {r['gap']:+.4f} ± {r['se']:.4f}) -> test {r['one_se_test']:.4f}"
                  f"{'' if r['one_se_test'] >= floor else ' (below max(BM25, zero-shot))'}")
        for key in ("best_test", "one_se_test"):
            values = [r[key] for r in runs]
            held = sum(r[key] >= max(r["bm25"], r["zero_shot"]) - 1e-12 for r in runs)
            print(f"  {key}: {statistics.fmean(values):.4f}"
                  + (f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else "")
                  + f"; >= max(BM25, zero-shot) in {held} of {len(runs)}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
