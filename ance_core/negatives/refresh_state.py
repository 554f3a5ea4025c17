"""The asynchronous trainer's side of the refresh (ANCE Fig. 2): which negatives it trains on, when it swaps in newer
ones, when it waits for them, and the staleness of every step, kept in `async_state.jsonl` of its training folder
(one line per event, appended: a step costs a line, not a rewrite of the whole history).

The inferencer (tasks/train_async.py) publishes each snapshot's negatives on a board: in the trainer's own process (one
training process) or, for DDP ranks started by torchrun, a file the task process writes (`FileBoard`) that rank 0
reads; rank 0 then tells the other ranks what to swap in, so every rank changes negatives at the same step.
"""

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch.distributed as dist

from ance_core.artifacts import ASYNC_STATE, ASYNC_STATE_V1, NEGATIVES, atomic_folder, write_json, write_text

READY_FILE = "async_ready.json"  # DDP: the task process's board (snapshot steps, ready negatives, errors)
SNAPSHOTS = "snapshots"  # DDP: rank 0 saves the model of each snapshot step here (step-N), for the task to publish


def snapshot_folder(out: Path, step: int) -> Path:
    """DDP: where rank 0 saves the model of snapshot step `step` in the training folder `out`."""
    return out / SNAPSHOTS / f"step-{step}"


class Board(Protocol):
    def read(self) -> tuple[dict[int, tuple[str, float]], set[int], list[str]]:
        """(snapshot step -> (negatives folder, seconds after the snapshot), snapshot steps published, errors)."""

    def wait(self, seconds: float) -> None:
        """Until the board may have changed, at most `seconds`."""


class MemoryBoard:
    """The board of one process: the inferencer threads post, the trainer reads."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.ready: dict[int, tuple[str, float]] = {}
        self.snapshots: set[int] = set()
        self.errors: list[str] = []
        self.mirror: Path | None = None  # DDP: also written to this file for rank 0

    def post(self, snapshot: int | None = None, ready: tuple[int, str, float] | None = None,
             error: str | None = None) -> None:
        with self.lock:
            if snapshot is not None:
                self.snapshots.add(snapshot)
            if ready is not None:
                self.ready[ready[0]] = (ready[1], ready[2])
            if error is not None:
                self.errors.append(error)
            if self.mirror is not None:
                write_json(self.mirror, {"ready": {str(k): v for k, v in self.ready.items()},
                                         "snapshots": sorted(self.snapshots), "errors": self.errors})
            self.lock.notify_all()

    def read(self) -> tuple[dict[int, tuple[str, float]], set[int], list[str]]:
        with self.lock:
            return dict(self.ready), set(self.snapshots), list(self.errors)

    def wait(self, seconds: float) -> None:
        with self.lock:
            self.lock.wait(timeout=seconds)


class FileBoard:
    """Rank 0's view of the task process's board. `saved` are the snapshots this trainer wrote: they count as pending
    before the task process has published them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.saved: set[int] = set()

    def read(self) -> tuple[dict[int, tuple[str, float]], set[int], list[str]]:
        try:
            board = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            board = {"ready": {}, "snapshots": [], "errors": []}
        ready = {int(k): (v[0], float(v[1])) for k, v in board["ready"].items()}
        return ready, set(board["snapshots"]) | self.saved, list(board["errors"])

    def wait(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.5))


def read_refresh_state(out: Path, first: str = "") -> dict:
    """The refresh state of the asynchronous trainer in training folder `out`: the negatives in use (`first` until a
    swap), swaps, waits and per-step staleness ([step, staleness]), folded from its event log. A line cut short by a
    kill ends the log there; a folder written before the log keeps its one JSON document (`async_state.json`)."""
    state = {"in_use": {"checkpoint_step": 0, "negatives": first}, "swaps": [], "waits": [], "staleness": []}
    log = out / ASYNC_STATE
    if not log.is_file():
        return json.loads((out / ASYNC_STATE_V1).read_text()) if (out / ASYNC_STATE_V1).is_file() else state
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            break
        _apply(state, event)
    return state


def _apply(state: dict, event: dict) -> None:
    if "staleness" in event:
        state["staleness"].append(event["staleness"])
    elif "swap" in event:
        state["swaps"].append(event["swap"])
        state["in_use"] = {"checkpoint_step": event["swap"]["checkpoint_step"], "negatives": event["swap"]["negatives"]}
    elif "wait" in event:
        state["waits"].append(event["wait"])


def _events(state: dict) -> list[dict]:
    """The event log that folds to `state` (in step order: a wait and a swap come before their step's staleness)."""
    timed = [(w["step"], 0, {"wait": w}) for w in state["waits"]]
    timed += [(s["swapped_at_step"], 1, {"swap": s}) for s in state["swaps"]]
    timed += [(step, 2, {"staleness": [step, n]}) for step, n in state["staleness"]]
    return [event for *_, event in sorted(timed, key=lambda t: t[:2])]


