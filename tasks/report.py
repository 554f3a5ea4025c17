from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.pipeline.report import Selection, StageTiming, build_report, write_report
from tasks.common import stage_task


@stage_task("report")
def report(evaluations: list[tuple[str, ArtifactRef]], timings: list[StageTiming], split: str, dataset: str,
           work_dir: str, dev: dict[str, ArtifactRef] | None = None, dev_split: str | None = None,
           candidates: list[str] | None = None, started_from: dict[str, str] | None = None,
           selection: Selection = "best", folds: list[dict[str, ArtifactRef]] | None = None) -> ArtifactRef:
    """The results table (results.md + results.json) under <work_dir>/reports/<digest>/: metrics per model, the model
    selected on the dev split among `candidates` by `selection` (`cv`: with the other dev folds' evaluations,
    `folds`), and the training stages that made the dev score worse."""
    inputs = {label: ref.digest for label, ref in evaluations}
    inputs |= {f"dev:{label}": ref.digest for label, ref in (dev or {}).items()}
    inputs |= {f"fold{k}:{kind}": ref.digest for k, fold in enumerate(folds or [], 1) for kind, ref in fold.items()}
    config = {"split": split, "dataset": dataset, "dev_split": dev_split, "candidates": candidates,
              "started_from": started_from} | ({"selection": selection} if selection != "best" else {})

    def build(out):
        write_report(build_report(evaluations, timings, split, dataset, dev, dev_split, candidates, started_from,
                                  selection, folds), out)

    return run_stage(work_dir, "reports", config, inputs, build)
