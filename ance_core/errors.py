"""User-facing errors and warnings: the CLI prints an error as one line, without a stack trace; a warning is a problem
the run survives (one bad row, a query with no candidates) and is kept in the stage's manifest (`run_stage`)."""

import contextlib
import contextvars
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path


class AnceError(Exception):
    """An error the user can act on (bad input, bad config, missing file)."""


class DataError(AnceError):
    """Invalid dataset content; names the file, the line (1-based) and the problem."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


@contextlib.contextmanager
def damaged_stage(folder: str | Path, what: str = "stage folder",
                  then: str = "remove it and run again (it is built anew)") -> Iterator[None]:
    """A read of a stage folder's files (`what` it is) whose failure (a file missing, cut short, or not what it should
    be: a disk that filled, a copy interrupted) is one line naming the folder and what to do (`then`), not a reader's
    traceback."""
    try:
        yield
    except (FileNotFoundError, ValueError) as e:  # (pyarrow's ArrowInvalid is a ValueError; other OSErrors, such as
        # no permission or no memory, are no damage: the CLI says what they are)
        raise AnceError(f"{folder}: a damaged {what} ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                        f"{then}") from None


class DamagedStage(AnceError, ValueError):
    """A stage folder whose manifest cannot be read (cut short by a crash before it reached the disk, a copy
    interrupted): `run_stage` builds such a folder again; a command given it says so in one line. (A ValueError too,
    as the JSON error it replaces: callers that treat an unreadable manifest as no stage still do.)"""


class OutOfMemory(AnceError):
    """The accelerator ran out of memory. The same batch runs out of memory the same way again, so it is not retried;
    the message names the batch and what to change."""


class DamagedCheckpoint(AnceError):
    """A checkpoint folder whose files are missing, cut short or not what they should be (a disk that filled, a copy
    interrupted, a hand edit): nothing computed from it would mean anything."""


class AnceWarning(UserWarning):
    """Something the user should know about that the run survives; stages record these in their manifest."""


_COLLECTOR: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("ance_warnings", default=None)


def warn(message: str) -> None:
    """Warn (AnceWarning) and record the message in the stage being built, if any (`collect_warnings`); then tell
    the listeners (`on_warning`: the orchestration layer puts it in the Prefect run's logs)."""
    if (collected := _COLLECTOR.get()) is not None:
        collected.append(message)
    warnings.warn(message, AnceWarning, stacklevel=2)
    for listener in _LISTENERS:
        listener(message)


_LISTENERS: list[Callable[[str], None]] = []


def on_warning(listener: Callable[[str], None]) -> None:
    """Call `listener(message)` on every `warn` from now on (once, however often it is added): the layers above the
    core (tasks/common.py) route warnings where this one cannot see (a Prefect run's logs)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


@contextlib.contextmanager
def collect_warnings() -> Iterator[list[str]]:
    """The messages `warn` is called with inside this block, in this context (thread-safe: a context variable)."""
    collected: list[str] = []
    token = _COLLECTOR.set(collected)
    try:
        yield collected
    finally:
        _COLLECTOR.reset(token)


def preview(ids, limit: int = 5) -> str:
    """The first few of a list of ids, for a message: "q1, q2, q3 and 12 more"."""
    ids = [str(i) for i in ids]
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