def _lines(events: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


class RefreshState:
    """The negatives in use, the swaps, waits and per-step staleness of an asynchronous trainer (`async_state.jsonl`
    in its training folder, appended each step: it survives a kill)."""

    def __init__(self, out: Path, first: str, max_staleness: int | None):
        self.out, self.first, self.max_staleness = out, first, max_staleness
        self.state = read_refresh_state(out, first)

    def _append(self, events: list[dict]) -> None:
        with open(self.out / ASYNC_STATE, "a") as log:
            log.write(_lines(events))

    def save(self) -> None:
        """The whole log anew (after a resume cut it back), as a new file."""
        write_text(self.out / ASYNC_STATE, _lines(_events(self.state)))
        (self.out / ASYNC_STATE_V1).unlink(missing_ok=True)

    def _newest_ready(self, ready: dict[int, tuple[str, float]]) -> int | None:
        newer = [s for s in ready if s > self.state["in_use"]["checkpoint_step"]]
        return max(newer) if newer else None

    def update(self, step: int, board: Board) -> str | None:
        """Before training step `step`: the folder of newer negatives to swap in (None: keep those in use). Waits
        when `max_staleness` is exceeded and a refresh is still pending; records the step's staleness."""
        events = []
        ready, snapshots, errors = board.read()
        in_use = self.state["in_use"]["checkpoint_step"]
        pending = [s for s in snapshots if s > in_use and s not in ready]
        if self.max_staleness is not None and step - in_use > self.max_staleness and pending \
                and self._newest_ready(ready) is None:
            started = time.time()
            while self._newest_ready(ready) is None and len(errors) + len(ready) < len(snapshots):
                board.wait(1.0)
                ready, snapshots, errors = board.read()
            events.append({"wait": {"step": step, "seconds": round(time.time() - started, 3)}})
        newest = self._newest_ready(ready)
        swapped = None
        if newest is not None:
            swapped, ready_after = ready[newest]
            events.append({"swap": {"checkpoint_step": newest, "swapped_at_step": step,
                                    "ready_after_s": round(ready_after, 2), "negatives": swapped}})
        for event in events:
            _apply(self.state, event)
        events.append({"staleness": [step, step - self.state["in_use"]["checkpoint_step"]]})
        _apply(self.state, events[-1])
        self._append(events)
        return swapped

    def resume(self, resumed_step: int) -> str | None:
        """After a restart at `resumed_step`: forget what came after it; the negatives that were in use then (None:
        the first ones)."""
        self.state["staleness"] = [s for s in self.state["staleness"] if s[0] < resumed_step]
        self.state["swaps"] = [s for s in self.state["swaps"] if s["swapped_at_step"] < resumed_step]
        self.state["waits"] = [w for w in self.state["waits"] if w["step"] < resumed_step]
        last = self.state["swaps"][-1] if self.state["swaps"] else {"checkpoint_step": 0, "negatives": self.first}
        self.state["in_use"] = {"checkpoint_step": last["checkpoint_step"], "negatives": last["negatives"]}
        self.save()
        in_use = self.state["in_use"]
        return in_use["negatives"] if in_use["checkpoint_step"] else None

    def reload(self) -> None:
        """What another process (rank 0) recorded."""
        self.state = read_refresh_state(self.out, self.first)


def rank_refresh(out: Path, spec: dict, main: bool, world: int
                 ) -> tuple[Callable[[int], pd.DataFrame | None], Callable[[int, Callable[[Path], None]], None]]:
    """A DDP rank's `negatives_update` and `on_snapshot` (training/loop.py `train`) for the asynchronous refresh of the
    training folder `out`. `spec`: first (the first negatives' folder), restored (those in use when the run was
    interrupted, or None), max_staleness. Rank 0 decides from the task's board and broadcasts the decision, so every
    rank swaps at the same step; it saves each snapshot for the task process to publish."""
    board = FileBoard(out / READY_FILE)
    state = RefreshState(out, spec["first"], spec["max_staleness"]) if main else None
    restored = [spec["restored"]] if spec.get("restored") else []

    def update(step: int) -> pd.DataFrame | None:
        decision = [state.update(step, board) if state is not None else None]
        if world > 1:
            dist.broadcast_object_list(decision, src=0)
        folder = decision[0] or (restored[0] if restored else None)
        restored.clear()
        return pd.read_parquet(Path(folder, NEGATIVES)) if folder else None

    def on_snapshot(step: int, save: Callable[[Path], None]) -> None:
        board.saved.add(step)
        with atomic_folder(snapshot_folder(out, step)) as folder:  # whole, or not there: the task waits for it
            save(folder)

    return update, on_snapshot
