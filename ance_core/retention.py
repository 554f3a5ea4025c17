"""What a work folder keeps: the garbage collection that removes the rest.

`plan_gc` decides, from the run records (ance_core/run_records.py) and the stage manifests (each names its inputs'
digests), what may go:

- **kept runs**: the stage folders the last `keep_runs` runs to finish used (every run's when unset): what a re-run
  of them reuses from the cache (a run records every stage it uses, built or reused, so their inputs are among them);
- **refreshes**: of each kept run, only the corpus encodings of its last `keep_refreshes` checkpoints (every one when
  unset) keep their big files: the `encode` folder, its `encode-shard` folders, the indexes built on it and the
  rankings searched in them (`retrieve`). Older refreshes go even though a kept run used them (its negatives,
  evaluations and checkpoints stay);
- **rankings** (`keep_rankings: false`): every ended run's `retrieve` folders go, the kept refreshes' too;
- **never removed**: the stages of a live run (its lock is held), the model `latest.json` names with its corpus
  encodings, their indexes, data and its BM25 index (what `ance search --model [--hybrid]` reads, whichever runs
  are kept), a stage folder no
  run recorded that is less than an hour old (built by another process for a live run: an inferencer deployment's
  refresh), stage folders no run recorded at all when `keep_runs` is unset, partial folders (a stage being built,
  or a killed training that resumes from them), and everything that is not a stage folder: the MLflow store
  (`mlflow.db`, `mlartifacts/`: registered model versions are copies there), plots, locks;
- **champion copies** (`champion/`, one downloaded per promotion for the retrains that start from it): with
  `keep_runs` set, only the newest (the one a retrain used last), one used in the last hour, one a kept or live run
  started from, and the model latest.json names stay (a removed one is downloaded again if a retrain needs it).

`collect` removes what the plan names, each folder under its stage's lock (a stage being built is skipped; one a run
took since the plan, or latest.json names since, is kept) and moved aside before it is deleted, so no reader sees half
a folder; what a killed gc left aside (`.gc-*`) the next one deletes. One gc runs at a time in a work folder.
"""

import json
import os
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import Field

from ance_core.artifacts import MANIFEST, waited_for
from ance_core.errors import warn
from ance_core.run_records import CHAMPION, mtime, protected_keys, run_records
from ance_core.stage_config import StageConfig

LATEST = "latest.json"


class RetentionConfig(StageConfig):
    """What a work folder keeps after each run (`ance gc` applies the same rules to a whole work folder). Unset keeps
    everything: every stage stays cached for re-runs. Scheduled retraining (the `retrain` deployment) sets both."""

    keep_runs: int | None = Field(None, ge=1, description="Keep the stage folders of the last N runs to finish in "
                                  "the work folder (and what they were built from); older runs' stages are removed. "
                                  "Unset: every run's")
    keep_refreshes: int | None = Field(
        None, ge=1, description="Of each kept run, keep the corpus encodings and indexes of its last N refreshes "
        "(one per checkpoint it encoded: the largest files of a work folder); the older ones are removed, the run's "
        "other stages stay. Unset: every refresh's")
    keep_rankings: bool = Field(
        True, description="Keep the dense rankings (`retrieve` folders) of the kept refreshes once their run has "
        "ended. false: they go too, as soon as the run ends: mining's ranking of every training query (500k x 200 "
        "rows, ~0.9 GB per refresh at MS MARCO's shape) is read once, by the mining it fed, whose negatives stay "
        "cached; a re-run of the run searches its index again")

    UNSAID = {"keep_rankings": True}  # (added after the whole config's digest existed: left out while it keeps them)

    @property
    def active(self) -> bool:
        return self.keep_runs is not None or self.keep_refreshes is not None or not self.keep_rankings


# ---------------------------------------------------------------- garbage collection


@dataclass(frozen=True)
class StageFolder:
    stage: str
    key: str
    path: Path
    inputs: dict[str, str]


