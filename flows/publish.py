"""A flow run's records in Prefect: its artifacts (the results and stage-time tables, the link to its MLflow run),
published best effort, and the tags that tie its MLflow runs back to it."""

import re
from collections.abc import Callable
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_UI_URL

from ance_core.errors import warn
from ance_core.pipeline.report import StageTiming
from tracking.run import PipelineTracking, run_url


def artifact_key(*parts: str) -> str:
    """`parts` as a Prefect artifact key: lowercase letters, digits and dashes (Prefect refuses anything else)."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")[:200]


def publish(create: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """A Prefect artifact, best effort: a Prefect API that fails here warns and leaves the run alone (its MLflow runs
    would be left RUNNING at the start; at the end a finished, registered run would show as failed)."""
    try:
        create(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        warn(f"the Prefect artifact {kwargs.get('key')} was not published ({type(e).__name__}: {e})")


def flow_tags() -> dict[str, str]:
    """Tags that tie the MLflow runs to this Prefect flow run (and its page, when a Prefect server is used)."""
    tags = {"prefect.flow_run_id": str(flow_run.get_id()), "prefect.flow_run_name": str(flow_run.get_name()),
            "prefect.deployment": str(deployment.get_name() or "")}
    if PREFECT_UI_URL.value():
        tags["prefect.flow_run_url"] = str(flow_run.get_flow_run_ui_url())
    return tags


RESULT_COLUMNS = {"dev_ndcg_at_10": "dev nDCG@10", "ndcg_at_10": "nDCG@10", "mrr_at_10": "MRR@10",
                  "recall_at_100": "R@100", "recall_at_1000": "R@1000"}


def publish_tables(results: list[dict], timings: list[StageTiming], started_from: dict[str, str],
                   key: Callable[[str], str]) -> None:
    """The results table and the per-stage wall times as Prefect table artifacts of the flow run, keyed (`key`:
    `<flow>-<collection>-results`, `-stage-times`) so the UI's Artifacts page keeps their history across runs."""
    rows = [{"model": r["model"], "trained from": started_from.get(r["model"], "")}
            | {label: round(r[k], 4) if k in r else None for k, label in RESULT_COLUMNS.items()} for r in results]
    publish(create_table_artifact, rows, key=key("results"), description="the run's models: dev and evaluation metrics")
    stages = [{"model": t.label, "stage": t.stage, "seconds": round(t.ref.seconds, 1), "reused": t.ref.cached}
              for t in timings]
    publish(create_table_artifact, stages, key=key("stage-times"), description="each stage's wall seconds (a reused "
            "stage: the seconds it took when it was built)")


def link_mlflow_run(tracking: PipelineTracking, markdown: str | None = None, closing: list[str] = (),
                    key: str = "mlflow-run") -> None:
    """The Prefect side of the link: a markdown artifact on the flow run naming its MLflow run (and, at the end,
    the results and anything tracking could not deliver)."""
    parent, uri = tracking.parent, tracking.tracker.uri
    url = run_url(tracking.tracker, parent)
    lines = ["# MLflow run", "",
             f"- run: [{parent}]({url})" if url else f"- run id: `{parent}`",
             f"- tracking store: `{uri}`" + ("" if url else f" (open it with `mlflow ui --backend-store-uri {uri}`)"),
             f"- experiment id: `{tracking.tracker.experiment_id}`"]
    lines += [f"- {line.removeprefix('MLflow: ')}" for line in closing]
    if markdown:
        lines += ["", markdown]
    publish(create_markdown_artifact, "\n".join(lines), key=key, description="the MLflow run of this pipeline run")
