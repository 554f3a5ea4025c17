"""The results table a pipeline run ends with: one row per model, its metrics on the evaluation split and the dev
split, the model chosen as the run's result, and the wall time per stage.

Model selection (`build_report`: `select_model`, then `one_se`), among the run's checkpoints, the one it started
from and the hybrid row, on the dev split, never the evaluation split (that is for reporting), by the config's
`selection`:
- `best` (the default): the best dev nDCG@10.
- `one-se`: the one-standard-error rule (Hastie, Tibshirani & Friedman, The Elements of Statistical Learning, 7.10):
  the simplest model whose dev nDCG@10 is within one standard error of the best's, the error that of their
  per-query difference; simplest = earliest in training order (the starting model first), a dense model before
  its hybrid row. Meant for dev splits of a dozen queries, where a trained model's lead of a few hundredths is
  noise; measured on seven collections it was no better on test than `best` (RESULTS.md), so it is an option, not
  the default.
- `cv`: cross-validation, for collections too small for one dev split. The run trains once more per other dev fold
  (`data.dev_fold`: disjoint dev splits of the training queries, flows/ance_pipeline.py) and each model's dev
  nDCG@10 is pooled with the same model's in the other folds' runs (`pooled_dev`), each dev query scored by a run
  that did not train on it; the best pooled score chooses (`select_model`), among this run's models.
A training stage that made the dev score worse than its start is a warning (`dev_regressions`).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from ance_core.artifacts import MANIFEST, METRICS, PER_QUERY, RESULTS_JSON, RESULTS_MD, ArtifactRef, write_json
from ance_core.errors import AnceError

COLUMNS = {"ndcg_at_10": "nDCG@10", "mrr_at_10": "MRR@10", "recall_at_100": "R@100", "recall_at_1000": "R@1000"}
DEV_KEY = "dev_ndcg_at_10"
CV_KEY = "cv_ndcg_at_10"  # a model's dev nDCG@10 pooled over the dev folds (selection cv)
HYBRID = " + BM25"  # the label of a hybrid row: "<its dense model> + BM25"
Selection = Literal["one-se", "best", "cv"]
HYBRID_KIND = "hybrid"  # a hybrid row pooled over folds: each fold's run fuses its own best dense model with BM25


def is_hybrid(label: str) -> bool:
    return label.endswith(HYBRID)


def dense_of(label: str) -> str:
    """The dense model of a row: itself, or a hybrid row's."""
    return label.removesuffix(HYBRID)


def last_dense(results: list[dict]) -> str:
    """The last dense model of a run's rows (neither BM25 nor a hybrid row): the run's result without a dev split."""
    return [r["model"] for r in results if r["model"] != "BM25" and not is_hybrid(r["model"])][-1]


@dataclass(frozen=True)
class StageTiming:
    label: str  # which model or round the stage ran for
    stage: str
    ref: ArtifactRef


def read_metrics(evaluation: ArtifactRef) -> dict[str, float]:
    return json.loads((Path(evaluation.path) / METRICS).read_text())


def relevant_grade(evaluation: ArtifactRef) -> int:
    """The lowest qrels grade an evaluation's MRR@10 and R@k counted as relevant (its stage config's, 1 unsaid)."""
    manifest = Path(evaluation.path) / MANIFEST
    config = json.loads(manifest.read_text()).get("config") or {} if manifest.is_file() else {}
    return config.get("relevant_grade", 1)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def select_model(results: list[dict], candidates: list[str]) -> str | None:
    """The candidate with the best dev nDCG@10 (on a tie a dense model before a hybrid row, whose fusion was itself
    chosen on these queries, then the later one: it trained more); None without dev scores."""
    scored = [(r[DEV_KEY], not is_hybrid(r["model"]), k, r["model"]) for k, r in enumerate(results)
              if r["model"] in candidates and DEV_KEY in r]
    return max(scored)[3] if scored else None


