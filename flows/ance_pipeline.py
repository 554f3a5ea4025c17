"""The ANCE pipeline (paper Fig. 2): BM25 warm-up, then K rounds of encode -> index -> mine -> train, every checkpoint
evaluated from the same corpus encoding it mines from.

`refresh: sync` runs the rounds one after the other. `refresh: async` trains all rounds as one continuous run while
an inferencer refreshes the negatives in the background (see tasks/train_async.py).
"""

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from prefect import flow, get_run_logger

from ance_core.artifacts import ArtifactRef, read_manifest
from ance_core.data.splits import fold_count
from ance_core.errors import AnceError, collect_warnings
from ance_core.modeling.checks import check_lengths, check_loadable
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import checkpoint_digest, read_meta, resolve_model_name
from ance_core.negatives.samplers import train_config_for
from ance_core.pipeline.config import PipelineConfig, maxp_refusal, start_checkpoint_refusal
from ance_core.pipeline.report import HYBRID, StageTiming, dense_of, dev_evaluations, fold_kind, is_hybrid
from ance_core.retention import RetentionConfig, collect
from ance_core.retrieval.index import check_index_device
from ance_core.run_records import live_run
from ance_core.training.plan import check_precision
from flows.book import RunBook, Trial
from flows.compress import check_compression, compress_model, log_compression, public_rows
from flows.names import dataset_run_name
from flows.start import held_checkpoint, record_latest, trained_checkpoint, with_local_start
from tasks.common import held_result, run_task
from tasks.data import prepare_data
from tasks.fusion import read_fusion
from tasks.inferencer import check_deployment
from tasks.mine import stage_pairs
from tasks.model import init_checkpoint
from tasks.train import SchedulePlan
from tasks.train_async import train_async
from tracking.registry import check_model_name


@flow(name="ance-train", flow_run_name=dataset_run_name, log_prints=True)
def ance_pipeline(config: PipelineConfig = PipelineConfig()) -> dict:
    """The whole pipeline: BM25 warm-up, ANCE rounds (encode, index, mine, train), every model evaluated, the run's
    result chosen on the dev split and registered in MLflow.

    Args:
        config: The pipeline config, a section per stage (the sections of `ance run --config`).
    """
    config = with_local_start(config)  # (a registered model's URI: its folder)
    with live_run(config.work_dir, "ance-train"):  # the stages it uses, which garbage collection leaves
        result = train_and_evaluate(config)
    return result | retain(config.work_dir, config.retention)


def check_pipeline(c: PipelineConfig, devices: bool = True) -> None:
    """What the config asks of this machine and model, refused before any work (not in the first stage that needs
    it): fp16 training without CUDA, token lengths above the model's (or a teacher's) positions, a model or teacher
    that cannot be loaded, an index on a GPU where there is none. `devices` False: the run's stages do not run in
    this process (a recipe search's trials on GPU Ray workers, each of which checks its own devices)."""
    if devices:
        for name in ("warmup", "ance"):
            check_precision(getattr(c, name).precision, pick_device(), f"{name}.precision")
        check_index_device(c.index if c.rounds else c.index.exact())  # (without rounds only evaluation's flat index)
    lengths = {"model.query_max_length": c.model.query_max_length,
               "model.passage_max_length": c.model.passage_max_length}
    lengths |= {f"{name}.{field}": getattr(getattr(c, name), field) for name in ("warmup", "ance")
                for field in ("query_max_length", "passage_max_length")}
    try:
        check_lengths(c.start_checkpoint or c.model.name, lengths)
        check_loadable(c.start_checkpoint or c.model.name)  # (its weights and tokenizer, where they are local files)
    except AnceError as e:  # (the setting that names it: a start checkpoint that cannot load was said by its path)
        named = c.start_checkpoint and str(e).startswith("cannot load model")
        raise AnceError(f"start_checkpoint: {e}" if named else str(e)) from None
    if c.start_checkpoint and (meta := read_meta(c.start_checkpoint)).document_mode == "maxp":  # (its config's is not
        # its own: a retrain's config is the deployment's) what PipelineConfig refuses a maxp model config, here
        if refusal := maxp_refusal(c, meta.passage_max_length, warmup=False):
            raise AnceError(f"start_checkpoint {c.start_checkpoint} is a MaxP model: {refusal}")
    check_model_name(c.data)  # (its models are registered at the end)
    used = {"bm25_negatives": not c.start_checkpoint, "mining": c.rounds > 0}  # (a warm-up, rounds at all)
    for name in ("bm25_negatives", "mining"):  # a teacher that cannot be loaded, or reads more tokens than it takes
        if (teacher := getattr(c, name).teacher) is not None and used[name]:
            check_lengths(teacher.model, {f"{name}.teacher.max_length": teacher.max_length})


