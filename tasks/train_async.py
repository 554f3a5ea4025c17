"""The asynchronous trainer (`refresh: async`): all ANCE rounds as one training run that keeps training while an
inferencer thread (or deployment) refreshes its negatives from its own recent checkpoints (ANCE Fig. 2, Appendix
A.1); its snapshots, their publication and its resume."""

import contextvars
import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pandas as pd
import torch
from prefect import get_run_logger

from ance_core.artifacts import (
    ASYNC_REFRESH,
    NEGATIVES,
    ArtifactRef,
    hold_refs,
    is_complete,
    read_manifest,
    run_stage,
    stage_key,
)
from ance_core.data.config import DataConfig
from ance_core.data.corpus import ParquetCorpus
from ance_core.data.dataset import read_tables
from ance_core.errors import AnceError
from ance_core.modeling.model import model_files
from ance_core.negatives.config import InferencerConfig, MiningConfig
from ance_core.negatives.mining import read_training_pairs
from ance_core.negatives.refresh_state import READY_FILE, SNAPSHOTS, MemoryBoard, RefreshState, snapshot_folder
from ance_core.retrieval.config import BM25Config, EncodeConfig, ExecutionConfig, IndexConfig
from ance_core.training.config import TrainConfig
from ance_core.training.distributed import FAULT_HOOK, launch
from ance_core.training.loop import train
from ance_core.training.plan import check_processes, planned_steps
from ance_core.training.ranks import inferencer_gpu
from ance_core.training.state import checkpoint_step, latest_checkpoint
from tasks.common import progress_artifact, running_task_runs, stage_task
from tasks.inferencer import DeploymentInferencer
from tasks.refresh import refresh_negatives
from tasks.train import ACCUMULATION_RULE, fault_callback, progress_callback
from tracking.live import live_callbacks


def _snapshot_config(step: int, trainer_key: str) -> tuple[dict, dict]:
    return {"step": step}, {"trainer": trainer_key}


def snapshot_ref(work_dir: str, trainer_key: str, step: int, trainer: Path | None = None) -> ArtifactRef:
    """The published checkpoint of an asynchronous trainer at a step (it must exist). `trainer`: the trainer's folder
    (its `.partial-` one while it trains), named by the error."""
    config, inputs = _snapshot_config(step, trainer_key)
    key = stage_key("snapshot", config, inputs)
    folder = Path(work_dir) / "snapshot" / key
    missing = AnceError(f"{folder}: the step-{step} checkpoint of trainer {trainer_key} is missing; delete "
                        f"{trainer or Path(work_dir) / 'train-async' / trainer_key} to train again")
    if not is_complete(folder):
        raise missing
    ref = ArtifactRef(str(folder), key, read_manifest(folder).get("seconds", 0.0), cached=True)
    if not hold_refs(ref):  # not built by run_stage here: recorded by the live run all the same, under its stage lock
        raise missing  # (removed by a gc since the check above)
    return ref