@dataclass
class GcPlan:
    remove: list[StageFolder] = field(default_factory=list)
    keep: list[StageFolder] = field(default_factory=list)
    freed_bytes: int = 0  # what removing them frees (files hard-linked from a kept folder free nothing)

    def summary(self) -> dict:
        return {"removed": len(self.remove), "kept": len(self.keep), "freed_bytes": self.freed_bytes,
                "removed_by_stage": {s: sum(f.stage == s for f in self.remove)
                                     for s in sorted({f.stage for f in self.remove})}}


def stage_folders(work_dir: str | Path) -> dict[str, StageFolder]:
    """Every complete stage folder of a work folder, by key (its manifest names its stage and inputs)."""
    out, linked = {}, set()
    for manifest in Path(work_dir).glob(f"*/*/{MANIFEST}"):
        folder = manifest.parent
        if folder.name.startswith(".") or folder.is_symlink() or folder.parent.is_symlink():
            # (a link someone made is not the work folder's to remove, nor is what it points to: another work
            # folder's stages may be there too)
            linked |= {folder.parent.name} if folder.parent.is_symlink() else set()
            continue
        try:
            m = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if m.get("key") == folder.name and m.get("stage") == folder.parent.name:
            out[folder.name] = StageFolder(m["stage"], folder.name, folder, dict(m.get("inputs") or {}))
    if linked:
        warn(f"{work_dir}: {', '.join(f'{name}/' for name in sorted(linked))} "
             f"{'is a link' if len(linked) == 1 else 'are links'} (to another disk?): the stage folders in "
             f"{'it' if len(linked) == 1 else 'them'} are neither collected nor counted (another work folder's may be "
             "there too); link the whole work folder instead to have them collected")
    return out


def _refresh_of(folders: dict[str, StageFolder], encode_key: str) -> set[str]:
    """An encode folder, its shards' folders (same checkpoint and data), the indexes built on it and the rankings
    searched in them (a mining round's ranking of every training query: 500k × 200 rows, ~0.9 GB, at MS MARCO's
    shape)."""
    encode = folders[encode_key]
    indexes = {f.key for f in folders.values() if f.stage == "index" and f.inputs.get("embeddings") == encode_key}
    return {encode_key} | indexes | {
        f.key for f in folders.values()
        if (f.stage == "encode-shard" and f.inputs.get("checkpoint") == encode.inputs.get("checkpoint")
            and f.inputs.get("data") == encode.inputs.get("data"))
        or (f.stage == "retrieve" and f.inputs.get("index") in indexes)}


def _latest_search(folders: dict[str, StageFolder], work_dir: Path) -> set[str]:
    """What `ance search --model <the model latest.json names>` reads: the model, its corpus encodings (with their
    shards and indexes; not the rankings searched in them), the data they encoded and that data's BM25 index
    (`--hybrid` fuses with it: on a large corpus minutes to build again)."""
    try:
        record = json.loads((work_dir / LATEST).read_text())
        latest = Path(record["checkpoint"]).name
    except (OSError, KeyError, TypeError, ValueError):
        return set()
    keep = {latest} & set(folders)  # (a model that is no stage folder, the champion a retrain kept: its encodings)
    names = {record.get("digest"), latest if keep else None} - {None}
    for f in folders.values():
        if f.stage == "encode" and f.inputs.get("checkpoint") in names:
            keep |= {k for k in _refresh_of(folders, f.key) if folders[k].stage != "retrieve"}
            keep |= {f.inputs.get("data")} & set(folders)
    return keep | {f.key for f in folders.values() if f.stage == "bm25-index" and f.inputs.get("data") in keep}


GRACE_SECONDS = 3600  # a stage folder no run has recorded is kept this long: another process's (an inferencer
# deployment's refresh, a Ray worker's shard) that a live run has not read yet