def train_and_evaluate(c: PipelineConfig, trial: Trial | None = None, experiment: str = "ance-train") -> dict:
    """The pipeline's stages and the run's end; `trial`: a trial of a recipe search (flows/tune.py), which records
    nothing outside its MLflow run (no latest.json, registry or compression); `experiment`: the flow's name, which
    names its MLflow experiment and its Prefect artifacts' keys (`bm25-warmup` for the warm-up alone)."""
    check_pipeline(c)
    if c.refresh == "async" and c.rounds:
        check_deployment(c.inferencer, get_run_logger())  # before the warm-up trains
    run = RunBook(c, experiment, next_mining=c.mining, trial=trial)
    with run.ended_on_failure(), collect_warnings() as run.loose:  # (what is warned outside the stages' builds)
        if c.selection == "cv":
            run.folds = dev_folds(c, trial.experiment if trial else experiment, run.tracking.parent,
                                  trial.name if trial else None)
        return run_stages(c, run)


def dev_folds(c: PipelineConfig, experiment: str, parent_run: str | None, within: str | None = None
              ) -> list[dict[str, ArtifactRef]]:
    """`selection: cv`: the pipeline once per other dev fold (data.dev_fold 1 .. fold_count - 1), each a trial nested
    under the run's MLflow run (nothing registered; `within`: the name of the search trial the run is, which names its
    folds' runs). Each fold's data, BM25 ranking, encodings and training are its own (only the zero-shot model is
    shared): about fold_count times the pipeline. Every fold's dev split is checked before any training
    (`check_dev_folds`). Returns their dev evaluations, by the kind the report pools them as."""
    count = check_dev_folds(c)
    folds = []
    for fold in range(1, count):
        name = f"{within} · dev fold {fold}" if within else f"dev fold {fold}"
        print(f"selection cv: the run for dev fold {fold} (of folds 0 to {count - 1}; this run's is fold 0)"
              + (f", of the trial {within}" if within else ""))
        sub = c.model_copy(update={"selection": "best", "data": c.data.model_copy(update={"dev_fold": fold})})
        result = train_and_evaluate(sub, Trial(experiment, parent_run, name))
        folds.append({fold_kind(label): ref for label, ref in dev_evaluations(result["stages"]).items()})
    return folds


def check_dev_folds(c: PipelineConfig) -> int:
    """What `selection: cv` needs, refused before any training: no start checkpoint, and every dev fold with dev and
    training queries of its own, carved from the training queries (each fold's data stage: cheap, cached). Returns
    the number of folds."""
    if c.start_checkpoint:  # (retrain sets it by model_copy, past the config's validators)
        raise AnceError(start_checkpoint_refusal(c.start_checkpoint))
    count = fold_count(c.data.dev_fraction)
    digests = []
    for fold in range(count):
        data = run_task(prepare_data, c.data.model_copy(update={"dev_fold": fold}), c.work_dir)
        summary = read_manifest(data.path)["summary"]
        splits = summary.get("splits", [])
        if c.data.dev_split not in splits or c.data.train_split not in splits:
            raise AnceError(f"selection cv: dev fold {fold} of data.dev_fraction {c.data.dev_fraction} leaves "
                            f"{'no dev' if c.data.dev_split not in splits else 'no training'} "
                            f"queries in {c.data.dataset} (too few training queries for {count} folds): raise "
                            "data.dev_fraction, or choose with selection best or one-se")
        digests.append(summary["split_digests"][c.data.dev_split])
    if len(set(digests)) < count:
        raise AnceError(f"selection cv carves its dev folds from the training queries, but {c.data.dataset} has its "
                        f"own '{c.data.dev_split}' split, which is used as it is: choose with selection best or "
                        "one-se")
    return count