def one_se(best: str, candidates: list[str], per_query: dict[str, pd.Series]) -> tuple[str, float, float]:
    """The simplest of `candidates` (given in training order: the earliest trained first, a dense model before its
    hybrid row) whose per-query dev nDCG@10 trails `best`'s by at most one standard error of the mean difference,
    with that mean difference and error."""
    dense = [c for c in candidates if not is_hybrid(c)]

    def simplicity(label: str) -> tuple[int, bool]:
        base = dense_of(label)
        return (dense.index(base) if base in dense else len(dense), is_hybrid(label))

    for label in sorted(candidates, key=simplicity):
        diff = per_query[best] - per_query[label].reindex(per_query[best].index, fill_value=0.0)
        gap, se = float(diff.mean()), float(diff.std(ddof=1)) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
        if gap <= se + 1e-12:
            return label, gap, se
    return best, 0.0, 0.0  # (unreachable: best trails itself by 0)


def read_per_query(evaluation: ArtifactRef) -> pd.Series | None:
    """An evaluation's per-query nDCG@10 by query id (None for a folder without them)."""
    path = Path(evaluation.path) / PER_QUERY
    if not path.is_file():
        return None
    return pd.read_parquet(path, columns=["query_id", "ndcg_at_10"]).set_index("query_id")["ndcg_at_10"]


def fold_kind(label: str) -> str:
    """What a model of a run is pooled with in the other folds' runs: the model of the same name (the same
    procedure: "the warm-up", "round 1 from the best model so far"), or any hybrid row. (A fold's run fuses its own
    best dense model on its dev split; the run choosing under cv fuses the one best on the pooled scores.)"""
    return HYBRID_KIND if is_hybrid(label) else label


def dev_evaluations(stages: list[dict]) -> dict[str, ArtifactRef]:
    """A finished run's dev evaluation of each model but BM25, by label, from its stages (`stages` of its result)."""
    return {s["for"]: ArtifactRef(s["path"], Path(s["path"]).name) for s in stages
            if s["stage"] == "evaluate-dev" and s["for"] != "BM25"}


def pooled_best(pooled: dict[str, pd.Series], order: list[str]) -> str | None:
    """The label of `pooled` with the best mean (ties as `select_model` breaks them, in `order`)."""
    rows = [{"model": label, DEV_KEY: float(pooled[label].mean())} for label in order if label in pooled]
    return select_model(rows, list(pooled))


def pooled_dev(dev: dict[str, ArtifactRef], folds: list[dict[str, ArtifactRef]]) -> dict[str, pd.Series]:
    """Each model's per-query dev nDCG@10 (`dev`: label -> its dev evaluation) with those of the same kind in the
    other folds' runs (`folds`: kind -> dev evaluation, one dict per fold); models some fold lacks are left out."""
    pooled = {}
    for label, ref in dev.items():
        refs = [ref] + [fold.get(fold_kind(label)) for fold in folds]
        if any(r is None for r in refs):
            continue
        scores = [read_per_query(r) for r in refs]
        if any(s is None for s in scores):
            raise AnceError(f"selection cv needs per-query dev scores, and an evaluation of {label} has none (one "
                            "from before they were kept): evaluate again, or choose another selection")
        joined = pd.concat(scores)
        if joined.index.duplicated().any():
            shared = sorted(set(joined.index[joined.index.duplicated()]))
            raise AnceError(f"selection cv: the dev folds share queries ({', '.join(map(str, shared[:5]))}): the folds "
                            "are not disjoint (a dataset's own dev split is not carved into folds)")
        pooled[label] = joined
    return pooled


def dev_regressions(results: list[dict], started_from: dict[str, str]) -> list[str]:
    """One warning per training stage whose model scores a lower dev nDCG@10 than the model it started from."""
    dev = {r["model"]: r[DEV_KEY] for r in results if DEV_KEY in r}
    out = []
    for label, start in started_from.items():
        if label in dev and start in dev and dev[label] < dev[start]:
            out.append(f"{label} made the model worse on the dev split: nDCG@10 {dev[start]:.4f} ({start}) -> "
                       f"{dev[label]:.4f} ({dev[label] - dev[start]:+.4f})")
    return out


