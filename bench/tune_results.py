"""The test split of a finished recipe search (`ance tune`), read once the choice is made (issue 40): per collection,
BM25 and the zero-shot model, then the baseline recipe's and the chosen recipe's runs under each seed the search ran
whole — the dense model each run delivers (its best on dev), its hybrid row and the run's result (chosen on dev among
both) — with the issue's targets checked: the result >= max(BM25, zero-shot) on test, the dense result > zero-shot.

    python bench/tune_results.py <work folder> [<work folder> ...] [--json out.json]

Each work folder holds one search (its newest tune/<key>/tune.json). Nothing here chooses anything: the search chose
on the dev split before these numbers were read.
"""

import argparse
import json
import statistics
from pathlib import Path

HYBRID = " + BM25"


def newest(work: Path, stage: str, name: str) -> Path:
    found = sorted((work / stage).glob(f"*/{name}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"{work}: no {stage}/*/{name}")
    return found[-1]


def run_rows(trial: dict) -> dict:
    """A whole-recipe trial's dense result (its best dense model on dev), hybrid row and selected result, on test."""
    rows = {r["model"]: r for r in trial["results"]}
    dense = rows[trial["model"]]
    hybrid = next((r for m, r in rows.items() if m.endswith(HYBRID)), None)
    selected = rows[trial["selected"]]
    return {"dense_model": trial["model"], "dense": dense["ndcg_at_10"], "dense_dev": dense["dev_ndcg_at_10"],
            "hybrid": hybrid["ndcg_at_10"] if hybrid else None, "selected_model": trial["selected"],
            "selected": selected["ndcg_at_10"], "bm25": rows["BM25"]["ndcg_at_10"],
            "zero_shot": rows["zero-shot"]["ndcg_at_10"]}


def summarize(work: Path) -> dict:
    search = json.loads(newest(work, "tune", "tune.json").read_text())
    baseline = search["candidates"][0]["name"]
    out = {"collection": work.parent.name if work.name == "work" else work.name, "winner": search["winner"],
           "reason": search["evidence"]["reason"], "stopped": search.get("stopped"), "recipes": {}}
    for name in dict.fromkeys([baseline, search["winner"]]):
        trials = sorted((t for t in search["trials"] if t["candidate"] == name and t["full"]), key=lambda t: t["seed"])
        out["recipes"][name] = {t["seed"]: run_rows(json.loads(Path(t["path"], "trial.json").read_text()))
                                for t in trials}
    return out


def mean_sd(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.fmean(values):.4f}" + (f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("works", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summaries = [summarize(w) for w in args.works]
    for s in summaries:
        print(f"\n## {s['collection']}: chosen {s['winner']} ({s['reason']})" + (f"; {s['stopped']}" if s["stopped"]
                                                                                 else ""))
        for name, seeds in s["recipes"].items():
            if not seeds:
                continue
            first = next(iter(seeds.values()))
            print(f"  {name}: BM25 {first['bm25']:.4f}, zero-shot {first['zero_shot']:.4f}")
            for seed, r in seeds.items():
                ok = r["selected"] >= max(r["bm25"], r["zero_shot"]) - 1e-12
                print(f"    seed {seed}: dense {r['dense']:.4f} ({r['dense_model']}), hybrid "
                      f"{r['hybrid'] if r['hybrid'] is None else round(r['hybrid'], 4)}, result {r['selected']:.4f} "
                      f"({r['selected_model']}) {'>= max(BM25, zero-shot)' if ok else 'BELOW max(BM25, zero-shot)'}; "
                      f"dense {'>' if r['dense'] > r['zero_shot'] else '<='} zero-shot")
            for key in ("dense", "hybrid", "selected"):
                print(f"    {key}: {mean_sd([r[key] for r in seeds.values() if r[key] is not None])}")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
