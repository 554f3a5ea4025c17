"""The ANCE pipeline (paper Fig. 2): BM25 warm-up, then K rounds of encode -> index -> mine -> train, every checkpoint
evaluated from the same corpus encoding it mines from.

`refresh: sync` runs the rounds one after the other. `refresh: async` trains all rounds as one continuous run while
an inferencer refreshes the negatives in the background (see tasks/train.py: train_async).
"""

import dataclasses
import time
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_UI_URL

from ance_core.artifacts import ArtifactRef, write_json
from ance_core.config import PipelineConfig
from ance_core.errors import AnceError
from ance_core.model import checkpoint_digest
from ance_core.report import StageTiming, read_report
from ance_core.samplers import DENSE, MINED, train_config_for
from flows.compress import compress_model, log_compression, public_rows
from tasks.analysis import DEPTH, analyse_negatives, read_stats
from tasks.bm25 import bm25_run
from tasks.common import StageLog, run_task
from tasks.data import prepare_data
from tasks.evaluate import evaluate
from tasks.model import init_checkpoint
from tasks.refresh import evaluate_stages, refresh_negatives
from tasks.report import report
from tasks.tracking import LATEST, PipelineTracking, closing_lines, trained_checkpoint
from tasks.train import train_async, train_round


@flow(name="ance-train", log_prints=True)
def ance_pipeline(config: PipelineConfig = PipelineConfig()) -> dict:
    c, wd = config, config.work_dir
    train_split, eval_split = c.data.train_split, c.data.eval_split
    log = StageLog()
    timings, stage = log.timings, log.run
    evaluations: list[tuple[str, ArtifactRef]] = []
    trained_on: dict[str, ArtifactRef] = {}  # model label -> the negatives it was trained on
    stats: dict[str, ArtifactRef] = {}  # model label -> its negatives analysis
    tracking = PipelineTracking(c, flow_tags())
    link_mlflow_run(tracking)

    def refresh(label: str, checkpoint: ArtifactRef, round_: int) -> dict[str, ArtifactRef]:
        """Negatives for round `round_` from `label`'s checkpoint (its encoding also serves its evaluation)."""
        refs = refresh_negatives(checkpoint, data, train_split, c.encode, c.index, c.mining, round_, wd, c.bm25)
        for name, ref in refs.items():
            for_label = label if name in ("encode", "index") else f"ANCE round {round_}"
            timings.append(StageTiming(for_label, "retrieve-train" if name == "retrieve" else name, ref))
        return refs

    def evaluate_model(label: str, checkpoint: ArtifactRef, index: ArtifactRef | None = None) -> dict[str, ArtifactRef]:
        """Evaluate a checkpoint; the corpus encoding and index are shared with its mining when given. A model trained
        on mined negatives also gets the negatives analysis (its own ranking of the training queries, shared with
        the next round's mining)."""
        refs = evaluate_stages(checkpoint, data, eval_split, c.eval.top_k, c.encode, c.index, wd, index)
        evaluations.append((label, log.record(label, refs)["evaluate"]))
        if label in trained_on:
            depth = c.mining.depth if c.mining.sampler in DENSE else DEPTH  # dense: the next mining's ranking, cached
            stats[label] = analyse_negatives(trained_on[label], checkpoint, index or refs["index"], data, train_split,
                                             c.encode, c.index, wd, depth)
        return refs

    def train(label: str, task, *args) -> ArtifactRef:
        with tracking.live(label, timings):  # steps stream to MLflow while it trains
            return stage(label, "train", task, *args)

    data = stage("data", "prepare", prepare_data, c.data, wd)
    tracking.set_dataset(data.digest)
    bm25_eval = stage("BM25", "bm25", bm25_run, data, c.bm25, eval_split, c.bm25.top_k, wd)
    evaluations.append(("BM25", stage("BM25", "evaluate", evaluate, bm25_eval, data, eval_split, wd)))

    if c.start_checkpoint:  # retraining: the rounds start from a model trained before
        checkpoint, label = ArtifactRef(c.start_checkpoint, checkpoint_digest(c.start_checkpoint)), "start"
    else:
        checkpoint = stage("zero-shot", "init", init_checkpoint, c.model, wd)
        evaluate_model("zero-shot", checkpoint)
        negatives = log.record("warmup", refresh_negatives(None, data, train_split, c.encode, c.index,
                                                           c.bm25_negatives, 0, wd, c.bm25))["mine"]
        checkpoint = train("warmup", train_round, checkpoint, negatives, data, train_split,
                           train_config_for(c.bm25_negatives, c.warmup), wd)
        label = "warmup"
        if c.bm25_negatives.sampler in MINED:
            trained_on["warmup"] = negatives
    extra = {}

    if c.refresh == "sync" or c.rounds == 0:
        for k in range(1, c.rounds + 1):
            refs = refresh(label, checkpoint, k)
            evaluate_model(label, checkpoint, refs.get("index"))
            label = f"ANCE round {k}"
            if c.mining.sampler in MINED:
                trained_on[label] = refs["mine"]
            checkpoint = train(label, train_round, checkpoint, refs["mine"], data, train_split,
                               train_config_for(c.mining, c.ance), wd)
    else:
        refs = refresh(label, checkpoint, 1)
        evaluate_model(label, checkpoint, refs["index"])
        with tracking.live("ANCE (async)", timings):
            state = train_async(checkpoint, refs["mine"], data, train_split, c.ance, c.rounds, c.encode, c.index,
                                c.mining, c.max_staleness, wd, return_state=True)
        trained = state.result()
        for k in range(1, c.rounds + 1):
            trained_on[f"ANCE round {k}"] = negatives_in_use(trained["refresh"], k, refs["mine"])
        trainer = dataclasses.replace(trained["checkpoint"], cached=state.name == "Cached")
        timings.append(StageTiming("ANCE (async)", "train", trainer))
        for k, snapshot in enumerate(trained["snapshots"], 1):
            evaluate_model(f"ANCE round {k}", snapshot)  # encoded and indexed by the inferencer: cached
        checkpoint, label = trained["checkpoint"], f"ANCE round {c.rounds}"
        extra = {"async_refresh": trained["refresh"]}
        _print_staleness(trained["refresh"])
    final = evaluate_model(label, checkpoint)

    summary = run_task(report, evaluations, timings, eval_split, c.data.dataset, wd)
    result = read_report(summary)
    print(result["markdown"])
    reused = [s for s in timings if s.ref.cached]
    print(f"{len(reused)} of {len(timings)} stages reused from earlier runs")
    stages = [s | {"cached": t.ref.cached} for s, t in zip(result["stages"], timings, strict=True)]
    record_latest(wd, checkpoint, result["results"][-1])
    tracked = tracking.finish_safely(result, timings, evaluations, data.path, stats, extra.get("async_refresh"))
    if c.compression is not None:  # the final model, from the corpus encoding its evaluation just made
        compressed = compress_model(checkpoint, final["encode"], data, c.compression, train_split, eval_split,
                                    c.encode, c.index, wd)
        tracked["compression"] = log_compression(tracking.tracker, tracking.parent, compressed, c.compression,
                                                 c.data.dataset, tracking.tags) | {"table": compressed["table"]}
        extra["compression"] = {"table": compressed["table"], "files": compressed["files"],
                                "rows": public_rows(compressed["rows"])}
        tracked |= tracking.tracker.summary()
    closing = closing_lines(tracked)
    print("\n".join(closing))
    link_mlflow_run(tracking, result["markdown"], closing)
    negatives = {label: read_stats(ref) for label, ref in stats.items()}
    return result | extra | {"stages": stages, "final_checkpoint": checkpoint.path, "report_dir": summary.path,
                             "negatives": negatives, "tracking": tracked, "mlflow_run_id": tracked["run_id"],
                             "mlflow_uri": tracked["tracking_uri"]}


