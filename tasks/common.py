"""What every stage task shares: a content cache key, persisted results, retries with backoff, fault injection.

Cache key (`StageCache`): the task's source, the ance_core version and the task's inputs with each `ArtifactRef`
reduced to its content digest, plus the content the inputs do not carry (the dataset's files, a local model's).
Results are persisted, so a re-run in a new process finds them. A cached record whose folder was deleted or is
incomplete is not used: the task runs again and rebuilds the same folder.

Fault injection, for tests and drills: `ANCE_FAULT="<task>[@<step>][:fail|:hang|:exit]"` (comma-separated for
several) makes the named task raise `InjectedFault` once per process (the retry then succeeds), or hang so that the
process can be killed at a known point, or kill its process at once (`:exit`, once across all processes: the first
to get there creates the file named by `ANCE_FAULT_SIGNAL`, which is required; a killed Ray worker). Without
`@<step>` it fires when the task starts. With it, at a point inside the task's work: `train@N` / `train-async@N`
after optimizer step N (and its checkpoint, when one is due), `snapshot@N` between an asynchronous trainer's
step-N checkpoint and the publication of its step-N snapshot, `encode-corpus@N` after the N-th corpus shard is
written (in its shard task), `build-index@1` after the index file is written and before its doc ids,
`prepare-data@1` between the data tables (ance_core/faults.py). `:hang` first creates the file named by
`ANCE_FAULT_SIGNAL`, if set. `<spec>#<n>` fires the n-th time the point is reached instead of the first
(`train@3#3`: after step 3 of the third training stage). `faults_off()` suspends all of it (the CLI's validation
of the data before the flow).
"""

import contextlib
import contextvars
import dataclasses
import errno
import functools
import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext, get_run_context
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler
from prefect.results import get_result_store
from prefect.states import State
from prefect.tasks import Task, exponential_backoff
from pydantic import BaseModel

import ance_core
from ance_core.artifacts import STAGE_RULES, ArtifactRef, digest_of, hold_refs, is_complete
from ance_core.errors import AnceError, on_warning
from ance_core.faults import set_fault_hook
from ance_core.pipeline.report import StageTiming
from ance_core.stage_config import KEY_DUMP

FAULT_ENV = "ANCE_FAULT"
FAULT_SIGNAL_ENV = "ANCE_FAULT_SIGNAL"
_fired: set[str] = set()
_reached: dict[str, int] = {}
_SUSPENDED = contextvars.ContextVar("ance_faults_suspended", default=False)


@contextlib.contextmanager
def faults_off() -> Iterator[None]:
    """No injected fault fires inside this block (in this context)."""
    token = _SUSPENDED.set(True)
    try:
        yield
    finally:
        _SUSPENDED.reset(token)


class InjectedFault(RuntimeError):
    """A failure asked for by ANCE_FAULT; transient by design (retried)."""


def inject_fault(task_name: str, step: int | None = None) -> None:
    """Fire the fault ANCE_FAULT names for this task (and step), at most once per process; `#n` fires at the n-th
    time the point is reached (`train@3#3`: step 3 of the third training stage)."""
    if _SUSPENDED.get():
        return
    for spec in filter(None, (s.strip() for s in os.environ.get(FAULT_ENV, "").split(","))):
        target, _, mode = spec.partition(":")
        target, _, nth = target.partition("#")
        name, _, at = target.partition("@")
        if name != task_name or (at and (step is None or int(at) != step)) or (not at and step is not None):
            continue
        if mode == "exit":
            _exit_once(spec)
            continue
        if spec in _fired:
            return
        _reached[spec] = _reached.get(spec, 0) + 1
        if _reached[spec] < int(nth or 1):
            continue
        _fired.add(spec)
        if mode == "hang":
            if signal := os.environ.get(FAULT_SIGNAL_ENV):
                Path(signal).write_text(spec)
            while True:
                time.sleep(60)
        raise InjectedFault(f"{FAULT_ENV}={spec}: injected failure of task '{task_name}'"
                            + (f" at step {step}" if step is not None else ""))


def _drill_asked() -> bool:
    """Whether ANCE_FAULT asks for any drill here (the training then writes each checkpoint before its step's drill
    can stop the process: `train@N` fires after step N and its checkpoint)."""
    return bool(os.environ.get(FAULT_ENV, "").strip()) and not _SUSPENDED.get()


set_fault_hook(inject_fault, armed=_drill_asked)  # the fault points inside the core's long work (ance_core/faults.py)

RUN_LOGS = "ance.warnings"  # the logger that sends warnings to the Prefect API only (the console has them already)


def to_run_logs(message: str) -> None:
    """A warning (`ance_core.errors.warn`) as a WARNING line of the Prefect flow or task run this code runs in (none
    outside one): Python's warnings reach a process's stderr only, never the run's page in the UI."""
    try:
        get_run_context()
    except MissingContextError:
        return
    logger = logging.getLogger(RUN_LOGS)
    if not logger.handlers:
        logger.addHandler(APILogHandler())
        logger.propagate = False  # (printed by the warning itself: not twice on the console)
    logger.warning(message)


