"""Where mapped stage tasks run: `execution.task_runner` as a Prefect task runner, configured, not written here.

local: each call is a task run in the flow's process, one after another (nothing to start; the default).
ray: prefect-ray's `RayTaskRunner`; each call is a Ray task that runs the Prefect task (its cache, retries and task
run) in a Ray worker, asking Ray for `threads_per_worker` CPUs and `gpus_per_task` GPUs. Without `address` a local
Ray of `workers` x `threads_per_worker` CPUs starts at the first use and lives as long as the process (one start-up
per run, not per stage); with one, the tasks go to that cluster.
"""

import atexit
import contextlib
import dataclasses
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.tasks import Task

from ance_core.artifacts import ArtifactRef, hold_refs
from ance_core.errors import AnceError
from ance_core.retrieval.config import ExecutionConfig
from tasks.common import FAULT_ENV, FAULT_SIGNAL_ENV, ChildTasksFailed, run_task

FORWARDED_ENV = (FAULT_ENV, FAULT_SIGNAL_ENV, "ANCE_DATA_HOME", "PREFECT_API_URL", "PREFECT_HOME",
                 "PREFECT_LOCAL_STORAGE_PATH", "PREFECT_RESULTS_PERSIST_BY_DEFAULT")


def run_mapped(stage: Task, calls: list[dict[str, Any]], execution: ExecutionConfig,
               done: Callable[[int], None] = lambda n: None, errors: bool = False
               ) -> list[ArtifactRef | BaseException]:
    """Each call of `stage` (its keyword arguments) as its own task run, on the configured runner; the references in
    call order, each marked `cached` when Prefect answered from its cache. The first failure is raised (after that
    task's own retries, as ChildTasksFailed: the calling task does not retry it again). `errors`: every call runs,
    and a failed one's place holds its error instead (the recipe search's trials: one that diverges is an answer)."""
    if execution.task_runner == "local":
        outside = FlowRunContext.get() is None  # the task's function called outside Prefect (`.fn`: bench/...)
        if outside and not errors:
            return [stage.fn(**kwargs) for kwargs in calls]
        refs = []
        for k, kwargs in enumerate(calls):
            with _after_retries(stage, k, len(calls), refs if errors else None):
                refs.append(stage.fn(**kwargs) if outside else run_task(stage, **kwargs))
            done(k + 1)
        return refs
    from prefect_ray.context import remote_options

    runner = _ray_runner(execution, stage)
    _check_resources(execution)
    resources = {"num_cpus": execution.threads_per_worker} | (
        {"num_gpus": execution.gpus_per_task} if execution.gpus_per_task else {})
    with runner, remote_options(**resources):
        futures = [runner.submit(stage, kwargs) for kwargs in calls]
        held = {}
        for k, future in enumerate(futures):  # each result recorded by this process's live run once it and those
            future.wait()  # before it have ended (built on Ray's workers: no run_stage here), not after the last one
            state = future.state  # (a folder no run recorded is also kept for an hour: retention.GRACE_SECONDS)
            held[k] = not state.is_completed() or hold_refs(state.result())  # (a failure is raised below)
            done(k + 1)
    refs = []
    for k, future in enumerate(futures):
        with _after_retries(stage, k, len(calls), refs if errors else None):
            refs.append(future.state.result())  # the first failed task's error
            if not held[k]:  # its folder went between its end and its record: built again, here
                refs[k] = run_task(stage, **calls[k])
    return [ref if isinstance(ref, BaseException) else
            dataclasses.replace(ref, cached=ref.cached or future.state.name == "Cached")
            for ref, future in zip(refs, futures, strict=True)]


@contextlib.contextmanager
def _after_retries(stage: Task, k: int, calls: int, errors: list | None = None) -> Iterator[None]:
    """A child task's failure after its own retries, raised as ChildTasksFailed (the parent task does not retry it
    again); a user error (AnceError, ValueError) as it is. With `errors` (the results so far), it is call k's result
    instead (in place of a result the call had, when building it again failed)."""
    try:
        yield
    except (AnceError, ValueError) as e:
        if errors is None:
            raise
        errors[k:] = [e]
    except Exception as e:
        error = ChildTasksFailed(f"{stage.name} call {k + 1} of {calls} failed after its retries: "
                                 f"{type(e).__name__}: {e}")
        if errors is None:
            raise error from e
        error.__cause__ = e
        errors[k:] = [error]


def _ray_runner(execution: ExecutionConfig, stage: Task):
    """A RayTaskRunner on the process's Ray (`start_ray`, its workers preloading the stage's module); a runner that
    finds Ray running does not stop it."""
    start_ray(execution, preload=(stage.fn.__module__,))
    from prefect_ray import RayTaskRunner

    return RayTaskRunner()


def start_ray(execution: ExecutionConfig, preload: tuple[str, ...] = ()) -> None:
    """Connect to `execution.address`, or start a local Ray of `workers` x `threads_per_worker` CPUs; once per
    process (stopped when it exits). The workers get this run's Prefect API and the ANCE_ fault settings, and import
    the `preload` modules (the stage code: torch, transformers, Prefect) before the first stage runs."""
    try:
        import prefect_ray  # noqa: F401
        import ray
    except ImportError as e:
        raise AnceError(f"execution.task_runner 'ray' needs Ray and prefect-ray ({e}): pip install -e '.[ray]'"
                        ) from None
    if ray.is_initialized():
        return
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    # the workers report their task runs to this run's Prefect API, the ephemeral one included (left to themselves,
    # each would start an ephemeral server of its own)
    with get_client(sync_client=True) as client:
        env["PREFECT_API_URL"] = str(client.api_url).rstrip("/")
    if execution.address:
        ray.init(address=execution.address, runtime_env={"env_vars": env})
    else:
        # "local": a Ray of its own, as `address: null` says (left unset, Ray joins the cluster RAY_ADDRESS or a
        # `ray start --head` on this machine names, and refuses num_cpus there)
        ray.init(address="local", num_cpus=execution.workers * execution.threads_per_worker, include_dashboard=False,
                 runtime_env={"env_vars": env}, configure_logging=False)
    atexit.register(ray.shutdown)
    _check_resources(execution)
    # each worker imports the stage code (torch, transformers, Prefect: most of a fresh worker's first task) now,
    # as part of the start-up, not of the first stage that uses them
    warm = ray.remote(_import_modules).options(num_cpus=execution.threads_per_worker)
    ray.get([warm.remote(preload) for _ in range(execution.workers)])


def _check_resources(execution: ExecutionConfig) -> None:
    """An AnceError when no node of the cluster can run a shard task (Ray would queue it for ever)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    if execution.threads_per_worker > cpus or execution.gpus_per_task > gpus:
        raise AnceError(f"execution asks {execution.threads_per_worker} CPUs and {execution.gpus_per_task} GPUs per "
                        f"shard task, but the Ray cluster's largest node has {cpus:g} CPUs and {gpus:g} GPUs")


def _import_modules(modules: tuple[str, ...]) -> int:
    for module in modules:
        importlib.import_module(module)
    return os.getpid()
