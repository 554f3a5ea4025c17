"""A stopped asynchronous trainer ends the task runs of its inferencer's threads on the server (issue 41 item 10),
even those whose Running state the server has not yet recorded when it is stopped (a busy server records the events
that carry task run states seconds late: CI saw an encode shard left Running)."""

import subprocess
import sys
import time
import uuid

import httpx

from tests.tiny import env_for

TRAINER = """
import contextvars, sys, threading
from prefect import flow, task
from tasks.common import stage_task
from tasks.train_async import _crash_task_runs_beside

started = threading.Event()

@stage_task("hung-stage", task_run_name="hung-{n}")
def hung(n: int):
    started.set()
    threading.Event().wait()  # never returns: the process ends around it, as a stopped run's daemon threads do

@task(name="trainer", task_run_name="trainer")
def trainer():
    context = contextvars.copy_context()  # the thread's task run is a child of this one, as the inferencer's are
    threading.Thread(target=context.run, args=(hung, 1), daemon=True).start()
    assert started.wait(120)
    _crash_task_runs_beside("the trainer was stopped")  # at once: before the server has recorded hung-1 Running

@flow(name=sys.argv[1])
def stopped():
    trainer()

stopped()
"""


def _task_runs_of(api: str, flow_name: str, deadline: float) -> dict[str, str]:
    """{name: state type} of the task runs of the flow run of `flow_name`, once hung-1's is recorded and not
    Running, or at the deadline."""
    while True:
        runs = httpx.post(f"{api}/flow_runs/filter", json={"flows": {"name": {"any_": [flow_name]}}},
                          timeout=30).json()
        states = {}
        if runs:
            states = {r["name"]: r["state_type"] for r in httpx.post(
                f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [runs[0]["id"]]}}}, timeout=30).json()}
        if states.get("hung-1") not in (None, "RUNNING", "PENDING") or time.time() > deadline:
            return states
        time.sleep(1)


def test_a_thread_task_run_the_server_has_not_recorded_yet_is_ended_crashed(prefect_server, tmp_path):
    name = f"stopped-trainer-{uuid.uuid4().hex[:8]}"
    env = env_for(tmp_path, PREFECT_API_URL=prefect_server)
    proc = subprocess.run([sys.executable, "-c", TRAINER, name], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = _task_runs_of(prefect_server, name, time.time() + 90)
    assert states.get("trainer") == "COMPLETED", states
    assert states.get("hung-1") == "CRASHED", states
