"""One SIGTERM (a worker stopping its flow run, `kill`, a container's stop) ends a running `ance run`: the process
exits without a second signal, its flow run ends Crashed or Cancelled on the Prefect server it reports to, no stage
folder is left half-written, and a re-run resumes from the stages and checkpoint already made (issue 29)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ance_cli.orphans import NAME
from ance_core.artifacts import is_complete
from tests.tiny import RUN_RECORDS, command, env_for, run, tiny_pipeline_config

ENDED = {"CRASHED", "CANCELLED", "FAILED"}
STATES_OF_FLOW_RUNS = """
import asyncio, json
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as client:
        print(json.dumps([[r.name, r.state.type.value] for r in await client.read_flow_runs()]))

asyncio.run(main())
"""


def _terminate_when_hung(root: Path, config: dict, env: dict, fault: str, sig: int = signal.SIGTERM,
                         group: bool = False) -> int:
    """Start `ance run` with `fault` set to hang, wait until it hangs, send its process (only it; `group`: its whole
    process group, the embedded server included, as Ctrl-C at a terminal or a container's stop do) one `sig`; its
    exit status. A process still alive 120 s later fails the test (and its group is killed)."""
    signal_file = root / "hung"
    proc = subprocess.Popen(command(root, config), stdout=subprocess.DEVNULL, stderr=open(root / "run.log", "w"),
                            env=env | {"ANCE_FAULT": f"{fault}:hang", "ANCE_FAULT_SIGNAL": str(signal_file)},
                            start_new_session=True)
    deadline = time.time() + 600
    while not signal_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert signal_file.exists(), f"the run never reached {fault} (exit {proc.poll()}): {_tail(root)}"
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"one {signal.Signals(sig).name} did not end `ance run` within 120 s: {_tail(root)}"
                             ) from None


def _tail(root: Path) -> str:
    return (root / "run.log").read_text()[-3000:]


def _servers_left(home: Path) -> list[int]:
    """Processes still running with `home` as their PREFECT_HOME (the embedded server is a uvicorn subprocess)."""
    left = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"PREFECT_HOME={home}".encode() in environ.read_bytes().split(b"\0"):
                left.append(int(environ.parent.name))
        except OSError:  # gone, or not ours to read
            pass
    return left


def _flow_run_states(env: dict) -> list[list[str]]:
    """[name, state type] of the flow runs the API that `env` points at knows (the embedded server's database when
    no PREFECT_API_URL is set)."""
    out = subprocess.run([sys.executable, "-c", STATES_OF_FLOW_RUNS], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _no_stage_half_written(work: Path) -> list[Path]:
    """Every visible stage folder is complete (a stage is built under .partial-* and renamed when done); the partial
    ones, which a re-run resumes from."""
    stages = [d for d in work.iterdir() if d.is_dir() and d.name not in RUN_RECORDS]
    for folder in (f for d in stages for f in d.iterdir() if not f.name.startswith(".")):
        assert is_complete(folder), f"{folder}: a visible stage folder that is not complete"
    return [f for d in stages for f in d.glob(".partial-*")]


@pytest.mark.parametrize("mode", ["embedded", "server"])
def test_one_sigterm_ends_the_run_its_flow_run_and_a_rerun_resumes(mode, tiny_scifact, tiny_model, tmp_path,
                                                                     request):
    """Stopped after the warm-up's step 2 (and its checkpoint): on the embedded server (`make demo`'s mode) and on a
    real Prefect server (a deployment's: PREFECT_API_URL)."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=3)
    env = {k: v for k, v in env_for(tmp_path).items() if k != "PREFECT_API_URL"}
    if mode == "server":
        env["PREFECT_API_URL"] = request.getfixturevalue("prefect_server")
    code = _terminate_when_hung(tmp_path, config, env, "train@2")
    assert code == 143 and "stopped (SIGTERM): the stages finished so far are kept" in _tail(tmp_path), _tail(tmp_path)
    left = _servers_left(tmp_path / "prefect")
    for pid in left:  # (not to outlive the test either)
        os.kill(pid, signal.SIGKILL)
    assert not left, "the embedded Prefect server outlived the run it served"
    partial = _no_stage_half_written(tmp_path / "work")
    assert [p.parent.name for p in partial] == ["train"] and (partial[0] / "checkpoints" / "step-000002").is_dir()

    work_flows = [state for name, state in _flow_run_states(env) if name]
    if mode == "server":  # the server holds the flow runs of other tests: this one's is the one whose work it was
        work_flows = _states_of_this_run(env["PREFECT_API_URL"], tmp_path)
    assert work_flows and all(state in ENDED for state in work_flows), work_flows
    assert "RUNNING" not in work_flows

    if mode == "server":
        result, _ = run(tmp_path, config, PREFECT_API_URL=env["PREFECT_API_URL"])
        warmup = next(s for s in result["stages"] if (s["for"], s["stage"]) == ("warmup", "train"))
        summary = json.loads(Path(warmup["path"], "manifest.json").read_text())["summary"]
        assert summary["resumed_from_step"] == 2 and not warmup["cached"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_group_ends_the_run_and_its_embedded_server(sig, tiny_scifact, tiny_model, tmp_path):
    """Ctrl-C at a terminal (SIGINT) and a container's stop (SIGTERM) signal the whole process group: the embedded
    Prefect server stops with the run, whose last calls to it then failed slowly (a rehearsal's `ance run` took about
    two minutes to exit after one SIGTERM to its group)."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=3)
    env = {k: v for k, v in env_for(tmp_path).items() if k != "PREFECT_API_URL"}
    started = time.monotonic()
    code = _terminate_when_hung(tmp_path, config, env, "train@2", sig=sig, group=True)
    print(f"exit {code} {time.monotonic() - started:.0f} s after start")
    assert code == 128 + sig, _tail(tmp_path)
    log = (tmp_path / "run.log").read_text()
    # one line says what happened and what is kept; no dump of each Prefect event the dead server could not take
    assert ("the stages finished so far are kept in the work folder, and the same command resumes from them (a "
            "training from its last checkpoint)") in log.split("Crash detected")[-1], _tail(tmp_path)
    assert "EventsWorker" not in log and "Unable to connect" not in log, _tail(tmp_path)
    left = _servers_left(tmp_path / "prefect")
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the embedded Prefect server outlived the run it served"
    assert not [p for p in _no_stage_half_written(tmp_path / "work") if p.parent.name != "train"]


def test_a_sigkill_to_the_command_alone_does_not_leave_its_embedded_server(tiny_scifact, tiny_model, tmp_path):
    """SIGKILL runs no exit handler (the kernel's OOM killer, `kill -9 <pid>`): the embedded Prefect server, a child
    process the command stops on its way out, was left serving for good. Its watcher (ance_cli/orphans.py) stops it
    once the command is gone, and ends too."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=3)
    env = {k: v for k, v in env_for(tmp_path).items() if k != "PREFECT_API_URL"}
    code = _terminate_when_hung(tmp_path, config, env, "encode-corpus@1", sig=signal.SIGKILL)
    assert code == -signal.SIGKILL, _tail(tmp_path)
    deadline = time.time() + 120  # (the watcher looks every second, and gives the server 10 s to stop)
    while (left := _servers_left(tmp_path / "prefect")) and time.time() < deadline:
        time.sleep(0.5)
    for pid in left:  # (not to outlive the test either)
        os.kill(pid, signal.SIGKILL)
    assert not left, "the embedded Prefect server outlived the command killed outright"
    while (orphaned := _watchers_of_gone_commands()) and time.time() < deadline:
        time.sleep(0.5)
    assert not orphaned, "a server's watcher outlived its command and its server"


def _watchers_of_gone_commands() -> list[int]:
    """Server watchers (ance_cli/orphans.py) whose command is no longer there: they should have ended."""
    orphaned = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if NAME in args and not Path(f"/proc/{args[args.index(NAME) + 1]}").exists():
            orphaned.append(int(cmdline.parent.name))
    return orphaned


def _states_of_this_run(api: str, root: Path) -> list[str]:
    """The state types of the flow runs whose parameters name this test's work folder (the pipeline flow's)."""
    deadline = time.time() + 120
    while True:  # the server may take a moment to record the crash it was told of
        runs = httpx.post(f"{api}/flow_runs/filter", json={"limit": 200}, timeout=30).json()
        mine = [r["state_type"] for r in runs if str(root / "work") in json.dumps(r.get("parameters", {}))]
        if mine and all(s in ENDED for s in mine) or time.time() > deadline:
            return mine
        time.sleep(1)


def test_one_sigterm_during_an_async_refresh_ends_the_inferencers_task_runs_too(tiny_scifact, tiny_model, tmp_path,
                                                                                 prefect_server):
    """refresh: async in thread mode, stopped while the inferencer thread encodes the step-4 snapshot (its second
    shard): the task runs of that thread end with the flow run, none is left Running on the server (issue 41)."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=2, steps=4) | {"refresh": "async"}
    env = {k: v for k, v in env_for(tmp_path).items() if k != "PREFECT_API_URL"} | {"PREFECT_API_URL": prefect_server}
    # corpus encodings: the zero-shot model's, the warm-up's, then the inferencer's of the step-4 snapshot
    code = _terminate_when_hung(tmp_path, config, env, "encode-corpus@2#3")
    assert code != 0, _tail(tmp_path)
    assert _states_of_this_run(prefect_server, tmp_path) == ["CRASHED"]
    states = _task_run_states(prefect_server, tmp_path)
    assert any(name.startswith("encode-shard") for name, _ in states), states  # the inferencer's tasks are there
    assert not [name for name, state in states if state == "RUNNING"], states


def _task_run_states(api: str, root: Path) -> list[tuple[str, str]]:
    """[name, state type] of the task runs of this test's flow run, once none is Running or after a deadline."""
    flow_run = next(r for r in httpx.post(f"{api}/flow_runs/filter", json={"limit": 200}, timeout=30).json()
                    if str(root / "work") in json.dumps(r.get("parameters", {})))
    deadline = time.time() + 60
    while True:  # the server records the runs' ends from their events: late on a busy machine
        runs = httpx.post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run["id"]]}},
                                                            "limit": 200}, timeout=30).json()
        states = [(r["name"], r["state_type"]) for r in runs]
        if all(state != "RUNNING" for _, state in states) or time.time() > deadline:
            return states
        time.sleep(2)
