"""Stage folders named by a digest of (stage, config, input digests), written atomically.

A stage builds into `<work_dir>/<stage>/.partial-<key>/` and renames it to `<work_dir>/<stage>/<key>/` only
after its manifest is written, so a half-written folder is never visible to a later stage or a cache.
Resumable stages (training) keep the partial folder across failures and pick up their last checkpoint.

Concurrent runs: a stage holds a file lock per key (`<work_dir>/.locks/<stage>-<key>.lock`, `filelock`) while it
checks for and builds its folder, so a second run of the same stage waits and then reuses the first one's result
instead of building into the same partial folder. The operating system releases the lock of a killed process.

A folder that is not a stage (a flow's result files) is written the same way with `atomic_folder`.

The names of the files that one stage writes and others read are defined here, once (see "Stage file names").
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from filelock import FileLock, Timeout
from pydantic import BaseModel

import ance_core
from ance_core.errors import AnceError, DamagedStage, collect_warnings
from ance_core.stage_config import KEY_DUMP

MANIFEST = "manifest.json"

# Stage file names: what a stage folder holds, for the stages (and flows) that read another stage's files.
EMBEDDINGS, EMBEDDING_SHARDS = "emb_{:05d}.npy", "emb_*.npy"  # encode / compress: float32 (rows, h) shard n, in order
DOCIDS = "docids.txt"  # encode / compress: one doc id per line, in the order of the concatenated shards
WINDOWS = "windows.txt"  # encode (MaxP): the window number of each row
INDEX = "index"  # index: the faiss index file (flat, HNSW or IVF-PQ)
INDEX_DOCIDS = "docid"  # index: the doc id of each index row (pyserini's name)
INDEX_WINDOWS = "window"  # index (MaxP): the window number of each index row
RUN = "run.parquet"  # retrieve / bm25-run: (query_id, doc_id, rank, score[, window])
POSITIVE_SCORES = "positive_scores.parquet"  # retrieve: every labelled positive's exact score, retrieved or not
NEGATIVES = "negatives.parquet"  # mine: (query, positive, negative ids, ranks, scores) per training pair
CANDIDATES = "candidates.parquet"  # dev-candidates: (query_id, doc_id) of each dev query a stage's dev checks rank
TRAIN_LOG = "train_log.jsonl"  # train / train-async / compress (ConAE): one JSON line per optimizer step
ASYNC_STATE = "async_state.jsonl"  # train-async: the refresh state as events (swaps, waits, staleness per step)
ASYNC_STATE_V1 = "async_state.json"  # the same as one JSON document rewritten every step (folders from before the log)
ASYNC_REFRESH = "async_refresh.json"  # train-async: the refresh record of the finished run
METRICS = "metrics.json"  # evaluate: the split's metrics
PER_QUERY = "per_query.parquet"  # evaluate: each query's metrics
RUN_TREC = "run.trec"  # evaluate: the run in TREC format
STATS = "stats.json"  # negative-stats: the statistics of a set of mined negatives
PROFILE = "profile.npy"  # score-profile: the top-k score profile of a query sample
RESULTS_JSON, RESULTS_MD = "results.json", "results.md"  # report: the results table's data, and as markdown
# the compression flow's result folder: the table's rows (JSON, CSV) and the table (markdown)
COMPRESSION_JSON, COMPRESSION_CSV, COMPRESSION_MD = "compression.json", "compression.csv", "compression.md"


@dataclass(frozen=True)
class ArtifactRef:
    """What a stage hands to the next one: where its folder is and the digest that names it."""

    path: str
    digest: str
    seconds: float = 0.0  # wall time of the build that produced the folder
    cached: bool = False  # True when an existing complete folder was reused


def canonical_json(obj: Any) -> str:
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json", context=KEY_DUMP)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest_of(obj: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# Each stage's rule: bump it when a change alters what the stage writes for the same config and inputs (otherwise
# its key stays, and a folder the old code built is handed out as the new code's). 0 adds nothing to the key (the
# keys from before the rules); tests/core/test_stage_keys.py pins this table, every stage name the code builds, and
# a key per stage, so a change of output meets a failing test until its rule is bumped on purpose, and says why each
# was (issue 41 changed the keys of the inputs that were missing: a teacher's content, SimANS under a margin).
STAGE_RULES: dict[str, int] = {
    "data": 5, "bm25-index": 0, "bm25": 0, "model": 0, "encode": 0, "encode-shard": 0, "index": 0, "retrieve": 0,
    "query-embeddings": 0, "mine": 1, "negative-stats": 0, "score-profile": 0, "train": 1, "train-async": 1,
    "snapshot": 0, "dev-candidates": 0, "evaluate": 1, "fusion": 3, "fuse": 3, "serving": 0, "reports": 0,
    "compress": 1, "trial": 0, "tune": 0, "corpus": 3,
}


def stage_key(stage: str, config: Any, inputs: Mapping[str, str]) -> str:
    key = {"stage": stage, "config": config, "inputs": dict(inputs), "version": ance_core.__version__}
    return digest_of(key | ({"rule": rule} if (rule := STAGE_RULES.get(stage, 0)) else {}))


def shard_paths(folder: str | Path) -> list[Path]:
    """An encode folder's emb_<k>.npy shards in their order: by k (emb_100000 after emb_99999; by name it would sort
    before emb_10001, and its rows would meet another shard's ids)."""
    return sorted(Path(folder).glob(EMBEDDING_SHARDS), key=lambda path: int(path.stem.rsplit("_", 1)[-1]))