def run_stages(c: PipelineConfig, run: RunBook) -> dict:
    """The stages of `train_and_evaluate`, in `run`: data, BM25, the warm-up (or a start checkpoint), the rounds, the
    evaluations and the hybrid row, and the run's end."""
    # retraining from a model of the work folder: recorded as used first (a gc meanwhile leaves it)
    if c.start_checkpoint:
        held_checkpoint(c.start_checkpoint, "start_checkpoint ")
    run.prepare_data()
    if c.compression is not None and run.trial is None:  # what compress_model would refuse after every stage trained
        check_compression(c.start_checkpoint or resolve_model_name(c.model.name), c.compression,
                          read_manifest(run.data.path)["summary"]["documents"])
    run.bm25()
    round_cfg = train_config_for(c.mining, c.ance)
    rounds_cfgs = [round_cfg] * (c.rounds if c.refresh == "sync" else 0)
    rounds_pairs = [stage_pairs(run.data, run.split, c.mining, k) for k in range(1, len(rounds_cfgs) + 1)]
    if c.start_checkpoint:  # retraining: the rounds start from a model trained before
        label, checkpoint = "start", ArtifactRef(c.start_checkpoint, checkpoint_digest(c.start_checkpoint))
        schedules = SchedulePlan(c.schedule, rounds_cfgs, pairs=rounds_pairs)
    else:  # the BM25 warm-up, from the pretrained model
        warm_cfg = train_config_for(c.bm25_negatives, c.warmup)
        schedules = SchedulePlan(c.schedule, [warm_cfg, *rounds_cfgs],
                                 pairs=[stage_pairs(run.data, run.split, c.bm25_negatives, 0), *rounds_pairs])
        checkpoint = run.log.run("zero-shot", "init", init_checkpoint, c.model, c.work_dir)
        run.say_long_documents(checkpoint)
        run.evaluate("zero-shot", checkpoint)
        negatives = run.mine("warmup", None, None, c.bm25_negatives, 0, scorer="zero-shot", train=warm_cfg)["mine"]
        checkpoint = run.train("warmup", "zero-shot", checkpoint, negatives, warm_cfg, c.bm25_negatives.sampler,
                               schedules.next(negatives))
        label = "warmup"
    async_refresh = None
    if c.warmup_only:
        pass  # the warm-up alone (the recipe search's first rung)
    elif c.refresh == "async" and c.rounds:
        label, checkpoint, async_refresh = ance_rounds_async(run, label, checkpoint)
    else:
        for k in range(1, c.rounds + 1):  # ANCE rounds: encode -> index -> mine -> train
            run.evaluate(label, checkpoint)
            start = run.start_of(f"ANCE round {k}", label)  # the best model so far on dev
            refs = run.mine(f"ANCE round {k}", start, run.models[start]["checkpoint"], c.mining, k, train=round_cfg)
            checkpoint = run.train(f"ANCE round {k}", start, run.models[start]["checkpoint"], refs["mine"], round_cfg,
                                   c.mining.sampler, schedules.next(refs["mine"], restart=start != label), round_=k)
            label = f"ANCE round {k}"
    run.evaluate(label, checkpoint)
    run.hybrid(label)
    return finish(run, label, checkpoint, async_refresh)


def retain(work_dir: str, retention: RetentionConfig) -> dict:
    """The retention policy applied to the work folder once the run has ended (nothing when it is unset)."""
    if not retention.active:
        return {}
    plan = collect(work_dir, retention)
    print(f"retention ({retention.keep_runs or 'all'} runs, {retention.keep_refreshes or 'all'} refreshes each"
          f"{'' if retention.keep_rankings else ', no rankings'}): "
          f"removed {len(plan.remove)} stage folders, {plan.freed_bytes / 2**30:.2f} GiB freed")
    return {"retention": plan.summary()}


