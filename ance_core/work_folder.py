"""The folders a command writes to, checked before any work: the work folder (made, writable, and removed again when
the command that made it is refused before a stage was built in it) and an output's folder; whether a file lock is
held by another process."""

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from ance_core.artifacts import MANIFEST
from ance_core.errors import AnceError

WHERE_WORK_DIR = "ance run, tune, compare: --set work_dir=...; the other commands: --work-dir"


def writable_work_dir(work_dir: str | Path) -> Path:
    """`work_dir` created if it is missing and checked writable (a file made and removed in it): before any work, so
    that a folder that cannot hold the stages is one clear error, not a traceback from the first stage."""
    if not str(work_dir).strip():  # (Path("") is the current folder: `--set work_dir=$UNSET`)
        raise AnceError(f"work_dir is empty: the stages would be written into the current folder; set work_dir to a "
                        f"folder ({WHERE_WORK_DIR})")
    folder = Path(work_dir).expanduser()
    if folder.exists() and not folder.is_dir():
        raise AnceError(f"work_dir {folder}: a file, not a folder; set work_dir to a folder ({WHERE_WORK_DIR})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise AnceError(f"work_dir {folder}: cannot be created or written ({e.strerror or type(e).__name__}); set "
                        f"work_dir to a folder you can write to ({WHERE_WORK_DIR})") from None
    return folder


@contextmanager
def made_work_dir(work_dir: str | Path) -> Iterator[Path]:
    """`writable_work_dir`, and, when the body fails, the folder removed again if this call made it and no stage was
    built in it (its locks and empty stage folders are not left behind; a stage built whole is kept for reuse), unless
    another process holds one of its stage locks (a command started beside this one, building in it)."""
    fresh = not Path(work_dir).expanduser().exists()
    folder = writable_work_dir(work_dir)
    try:
        yield folder
    except BaseException:
        if fresh and not any(folder.rglob(MANIFEST)) and not any(map(lock_held, (folder / ".locks").glob("*.lock"))):
            shutil.rmtree(folder, ignore_errors=True)
        raise


def lock_held(lock_file: Path) -> bool:
    """Whether another holder has the file lock `lock_file` now (taken and given back at once when not)."""
    lock = FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def writable_folder(folder: str | Path, what: str) -> None:
    """An existing folder checked writable (a file made and removed in it) before any work, so that an output that
    cannot be written there is one clear error naming `what` (the option), not a traceback after the work."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise AnceError(f"{what}: cannot write in {folder} ({e.strerror or type(e).__name__})") from None