def id_lines(path: str | Path) -> list[str]:
    """The ids of a file that holds one per line ("\n"-joined, docids.txt): split on "\n" alone (str.splitlines also
    splits on \r, \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029, and one id holding one would shift every later id
    onto the wrong vectors; the data readers refuse such ids, ance_core/data/lines.py)."""
    text = Path(path).read_text(encoding="utf-8")
    return text.removesuffix("\n").split("\n") if text else []


def is_complete(folder: str | Path) -> bool:
    """A stage folder whose manifest (written last) is readable: one cut short by a crash is built again."""
    try:
        read_manifest(folder)
    except (OSError, ValueError):
        return False
    return True


def read_manifest(folder: str | Path) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        if isinstance(manifest := json.loads((Path(folder) / MANIFEST).read_text()), dict):
            return manifest
    raise DamagedStage(f"{folder}: a damaged stage folder (its {MANIFEST} cannot be read: cut short by a crash, or an "
                       "interrupted copy); remove it, and the run that needs it builds it again")


# called with (stage, ref) for every stage folder `run_stage` hands out, built or reused: the live runs' records of the
# stages they use (ance_core/run_records.py), which garbage collection never removes
stage_observers: list[Callable[[str, "ArtifactRef"], None]] = []


def run_stage(
    work_dir: str | Path,
    stage: str,
    config: Any,
    inputs: Mapping[str, str],
    build: Callable[[Path], Mapping[str, Any] | None],
    resumable: bool = False,
) -> ArtifactRef:
    """Return the stage's folder, building it with `build(tmp_dir)` unless a complete one exists.

    `build` writes its files into the temporary folder and may return a small summary for the manifest. What it
    warns about (`ance_core.errors.warn`) is kept in the manifest (`warnings`), so a reused stage still reports it.
    """
    key = stage_key(stage, config, inputs)
    final = Path(work_dir) / stage / key
    if read_only(work_dir):  # (a read-only mount or shared copy: no run builds or collects there, so no lock)
        if is_complete(final):
            return _reused(final, stage, key)
        from ance_core.errors import AnceError

        raise AnceError(f"work_dir {work_dir}: read-only, and it holds no {stage} stage {key} to reuse; give a work "
                        "folder you can write to")
    locks = Path(work_dir) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock = FileLock(locks / f"{stage}-{key}.lock")
    if is_complete(final):
        # observed under the stage's lock, which garbage collection holds while it decides and removes
        # (retention.collect): either this run's record names the folder first and it stays, or it is gone first and
        # is built again below
        with lock:
            if is_complete(final):
                return _reused(final, stage, key)
    with waited_for(lock, f"{stage} {key}: another run is building it; waiting for it to finish ({lock.lock_file})"):
        ref = _build_stage(final, stage, key, config, inputs, build, resumable)
        _observe(stage, ref)
    return ref