def ance_rounds_async(run: RunBook, label: str, checkpoint: ArtifactRef) -> tuple[str, ArtifactRef, dict]:
    """`refresh: async` (ANCE Fig. 2): the rounds as one continuous training run while an inferencer refreshes the
    negatives in the background; each round's snapshot is evaluated (encoded and indexed by the inferencer: cached).
    Returns the last round's label, the final checkpoint and the refresh record (swaps, staleness, waits)."""
    c = run.c
    run.evaluate(label, checkpoint)
    start = run.start_of("ANCE round 1", label)  # the best model so far on dev
    checkpoint = run.models[start]["checkpoint"]
    refs = run.mine("ANCE round 1", start, checkpoint, c.mining, 1, train=c.ance)
    with run.tracking.live("ANCE (async)", run.log.timings):
        # recorded under the stage locks: answered from Prefect's cache, no run_stage ran here, and a gc in between
        # must not take a folder this run reads (trained again if it did)
        state, trained = held_result(train_async, checkpoint, refs["mine"], run.data, run.split, c.ance, c.rounds,
                                     c.encode, c.index, c.mining, c.max_staleness, c.work_dir, c.execution,
                                     c.inferencer, c.data, c.bm25)
    # reused: answered from Prefect's cache, or its folder found built (run_task ORs the two the same way)
    trainer = dataclasses.replace(trained["checkpoint"], cached=state.name == "Cached" or trained["checkpoint"].cached)
    run.log.timings.append(StageTiming("ANCE (async)", "train", trainer))
    label = start
    for k in range(1, c.rounds + 1):
        run.trained(f"ANCE round {k}", label, negatives_in_use(trained["refresh"], k, refs["mine"]), c.mining.sampler)
        label = f"ANCE round {k}"
        if k < c.rounds:
            run.evaluate(label, trained["snapshots"][k - 1])
    _print_staleness(trained["refresh"])
    return label, trained["checkpoint"], trained["refresh"]


def finish(run: RunBook, last: str, checkpoint: ArtifactRef, async_refresh: dict | None) -> dict:
    """The run's end: the results table, its result (chosen on the dev split; without one, the `last` model) recorded
    in latest.json, the plots, MLflow (metrics, checkpoints, registry and champion), the optional compression of the
    result, and the closing lines."""
    c, log = run.c, run.log
    summary, result = run.report()
    chosen = result["selected"] or last
    print(result["markdown"] if run.trial is None else f"[{run.trial.name}] its models:\n{result['markdown']}")
    reused = [s for s in log.timings if s.ref.cached]
    print(f"{len(reused)} of {len(log.timings)} stages reused (built by an earlier run, or earlier in this one)")
    # the report may be reused from a work folder that was since moved or copied: the folders are this run's
    stages = [s | {"path": t.ref.path, "cached": t.ref.cached}
              for s, t in zip(result["stages"], log.timings, strict=True)]
    final = run.models[chosen]
    # a hybrid result's checkpoint is its dense model's: that model is the champion candidate (its own dev score, so
    # champions compare like with like), and the fusion the run chose for it is recorded for `ance search --hybrid`
    hybrid = run.models.get(dense_of(chosen) + HYBRID, {})
    fusion = read_fusion(hybrid["fusion"]).as_dict() | {"bm25": c.bm25.model_dump(mode="json"),
                                                        "depth": c.eval.top_k, "result": chosen} \
        if "fusion" in hybrid else None
    if run.trial is None:
        record_latest(c.work_dir, final["checkpoint"], chosen,
                      next(r for r in result["results"] if r["model"] == chosen), fusion, run.dev_setting,
                      c.data.collection)
    plots = Path(c.work_dir) / "plots" / summary.digest  # the run's plots as files too, beside MLflow's copies
    plots.mkdir(parents=True, exist_ok=True)
    drawing = Path(tempfile.mkdtemp(dir=plots.parent, prefix=".drawing-"))  # a concurrent run draws its own
    package = run.retrieval_package(chosen) if is_hybrid(chosen) and run.trial is None else None
    compressing = c.compression is not None and run.trial is None  # (the parent ends once it is logged)
    tracked = run.track(result, drawing, (dense_of(chosen), final["checkpoint"]), async_refresh, retrieval=package,
                        end=not compressing)
    for png in drawing.iterdir():
        os.replace(png, plots / png.name)  # each file whole, whichever run renames last
    shutil.rmtree(drawing, ignore_errors=True)
    extra = {"async_refresh": async_refresh} if async_refresh is not None else {}
    if compressing:  # the chosen model, from the corpus encoding its evaluation
        compressed = compress_model(final["checkpoint"], final["encode"], run.data, c.compression, run.split,
                                    c.data.eval_split, c.encode, c.index, c.work_dir, run.eval)
        tracked["compression"] = log_compression(run.tracking.tracker, run.tracking.parent, compressed, c.compression,
                                                 c.data, run.tracking.tags) | {"table": compressed["table"]}
        extra["compression"] = {"table": compressed["table"], "files": compressed["files"],
                                "rows": public_rows(compressed["rows"])}
        run.tracking.tracker.end_run(run.tracking.parent)  # (a failure before: FAILED, by run.ended_on_failure)
        tracked |= run.tracking.tracker.summary()
    run.conclude(tracked, result, chosen)
    extra |= {"fusion": fusion} if fusion is not None else {}
    return result | extra | {"stages": stages, "selected": chosen, "final_checkpoint": final["checkpoint"].path,
                             "last_checkpoint": checkpoint.path, "report_dir": summary.path, "plots_dir": str(plots),
                             "negatives": run.negatives(), "tracking": tracked, "mlflow_run_id": tracked["run_id"],
                             "mlflow_uri": tracked["tracking_uri"]}


