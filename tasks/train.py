"""Training tasks: one synchronous round, or the asynchronous trainer that keeps training while an inferencer
thread refreshes its negatives from its own recent checkpoints (ANCE Fig. 2, Appendix A.1)."""

import contextvars
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

import pandas as pd
import torch
from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from ance_core.artifacts import (
    ASYNC_REFRESH,
    ASYNC_STATE,
    NEGATIVES,
    ArtifactRef,
    is_complete,
    read_manifest,
    run_stage,
    stage_key,
)
from ance_core.config import EncodeConfig, ExecutionConfig, IndexConfig, MiningConfig, TrainConfig
from ance_core.data import read_tables
from ance_core.distributed import FAULT_HOOK, launch
from ance_core.errors import AnceError
from ance_core.train import Schedule, continuous_schedules, latest_checkpoint, planned_steps, train
from tasks.common import inject_fault, stage_task
from tasks.refresh import refresh_negatives
from tracking.live import live_callbacks


def _fault_callback(name: str):
    return lambda record: inject_fault(name, step=record["step"])


def _progress_callback(every: int = 10):
    """Training progress in the task's Prefect log (the UI shows it; tqdm's bar only reaches the terminal); outside a
    task run (`train_round.fn`, the benchmarks) in the standard logger `ance`."""
    try:
        logger = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger("ance")

    def log(record: dict) -> None:
        if record["step"] % every == 0:
            logger.info(f"step {record['step']}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, "
                        f"grad norm {record['grad_norm']:.2f}, {record['examples_per_s']:.1f} examples/s")

    return log


@stage_task("train")
def train_round(checkpoint: ArtifactRef, negatives: ArtifactRef, data: ArtifactRef, split: str, cfg: TrainConfig,
                work_dir: str, schedule: Schedule | None = None) -> ArtifactRef:
    """Train from a checkpoint on mined negatives (within a shared learning-rate `schedule`, if given); a retried or
    re-run task resumes from its last checkpoint."""

    def build(out):
        callbacks = [_progress_callback(), *live_callbacks(), _fault_callback("train")]
        if cfg.world_size > 1:
            spec = {"checkpoint": checkpoint.path, "negatives": str(Path(negatives.path, NEGATIVES)),
                    "data": data.path, "split": split, "cfg": cfg.model_dump(mode="json"),
                    "schedule": dataclasses.asdict(schedule) if schedule is not None else None}
            resumed = latest_checkpoint(out)
            return launch(spec, out, cfg.world_size, callbacks, resumed_step=int(resumed.name[5:]) if resumed else 0,
                          env={FAULT_HOOK: "tasks.common"})
        tables = read_tables(data.path)
        pairs = pd.read_parquet(Path(negatives.path, NEGATIVES))
        return train(checkpoint.path, pairs, tables.corpus, tables.queries, tables.relevant(split), cfg, out,
                     callbacks=callbacks, schedule=schedule)

    inputs = {"checkpoint": checkpoint.digest, "negatives": negatives.digest, "data": data.digest}
    config = {"train": cfg, "split": split} | ({"schedule": schedule} if schedule is not None else {})
    return run_stage(work_dir, "train", config, inputs, build, resumable=True)


class SchedulePlan:
    """The learning-rate schedule of each training stage of a run, in order: None (each stage its own) or, for
    `schedule: continuous`, its part of one schedule over all of them (ance_core.train.Schedule). The step counts come
    from the first stage's negatives (one row per training pair, whatever the sampler)."""

    def __init__(self, mode: str, stages: list[TrainConfig], resume_first: bool = False):
        self.mode, self.stages, self.resume_first = mode, stages, resume_first
        self.planned: list[Schedule] | None = None

    def next(self, negatives: ArtifactRef) -> Schedule | None:
        if self.mode != "continuous" or not self.stages:
            return None
        if self.planned is None:
            pairs = read_manifest(negatives.path)["summary"]["pairs"]
            steps = [planned_steps(pairs, cfg) for cfg in self.stages]
            self.planned = continuous_schedules(steps, self.stages[0].warmup_ratio, self.resume_first)
        return self.planned.pop(0)


def _snapshot_config(step: int, trainer_key: str) -> tuple[dict, dict]:
    return {"step": step}, {"trainer": trainer_key}


def snapshot_ref(work_dir: str, trainer_key: str, step: int) -> ArtifactRef:
    """The published checkpoint of an asynchronous trainer at a step (it must exist)."""
    config, inputs = _snapshot_config(step, trainer_key)
    key = stage_key("snapshot", config, inputs)
    folder = Path(work_dir) / "snapshot" / key
    if not is_complete(folder):
        raise AnceError(f"{folder}: the step-{step} checkpoint of trainer {trainer_key} is missing; delete "
                        f"{Path(work_dir) / 'train-async' / trainer_key} to train again")
    return ArtifactRef(str(folder), key, read_manifest(folder).get("seconds", 0.0), cached=True)