@contextlib.contextmanager
def waited_for(lock: FileLock, waiting: str) -> Iterator[None]:
    """`lock` held for the block; when another holder has it, `waiting` is printed first (a wait said, not a hang)."""
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(waiting, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def read_only(work_dir: str | Path) -> bool:
    """A work folder that exists and cannot be written: its complete stages are read as they are."""
    return Path(work_dir).is_dir() and not os.access(work_dir, os.W_OK)


def _reused(final: Path, stage: str, key: str) -> ArtifactRef:
    ref = ArtifactRef(str(final), key, read_manifest(final).get("seconds", 0.0), cached=True)
    _observe(stage, ref)
    return ref


def _observe(stage: str, ref: ArtifactRef) -> None:
    for observe in list(stage_observers):
        observe(stage, ref)


def observe_refs(result: Any) -> None:
    """Tell the stage observers of every stage folder a result holds (an ArtifactRef, or lists and dicts of them):
    for the folders a run gets without `run_stage` in its process (a task answered from Prefect's cache, a task run
    on another worker)."""
    if isinstance(result, ArtifactRef):
        for observe in list(stage_observers):
            observe(Path(result.path).parent.name, result)
    elif isinstance(result, (list, tuple)):
        for item in result:
            observe_refs(item)
    elif isinstance(result, dict):
        for item in result.values():
            observe_refs(item)


def _refs_of(result: Any) -> list[ArtifactRef]:
    if isinstance(result, ArtifactRef):
        return [result]
    items = result if isinstance(result, (list, tuple)) else result.values() if isinstance(result, dict) else []
    return [ref for item in items for ref in _refs_of(item)]


def hold_refs(result: Any) -> bool:
    """`observe_refs` under each stage folder's lock, the one garbage collection removes a folder under
    (retention.collect): a folder still whole is recorded by the live runs before gc can decide on it. False when one
    is gone or half there (removed since the result was made: a task answered from Prefect's cache after gc took its
    folder); the caller builds it again."""
    whole = True
    for ref in _refs_of(result):
        folder = Path(ref.path)
        locks = folder.parent.parent / ".locks"
        if folder.parent.name not in STAGE_RULES or not locks.is_dir():  # not a stage folder of a work folder (a
            observe_refs(ref)  # checkpoint given from elsewhere, the champion downloaded for a retrain)
            continue
        with FileLock(locks / f"{folder.parent.name}-{folder.name}.lock"):
            if is_complete(folder):
                _observe(folder.parent.name, ref)
            else:
                whole = False
    return whole


def _build_stage(final: Path, stage: str, key: str, config: Any, inputs: Mapping[str, str],
                 build: Callable[[Path], Mapping[str, Any] | None], resumable: bool) -> ArtifactRef:
    """`run_stage` under its lock: reuse a folder another run completed meanwhile, else build it."""
    if is_complete(final):
        return ArtifactRef(str(final), key, read_manifest(final).get("seconds", 0.0), cached=True)
    partial = final.parent / f".partial-{key}"
    if partial.exists() and not resumable:
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        with collect_warnings() as raised:
            summary = build(partial) or {}
    except BaseException:
        if not resumable:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    manifest = {
        "stage": stage,
        "key": key,
        "config": json.loads(canonical_json(config)) if config is not None else None,
        "inputs": dict(inputs),
        "summary": dict(summary),
        "seconds": round(time.time() - started, 3),
        "version": ance_core.__version__,
        "warnings": raised,
    }
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    readable_files(partial)
    if final.exists():  # an incomplete leftover (no manifest) from an older layout: replace it
        shutil.rmtree(final)
    os.replace(partial, final)
    return ArtifactRef(str(final), key, manifest["seconds"])


@contextlib.contextmanager
def atomic_folder(final: str | Path) -> Iterator[Path]:
    """Write a whole folder at once: yields an empty temporary folder beside `final` (`.partial-<name>-<random>`),
    which replaces `final` (and whatever it held) when the block ends without an exception; on an exception it is
    removed and `final` is left as it was. Readers see the old folder or the new one whole, never a mix (between the
    old one being moved aside and the new one moved in, for an instant, no folder). A `final` that is a symbolic link
    (`models/current` -> `v3`): the folder it names is replaced and the link kept (a rename onto the link failed)."""
    final = Path(final).resolve() if Path(final).is_symlink() else Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".partial-{final.name}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()  # (not mkdtemp: its folders are private to the user, the result folder keeps the usual mode)
    try:
        yield tmp
        readable_files(tmp)
        while True:
            try:
                os.replace(tmp, final)  # renames onto a missing or empty folder only
                break
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            aside = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:12]}"
            aside.mkdir()
            try:
                os.replace(final, aside)
            except FileNotFoundError:  # another writer moved it first: try again
                pass
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON through a temporary file of its own and rename, so readers never see half a file (also when
    several runs write the same file at once: the last rename wins, whole)."""
    write_text(path, json.dumps(obj, indent=2, default=str))


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """`dst` as a hard link to `src` (no second copy on disk: a stage that hands on another's large files), or a copy
    where the file system cannot link (another device, no hard links)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_text(path: str | Path, text: str) -> None:
    """Replace a file's content at once (a temporary file and a rename: a new file, never half of one)."""
    with replaced_file(path) as f:
        f.write(text)


def readable_files(folder: Path) -> None:
    """Give the files in `folder` that were created private (0600: safetensors' save_file writes every weights file
    so, transformers' save_pretrained included) the mode open() would have given them, as the other files of a stage
    or an export have: a work folder or a served model shared with other users or containers must be readable."""
    mode = new_file_mode()
    for path in folder.rglob("*"):
        try:  # (a hard link is another file's too: a checkpoint linked from outside the work folder keeps its mode)
            if path.is_file() and not path.is_symlink() and (st := path.stat()).st_nlink == 1 \
                    and st.st_mode & 0o777 == 0o600 != mode:
                path.chmod(mode)
        except OSError:  # (a file another process removed meanwhile; a mode this user cannot set)
            continue


def new_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the process's umask (read from /proc, which leaves the umask alone:
    setting it to read it back would race other threads' file creation); 0644 where /proc has no answer."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


@contextlib.contextmanager
def replaced_file(path: str | Path, encoding: str | None = None) -> Iterator[TextIO]:
    """A text file to write `path` through, streamed: a temporary file beside it, renamed into place when the block
    ends (a new file, never half of one); removed when the block raises. A `path` that is a symbolic link: the file it
    names is replaced and the link kept; a device, a pipe or a folder is refused (a rename replaced /dev/full with a
    text file)."""
    path = Path(path)
    if path.is_symlink():
        try:
            path = path.resolve(strict=False)
        except (RuntimeError, OSError) as e:  # (a loop of links)
            raise AnceError(f"{path}: a symbolic link that cannot be followed ({e})") from None
        if not path.parent.is_dir():
            raise AnceError(f"{path}: the file a symbolic link names, in a folder that does not exist")
    if path.exists() and not path.is_file():
        raise AnceError(f"{path}: not a regular file (a folder, a device or a pipe); give the path of a file to write")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # (mkstemp's file is 0600: the renamed file gets what open() would give it)
        with os.fdopen(fd, "w", encoding=encoding) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stage_warnings(folder: str | Path) -> list[str]:
    """The AnceWarnings a stage raised when it was built (see `run_stage`)."""
    return read_manifest(folder).get("warnings", []) if is_complete(folder) else []
