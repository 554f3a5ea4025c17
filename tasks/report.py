from pathlib import Path

from prefect import task

from ance_core.artifacts import ArtifactRef, digest_of
from ance_core.report import StageTiming, build_report, write_report


@task(name="report")
def report(evaluations: list[tuple[str, ArtifactRef]], timings: list[StageTiming], split: str, dataset: str,
           work_dir: str) -> dict:
    """The results table (markdown + JSON) under <work_dir>/reports/<digest>/."""
    result = build_report(evaluations, timings, split, dataset)
    folder = Path(work_dir) / "reports" / digest_of([ref.digest for _, ref in evaluations])
    write_report(result, folder)
    return result | {"report_dir": str(folder)}