# Dev queries under which a choice among a run's models is mostly noise: on MED's 6, LISA's 5 and DL19's 10 the dev
# split could not see what training did on test, either way (RESULTS.md); the searches hold with 13-30
SMALL_DEV = 13


def small_dev_warning(dev: dict[str, ArtifactRef], model: str | None, dev_split: str | None,
                      pooled: dict[str, pd.Series] | None = None) -> list[str]:
    """A warning when the dev split that chose the result (or the folds' pooled: `pooled`) has fewer than SMALL_DEV
    queries."""
    values = (pooled or {}).get(model) if pooled else read_per_query(dev[model]) if model in dev else None
    if values is None or len(values) >= SMALL_DEV:
        return []
    counted = f"{len(values)} {dev_split} quer{'y' if len(values) == 1 else 'ies'}"
    return [f"the result was chosen on {counted}: on a dev split under {SMALL_DEV} queries a "
            f"difference of a few hundredths of nDCG@10 is noise, so the run may keep its starting model where "
            f"training helped, or a trained model where it did not (RESULTS.md: MED, LISA, DL19); more {dev_split} "
            f"queries (data.dev_fraction, or a {dev_split} split in the dataset) make the choice surer"
            + ("" if pooled else ", as does selection: cv (a run per dev fold, their dev queries pooled)")]


