"""The asynchronous trainer's inferencer on workers of its own (ANCE Fig. 2, the paper's 1:1 trainer/inferencer
allocation): each refresh is a flow run of the `refresh-negatives` deployment (`inferencer.mode: deployment`).

The trainer starts the flow run without waiting for it (`run_deployment(timeout=0)`), keeps training on the negatives
it has, and follows the run through the Prefect API. A run that fails, crashes or is cancelled, or whose worker stops
sending heartbeats (killed with its machine: nobody is left to mark it crashed), is marked crashed and replaced by a
new flow run, which waits in the pool until a worker takes it. The flow run writes the folders it built to a result
file in the trainer's folder (work_dir is shared storage), and the trainer swaps in its negatives from there.
"""

import json
import logging
import threading
import time
import uuid
from pathlib import Path

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, State, WorkerStatus
from prefect.client.schemas.responses import SetStateStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Cancelling, Crashed

from ance_core.artifacts import ArtifactRef, hold_refs, write_json
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.negatives.config import InferencerConfig
from ance_core.stage_config import SPARSE_DUMP

RESULTS = "inferencer"  # train-async: step-<N>.json, the folders each refresh flow run built
MISSED_HEARTBEATS = 3  # Prefect's own rule for an offline worker (server.services.foreman)
FALLBACK_HEARTBEAT_S = 30  # a worker that did not say its interval: Prefect's default
STOPPED = "stopped"  # _follow: training finished first, the flow run was cancelled
API_ERRORS = (httpx.TransportError, PrefectHTTPStatusError)  # a failed Prefect API call; see _transient


def check_deployment(cfg: InferencerConfig, logger: logging.Logger | logging.LoggerAdapter | None = None) -> None:
    """Refuse a run whose inferencer deployment cannot be started, before anything trains; warn when no worker of its
    pool is online (its refreshes would wait in the pool until one starts)."""
    if cfg.mode != "deployment":
        return
    where = PREFECT_API_URL.value()
    if not where:
        raise AnceError(f"inferencer.mode 'deployment' starts flow runs of '{cfg.deployment}' on a Prefect server, "
                        "and this run has none (PREFECT_API_URL is unset: an ephemeral server). Run it on the stack "
                        "(make up, make deploy) or set inferencer.mode: thread")
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(cfg.deployment)
        except ObjectNotFound:
            raise AnceError(f"inferencer.deployment '{cfg.deployment}' is not deployed on {where} (make deploy "
                            "registers refresh-negatives/refresh-negatives)") from None
        pool = deployment.work_pool_name
        if pool and not any(w.status == WorkerStatus.ONLINE for w in client.read_workers_for_work_pool(pool)):
            (logger or logging.getLogger(__name__)).warning(
                f"no worker of pool '{pool}' is online: the refreshes of '{cfg.deployment}' wait in the pool until one "
                f"starts (ANCE_PROJECT_DIR=<this checkout> prefect worker start --pool {pool}; make up starts one "
                "for 'infer')")