def plan_gc(work_dir: str | Path, cfg: RetentionConfig, now: float | None = None) -> GcPlan:
    """What `collect` would remove under `cfg` (see the module docstring), and what it frees."""
    work_dir = Path(work_dir).resolve()
    folders = stage_folders(work_dir)
    ended, live = run_records(work_dir)
    kept_runs = ended if cfg.keep_runs is None else ended[-cfg.keep_runs:]
    recorded = {s["key"] for r in [*ended, *live] for s in r["stages"]}
    now = time.time() if now is None else now
    unrecorded = {k for k, f in folders.items()  # not recorded by any run: an older work folder's, or just built
                  if k not in recorded and (cfg.keep_runs is None or now - _built_at(f) < GRACE_SECONDS)}  # elsewhere
    keep = {s["key"] for r in kept_runs for s in r["stages"] if s["key"] in folders}
    for run in kept_runs:
        encodes = [s["key"] for s in run["stages"] if s["stage"] == "encode" and s["key"] in folders]
        for k, encode in enumerate(encodes):
            recent = cfg.keep_refreshes is None or k >= len(encodes) - cfg.keep_refreshes
            keep = keep | _refresh_of(folders, encode) if recent else keep - _refresh_of(folders, encode)
    for run in kept_runs:  # an encoding that is one of a kept run's last refreshes stays, whatever another run says
        encodes = [s["key"] for s in run["stages"] if s["stage"] == "encode" and s["key"] in folders]
        for encode in encodes[-cfg.keep_refreshes:] if cfg.keep_refreshes else encodes:
            keep |= _refresh_of(folders, encode)
    if not cfg.keep_rankings:  # ended runs' rankings: what they fed is built (a live run's stay, below)
        keep -= {s["key"] for r in ended for s in r["stages"] if s["stage"] == "retrieve"}
    keep |= _latest_search(folders, work_dir)  # (after the refreshes: the model a run delivers may be an early one's)
    keep |= unrecorded  # (after the refreshes too: a live run's shards of a new encoding are not an old refresh's)
    live_keys = {s["key"] for r in live for s in r["stages"] if s["key"] in folders}
    keep |= live_keys | {k for key in live_keys if folders[key].stage == "encode" for k in _refresh_of(folders, key)}
    plan = GcPlan(remove=sorted((f for k, f in folders.items() if k not in keep), key=lambda f: (f.stage, f.key)),
                  keep=[f for k, f in folders.items() if k in keep])
    if cfg.keep_runs is not None:  # (unset, every run's inputs stay: the champions they started from too)
        used = {s.get("folder") for r in [*kept_runs, *live] for s in r["stages"] if s["stage"] == CHAMPION}
        newest: set[str] = set()  # a model name whose newest copy was seen (the copies come newest first)
        for copy in _champion_copies(work_dir):
            model = CHAMPION_COPY.match(copy.key)["model"]
            kept = model not in newest or copy.key in used or _champion_in_use(copy, work_dir, now)
            newest.add(model)
            (plan.keep if kept else plan.remove).append(copy)
    plan.freed_bytes = _freed_bytes([f.path for f in plan.remove])
    return plan


CHAMPION_COPY = re.compile(r"^(?P<model>.+)-v\d+-[0-9a-z]{1,8}$")  # (tracking/registry.py `champion_folder`)


def _champion_copies(work_dir: Path) -> list[StageFolder]:
    """The champion copies a retrain downloaded (tracking/registry.py `champion_checkpoint`), newest first (it touches
    the copy it answers with), each keyed by its folder's name (a run records the copy it started from by that name
    too: ance_core/run_records.py `LiveRun.add`); not a link, nor a folder of another name."""
    root = work_dir / CHAMPION
    if not root.is_dir():
        return []
    copies = [p for p in root.iterdir() if CHAMPION_COPY.match(p.name) and p.is_dir() and not p.is_symlink()]
    return [StageFolder(CHAMPION, p.name, p, {}) for p in sorted(copies, key=lambda p: mtime(p, 0.0), reverse=True)]


