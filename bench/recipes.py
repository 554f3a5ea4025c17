"""Recipe search across collections (issue 30): a recipe, with `--set` overrides, run through the pipeline (`ance
run`) on each collection given, for each seed; printed per run: the dev split's nDCG@10 of every model (BM25,
zero-shot, the warm-up, each round), the model the run selected on dev, and the wall time. Test metrics are printed
only with `--test`, once a recipe is chosen (never choose on them). Every run appends a JSON line to `--log`.

    python bench/recipes.py --datasets ../collections/cisi ../collections/npl --recipe demo \
        --set ance.epochs=3 --label e3 --seeds 42 43 44 --log recipes.jsonl

A collection is any dataset folder the pipeline reads (BEIR layout with qrels/train.tsv and a test split); its dev
split is `--dev-fraction` of its training queries (data.dev_fraction; unset, the recipe's), carved by the pipeline.
Each collection keeps one work folder under `--work` across configurations, so stages a configuration shares with an
earlier one (data, BM25, zero-shot, a warm-up) are reused and their seconds are not counted again.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(dataset: Path, sets: list[str], args, work: Path) -> dict:
    """`ance run --json` on the recipe with `sets`; the run's JSON result."""
    from ance_core.pipeline.recipes import recipe_config

    fraction = [] if args.dev_fraction is None else [f"data.dev_fraction={args.dev_fraction}"]
    config = recipe_config(args.recipe, [*sets, f"data.dataset={dataset}", *fraction, f"work_dir={work}"])
    path = work.parent / f"{work.name}-{args.label}.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    env = os.environ | {"PREFECT_HOME": str(work.parent / "prefect"), "TQDM_DISABLE": "1"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(path), "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{dataset.name}: ance run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The options naming what runs: collections, the recipe, its --set overrides, the seeds (bench/kfold.py too)."""
    parser.add_argument("--datasets", nargs="+", required=True, type=Path)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="key=value, as `ance run --set`")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    recipe_arguments(parser)
    parser.add_argument("--dev-fraction", type=float, help="data.dev_fraction of every collection (default: the "
                        "recipe's, 0.2; RESULTS.md's CISI and NPL runs: 0.3)")
    parser.add_argument("--label", default="run", help="this configuration's name in the log")
    parser.add_argument("--work", type=Path, help="work folders' root (default: a temporary folder)")
    parser.add_argument("--log", type=Path, help="append a JSON line per run here")
    parser.add_argument("--test", action="store_true", help="also print the test split's nDCG@10")
    parser.add_argument("--record-test", action="store_true", help="record the test split's metrics in --log without "
                        "printing them (for the tables computed once a recipe is chosen; never read while choosing)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    root = args.work or Path(tempfile.mkdtemp(prefix="ance-recipes-"))
    print(f"{'collection':12} {'seed':>4} {'model':24} {'dev nDCG@10':>11}" + (f" {'test':>7}" if args.test else ""))
    for dataset in args.datasets:
        for seed in args.seeds:
            seeds = [f"{section}.seed={seed}" for section in ("warmup", "ance", "mining", "bm25_negatives")]
            work = root / dataset.resolve().name / "work"
            work.parent.mkdir(parents=True, exist_ok=True)
            started = time.time()
            result = run_one(dataset.resolve(), [*args.sets, *seeds], args, work)
            wall = time.time() - started
            rows = [{"model": r["model"], "dev": r.get("dev_ndcg_at_10"), "test": r.get("ndcg_at_10")}
                    for r in result["results"]]
            for r in rows:
                test = f" {r['test']:7.4f}" if args.test and r["test"] is not None else ""
                dev = f"{r['dev']:11.4f}" if r["dev"] is not None else f"{'-':>11}"
                print(f"{dataset.name:12} {seed:4d} {r['model']:24} {dev}{test}")
            print(f"{dataset.name:12} {seed:4d} selected: {result.get('selected')}, {wall:.0f} s", flush=True)
            if args.log:
                record = {"label": args.label, "recipe": args.recipe, "sets": args.sets, "collection": dataset.name,
                          "seed": seed, "seconds": round(wall, 1), "selected": result.get("selected"),
                          "started_from": result.get("started_from"), "dev": {r["model"]: r["dev"] for r in rows},
                          "stages": [{k: s[k] for k in ("for", "stage", "seconds", "cached")}
                                     for s in result.get("stages", [])]}
                if args.test or args.record_test:
                    record["test"] = {r["model"]: r["test"] for r in rows}
                with open(args.log, "a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