class DeploymentInferencer:
    """Refreshes as flow runs of a deployment, each retried `cfg.retries` times with a new flow run."""

    def __init__(self, cfg: InferencerConfig, data: DataConfig, logger: logging.Logger | logging.LoggerAdapter):
        self.cfg, self.data, self.logger = cfg, data, logger
        self.stopping = threading.Event()

    def stop(self) -> None:
        """Training is over: refreshes still running can no longer be used; their flow runs are cancelled."""
        self.stopping.set()

    def refresh(self, snapshot: ArtifactRef, step: int, round_: int, args: dict, out: Path,
                trainer_key: str) -> str | None:
        """The folder of the negatives mined with the step-`step` snapshot (None: stopped first). `args`: the encode,
        index, mining, execution configs and work_dir of the trainer. A flow run started before by this trainer folder
        (the same idempotency key: a resumed trainer) is followed, not started again; one that had already failed is
        skipped."""
        result_file = out / RESULTS / f"step-{step}.json"
        result_file.parent.mkdir(parents=True, exist_ok=True)
        def sent(config) -> dict:  # (without the options at their unsaid values: a deployment registered by code
            return config.model_dump(mode="json", context=SPARSE_DUMP)  # from before one existed refuses them)

        parameters = {
            "checkpoint": str(Path(snapshot.path).resolve()), "data": sent(self.data), "encode": sent(args["encode"]),
            "index": sent(args["index"]), "mining": sent(args["mining"]), "round_number": round_,
            "work_dir": str(Path(args["work_dir"]).resolve()), "execution": sent(args["execution"]),
            "result_file": str(result_file.resolve()),
        }
        if args.get("train") is not None:  # the round's training: a draw of negatives per epoch
            parameters["train"] = sent(args["train"])
        if args.get("bm25") is not None and args["mining"].spec.uses_bm25:  # the run's BM25 (a deployment made
            parameters["bm25"] = sent(args["bm25"])  # before it took none: only when needed)
        # Prefect keeps idempotency keys per flow: a trainer folder deleted and trained again gets new keys
        key_prefix = f"{trainer_key}-{_folder_id(out)}-{self.cfg.deployment}-step-{step}"
        problems, key = [], 0
        while len(problems) <= self.cfg.retries and not self.stopping.is_set():
            flow_run = _transient_retried(
                run_deployment, self.cfg.deployment, parameters=parameters, timeout=0,
                flow_run_name=f"refresh-step-{step}-try-{key}", idempotency_key=f"{key_prefix}-try-{key}",
                tags=["ance", "inferencer"])
            key += 1
            state = flow_run.state
            if state is not None and state.is_final() and not state.is_completed():
                # the key's run is an earlier trainer process's try, failed before this one resumed: not a try of
                # this process (a resumed trainer gets its retries again)
                self.logger.info(f"refresh from the step-{step} checkpoint: flow run {flow_run.name} of an earlier "
                                 f"attempt ended {state.name}; starting the next")
                continue
            self.logger.info(f"refresh from the step-{step} checkpoint: flow run {flow_run.name} ({flow_run.id}) of "
                             f"{self.cfg.deployment}")
            problem = self._follow(flow_run)
            if problem == STOPPED:
                break
            if problem is None:
                problem, mined = _read_result(result_file)
                if problem is None:
                    return mined
            problems.append(f"{flow_run.name}: {problem}")
            self.logger.warning(f"refresh from the step-{step} checkpoint: flow run {flow_run.name} {problem}; "
                                + ("starting another" if len(problems) <= self.cfg.retries else "no retries left"))
        if self.stopping.is_set():
            self.logger.info(f"refresh from the step-{step} checkpoint: training finished first; not waited for")
            return None
        raise AnceError(f"every flow run of the step-{step} refresh failed: " + "; ".join(problems))

    def _follow(self, flow_run: FlowRun) -> str | None:
        """Wait for the flow run to finish: None when it completed, STOPPED when training finished first (the run
        is cancelled), else what went wrong (a run that lost its worker is marked crashed first, one that ran past
        `timeout_s` is cancelled). A failed API call is logged and polled again."""
        started = noted = time.monotonic()
        heartbeats: dict[str, tuple] = {}
        with get_client(sync_client=True) as client:
            while True:
                try:
                    outcome = self._check(client, flow_run, started, heartbeats)
                except API_ERRORS as e:
                    if not _transient(e):
                        raise
                    self.logger.warning(f"flow run {flow_run.name}: the Prefect API failed ({e}); polling again")
                    outcome = ()
                if outcome != ():
                    return outcome
                if time.monotonic() - noted > 300:
                    noted = time.monotonic()
                    self.logger.info(f"flow run {flow_run.name} not finished after {noted - started:.0f} s (pool "
                                     f"{flow_run.work_pool_name}: is a worker polling it?)")
                time.sleep(self.cfg.poll_seconds)

    def _check(self, client: SyncPrefectClient, flow_run: FlowRun, started: float, heartbeats: dict):
        """One poll of `_follow`: its outcome, or () while the flow run goes on."""
        run = client.read_flow_run(flow_run.id)
        state = run.state
        if state is not None and state.is_completed():
            return None
        if state is not None and state.is_final():
            return f"ended {state.name}: {state.message or 'no message'}"
        if self.stopping.is_set():
            return self._cancel(client, run, "the trainer finished before its negatives were ready", STOPPED)
        lost = _worker_lost(client, run, heartbeats) if state is not None and not state.is_scheduled() else None
        if lost is not None:
            return self._end(client, run, Crashed(message=f"the trainer gave it up: {lost}"), f"crashed: {lost}")
        if self.cfg.timeout_s is not None and time.monotonic() - started > self.cfg.timeout_s:
            late = f"not finished {self.cfg.timeout_s:g} s after the trainer began to follow it (inferencer.timeout_s)"
            return self._cancel(client, run, f"the trainer gave it up: {late}", f"cancelled: {late}")
        return ()

    def _cancel(self, client: SyncPrefectClient, run: FlowRun, message: str, outcome: str):
        """`_end` in Cancelling when a worker has the run (it stops the run's process), else straight in Cancelled."""
        taken = (run.labels or {}).get("prefect.worker.name")
        return self._end(client, run, Cancelling(message=message) if taken else Cancelled(message=message), outcome)

    def _end(self, client: SyncPrefectClient, run: FlowRun, state: State, outcome: str):
        """Move the flow run to `state` and return `outcome`; a run that finished meanwhile keeps its own end (the
        server refuses to leave a final state): None when it completed."""
        if client.set_flow_run_state(run.id, state).status == SetStateStatus.ACCEPT:
            return outcome
        now = client.read_flow_run(run.id).state
        if now is not None and now.is_completed():
            return None
        if now is not None and now.is_final():
            return outcome if outcome == STOPPED else f"ended {now.name}: {now.message or 'no message'}"
        client.set_flow_run_state(run.id, state, force=True)  # refused for another reason: the trainer decides
        return outcome