def _champion_in_use(copy: StageFolder, work_dir: Path, now: float) -> bool:
    """A champion copy downloaded or reused in the last hour (a retrain about to record it: `champion_checkpoint`
    touches the copy it answers with), or the model latest.json names (a retrain whose result was its start; by the
    folder's name: a work folder moved since keeps the path it was written with)."""
    try:
        latest = Path(json.loads((work_dir / LATEST).read_text())["checkpoint"]).name
    except (OSError, KeyError, TypeError, ValueError):
        latest = None
    return now - mtime(copy.path, now) < GRACE_SECONDS or copy.path.name == latest


def _built_at(folder: StageFolder) -> float:
    return (folder.path / MANIFEST).stat().st_mtime


def _freed_bytes(paths: list[Path]) -> int:
    """Bytes the file system gets back when the folders go: a file counts once its every hard link is among them."""
    links: dict[tuple[int, int], list] = {}
    for folder in paths:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                entry = links.setdefault((st.st_dev, st.st_ino), [0, st.st_nlink, st.st_size])
                entry[0] += 1
    return sum(size for seen, nlink, size in links.values() if seen >= nlink)


def collect(work_dir: str | Path, cfg: RetentionConfig, dry_run: bool = False) -> GcPlan:
    """Remove the stage folders `plan_gc` names (unless `dry_run`); a folder whose stage is being built is skipped."""
    since = time.time()
    plan = plan_gc(work_dir, cfg)
    if dry_run:
        return plan
    work_dir = Path(work_dir).resolve()
    lock = FileLock(work_dir / ".locks" / "gc.lock")  # one gc at a time (each deletes what another left aside)
    with waited_for(lock, f"gc: another garbage collection of {work_dir} is running; waiting for it to finish "
                          f"({lock.lock_file})"):  # (said: a run at its end seemed hung)
        return _collect(work_dir, plan, since)


def _collect(work_dir: Path, plan: GcPlan, since: float) -> GcPlan:
    for aside in work_dir.glob("*/.gc-*"):  # what an earlier gc moved aside and could not delete (killed meanwhile)
        _delete(aside)
    folders = stage_folders(work_dir)
    locks = work_dir / ".locks"
    removed: dict[Path, StageFolder] = {}  # moved aside -> the folder it was
    for folder in plan.remove:
        champion = folder.stage == CHAMPION  # (under the lock its download and reuse take)
        lock = FileLock(folder.path.parent / f".{folder.path.name}.lock" if champion
                        else locks / f"{folder.stage}-{folder.key}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        try:  # what the plan did not know: a live run took it since (artifacts.run_stage), or a run that took it
            # ended meanwhile, or latest.json names it now (a champion copy: or a retrain was answered with it since)
            protected = protected_keys(work_dir, since)
            if folder.key in protected | _latest_search(folders, work_dir) or champion and (
                    _champion_in_use(folder, work_dir, time.time())):
                continue
            aside = folder.path.parent / f".gc-{folder.key}-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(folder.path, aside)  # no reader sees a stage folder without its files
            except FileNotFoundError:
                continue
            removed[aside] = folder
            if champion:  # (its registry tags, beside it)
                folder.path.with_name(f"{folder.path.name}.json").unlink(missing_ok=True)
        finally:
            lock.release()  # (the lock file stays: a run waiting on it holds its inode)
    plan.keep += [f for f in plan.remove if f not in removed.values()]
    plan.remove = list(removed.values())
    plan.freed_bytes = _freed_bytes(list(removed))  # what was removed, not what was planned
    for aside in removed:
        _delete(aside)
    return plan


def _delete(folder: Path) -> None:
    """Delete a folder gc moved aside; what cannot be deleted now is said, and the next gc tries again."""
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        warnings.warn(f"{folder}: could not be deleted whole (files in use, or no permission); the next gc tries "
                      "again", stacklevel=3)