class AsyncNegatives:
    """The inferencer's side of the asynchronous refresh, and the trainer's when it trains in this process.

    At each snapshot step the current model is saved as its own stage folder and an inferencer thread runs
    encode -> index -> retrieve -> mine with it (Prefect tasks, cached and retried), posting the negatives on a board
    when they are ready. Before every step the trainer asks `update(step)` for newer negatives
    (ance_core.negatives.refresh_state: swaps, waits past `max_staleness`, every step's staleness, kept in
    `async_state.json`).
    DDP ranks read the board from a file instead (`ddp()`), and rank 0 keeps that state.
    """

    def __init__(self, out: Path, first: ArtifactRef, refresh_args: dict, trainer_key: str, work_dir: str,
                 max_staleness: int | None, steps_per_round: int, remote: DeploymentInferencer | None = None):
        self.out, self.refresh_args, self.trainer_key, self.work_dir = out, refresh_args, trainer_key, work_dir
        self.steps_per_round = steps_per_round
        self.remote = remote  # inferencer.mode deployment: flow runs on the inferencer's own workers
        self.logger = get_run_logger()
        self.trainer_gpus, self.warned_gpu = 1, False  # the training ranks' GPUs (`ddp`: world_size)
        self.board = MemoryBoard()
        self.threads: list[threading.Thread] = []
        self.refresh = RefreshState(out, first.path, max_staleness)

    def ddp(self) -> None:
        """The trainer is a group of DDP ranks: post the board to the file rank 0 reads."""
        self.board.mirror = self.out / READY_FILE
        self.board.post()

    def on_snapshot(self, step: int, save) -> None:
        ref = run_stage(self.work_dir, "snapshot", *_snapshot_config(step, self.trainer_key), save)
        self.publish(step, ref)

    def publish(self, step: int, snapshot: ArtifactRef) -> None:
        self.board.post(snapshot=step)
        started = time.time()
        context = contextvars.copy_context()  # the inferencer's tasks run as children of this task run

        def infer():
            round_ = step // self.steps_per_round + 1  # round k+1 is mined with round k's checkpoint, as in sync
            try:
                if self.remote is not None:  # its flow runs are subflows of this task's flow run in the UI
                    mined = context.run(self.remote.refresh, snapshot, step, round_, self.refresh_args, self.out,
                                        self.trainer_key)
                else:
                    gpu, shared = inferencer_gpu(torch.cuda.device_count(), self.trainer_gpus)
                    if gpu is not None:  # 1:1 allocation (paper A.3): the trainer's ranks keep their GPUs
                        torch.cuda.set_device(gpu)
                    if shared and not self.warned_gpu:
                        self.warned_gpu = True
                        self.logger.warning(shared)
                    mined = context.run(refresh_negatives, snapshot, round_=round_, **self.refresh_args)["mine"].path
            except Exception as e:  # the trainer goes on with the negatives it has; the run reports the failure
                self.logger.warning(f"refresh from the step-{step} checkpoint failed: {e}")
                self.board.post(error=f"step {step}: {e}")
                return
            if mined is None:  # deployment: training finished first and the flow run was cancelled
                return
            self.board.post(ready=(step, mined, time.time() - started))
            self.logger.info(f"negatives from the step-{step} checkpoint are ready after {time.time() - started:.0f} s")

        thread = threading.Thread(target=infer, name=f"inferencer-step-{step}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def update(self, step: int) -> pd.DataFrame | None:
        swapped = self.refresh.update(step, self.board)
        if swapped is None:
            return None
        self.logger.info(f"step {step}: swapped in negatives mined with the step-"
                         f"{self.refresh.state['in_use']['checkpoint_step']} checkpoint")
        return read_training_pairs(Path(swapped, NEGATIVES))

    def resume(self, resumed_step: int, snapshot_steps: list[int]) -> str | None:
        """After a restart: keep the negatives that were in use (their folder; None: the first ones), re-launch the
        refreshes not yet swapped in."""
        in_use = self.refresh.resume(resumed_step)
        for step in snapshot_steps:
            if step > resumed_step:
                continue
            saved = snapshot_folder(self.out, step)
            if saved.is_dir():  # DDP: rank 0 saved it; the task may have stopped before it published it
                self.on_snapshot(step, _copy_from(saved))
            elif step == resumed_step:  # stopped after the step's checkpoint, maybe before its snapshot was published:
                # the checkpoint resumed from is that model (published now unless it was: run_stage reuses it)
                self.on_snapshot(step, _model_files_from(latest_checkpoint(self.out)))
            else:
                self.publish(step, snapshot_ref(self.work_dir, self.trainer_key, step, self.out))
        return in_use

    def finish(self, rounds: int) -> dict:
        steps_per_round = self.steps_per_round
        if self.remote is not None:  # a refresh still running can no longer be used: its flow run is cancelled
            self.remote.stop()
        for thread in self.threads:
            thread.join()
        state = self.refresh.state
        per_round = []
        for k in range(rounds):
            first, last = k * steps_per_round, (k + 1) * steps_per_round
            values = [s for step, s in state["staleness"] if first <= step < last]
            per_round.append({"round": k + 1, "mean_staleness": round(sum(values) / len(values), 2) if values else 0,
                              "max_staleness": max(values, default=0)})
        return {"steps_per_round": steps_per_round, "rounds": per_round, "swaps": state["swaps"],
                "waits": state["waits"], "wait_seconds": round(sum(w["seconds"] for w in state["waits"]), 3),
                "refresh_errors": self.board.read()[2]}


def trainer_config(cfg: TrainConfig, split: str, rounds: int, encode: EncodeConfig, index: IndexConfig,
                   mining: MiningConfig, max_staleness: int | None, bm25: BM25Config) -> dict:
    """The train-async stage's config, in its key: what its refreshes encode, index and mine with, and the run's BM25
    when the sampler mines a BM25 ranking (tests/tasks/test_train_keys.py)."""
    config = {"train": cfg, "split": split, "rounds": rounds, "encode": encode, "index": index, "mining": mining,
              "max_staleness": max_staleness, "round": 1}  # seeded as round 1 (training/loop.py stage_seed)
    if cfg.grad_accumulation > 1:
        config["accumulation"] = ACCUMULATION_RULE
    if mining.spec.uses_bm25:  # (only then: the other samplers' keys are those of before)
        config["bm25"] = bm25.scoring()  # (the evaluation depth is in no key)
    return config


def _crash_task_runs_beside(reason: str) -> None:
    """Set Crashed the task runs of this task's flow run that are still Running or Pending, other than this one: a
    stopped process takes the inferencer's threads (daemons) down with it, and their task runs would stay Running on
    the server, where Prefect's own handler crashes only the flow run and the task run it was in.

    Two paths, as a task run's states reach the server by two: those running here are ended by a Crashed state event
    sent after their Running one (the server records a state only if newer, so a Running event it has not yet
    recorded cannot undo it: a busy server records events seconds late), and those the server knows as Running or
    Pending are set Crashed through its API. Best effort: the server may be going away too."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.context import TaskRunContext
    from prefect.states import Crashed
    from prefect.utilities.engine import emit_task_run_state_change_event

    context = TaskRunContext.get()
    if context is None:
        return
    log = logging.getLogger(__name__)
    for run in running_task_runs():
        if run.id == context.task_run.id or run.flow_run_id != context.task_run.flow_run_id:
            continue
        try:
            crashed = Crashed(message=reason)
            crashed.state_details.task_run_id, crashed.state_details.flow_run_id = run.id, run.flow_run_id
            emit_task_run_state_change_event(task_run=run, initial_state=run.state, validated_state=crashed)
        except Exception as e:  # noqa: BLE001
            log.warning(f"could not end the task run {run.name}: {e}")
    try:
        with get_client(sync_client=True) as client:
            running = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[context.task_run.flow_run_id])),
                task_run_filter=TaskRunFilter(state=TaskRunFilterState(
                    type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))))
            for run in running:
                if run.id != context.task_run.id:
                    client.set_task_run_state(run.id, Crashed(message=reason), force=True)
    except Exception as e:  # noqa: BLE001
        log.warning(f"could not end the refresh's task runs: {e}")


def _copy_from(saved: Path):
    """A snapshot stage's `save`: the model files rank 0 saved."""

    def save(folder: Path) -> None:
        shutil.copytree(saved, folder, dirs_exist_ok=True)

    return save


def _model_files_from(checkpoint: Path):
    """A snapshot stage's `save`: the model files of a resumable checkpoint (not its optimizer state)."""

    def save(folder: Path) -> None:
        for path in model_files(checkpoint):
            shutil.copy2(path, folder / path.name)

    return save


def _snapshot_watch(async_negatives: AsyncNegatives, out: Path, snapshot_steps: list[int], timeout: float = 600):
    """DDP: a launch callback that publishes each snapshot rank 0 saved (ance_core.training.distributed:
    `snapshots/step-N`, written after the step's log record) as the snapshot stage the inferencer encodes."""

    def watch(record: dict) -> None:
        step = record["step"]
        if step not in snapshot_steps:
            return
        saved = snapshot_folder(out, step)
        deadline = time.time() + timeout
        while not saved.is_dir():
            if time.time() > deadline:
                raise AnceError(f"{saved}: rank 0 logged step {step} but did not save its snapshot")
            time.sleep(0.2)
        async_negatives.on_snapshot(step, _copy_from(saved))

    return watch


@stage_task("train-async", ignore=("execution", "inferencer", "data_config"))
def train_async(checkpoint: ArtifactRef, negatives: ArtifactRef, data: ArtifactRef, split: str, cfg: TrainConfig,
                rounds: int, encode: EncodeConfig, index: IndexConfig, mining: MiningConfig,
                max_staleness: int | None, work_dir: str, execution: ExecutionConfig = ExecutionConfig(),
                inferencer: InferencerConfig = InferencerConfig(), data_config: DataConfig | None = None,
                bm25: BM25Config = BM25Config()) -> dict:
    """All ANCE rounds as one continuous training run (one optimizer, one LR schedule over rounds x the steps of a
    round) whose negatives are refreshed in the background from the checkpoint at the end of each round: by a thread
    of this task, or (`inferencer.mode: deployment`) by flow runs of the inferencer's deployment started for the
    dataset `data_config` (the one `data` was prepared from). `bm25`: the run's BM25 (a sampler that mines a BM25
    ranking, `ance+bm25`, mines the same as the synchronous rounds, from the run's one BM25 index).

    Returns the final checkpoint, the round snapshots (evaluated by the flow) and the staleness/wait record."""
    inputs = {"checkpoint": checkpoint.digest, "negatives": negatives.digest, "data": data.digest}
    config = trainer_config(cfg, split, rounds, encode, index, mining, max_staleness, bm25)
    bm25 = bm25.scoring()
    key = stage_key("train-async", config, inputs)
    report: dict = {}

    def build(out: Path):
        tables = read_tables(data.path, corpus_columns=[])  # the passages are read by row, as needed
        pairs = read_training_pairs(Path(negatives.path, NEGATIVES))
        per_round = planned_steps(len(pairs), cfg)
        snapshot_steps = [k * per_round for k in range(1, rounds)]
        refresh_args = dict(data=data, split=split, encode=encode, index=index, mining=mining, work_dir=work_dir,
                            execution=execution, train=cfg,  # a round's steps: a draw of negatives per epoch
                            bm25=bm25)
        remote = None
        if inferencer.mode == "deployment":
            if data_config is None:
                raise AnceError("inferencer.mode 'deployment' needs the data config to start the refresh flow runs")
            remote = DeploymentInferencer(inferencer, data_config, get_run_logger())
        async_negatives = AsyncNegatives(out, negatives, refresh_args, key, work_dir, max_staleness, per_round,
                                         remote)
        resumed = checkpoint_step(out)
        # (also from step 0: a run stopped before its first checkpoint left refreshes and staleness of its steps)
        in_use = async_negatives.resume(resumed, snapshot_steps)
        train_cfg = cfg.model_copy(update={"max_steps": per_round * rounds})
        bar = progress_artifact(per_round * rounds, f"training {rounds} ANCE rounds, negatives refreshed "
                                f"asynchronously: {per_round * rounds} steps")
        callbacks = [progress_callback(), lambda record: bar(record["step"]), *live_callbacks(),
                     fault_callback("train-async")]
        if cfg.world_size > 1:  # rank 0 reads the board from a file and saves the snapshots the task publishes
            check_processes(len(pairs), cfg)  # before the processes start
            async_negatives.ddp()
            async_negatives.trainer_gpus = cfg.world_size
            spec = {"checkpoint": checkpoint.path, "negatives": str(Path(negatives.path, NEGATIVES)),
                    "data": data.path, "split": split, "cfg": train_cfg.model_dump(mode="json"), "schedule": None,
                    "round": 1,
                    "async": {"snapshot_steps": snapshot_steps, "max_staleness": max_staleness,
                              "first": negatives.path, "restored": in_use}}
            watch = _snapshot_watch(async_negatives, out, snapshot_steps)
            summary = launch(spec, out, cfg.world_size, [*callbacks, watch],
                             resumed_step=resumed, env={FAULT_HOOK: "tasks.common"})
            async_negatives.refresh.reload()  # what rank 0 recorded
            shutil.rmtree(out / SNAPSHOTS, ignore_errors=True)
            (out / READY_FILE).unlink(missing_ok=True)
        else:
            restored = [in_use] if in_use is not None else []  # the negatives in use when interrupted

            def update(step: int) -> pd.DataFrame | None:
                table = async_negatives.update(step)
                if table is None and restored:
                    table = read_training_pairs(Path(restored[0], NEGATIVES))
                restored.clear()
                return table

            summary = train(checkpoint.path, pairs, ParquetCorpus.of_folder(data.path), tables.split_queries(split),
                            tables.relevant(split), train_cfg, out, callbacks=callbacks, negatives_update=update,
                            snapshot_steps=set(snapshot_steps), on_snapshot=async_negatives.on_snapshot, round_=1)
        bar.finish()
        report.update(async_negatives.finish(rounds))
        (out / ASYNC_REFRESH).write_text(json.dumps(report, indent=1))
        return summary | {"wait_seconds": report["wait_seconds"]}

    try:
        final = run_stage(work_dir, "train-async", config, inputs, build, resumable=True)
    except (Exception, GeneratorExit):
        raise
    except BaseException:  # stopped (SIGTERM, Ctrl-C): so are the inferencer threads' task runs
        _crash_task_runs_beside("the asynchronous trainer was stopped; its refresh ended with it")
        raise
    if not report:  # built before: read back what the run recorded
        report.update(json.loads((Path(final.path) / ASYNC_REFRESH).read_text()))
    per_round = report["steps_per_round"]
    refs = [snapshot_ref(work_dir, key, k * per_round) for k in range(1, rounds)]
    return {"checkpoint": final, "snapshots": refs, "refresh": report}