def build_report(evaluations: list[tuple[str, ArtifactRef]], timings: list[StageTiming], split: str,
                 dataset: str, dev: dict[str, ArtifactRef] | None = None, dev_split: str | None = None,
                 selected: list[str] | None = None, started_from: dict[str, str] | None = None,
                 rule: Selection = "best", folds: list[dict[str, ArtifactRef]] | None = None) -> dict:
    """Rows of metrics per model (`dev_*` keys: the dev split's), the selection among `selected` (candidate labels)
    by `rule` (`folds`: the other dev folds' evaluations for `cv`, kind -> evaluation), the dev regressions of the
    training stages (`started_from`: label -> the label it trained from), and markdown."""
    dev = dev or {}
    results = [{"model": label, **read_metrics(ref)} for label, ref in evaluations]
    for row in results:
        if row["model"] in dev:
            row |= {f"dev_{k}": v for k, v in read_metrics(dev[row["model"]]).items()}
    best = chosen = select_model(results, selected or [])
    warnings = dev_regressions(results, started_from or {})
    pooled: dict[str, pd.Series] = {}
    if rule == "cv" and best and folds:
        pooled = pooled_dev({r["model"]: dev[r["model"]] for r in results if r["model"] in selected
                             and r["model"] in dev}, folds)
        for row in results:
            if row["model"] in pooled:
                row |= {CV_KEY: float(pooled[row["model"]].mean()), "cv_queries": len(pooled[row["model"]])}
        if not pooled:  # (a fold's run without dev evaluations: dev_folds refuses it before any training)
            warnings.append("selection cv: the other dev folds' runs have no dev evaluation of this run's models; "
                            "the result is the best on this run's dev split")
            rule = "best"
        chosen = pooled_best(pooled, [r["model"] for r in results]) or best
    elif rule == "one-se" and best:  # (read only for this rule: `best` needs the dev means alone)
        per_query = {r["model"]: read_per_query(dev[r["model"]]) for r in results
                     if r["model"] in selected and r["model"] in dev}  # in training order
        missing = [label for label, values in per_query.items() if values is None]
        if missing:
            verb = "has" if len(missing) == 1 else "have"
            warnings.append(f"selection one-se needs every model's per-query dev scores, and {', '.join(missing)} "
                            f"{verb} none (an evaluation from before they were kept): the result is the best on dev")
            rule = "best"
        else:
            chosen, gap, se = one_se(best, list(per_query), per_query)
    else:
        rule = "best"
    warnings += small_dev_warning(dev, chosen, dev_split, pooled)
    stages = [{"for": t.label, "stage": t.stage, "seconds": round(t.ref.seconds, 1), "path": t.ref.path}
              for t in timings]
    per_model: dict[str, float] = {}
    for s in stages:
        per_model[s["for"]] = per_model.get(s["for"], 0.0) + s["seconds"]
    show_dev = bool(dev) and dev_split != split
    started_from = started_from or {}
    show_from = bool(started_from)
    show_cv = bool(pooled)
    header = ["model", *("trained from",) * show_from, *(f"{dev_split} nDCG@10",) * show_dev,
              *(f"{dev_split} nDCG@10, {len(folds or []) + 1} folds",) * show_cv, *COLUMNS.values(), "stage time (s)"]
    rows = [[f"**{r['model']}** (result)" if r["model"] == chosen else r["model"],
             *((started_from.get(r["model"], "—"),) * show_from),
             *((f"{r[DEV_KEY]:.4f}" if DEV_KEY in r else "—",) * show_dev),
             *((f"{r[CV_KEY]:.4f}" if CV_KEY in r else "—",) * show_cv),
             *(f"{r[k]:.4f}" for k in COLUMNS), f"{per_model.get(r['model'], 0.0):.0f}"] for r in results]
    models = [r["model"] for r in results if r["model"] != "BM25"]  # in the order they were trained
    skipped = [f"{label} trained from {start}, the best model before it on the {dev_split} split, not from "
               f"{models[models.index(label) - 1]}" for label, start in started_from.items()
               if label in models and models.index(label) > 0 and models[models.index(label) - 1] != start]
    stages_md = markdown_table(["for", "stage", "seconds"],
                               [[s["for"], s["stage"], f"{s['seconds']:.1f}"] for s in stages])
    total = sum(s["seconds"] for s in stages)
    chosen_md = ""
    if pooled:
        chosen_md = (f"The run's result is **{chosen}**: the best {dev_split} nDCG@10 of its models over "
                     f"{len(pooled[chosen])} queries of {len(folds) + 1} dev folds (selection cv: each fold's run "
                     f"trained without its fold's queries; on this run's {len(read_per_query(dev[best]))} {dev_split} "
                     f"queries alone the best is {best}; {split} is never used to choose).\n\n")
    elif chosen != best:
        chosen_md = (f"The run's result is **{chosen}**: the simplest of its models within one standard error of the "
                     f"best {dev_split} nDCG@10 ({best}: {gap:+.4f} ± {se:.4f} over {len(per_query[best])} queries; "
                     f"selection one-se, {split} is never used to choose).\n\n")
    elif chosen:
        chosen_md = (f"The run's result is **{chosen}**: the best {dev_split} nDCG@10 of its models, the starting one "
                     f"included ({split} is never used to choose).\n\n")
    warnings_md = "".join(f"**Warning:** {w}.\n\n" for w in warnings)
    grades = sorted({relevant_grade(ref) for _, ref in evaluations} - {1})
    grade_md = (f"MRR@10 and R@k count a document of qrels grade {' or '.join(map(str, grades))} or above as relevant "
                "(eval.relevant_grade); nDCG@10 gains by every grade.\n\n" if grades else "")
    skipped_md = "".join(f"{line}.\n\n" for line in skipped)
    markdown = (f"## {dataset} {split}\n\n{markdown_table(header, rows)}\n\n{grade_md}{chosen_md}{skipped_md}"
                f"{warnings_md}"
                f"Stage time: wall seconds of the builds that produced and evaluated each model (a reused stage counts "
                f"the time it took when it was built).\n\n"
                f"### Wall time per stage (total {total:.0f} s)\n\n{stages_md}\n")
    return {"dataset": dataset, "split": split, "dev_split": dev_split if dev else None, "results": results,
            "selected": chosen, "best_on_dev": best, "selection": rule if chosen else None, "warnings": warnings,
            "stages": stages, "started_from": started_from, "markdown": markdown}


def write_report(report: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / RESULTS_JSON, report)
    (folder / RESULTS_MD).write_text(report["markdown"])


def read_report(folder: ArtifactRef) -> dict:
    """A results table's content; one written before the selection rules had no `best_on_dev` or `selection`: it
    chose the best on dev."""
    report = json.loads((Path(folder.path) / RESULTS_JSON).read_text())
    report.setdefault("best_on_dev", report.get("selected"))
    report.setdefault("selection", "best" if report.get("selected") else None)
    return report