def flow_tags() -> dict[str, str]:
    """Tags that tie the MLflow runs to this Prefect flow run (and its page, when a Prefect server is used)."""
    tags = {"prefect.flow_run_id": str(flow_run.get_id()), "prefect.flow_run_name": str(flow_run.get_name()),
            "prefect.deployment": str(deployment.get_name() or "")}
    if PREFECT_UI_URL.value():
        tags["prefect.flow_run_url"] = str(flow_run.get_flow_run_ui_url())
    return tags


def link_mlflow_run(tracking: PipelineTracking, markdown: str | None = None, closing: list[str] = ()) -> None:
    """The Prefect side of the link: a markdown artifact on the flow run naming its MLflow run (and, at the end,
    the results and anything tracking could not deliver)."""
    parent, uri = tracking.parent, tracking.tracker.uri
    url = tracking.run_url(parent)
    lines = ["# MLflow run", "",
             f"- run: [{parent}]({url})" if url else f"- run id: `{parent}`",
             f"- tracking store: `{uri}`" + ("" if url else f" (open it with `mlflow ui --backend-store-uri {uri}`)"),
             f"- experiment id: `{tracking.tracker.experiment_id}`"]
    lines += [f"- {line.removeprefix('MLflow: ')}" for line in closing]
    if markdown:
        lines += ["", markdown]
    create_markdown_artifact("\n".join(lines), key="mlflow-run", description="the MLflow run of this pipeline run")


def negatives_in_use(refresh: dict, round_: int, first: ArtifactRef) -> ArtifactRef:
    """The negatives an asynchronous trainer was using when round `round_` ended."""
    end = round_ * refresh["steps_per_round"]
    swaps = [s for s in refresh["swaps"] if s["swapped_at_step"] <= end]
    if not swaps:
        return first
    return ArtifactRef(swaps[-1]["negatives"], Path(swaps[-1]["negatives"]).name)


def record_latest(work_dir: str, checkpoint: ArtifactRef, metrics: dict) -> None:
    """<work_dir>/latest.json names the newest trained model: where `retrain` starts from."""
    run = flow_run.get_id()
    write_json(Path(work_dir) / LATEST, {"checkpoint": checkpoint.path, "digest": checkpoint.digest, "metrics": metrics,
                                        "flow_run_id": run, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


@flow(name="retrain", log_prints=True)
def retrain(config: PipelineConfig = PipelineConfig()) -> dict:
    """ANCE rounds from the champion model, `models:/ance-<dataset>@champion` in the MLflow registry (the scheduled
    deployment runs this).

    `config.start_checkpoint` overrides where it starts. Without a champion (nothing registered yet, or the tracking
    server unreachable) it starts from the newest model of the work folder (<work_dir>/latest.json), and without
    either it stops with a clear error."""
    start, source = trained_checkpoint(config.work_dir, config.data.dataset, config.start_checkpoint)
    if not Path(start, "ance_model.json").is_file():
        raise AnceError(f"{start}: not an ANCE checkpoint (no ance_model.json)")
    print(f"retraining from {source}: {start}")
    return ance_pipeline(config.model_copy(update={"start_checkpoint": start}))


def _print_staleness(refresh: dict) -> None:
    rows = ", ".join(f"round {r['round']}: mean {r['mean_staleness']} max {r['max_staleness']}"
                     for r in refresh["rounds"])
    swaps = ", ".join(f"step-{s['checkpoint_step']} negatives at step {s['swapped_at_step']}" for s in refresh["swaps"])
    print(f"async refresh: staleness of negatives in trainer steps ({rows}); trainer waited "
          f"{refresh['wait_seconds']} s; swaps: {swaps or 'none'}")
