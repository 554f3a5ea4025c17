"""Training on several processes with torch.distributed (DDP): `warmup.world_size` / `ance.world_size` = N.

What runs where:
- the training task (a Prefect task, one process) starts `torchrun --standalone --nproc-per-node N` (PyTorch's own
  launcher, torch.distributed.run) on this module with a JSON spec of the stage, and waits;
- each of the N ranks (`gloo` on CPU, `nccl` on CUDA with one GPU per rank) runs `ance_core.training.loop.train` on its
  slice of every global batch; `batch_size` stays the number of queries per optimizer step over all ranks, so a
  run's epochs, steps and learning-rate schedule do not depend on N;
- each rank reads the passages the stage's negatives name (not the whole corpus), from the data folder's
  corpus.parquet by row (ance_core/data/corpus.py; every rank derives the same rows from the id column), and
  tokenizes them once per stage: every rank holds the token tables of all the stage's pairs, not of its slice;
- in-batch negatives span the ranks: each rank all-gathers the others' query and passage embeddings and puts its own
  in their place with their gradient (DPR, tevatron), computes the loss of the whole batch and scales it by N for
  DDP's gradient average: N ranks x b queries train the objective of one process with N*b;
- rank 0 writes the training log, the checkpoints (with every rank's RNG state) and the result; the task tails the
  training log and feeds its records to the stage's callbacks (live MLflow metrics, progress, fault drills), so the
  run is logged once;
- a task that is stopped or fails stops the ranks; a re-run resumes every rank from the latest checkpoint.

Single node only (one machine, N processes). With `refresh: async` rank 0 reads the task's board of ready negatives
and broadcasts each swap (ance_core/negatives/refresh_state.py). The process-group helpers the
training loop uses (a rank's rows, the gathers, the RNG states) are in training/ranks.py.
"""

import ctypes
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ance_core.artifacts import TRAIN_LOG, write_text
from ance_core.data.corpus import ParquetCorpus
from ance_core.data.dataset import read_tables
from ance_core.errors import AnceError, warn
from ance_core.negatives.mining import read_training_pairs
from ance_core.negatives.refresh_state import rank_refresh
from ance_core.training.config import TrainConfig
from ance_core.training.loop import cut_log, train
from ance_core.training.plan import Schedule
from ance_core.training.ranks import process_group

FAULT_HOOK = "ANCE_FAULT_HOOK"  # a module each rank imports first (the pipeline passes tasks.common: ANCE_FAULT)
SPEC = "distributed.json"
RESULT = "distributed_result.json"


# ---------------------------------------------------------------- the launcher (the task's side)


try:  # resolved here, in the task's process: the forked child must not dlopen (another thread may hold its lock)
    _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def _die_with_parent() -> None:
    """Linux: the launcher gets SIGTERM (and stops its ranks) when the task's process dies, even by SIGKILL. Runs in
    the forked child before exec: one call of a function resolved before the fork."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class LogTail:
    """The records appended to a training log since the last read: reads from where it stopped (a poll costs the
    new lines, not the whole log), complete lines only. A log replaced or shrunk (rank 0 cuts it back to its
    checkpoint on a resume) is read again from its start; records at or before a step already seen are skipped."""

    def __init__(self, path: Path, seen: int = 0):
        self.path, self.seen, self.offset, self.inode = path, seen, 0, None

    def records(self) -> list[dict]:
        try:
            with open(self.path, "rb") as log:
                inode = os.fstat(log.fileno()).st_ino
                if inode != self.inode or log.seek(0, os.SEEK_END) < self.offset:
                    self.offset, self.inode = 0, inode  # a new log (rewritten on a resume) or one cut back
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits for the next poll
        self.offset += len(complete)
        records = [r for r in map(json.loads, complete.splitlines()) if r["step"] > self.seen]
        if records:
            self.seen = records[-1]["step"]
        return records


def rank_threads(world_size: int) -> dict[str, str]:
    """Each rank's share of this machine's cores, unless OMP_NUM_THREADS is set: torchrun sets it to 1 for several
    processes per node, and gloo ranks on a 16-core machine would train on one thread each."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(max(1, cores // world_size))}


