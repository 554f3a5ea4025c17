from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.report import StageTiming, build_report, write_report
from tasks.common import stage_task


@stage_task("report")
def report(evaluations: list[tuple[str, ArtifactRef]], timings: list[StageTiming], split: str, dataset: str,
           work_dir: str) -> ArtifactRef:
    """The results table (results.md + results.json) under <work_dir>/reports/<digest>/."""
    inputs = {label: ref.digest for label, ref in evaluations}
    return run_stage(work_dir, "reports", {"split": split, "dataset": dataset}, inputs,
                     lambda out: write_report(build_report(evaluations, timings, split, dataset), out))
