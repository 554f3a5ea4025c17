"""Where a run is tracked: the tracking URI resolved (the work folder's embedded store unless one is given), the store
it names checked before MLflow opens it (a file store MLflow 3 refuses, an SQLite file that is something else: one
line each instead of MLflow's paragraph or a page of SQL), and the lock beside an embedded store. No MLflow import: a
command checks before it starts anything."""

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock


def resolve_tracking_uri(work_dir: str | Path, explicit: str | None = None) -> str:
    """An explicit URI, else $MLFLOW_TRACKING_URI, else the embedded store <work_dir>/mlflow.db."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(work_dir).resolve() / 'mlflow.db'}"


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """A file lock beside an embedded SQLite store while it is opened. Concurrent runs on one work folder would
    otherwise race to create its tables (MLflow's schema migrations fail when two run at once: "table ... already
    exists") and its experiment; a tracking server needs none."""
    if (db := sqlite_file(uri)) is None:
        return contextlib.nullcontext()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(db.parent / f".{db.name}.lock")


def file_store_problem(uri: str) -> str | None:
    """What is wrong with a tracking URI that MLflow reads as a folder of its file store (no scheme: a path, or a
    scheme typed without its "://"; file:), which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE is true (its error
    is a paragraph on migrating); None for any other URI. Pure: no MLflow import, so a command can check before it
    starts anything."""
    if uri.strip() in ("databricks", "databricks-uc", "uc"):  # (MLflow's names of its Databricks stores)
        return None
    try:
        scheme = urlsplit(uri).scheme.lower()
    except ValueError:  # (`http://[::1:5000`: MLflow's own refusal says what is wrong)
        return None
    if not (scheme in ("", "file") or len(scheme) == 1):  # (one letter: a Windows drive)
        return None
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
        return None
    return ("is a folder to MLflow (its file store: no scheme, or file:), which MLflow 3 opens only with "
            "MLFLOW_ALLOW_FILE_STORE=true; give a tracking server as http(s)://host:port, or sqlite:///<path>.db "
            "(unset: the work folder's own store)")


def sqlite_file(uri: str) -> Path | None:
    """The database file of an embedded SQLite store's URI (`sqlite:///<path>`); None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check_sqlite_store(uri: str, where: str = "the tracking URI") -> None:
    """An AnceError when `uri` names an SQLite store whose file is something else (MLflow's error is a page of SQL)."""
    from ance_core.errors import AnceError

    db = sqlite_file(uri)
    if db is None or not db.is_file() or not db.stat().st_size:  # (empty: a new database)
        return
    try:
        with open(db, "rb") as f:
            header = f.read(16)
    except OSError as e:
        raise AnceError(f"{where} '{uri}': {db} cannot be read ({e.strerror or type(e).__name__}): run as a user "
                        "who can read the work folder, or give a tracking server (MLFLOW_TRACKING_URI)") from None
    if header != b"SQLite format 3\x00":
        raise AnceError(f"{where} '{uri}': {db} is not an SQLite database (a damaged MLflow store, or another file "
                        "of that name): move it aside (a new store is made in its place), or give a tracking server as "
                        "http(s)://host:port (MLFLOW_TRACKING_URI)")