def launch(spec: dict, out: Path, world_size: int, callbacks: Sequence[Callable[[dict], None]] = (),
           resumed_step: int = 0, env: dict[str, str] | None = None, poll_seconds: float = 0.5) -> dict:
    """Train the stage described by `spec` (what `train` takes, as paths; see `main`) on `world_size` processes
    started by torchrun, calling `callbacks` with each new training-log record; returns rank 0's training summary.

    A callback that raises stops the ranks and re-raises (the latest checkpoint stays in `out`). `env`: added to the
    ranks' environment."""
    if torch.cuda.is_available() and world_size > (gpus := torch.cuda.device_count()):
        # each rank takes GPU LOCAL_RANK (`main`): the ranks beyond the last GPU fail with "invalid device ordinal"
        raise AnceError(f"world_size {world_size} but this machine has {gpus} GPU(s): each training process takes a "
                        f"GPU of its own; set world_size to at most {gpus}, or hide the GPUs (CUDA_VISIBLE_DEVICES=) "
                        f"to train {world_size} processes on the CPU")
    out.mkdir(parents=True, exist_ok=True)
    if (summary := _summary(out)) is not None:  # an earlier launch whose ranks finished (the model saved, its
        # checkpoints gone) was stopped while the last records' callbacks ran: deliver the records past `resumed_step`
        # (with its checkpoints gone, the caller's 0: every record again), do not train again
        for record in LogTail(out / TRAIN_LOG, seen=resumed_step).records():
            for callback in callbacks:
                callback(record)
        (out / RESULT).unlink()
        (out / SPEC).unlink(missing_ok=True)
        return summary
    (out / RESULT).unlink(missing_ok=True)
    (out / SPEC).write_text(json.dumps(spec | {"out": str(out), "world_size": world_size}, indent=1))
    if (out / TRAIN_LOG).is_file():  # cut back here, as rank 0 will once it starts: the tail's first polls must not
        cut_log(out / TRAIN_LOG, resumed_step)  # read the killed attempt's steps after the checkpoint as new ones
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               "-m", "ance_core.training.distributed", str(out / SPEC)]
    proc = subprocess.Popen(command, start_new_session=True, preexec_fn=_die_with_parent,
                            env=os.environ | rank_threads(world_size) | (env or {}))
    tail = LogTail(out / TRAIN_LOG, seen=resumed_step)
    try:
        while True:
            finished = proc.poll() is not None
            for record in tail.records():
                for callback in callbacks:
                    callback(record)
            if finished:
                break
            time.sleep(poll_seconds)
    except BaseException:
        _stop(proc)
        raise
    summary = finished_summary(out, proc.returncode, world_size)
    (out / RESULT).unlink()
    (out / SPEC).unlink()
    return summary


def finished_summary(out: Path, returncode: int, world_size: int) -> dict:
    """Rank 0's training summary, written once the trained model was saved and its checkpoints removed. With a
    summary, a failing exit status is the ranks' teardown (a crash at exit): the training is kept, with a warning (an
    error would retrain it from step 0: its checkpoints are gone). Without one, the training failed."""
    if (summary := _summary(out)) is None:
        raise AnceError(f"distributed training on {world_size} processes failed (torchrun exit status "
                        f"{returncode}; the ranks' errors are in the log above); a re-run resumes from the "
                        f"latest checkpoint in {out}")
    if returncode != 0:
        warn(f"distributed training on {world_size} processes ended with torchrun exit status {returncode} after "
             f"rank 0 saved the trained model and its summary (a failure at the ranks' exit; their errors are in the "
             f"log above): the trained model in {out} is kept")
    return summary


def _summary(out: Path) -> dict | None:
    """Rank 0's training summary in `out`, None where there is none (written whole or not at all: `main`)."""
    try:
        return json.loads((out / RESULT).read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- a rank (torchrun's side)


def main(spec_path: str) -> None:
    if hook := os.environ.get(FAULT_HOOK):
        importlib.import_module(hook)  # a drill: the module that installs the fault points' hook
    spec = json.loads(Path(spec_path).read_text())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # async: rank 0 may wait for a refresh (max_staleness) while the others wait in its broadcast: a corpus encoding
    # at MS MARCO's size outlasts the default collective timeout (10-30 min). A rank that dies still ends the group
    # at once (torchrun stops the others).
    timeout = {"timeout": timedelta(hours=24)} if spec.get("async") else {}
    with process_group("nccl" if torch.cuda.is_available() else "gloo", **timeout):
        summary = _train_rank(spec)  # (its DDP model freed on return, before the group is destroyed)
        if dist.get_rank() == 0:
            write_text(Path(spec["out"]) / RESULT, json.dumps(summary))  # (whole or not there: `finished_summary`)


def _train_rank(spec: dict) -> dict:
    """This rank's part of the training stage `spec` describes; its summary."""
    tables = read_tables(spec["data"], corpus_columns=[])  # the passages are read by row, as needed
    pairs = read_training_pairs(spec["negatives"])
    schedule = Schedule(**spec["schedule"]) if spec.get("schedule") else None
    out = Path(spec["out"])
    hooks = {}
    if spec.get("async"):  # the asynchronous refresh: negatives from the task's inferencer, snapshots for it
        update, on_snapshot = rank_refresh(out, spec["async"], dist.get_rank() == 0, dist.get_world_size())
        hooks = {"negatives_update": update, "on_snapshot": on_snapshot,
                 "snapshot_steps": set(spec["async"]["snapshot_steps"])}
    return train(spec["checkpoint"], pairs, ParquetCorpus.of_folder(spec["data"]),
                 tables.split_queries(spec["split"]), tables.relevant(spec["split"]),
                 TrainConfig.model_validate(spec["cfg"]), out, schedule=schedule, round_=spec.get("round", 0),
                 **hooks)


if __name__ == "__main__":
    main(sys.argv[1])
