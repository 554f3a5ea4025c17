"""The results table a pipeline run ends with: one row per model, metrics and wall time per stage."""

import json
from dataclasses import dataclass
from pathlib import Path

from ance_core.artifacts import ArtifactRef, write_json

COLUMNS = {"ndcg_at_10": "nDCG@10", "mrr_at_10": "MRR@10", "recall_at_100": "R@100", "recall_at_1000": "R@1000"}


@dataclass(frozen=True)
class StageTiming:
    label: str  # which model or round the stage ran for
    stage: str
    ref: ArtifactRef


def read_metrics(evaluation: ArtifactRef) -> dict[str, float]:
    return json.loads((Path(evaluation.path) / "metrics.json").read_text())


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def build_report(evaluations: list[tuple[str, ArtifactRef]], timings: list[StageTiming], split: str,
                 dataset: str) -> dict:
    results = [{"model": label, **read_metrics(ref)} for label, ref in evaluations]
    stages = [{"for": t.label, "stage": t.stage, "seconds": round(t.ref.seconds, 1), "path": t.ref.path}
              for t in timings]
    per_model: dict[str, float] = {}
    for s in stages:
        per_model[s["for"]] = per_model.get(s["for"], 0.0) + s["seconds"]
    metrics_md = markdown_table(
        ["model", *COLUMNS.values(), "stage time (s)"],
        [[r["model"], *(f"{r[k]:.4f}" for k in COLUMNS), f"{per_model.get(r['model'], 0.0):.0f}"] for r in results],
    )
    stages_md = markdown_table(["for", "stage", "seconds"],
                               [[s["for"], s["stage"], f"{s['seconds']:.1f}"] for s in stages])
    total = sum(s["seconds"] for s in stages)
    markdown = (f"## {dataset} {split}\n\n{metrics_md}\n\n"
                f"Stage time: wall seconds of the builds that produced and evaluated each model (a reused stage counts "
                f"the time it took when it was built).\n\n"
                f"### Wall time per stage (total {total:.0f} s)\n\n{stages_md}\n")
    return {"dataset": dataset, "split": split, "results": results, "stages": stages, "markdown": markdown}


def write_report(report: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "results.json", report)
    (folder / "results.md").write_text(report["markdown"])


def read_report(folder: ArtifactRef) -> dict:
    return json.loads((Path(folder.path) / "results.json").read_text())
