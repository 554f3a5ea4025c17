"""The ANCE pipeline (paper Fig. 2): BM25 warm-up, then K rounds of encode -> index -> mine -> train, every checkpoint
evaluated from the same corpus encoding it mines from.

`refresh: sync` runs the rounds one after the other. `refresh: async` trains all rounds as one continuous run while
an inferencer refreshes the negatives in the background (see tasks/train.py: train_async).
"""

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_UI_URL

from ance_core.artifacts import ArtifactRef
from ance_core.config import PipelineConfig
from ance_core.errors import AnceError
from ance_core.model import checkpoint_digest
from ance_core.report import StageTiming, read_report
from ance_core.samplers import train_config_for
from flows.book import ModelBook
from flows.compress import compress_model, log_compression, public_rows
from flows.start import record_latest, trained_checkpoint
from tasks.common import StageLog
from tasks.data import prepare_data
from tasks.model import init_checkpoint
from tasks.refresh import refresh_negatives
from tasks.train import SchedulePlan, train_async, train_round
from tracking.closing import closing_lines
from tracking.run import PipelineTracking, run_url


@flow(name="ance-train", log_prints=True)
def ance_pipeline(config: PipelineConfig = PipelineConfig()) -> dict:
    c, wd, split = config, config.work_dir, config.data.train_split
    log = StageLog()
    tracking = PipelineTracking(c, flow_tags())
    link_mlflow_run(tracking)

    def train(label: str, *args) -> ArtifactRef:
        with tracking.live(label, log.timings):  # steps stream to MLflow while it trains
            return log.run(label, "train", train_round, *args)

    data = log.run("data", "prepare", prepare_data, c.data, wd)
    tracking.set_dataset(data.digest)
    book = ModelBook(c, data, log)
    book.bm25()
    round_cfg = train_config_for(c.mining, c.ance)
    rounds_cfgs = [round_cfg] * (c.rounds if c.refresh == "sync" else 0)

    if c.start_checkpoint:  # retraining: the rounds start from a model trained before
        checkpoint, label = ArtifactRef(c.start_checkpoint, checkpoint_digest(c.start_checkpoint)), "start"
        schedules = SchedulePlan(c.schedule, rounds_cfgs)
    else:
        warm_cfg = train_config_for(c.bm25_negatives, c.warmup)
        schedules = SchedulePlan(c.schedule, [warm_cfg, *rounds_cfgs])
        checkpoint, label = log.run("zero-shot", "init", init_checkpoint, c.model, wd), "zero-shot"
        book.evaluate(label, checkpoint)
        negatives = log.record("warmup", refresh_negatives(None, data, split, c.encode, c.index, c.bm25_negatives, 0,
                                                           wd, c.bm25, scorer=book.models[label]))["mine"]
        checkpoint = train("warmup", checkpoint, negatives, data, split, warm_cfg, wd, schedules.next(negatives))
        book.trained("warmup", label, negatives, c.bm25_negatives.sampler)
        label = "warmup"
    extra = {}

    if c.refresh == "sync" or c.rounds == 0:
        for k in range(1, c.rounds + 1):
            refs = refresh(log, label, checkpoint, k, data, c)
            book.evaluate(label, checkpoint, refs)
            checkpoint = train(f"ANCE round {k}", checkpoint, refs["mine"], data, split, round_cfg, wd,
                               schedules.next(refs["mine"]))
            book.trained(f"ANCE round {k}", label, refs["mine"], c.mining.sampler)
            label = f"ANCE round {k}"
    else:
        refs = refresh(log, label, checkpoint, 1, data, c)
        book.evaluate(label, checkpoint, refs)
        with tracking.live("ANCE (async)", log.timings):
            state = train_async(checkpoint, refs["mine"], data, split, c.ance, c.rounds, c.encode, c.index,
                                c.mining, c.max_staleness, wd, return_state=True)
        trained = state.result()
        trainer = dataclasses.replace(trained["checkpoint"], cached=state.name == "Cached")
        log.timings.append(StageTiming("ANCE (async)", "train", trainer))
        for k in range(1, c.rounds + 1):
            book.trained(f"ANCE round {k}", label, negatives_in_use(trained["refresh"], k, refs["mine"]),
                         c.mining.sampler)
            label = f"ANCE round {k}"
            if k < c.rounds:  # encoded and indexed by the inferencer: cached
                book.evaluate(label, trained["snapshots"][k - 1])
        checkpoint = trained["checkpoint"]
        extra = {"async_refresh": trained["refresh"]}
        _print_staleness(trained["refresh"])
    book.evaluate(label, checkpoint)

    summary = book.report(c.data.dataset)
    result = read_report(summary)
    chosen = result["selected"] or label  # no dev split: the last model
    result["warnings"] = book.stage_warnings() + result["warnings"]
    print(result["markdown"])
    reused = [s for s in log.timings if s.ref.cached]
    print(f"{len(reused)} of {len(log.timings)} stages reused from earlier runs")
    stages = [s | {"cached": t.ref.cached} for s, t in zip(result["stages"], log.timings, strict=True)]
    final = book.models[chosen]
    metrics = next(r for r in result["results"] if r["model"] == chosen)
    record_latest(wd, final["checkpoint"], chosen, metrics)
    plots = Path(wd) / "plots" / summary.digest  # the run's plots as files too, beside MLflow's copies
    plots.mkdir(parents=True, exist_ok=True)
    drawing = Path(tempfile.mkdtemp(dir=plots.parent, prefix=".drawing-"))  # a concurrent run draws its own
    tracked = tracking.finish_safely(result, log.timings, book.evaluations, data.path, book.stats,
                                     extra.get("async_refresh"), plots_dir=drawing,
                                     selected=(chosen, final["checkpoint"]), dev=book.dev,
                                     dev_setting=book.dev_setting)
    for png in drawing.iterdir():
        os.replace(png, plots / png.name)  # each file whole, whichever run renames last
    shutil.rmtree(drawing, ignore_errors=True)
    if c.compression is not None:  # the chosen model, from the corpus encoding its evaluation made
        compressed = compress_model(final["checkpoint"], final["encode"], data, c.compression, split,
                                    c.data.eval_split, c.encode, c.index, wd)
        tracked["compression"] = log_compression(tracking.tracker, tracking.parent, compressed, c.compression,
                                                 c.data.dataset, tracking.tags) | {"table": compressed["table"]}
        extra["compression"] = {"table": compressed["table"], "files": compressed["files"],
                                "rows": public_rows(compressed["rows"])}
        tracked |= tracking.tracker.summary()
    closing = closing_lines(tracked, chosen, result["warnings"], on_dev=result["selected"] is not None)
    print("\n".join(closing))
    link_mlflow_run(tracking, result["markdown"], closing)
    return result | extra | {"stages": stages, "selected": chosen, "final_checkpoint": final["checkpoint"].path,
                             "last_checkpoint": checkpoint.path, "report_dir": summary.path, "plots_dir": str(plots),
                             "negatives": book.negatives(), "tracking": tracked, "mlflow_run_id": tracked["run_id"],
                             "mlflow_uri": tracked["tracking_uri"]}


def refresh(log: StageLog, label: str, checkpoint: ArtifactRef, round_: int, data: ArtifactRef,
            c: PipelineConfig) -> dict[str, ArtifactRef]:
    """Negatives for round `round_` from `label`'s checkpoint (its encoding also serves its evaluation): the corpus
    encoding and index are recorded for that model, retrieval and mining for the round they feed."""
    refs = refresh_negatives(checkpoint, data, c.data.train_split, c.encode, c.index, c.mining, round_, c.work_dir,
                             c.bm25)
    for name, ref in refs.items():
        for_label = label if name in ("encode", "index") else f"ANCE round {round_}"
        log.timings.append(StageTiming(for_label, "retrieve-train" if name == "retrieve" else name, ref))
    return refs


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
    url = run_url(tracking.tracker, parent)
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
