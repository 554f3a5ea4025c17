"""The asynchronous trainer's inferencer on workers of its own (ANCE Fig. 2, the paper's 1:1 trainer/inferencer
allocation): each refresh is a flow run of the `refresh-negatives` deployment (`inferencer.mode: deployment`).

The trainer starts the flow run without waiting for it (`run_deployment(timeout=0)`), keeps training on the negatives
it has, and follows the run through the Prefect API. A run that fails, crashes or is cancelled, or whose worker stops
sending heartbeats (killed with its machine: nobody is left to mark it crashed), is marked crashed and replaced by a
new flow run, which waits in the pool until a worker takes it. The flow run writes the folders it built to a result
file in the trainer's folder (work_dir is shared storage), and the trainer swaps in its negatives from there.
"""

import datetime
import json
import logging
import time
from pathlib import Path

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, WorkerStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed

from ance_core.artifacts import ArtifactRef
from ance_core.config import DataConfig, InferencerConfig
from ance_core.errors import AnceError

RESULTS = "inferencer"  # train-async: step-<N>.json, the folders each refresh flow run built
MISSED_HEARTBEATS = 3  # Prefect's own rule for an offline worker (server.services.foreman)
FALLBACK_HEARTBEAT_S = 30  # a worker that did not say its interval: Prefect's default


def check_deployment(cfg: InferencerConfig) -> None:
    """Refuse a run whose inferencer deployment cannot be started, before anything trains."""
    if cfg.mode != "deployment":
        return
    where = PREFECT_API_URL.value()
    if not where:
        raise AnceError(f"inferencer.mode 'deployment' starts flow runs of '{cfg.deployment}' on a Prefect server, "
                        "and this run has none (PREFECT_API_URL is unset: an ephemeral server). Run it on the stack "
                        "(make up, make deploy) or set inferencer.mode: thread")
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(cfg.deployment)
        except ObjectNotFound:
            raise AnceError(f"inferencer.deployment '{cfg.deployment}' is not deployed on {where} (make deploy "
                            "registers refresh-negatives/refresh-negatives)") from None


class DeploymentInferencer:
    """Refreshes as flow runs of a deployment, each retried `cfg.retries` times with a new flow run."""

    def __init__(self, cfg: InferencerConfig, data: DataConfig, logger: logging.Logger | logging.LoggerAdapter):
        self.cfg, self.data, self.logger = cfg, data, logger

    def refresh(self, snapshot: ArtifactRef, step: int, round_: int, args: dict, out: Path, trainer_key: str) -> str:
        """The folder of the negatives mined with the step-`step` snapshot. `args`: the encode, index, mining,
        execution configs and work_dir of the trainer. A flow run started before (the same idempotency key: a
        resumed trainer) is followed, not started again; one that had already failed is skipped."""
        result_file = out / RESULTS / f"step-{step}.json"
        result_file.parent.mkdir(parents=True, exist_ok=True)
        parameters = {
            "checkpoint": str(Path(snapshot.path).resolve()), "data": self.data.model_dump(mode="json"),
            "encode": args["encode"].model_dump(mode="json"), "index": args["index"].model_dump(mode="json"),
            "mining": args["mining"].model_dump(mode="json"), "round_number": round_,
            "work_dir": str(Path(args["work_dir"]).resolve()),
            "execution": args["execution"].model_dump(mode="json"), "result_file": str(result_file.resolve()),
        }
        problems, key = [], 0
        while len(problems) <= self.cfg.retries:
            flow_run = run_deployment(self.cfg.deployment, parameters=parameters, timeout=0,
                                      flow_run_name=f"refresh-step-{step}-try-{key}",
                                      idempotency_key=f"{trainer_key}-step-{step}-try-{key}",
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
            if problem is None:
                return json.loads(result_file.read_text())["mine"]
            problems.append(f"{flow_run.name}: {problem}")
            self.logger.warning(f"refresh from the step-{step} checkpoint: flow run {flow_run.name} {problem}; "
                                + ("starting another" if len(problems) <= self.cfg.retries else "no retries left"))
        raise AnceError(f"every flow run of the step-{step} refresh failed: " + "; ".join(problems))

    def _follow(self, flow_run: FlowRun) -> str | None:
        """Wait for the flow run to finish: None when it completed, else what went wrong (a run that lost its worker
        or ran past `timeout_s` is marked crashed first)."""
        started = time.time()
        noted = started
        with get_client(sync_client=True) as client:
            while True:
                run = client.read_flow_run(flow_run.id)
                state = run.state
                if state is not None and state.is_completed():
                    return None
                if state is not None and state.is_final():
                    return f"ended {state.name}: {state.message or 'no message'}"
                lost = _worker_lost(client, run) if state is not None and (state.is_running() or state.is_pending()) \
                    else None
                if lost is None and self.cfg.timeout_s is not None and time.time() - started > self.cfg.timeout_s:
                    lost = f"ran past inferencer.timeout_s ({self.cfg.timeout_s:g} s)"
                if lost is not None:
                    client.set_flow_run_state(run.id, Crashed(message=f"the trainer gave it up: {lost}"), force=True)
                    return f"crashed: {lost}"
                if time.time() - noted > 300:
                    noted = time.time()
                    self.logger.info(f"flow run {run.name} is {state.name if state else 'without a state'} after "
                                     f"{time.time() - started:.0f} s (pool {run.work_pool_name}: is a worker polling "
                                     "it?)")
                time.sleep(self.cfg.poll_seconds)


def _worker_lost(client: SyncPrefectClient, run: FlowRun) -> str | None:
    """Why the worker that took the flow run is gone (None: it is not, or no worker has taken it yet). A worker
    killed with its machine leaves its flow run running in the API; its missed heartbeats tell."""
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
    if worker.last_heartbeat_time is not None:
        silent = (datetime.datetime.now(datetime.UTC) - worker.last_heartbeat_time).total_seconds()
        if silent > MISSED_HEARTBEATS * interval:
            return f"its worker {name} sent no heartbeat for {silent:.0f} s ({MISSED_HEARTBEATS} x {interval} s)"
    return None