class AsyncNegatives:
    """The trainer's side of the asynchronous refresh.

    At each snapshot step the current model is saved as its own stage folder and an inferencer thread runs
    encode -> index -> retrieve -> mine with it (Prefect tasks, cached and retried). Before every step the trainer
    asks `update(step)` for newer negatives and swaps them in as soon as they are ready; it waits only when
    `max_staleness` is set and exceeded. Every step's staleness (steps since the checkpoint that produced the
    negatives in use) and every wait are recorded; the state survives a kill in `async_state.json`.
    """

    def __init__(self, out: Path, first: ArtifactRef, refresh_args: dict, trainer_key: str, work_dir: str,
                 max_staleness: int | None, steps_per_round: int):
        self.out, self.refresh_args, self.trainer_key, self.work_dir = out, refresh_args, trainer_key, work_dir
        self.steps_per_round = steps_per_round
        self.max_staleness = max_staleness
        self.logger = get_run_logger()
        self.lock = threading.Condition()
        self.ready: dict[int, tuple[ArtifactRef, float]] = {}  # snapshot step -> (negatives, seconds after snapshot)
        self.threads: list[threading.Thread] = []
        self.snapshots: dict[int, ArtifactRef] = {}
        self.errors: list[str] = []
        state_file = out / ASYNC_STATE
        self.state = json.loads(state_file.read_text()) if state_file.is_file() else {
            "in_use": {"checkpoint_step": 0, "negatives": first.path},
            "swaps": [], "waits": [], "staleness": [],
        }

    def _save_state(self) -> None:
        tmp = self.out / f".{ASYNC_STATE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.out / ASYNC_STATE)

    def on_snapshot(self, step: int, save) -> None:
        ref = run_stage(self.work_dir, "snapshot", *_snapshot_config(step, self.trainer_key), save)
        self.publish(step, ref)

    def publish(self, step: int, snapshot: ArtifactRef) -> None:
        self.snapshots[step] = snapshot
        started = time.time()
        context = contextvars.copy_context()  # the inferencer's tasks run as children of this task run

        def infer():
            if torch.cuda.device_count() > 1:  # 1:1 allocation (paper A.3): the trainer keeps GPU 0
                torch.cuda.set_device(torch.cuda.device_count() - 1)
            try:
                # round k+1 is mined with round k's checkpoint, as in the synchronous pipeline
                round_ = step // self.steps_per_round + 1
                result = context.run(refresh_negatives, snapshot, round_=round_, **self.refresh_args)
            except Exception as e:  # the trainer goes on with the negatives it has; the run reports the failure
                self.logger.warning(f"refresh from the step-{step} checkpoint failed: {e}")
                with self.lock:
                    self.errors.append(f"step {step}: {e}")
                    self.lock.notify_all()
                return
            with self.lock:
                self.ready[step] = (result["mine"], time.time() - started)
                self.lock.notify_all()
            self.logger.info(f"negatives from the step-{step} checkpoint are ready after {time.time() - started:.0f} s")

        thread = threading.Thread(target=infer, name=f"inferencer-step-{step}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _newest_ready(self) -> int | None:
        newer = [s for s in self.ready if s > self.state["in_use"]["checkpoint_step"]]
        return max(newer) if newer else None

    def update(self, step: int) -> pd.DataFrame | None:
        with self.lock:
            in_use = self.state["in_use"]["checkpoint_step"]
            pending = [s for s in self.snapshots if s > in_use and s not in self.ready]
            if self.max_staleness is not None and step - in_use > self.max_staleness and pending \
                    and self._newest_ready() is None:
                started = time.time()
                while self._newest_ready() is None and len(self.errors) + len(self.ready) < len(self.snapshots):
                    self.lock.wait(timeout=1.0)
                self.state["waits"].append({"step": step, "seconds": round(time.time() - started, 3)})
            newest = self._newest_ready()
            table = None
            if newest is not None:
                negatives, ready_after = self.ready[newest]
                table = pd.read_parquet(Path(negatives.path, NEGATIVES))
                self.state["swaps"].append({"checkpoint_step": newest, "swapped_at_step": step,
                                            "ready_after_s": round(ready_after, 2), "negatives": negatives.path})
                self.state["in_use"] = {"checkpoint_step": newest, "negatives": negatives.path}
                self.logger.info(f"step {step}: swapped in negatives mined with the step-{newest} checkpoint")
            self.state["staleness"].append([step, step - self.state["in_use"]["checkpoint_step"]])
            self._save_state()
            return table

    def resume(self, resumed_step: int, snapshot_steps: list[int]) -> pd.DataFrame | None:
        """After a restart: keep the negatives that were in use, re-launch refreshes not yet swapped in."""
        self.state["staleness"] = [s for s in self.state["staleness"] if s[0] < resumed_step]
        self.state["swaps"] = [s for s in self.state["swaps"] if s["swapped_at_step"] < resumed_step]
        self.state["waits"] = [w for w in self.state["waits"] if w["step"] < resumed_step]
        if self.state["swaps"]:
            last = self.state["swaps"][-1]
            self.state["in_use"] = {"checkpoint_step": last["checkpoint_step"], "negatives": last["negatives"]}
        for step in snapshot_steps:
            if step <= resumed_step:
                self.publish(step, snapshot_ref(self.work_dir, self.trainer_key, step))
        in_use = self.state["in_use"]
        return pd.read_parquet(Path(in_use["negatives"], NEGATIVES)) if in_use["checkpoint_step"] else None

    def finish(self, rounds: int) -> dict:
        steps_per_round = self.steps_per_round
        for thread in self.threads:
            thread.join()
        per_round = []
        for k in range(rounds):
            first, last = k * steps_per_round, (k + 1) * steps_per_round
            values = [s for step, s in self.state["staleness"] if first <= step < last]
            per_round.append({"round": k + 1, "mean_staleness": round(sum(values) / len(values), 2) if values else 0,
                              "max_staleness": max(values, default=0)})
        return {"steps_per_round": steps_per_round, "rounds": per_round, "swaps": self.state["swaps"],
                "waits": self.state["waits"], "wait_seconds": round(sum(w["seconds"] for w in self.state["waits"]), 3),
                "refresh_errors": self.errors}


@stage_task("train-async", ignore=("execution",))
def train_async(checkpoint: ArtifactRef, negatives: ArtifactRef, data: ArtifactRef, split: str, cfg: TrainConfig,
                rounds: int, encode: EncodeConfig, index: IndexConfig, mining: MiningConfig,
                max_staleness: int | None, work_dir: str, execution: ExecutionConfig = ExecutionConfig()) -> dict:
    """All ANCE rounds as one continuous training run (one optimizer, one LR schedule over rounds x the steps of a
    round) whose negatives are refreshed in the background from the checkpoint at the end of each round.

    Returns the final checkpoint, the round snapshots (evaluated by the flow) and the staleness/wait record."""
    inputs = {"checkpoint": checkpoint.digest, "negatives": negatives.digest, "data": data.digest}
    config = {"train": cfg, "split": split, "rounds": rounds, "encode": encode, "index": index, "mining": mining,
              "max_staleness": max_staleness}
    key = stage_key("train-async", config, inputs)
    report: dict = {}

    def build(out: Path):
        tables = read_tables(data.path)
        pairs = pd.read_parquet(Path(negatives.path, NEGATIVES))
        per_round = planned_steps(len(pairs), cfg)
        snapshot_steps = [k * per_round for k in range(1, rounds)]
        refresh_args = dict(data=data, split=split, encode=encode, index=index, mining=mining, work_dir=work_dir,
                            execution=execution)
        async_negatives = AsyncNegatives(out, negatives, refresh_args, key, work_dir, max_staleness, per_round)
        resumed = latest_checkpoint(out)
        first_table = None
        if resumed is not None:
            first_table = async_negatives.resume(int(resumed.name[5:]), snapshot_steps)
        restored = [first_table] if first_table is not None else []  # the negatives in use when interrupted

        def update(step: int) -> pd.DataFrame | None:
            table = async_negatives.update(step)
            if table is None and restored:
                table = restored[0]
            restored.clear()
            return table

        summary = train(checkpoint.path, pairs, tables.corpus, tables.queries, tables.relevant(split),
                        cfg.model_copy(update={"max_steps": per_round * rounds}), out,
                        callbacks=[_progress_callback(), *live_callbacks(), _fault_callback("train-async")],
                        negatives_update=update,
                        snapshot_steps=set(snapshot_steps), on_snapshot=async_negatives.on_snapshot)
        report.update(async_negatives.finish(rounds))
        (out / ASYNC_REFRESH).write_text(json.dumps(report, indent=1))
        return summary | {"wait_seconds": report["wait_seconds"]}

    final = run_stage(work_dir, "train-async", config, inputs, build, resumable=True)
    if not report:  # built before: read back what the run recorded
        report.update(json.loads((Path(final.path) / ASYNC_REFRESH).read_text()))
    per_round = report["steps_per_round"]
    refs = [snapshot_ref(work_dir, key, k * per_round) for k in range(1, rounds)]
    return {"checkpoint": final, "snapshots": refs, "refresh": report}