def negatives_in_use(refresh: dict, round_: int, first: ArtifactRef) -> ArtifactRef:
    """The negatives an asynchronous trainer was using when round `round_` ended."""
    end = round_ * refresh["steps_per_round"]
    swaps = [s for s in refresh["swaps"] if s["swapped_at_step"] <= end]
    if not swaps:
        return first
    return ArtifactRef(swaps[-1]["negatives"], Path(swaps[-1]["negatives"]).name)


@flow(name="retrain", flow_run_name=dataset_run_name, log_prints=True)
def retrain(config: PipelineConfig = PipelineConfig()) -> dict:
    """ANCE rounds from the champion model, `models:/ance-<dataset>@champion` in the MLflow registry (the scheduled
    deployment runs this).

    `config.start_checkpoint` overrides where it starts. Without a champion (nothing registered yet, or the tracking
    server unreachable) it starts from the newest model of the work folder (<work_dir>/latest.json), and without
    either it stops with a clear error.

    Args:
        config: The pipeline config of the rounds (a run's config replaces the deployment's whole config: give its
            retention too).
    """
    if config.warmup_only:  # (refused with start_checkpoint, which the user's form does not have: said here)
        raise AnceError("retrain trains ANCE rounds from the champion, and config.warmup_only is true: a trained "
                        "model has no warm-up to train; unset it (the bm25-warmup deployment trains a warm-up)")
    if config.selection == "cv":
        raise AnceError("retrain starts from the champion, and config.selection is cv: the champion was trained on "
                        "the other folds' dev queries, so their pooled scores would favour it; set selection best or "
                        "one-se")
    start, source = trained_checkpoint(config.work_dir, config.data.collection, config.start_checkpoint,
                                       "config.start_checkpoint")
    read_meta(start)  # a folder removed since it was recorded, or not a checkpoint: said before any work
    print(f"retraining from {source}: {start}")
    return ance_pipeline(config.model_copy(update={"start_checkpoint": start}))


def _print_staleness(refresh: dict) -> None:
    rows = ", ".join(f"round {r['round']}: mean {r['mean_staleness']} max {r['max_staleness']}"
                     for r in refresh["rounds"])
    swaps = ", ".join(f"step-{s['checkpoint_step']} negatives at step {s['swapped_at_step']}" for s in refresh["swaps"])
    print(f"async refresh: staleness of negatives in trainer steps ({rows}); trainer waited "
          f"{refresh['wait_seconds']} s; swaps: {swaps or 'none'}")
