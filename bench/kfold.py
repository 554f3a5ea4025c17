"""Cross-validated selection for collections too small for one dev split (issue 40): a recipe run once per dev fold
(`data.dev_fold` 0 .. floor(1 / dev_fraction) - 1: disjoint dev splits carved from the training queries), and the
run's result chosen on all the folds' dev queries pooled instead of fold 0's alone.

    python bench/kfold.py --datasets ../collections/med --recipe demo --dev-fraction 0.3 --seeds 42 43 44 \
        --work runs --log kfold.jsonl --record-test

Each model of a run is pooled with the models of the same name in the other folds' runs (each is the same procedure:
"the warm-up", "round 1 from the best model so far on this fold's dev"), each dev query counted once; a run's hybrid
row fuses that run's best dense model with BM25, so the hybrid rows of all folds are pooled as one kind, `hybrid`
(`selection: cv` does this inside one run, where the hybrid row fuses the dense model best on the pooled scores;
here fold 0's hybrid row is its own run's, fused with the dense model best on fold 0's dev split).
The kind with the best pooled dev nDCG@10 (ties as the pipeline breaks them, `select_model`) is the result, and the
best dense kind the dense result; both are delivered from fold 0's run (the pipeline's default dev split), beside
what fold 0's dev split alone chose. Runs reuse the stages they share (`--work` keeps one work folder per
collection, as bench/recipes.py does), so fold 0's runs are free after bench/recipes.py ran them.
Test metrics are recorded in `--log` with `--record-test` and never printed (choose first, read them after).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recipes import recipe_arguments, run_one  # noqa: E402  (bench/recipes.py)

from ance_core.data.splits import fold_count  # noqa: E402
from ance_core.pipeline.report import (  # noqa: E402
    dev_evaluations,
    fold_kind,
    is_hybrid,
    pooled_best,
    pooled_dev,
    read_per_query,
    select_model,
)


def pooled_choice(runs: list[dict]) -> dict:
    """The folds' runs of one recipe and seed (fold 0 first): each kind's pooled dev nDCG@10 (the pipeline's
    `pooled_dev`, as `selection: cv` pools), the kind chosen as the result and as the dense result, and the fold-0
    models they deliver."""
    first = dev_evaluations(runs[0]["stages"])
    pooled = pooled_dev(first, [{fold_kind(label): ref for label, ref in dev_evaluations(run["stages"]).items()}
                                for run in runs[1:]])
    if not pooled:
        raise SystemExit("the folds' runs share no model with a dev evaluation (a fold without a dev split?)")
    order = [r["model"] for r in runs[0]["results"]]
    result = pooled_best(pooled, order)
    dense = pooled_best({label: v for label, v in pooled.items() if not is_hybrid(label)}, order)
    fold0 = [r["model"] for r in runs[0]["results"] if r["model"] in first and not is_hybrid(r["model"])]
    return {"pooled": {fold_kind(label): round(float(v.mean()), 4) for label, v in pooled.items()},
            "queries": len(pooled[result]), "fold0_queries": len(read_per_query(first[result])),
            "result": result, "dense": dense, "fold0_selected": runs[0]["selected"],
            "fold0_dense": select_model(runs[0]["results"], fold0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    recipe_arguments(parser)
    parser.add_argument("--dev-fraction", type=float, required=True, help="data.dev_fraction: the folds' size")
    parser.add_argument("--label", default="kfold", help="this configuration's name in the log")
    parser.add_argument("--work", type=Path, required=True, help="work folders' root")
    parser.add_argument("--log", type=Path, help="append a JSON line per collection and seed here")
    parser.add_argument("--record-test", action="store_true", help="record the test split's nDCG@10 of the chosen "
                        "models in --log without printing them")
    args = parser.parse_args()
    folds = fold_count(args.dev_fraction)
    if folds < 2:
        raise SystemExit(f"--dev-fraction {args.dev_fraction}: fewer than two folds")
    for dataset in args.datasets:
        for seed in args.seeds:
            seeds = [f"{section}.seed={seed}" for section in ("warmup", "ance", "mining", "bm25_negatives")]
            work = args.work / dataset.resolve().name / "work"
            work.parent.mkdir(parents=True, exist_ok=True)
            runs = []
            for fold in range(folds):
                fold_set = [f"data.dev_fold={fold}"] if fold else []  # fold 0: the default config, its keys
                runs.append(run_one(dataset.resolve(), [*args.sets, *seeds, *fold_set],
                                    argparse.Namespace(recipe=args.recipe, dev_fraction=args.dev_fraction,
                                                       label=f"{args.label}-fold{fold}"), work))
            chosen = pooled_choice(runs)
            scores = ", ".join(f"{k} {v:.4f}" for k, v in chosen["pooled"].items())
            print(f"{dataset.name} seed {seed}: pooled dev nDCG@10 over {chosen['queries']} queries of {folds} folds "
                  f"({scores}); result {chosen['result']}, dense {chosen['dense']} (fold 0's "
                  f"{chosen['fold0_queries']} dev queries alone: {chosen['fold0_selected']}, dense "
                  f"{chosen['fold0_dense']})", flush=True)
            if args.log:
                record = {"label": args.label, "recipe": args.recipe, "sets": args.sets, "collection": dataset.name,
                          "seed": seed, "folds": folds} | chosen
                if args.record_test:
                    record["test"] = {r["model"]: r.get("ndcg_at_10") for r in runs[0]["results"]}
                with open(args.log, "a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