on_warning(to_run_logs)


def _exit_once(spec: str) -> None:
    """`:exit`: the process dies at once (exit status 137, as a SIGKILL'd process: a killed worker), the first time
    any process reaches the point; the file named by ANCE_FAULT_SIGNAL (required) records that it happened."""
    signal = os.environ.get(FAULT_SIGNAL_ENV)
    if not signal:
        raise RuntimeError(f"{FAULT_ENV}={spec}: ':exit' needs {FAULT_SIGNAL_ENV}, the file that makes it fire once")
    try:
        os.close(os.open(signal, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    Path(signal).write_text(spec)
    os._exit(137)


class ChildTasksFailed(Exception):
    """A task's child tasks (corpus shards) failed after their own retries: the parent does not retry them again."""


def retry_unless_user_error(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry transient failures; a bad dataset or config, a full disk or a folder it may not write, fails the same way
    every time, and a child task that failed after its own retries is not retried again by its parent."""
    try:
        state.result()
    except (AnceError, ValueError, ChildTasksFailed):
        return False
    except OSError as e:
        return e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
    except Exception:  # noqa: BLE001 (transient)
        pass
    return True


def _content(value: Any) -> Any:
    """What of a task input decides its result: digests of artifacts, the values of configs."""
    if isinstance(value, ArtifactRef):
        return value.digest
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", context=KEY_DUMP)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _content(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_content(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _content(v) for k, v in value.items()}
    return value


def artifact_paths(result: Any) -> list[str]:
    """Every stage folder a task result points at."""
    if isinstance(result, ArtifactRef):
        return [result.path]
    if isinstance(result, (list, tuple)):
        return [p for v in result for p in artifact_paths(v)]
    if isinstance(result, dict):
        return [p for v in result.values() for p in artifact_paths(v)]
    return []


def _record_usable(key: str) -> bool:
    """False when a cached result exists but one of its folders is gone or half-written."""
    store = get_result_store()
    if not store.exists(key):
        return True
    try:
        result = store.read(key).result
    except Exception:  # an unreadable record (older layout): rebuild rather than fail
        return False
    return all(is_complete(p) for p in artifact_paths(result))


@dataclass
class StageCache(CachePolicy):
    """Content-keyed cache policy of the stage tasks (see the module docstring)."""

    extra: Callable[[dict[str, Any]], Any] | None = field(default=None)
    ignore: tuple[str, ...] = ()  # inputs that say where or how the task runs, not what it computes

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        parts = {
            "task": task_ctx.task.name,
            "source": TASK_SOURCE.compute_key(task_ctx, inputs, flow_parameters),
            "version": ance_core.__version__,
            "inputs": {k: _content(v) for k, v in sorted(inputs.items()) if k not in self.ignore},
        }
        if bumped := {stage: rule for stage, rule in STAGE_RULES.items() if rule}:
            # a bumped rule moves its stage's folder key (artifacts.stage_key); Prefect's record, keyed apart from the
            # folder, would still answer with the old folder. Every bumped rule is in every task's key: a bump misses
            # every record once, and the stages it did not bump find their folders as before (run_stage)
            parts["rules"] = bumped
        if self.extra is not None:
            extra = self.extra(inputs)
            if extra is None:  # the content cannot be read without running the task: do not cache
                return None
            if extra != {}:  # (an empty one adds nothing: the key it had without)
                parts["extra"] = extra
        key = f"{task_ctx.task.name}-{digest_of(parts, 32)}"
        return key if _record_usable(key) else f"{key}-rebuild-{uuid.uuid4().hex[:12]}"


TASK_DEFAULTS = dict(
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),  # 5 s, 10 s
    retry_jitter_factor=0.2,
    retry_condition_fn=retry_unless_user_error,
    persist_result=True,
)


_RUNNING: dict[uuid.UUID, TaskRun] = {}  # task run id -> the engine's TaskRun, while its body runs in this process
_RUNNING_LOCK = threading.Lock()


@contextlib.contextmanager
def _running_here() -> Iterator[None]:
    """Records the calling task run in `_RUNNING` while the body runs (any thread of this process)."""
    context = TaskRunContext.get()
    run = context.task_run if context is not None else None
    if run is not None:
        with _RUNNING_LOCK:
            _RUNNING[run.id] = run
    try:
        yield
    finally:
        if run is not None:
            with _RUNNING_LOCK:
                _RUNNING.pop(run.id, None)


def running_task_runs() -> list[TaskRun]:
    """The stage task runs whose bodies are running in this process now (their engines' TaskRun objects)."""
    with _RUNNING_LOCK:
        return list(_RUNNING.values())


def stage_task(name: str, extra_key: Callable[[dict[str, Any]], Any] | None = None, ignore: tuple[str, ...] = (),
               **options: Any):
    """Decorator: a Prefect task with the stage defaults, the content cache key (without the `ignore` inputs) and
    the fault-injection hook."""

    def wrap(fn):
        @functools.wraps(fn)
        def body(*args, **kwargs):
            with _running_here():
                inject_fault(name)
                return fn(*args, **kwargs)

        return task(name=name, cache_policy=StageCache(extra=extra_key, ignore=ignore),
                    **(TASK_DEFAULTS | options))(body)

    return wrap


_BARS: dict[str, Any] = {}  # task run id -> its progress artifact's id: a retried attempt moves the same bar


class Progress:
    """A long stage's progress bar in the Prefect UI (a progress artifact on its task run): `bar(done)` of `total`,
    created at the first update and updated at most every `every_s` seconds and when done reaches total; `finish()`
    fills it (a stage that ends early: dev checks' early stop). A retried attempt of the task run moves the same bar
    (not a second one left behind where the first attempt stopped). Best effort: a server that does not answer
    leaves the work alone."""

    def __init__(self, total: int, description: str, every_s: float, task_run: str | None):
        self.total, self.description, self.every_s, self.task_run = total, description, every_s, task_run
        self.at: float | None = None  # (not 0: monotonic time counts from boot, so within `every_s` of it the first
        # update waited, on a machine up for less than an hour under a bar of an hour's cadence)

    def __call__(self, done: int) -> None:
        if self.task_run is None or self.total <= 0:
            return
        now = time.monotonic()
        if self.at is not None and now - self.at < self.every_s and done < self.total:
            return
        self.at = now
        self._send(round(100 * min(max(done, 0), self.total) / self.total, 1))

    def finish(self) -> None:
        if self.task_run is not None and self.total > 0:
            self._send(100.0)
            _BARS.pop(self.task_run, None)  # (its stage is done: no attempt moves it again)

    def _send(self, progress: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        try:
            if (artifact := _BARS.get(self.task_run)) is None:
                _BARS[self.task_run] = create_progress_artifact(progress, description=self.description)
            else:
                update_progress_artifact(artifact, progress)
        except Exception as e:  # noqa: BLE001
            logging.getLogger("ance").debug(f"progress artifact not updated: {e}")


def progress_artifact(total: int, description: str, every_s: float = 5.0) -> Progress:
    """A Progress bar on the current task run (one that does nothing outside a task run)."""
    from prefect.context import TaskRunContext

    context = TaskRunContext.get()
    return Progress(total, description, every_s, str(context.task_run.id) if context is not None else None)


def run_task(stage: Task, *args: Any, **kwargs: Any) -> ArtifactRef:
    """Call a stage task and return its reference, marked `cached` when Prefect answered from its cache.

    A cached answer ran no run_stage here: its folders are recorded by the live run under their stage locks
    (`hold_refs`), and if garbage collection removed one between Prefect's answer and that record, the task runs
    again (its cache record now names a missing folder, so its key is a rebuild's: `StageCache`)."""
    state, ref = held_result(stage, *args, **kwargs)
    return dataclasses.replace(ref, cached=ref.cached or state.name == "Cached")


_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("ance_stage_label", default=None)


@contextlib.contextmanager
def stages_for(label: str) -> Iterator[None]:
    """The stage tasks called within are named after `label` in the Prefect UI, `encode (ANCE round 1)` (one whose
    task names its runs itself keeps its name): Prefect's own, `encode-2`, said neither which model nor which split."""
    token = _LABEL.set(label)
    try:
        yield
    finally:
        _LABEL.reset(token)


def named(stage: Task) -> Task:
    """`stage` with its runs named after the label `stages_for` set, and the split a stage of one works on: `evaluate
    (warmup, dev)`, `train (warmup)` (unchanged without a label)."""
    label = _LABEL.get()
    if label is None or stage.task_run_name is not None:
        return stage
    # (Prefect fills it in; a training stage's is the train split, said by its name)
    split = ", {split}" if "split" in inspect.signature(stage.fn).parameters and stage.name != "train" else ""
    return stage.with_options(task_run_name=f"{stage.name} ({label.replace('{', '{{').replace('}', '}}')}{split})")


def held_result(stage: Task, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Call a stage task and record the folders of its result (an ArtifactRef, or dicts and lists of them) under
    their stage locks; called again when one went missing between Prefect's cached answer and that record (run_task).
    Its final state and result."""
    stage = named(stage)
    state = stage(*args, return_state=True, **kwargs)
    result = state.result()
    if not hold_refs(result):
        state = stage(*args, return_state=True, **kwargs)
        result = state.result()
        hold_refs(result)
    return state, result


class StageLog:
    """The stage runs of a flow, each under the model label it ran for: the report's wall-time table and the
    per-model stage times in MLflow."""

    def __init__(self) -> None:
        self.timings: list[StageTiming] = []

    def run(self, label: str, name: str, stage: Task, *args: Any) -> ArtifactRef:
        with stages_for(label):
            ref = run_task(stage, *args)
        self.timings.append(StageTiming(label, name, ref))
        return ref

    def record(self, label: str, refs: dict[str, ArtifactRef]) -> dict[str, ArtifactRef]:
        self.timings.extend(StageTiming(label, name, ref) for name, ref in refs.items())
        return refs
