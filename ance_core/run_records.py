"""The record of each run's stages in a work folder, which garbage collection (ance_core/retention.py) reads.

Every stage folder a run uses (built or reused) is recorded as the run goes, in `<work_dir>/.live/<id>.json`, beside
a lock the run holds (`live_run`); at its end the record moves to `<work_dir>/runs/<time>-<id>.json`. A record whose
lock nobody holds (the run was killed) counts as an ended run.
"""

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from ance_core.artifacts import ArtifactRef, stage_observers, write_json
from ance_core.errors import AnceError
from ance_core.work_folder import lock_held

RUNS, LIVE = "runs", ".live"
CHAMPION = "champion"  # <work_dir>/champion/<name>-v<N>-<run id>/: the registry's champion, downloaded to retrain from


class LiveRun:
    """The stages a run uses, recorded as it goes (`artifacts.run_stage` tells every live run of its work folder)."""

    def __init__(self, work_dir: str | Path, name: str):
        self.work_dir = Path(work_dir).resolve()
        self.id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        (self.work_dir / LIVE).mkdir(parents=True, exist_ok=True)
        self.path = self.work_dir / LIVE / f"{self.id}.json"
        self.lock = FileLock(self.work_dir / LIVE / f"{self.id}.lock")
        self.record = {"id": self.id, "name": name, "pid": os.getpid(), "started": time.time(), "stages": []}
        self._mutex = threading.Lock()  # stage tasks run in threads of the flow's process

    def add(self, stage: str, ref: ArtifactRef) -> None:
        if not Path(ref.path).resolve().is_relative_to(self.work_dir):
            return
        with self._mutex:  # (a champion copy is found by its folder's name: gc reads no checkpoint to match it)
            entry = {"stage": stage, "key": ref.digest} | ({"folder": Path(ref.path).name} if stage == CHAMPION else {})
            if entry not in self.record["stages"]:
                self.record["stages"].append(entry)
                self.record["updated"] = time.time()  # (a killed run's end: when it last recorded a stage)
                write_json(self.path, self.record)

    def finish(self) -> Path:
        """Move the record to runs/ (an ended run's)."""
        with self._mutex:
            self.record["finished"] = time.time()
            final = self.work_dir / RUNS / f"{self.id}.json"
            final.parent.mkdir(exist_ok=True)
            write_json(final, self.record)
            self.path.unlink(missing_ok=True)
        return final


@contextmanager
def live_run(work_dir: str | Path, name: str, keep: bool = True) -> Iterator[LiveRun]:
    """Record the stages of the block's run (see the module docstring); the record is kept if the block fails (a
    crash, a kill, an error after some stages: its re-run resumes from the stages it protects), not if it is refused
    before using any stage (an AnceError: bad input, said in one line; its record would count as the newest ended run,
    and `gc --keep-runs 1` would keep nothing of the last good one).
    `keep=False`: a part of another run (an asynchronous trainer's refresh, started on its own worker), protected
    while it works and never an ended run of its own afterwards, whether it succeeds or fails (the trainer's run
    records what it used; a leftover record would count as an ended run and take a `keep_runs` place). Killed, its
    record (marked `part`) is not counted as an ended run either (`run_records`)."""
    run = LiveRun(work_dir, name)
    if not keep:
        run.record["part"] = True
    run.lock.acquire()
    write_json(run.path, run.record)

    def observe(stage: str, ref: ArtifactRef) -> None:
        run.add(stage, ref)

    stage_observers.append(observe)
    try:
        yield run
        if keep:
            run.finish()
    except AnceError:
        if not run.record["stages"]:  # refused before it used any stage (else its re-run resumes from them)
            run.path.unlink(missing_ok=True)
        raise
    finally:
        if not keep:
            run.path.unlink(missing_ok=True)
        stage_observers.remove(observe)
        run.lock.release()
        Path(run.lock.lock_file).unlink(missing_ok=True)


def protected_keys(work_dir: Path, since: float) -> set[str]:
    """The stage keys live runs have recorded so far, and those of runs that ended at or after `since` (a run that
    started after a gc's plan, reused a folder it planned to remove, and ended meanwhile); a champion copy's folder
    name too."""
    ended, live = run_records(work_dir)
    return {s.get("folder") or s["key"] for r in [*live, *(r for r in ended if r.get("finished", 0) >= since)]
            for s in r["stages"]}


def read_record(path: Path) -> dict | None:
    """A run record, or None when it is gone (a part of another run removes its own) or is no run record (a file
    someone put there, or one cut short): such a file is passed over, never a reason for gc to fail."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(record, dict) and isinstance(record.get("id"), str)
          and isinstance(record.get("started"), (int, float)) and isinstance(record.get("stages"), list)
          and all(isinstance(s, dict) and {"stage", "key"} <= s.keys() for s in record["stages"]))
    return record if ok else None


def mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # (removed since it was read)
        return default


def run_records(work_dir: Path) -> tuple[list[dict], list[dict]]:
    """(ended runs, the one that finished last last; live runs): a `.live` record whose lock is free belongs to a run
    that was killed (ordered by when it last recorded a stage)."""
    live_paths = sorted((work_dir / LIVE).glob("*.json"))  # before runs/: a run ending meanwhile is in one of them
    ended = [r for p in sorted((work_dir / RUNS).glob("*.json")) if (r := read_record(p)) is not None]
    finished, live = {r["id"] for r in ended}, []
    for path in live_paths:
        if path.stem in finished:
            continue
        held = lock_held(path.with_suffix(".lock"))
        record = read_record(path)
        if record is None and not path.exists():  # it ended since runs/ was read: its record is there now (none
            record, held = read_record(work_dir / RUNS / path.name), False  # for a part of another run: it removes it)
        if record is not None and (held or not record.get("part")):  # (a killed part of another run is no run)
            if not held and "finished" not in record:  # killed: it ended when it last recorded a stage (its re-run
                # resumes from them), not when it started (a record of before `updated`: its file's time)
                record["finished"] = record.get("updated") or mtime(path, record["started"])
            (live if held else ended).append(record)
    # "the last N runs" are the last to finish: a long run that started before shorter ones keeps its place
    ended.sort(key=lambda r: (r.get("finished") or r["started"], r["started"]))
    return ended, live