def _folder_id(out: Path) -> str:
    """A random id kept in the trainer folder, made on its first refresh."""
    path = out / RESULTS / "folder-id.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"id": uuid.uuid4().hex[:12]})
    return json.loads(path.read_text())["id"]


def _read_result(result_file: Path, wait_s: float = 10) -> tuple[str | None, str | None]:
    """(problem, the mined folder) from a completed flow run's result file; shared storage may show it late. Every
    folder the refresh built or reused (encoding, index, ranking, negatives) is recorded by this process's live run,
    as the stages it runs itself are: a long run's refreshes are not removed by a garbage collection meanwhile, and a
    resumed trainer or the run's negatives analysis finds them."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            folders = json.loads(result_file.read_text())
            mined = folders["mine"]
            if not hold_refs([ArtifactRef(path, Path(path).name, cached=True) for path in folders.values()]):
                return f"its folders were removed before this run recorded them ({result_file})", None
            return None, mined
        except (OSError, ValueError, KeyError) as e:
            if time.monotonic() > deadline:
                return f"completed without a readable result in {result_file} ({e})", None
            time.sleep(1)


def _transient(error: Exception) -> bool:
    """A failed Prefect API call worth making again: no connection, or a server error (a server restarting)."""
    return not isinstance(error, PrefectHTTPStatusError) or error.response.status_code >= 500


def _transient_retried(call, *args, tries: int = 5, **kwargs):
    """`call(*args, **kwargs)`, made again after a transient API failure."""
    for attempt in range(tries):
        try:
            return call(*args, **kwargs)
        except API_ERRORS as e:
            if attempt == tries - 1 or not _transient(e):
                raise
            time.sleep(2**attempt)


def _worker_lost(client: SyncPrefectClient, run: FlowRun, heartbeats: dict) -> str | None:
    """Why the worker that took the flow run is gone (None: it is not, or no worker has taken it yet). A worker
    killed with its machine leaves its flow run running in the API; its missed heartbeats tell. `heartbeats`: each
    worker's last heartbeat seen and when (this machine's monotonic clock: the server's clock may differ)."""
    name = (run.labels or {}).get("prefect.worker.name")
    if not name or not run.work_pool_name:
        return None
    workers = {w.name: w for w in client.read_workers_for_work_pool(run.work_pool_name)}
    worker = workers.get(name)
    if worker is None:
        return f"its worker {name} left pool {run.work_pool_name}"
    if worker.status == WorkerStatus.OFFLINE:
        return f"its worker {name} is offline"
    interval = worker.heartbeat_interval_seconds or FALLBACK_HEARTBEAT_S
    now = time.monotonic()
    last, seen_at = heartbeats.get(name, (None, now))
    if worker.last_heartbeat_time != last:
        heartbeats[name] = (worker.last_heartbeat_time, now)
        return None
    if now - seen_at > MISSED_HEARTBEATS * interval:
        return f"its worker {name} sent no heartbeat for {now - seen_at:.0f} s ({MISSED_HEARTBEATS} x {interval} s)"
    return None
