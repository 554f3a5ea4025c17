"""Session fixtures: a tiny random BERT with a locally trained WordPiece tokenizer, and a ~200-document SciFact
subset in BEIR layout. Everything offline. And a real Prefect server on 127.0.0.1 for the tests that run flows.

Parallel runs (`make test`: pytest-xdist, `-n`): the controller starts one `prefect server` for the whole session and
every worker's flows report to it (PREFECT_API_URL), instead of each `ance run` starting an ephemeral server of its
own (about 14 s of CPU each); tests that need a server of their own start one, and the tests that check the
ephemeral mode unset PREFECT_API_URL. Each process runs torch on one thread (OMP_NUM_THREADS). Tests that share an
expensive fixture carry an `xdist_group` mark, so they run on one worker; the units (groups and single tests) start
longest first, by `tests/durations.json` (`pytest --store-durations` rewrites it). A plain `pytest` run (no `-n`)
starts nothing: every flow runs on its own ephemeral server, and a test that needs a server starts one for its module.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import transformers

from tests.tiny import (
    TinyPipeline,
    build_tiny_model,
    build_tiny_scifact,
    free_port,
    shared_scifact,
    wait_answering,
)

# Prefect's ephemeral server gets 20 s to start by default: not enough on a busy machine (as ance_cli.main sets it).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
SHARED_SERVER = "ANCE_TESTS_PREFECT_SERVER"  # the session server's API URL (set by the controller, read by workers)
SHARED_LOG = "ANCE_TESTS_PREFECT_SERVER_LOG"
DURATIONS = REPO / "tests" / "durations.json"
DEFAULT_SECONDS = 2.0  # a test durations.json does not know yet


def start_prefect_server(root: Path) -> tuple[subprocess.Popen, str, Path]:
    """`prefect server start` on a free 127.0.0.1 port with its own PREFECT_HOME under `root` (not yet answering)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(root / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log_path = root / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return server, f"http://127.0.0.1:{port}/api", log_path


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's wall time (setup + call + teardown) to {DURATIONS.relative_to(REPO)}")


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one pytest-xdist worker (a shared "
                                       "module fixture)")
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "ance-durations")
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker (the controller started the server), or a run without xdist (ephemeral servers)
    root = Path(tempfile.mkdtemp(prefix="ance-tests-prefect-"))
    server, api, log = start_prefect_server(root)
    config.stash[_server] = (server, root)
    os.environ |= {SHARED_SERVER: api, SHARED_LOG: str(log), "PREFECT_API_URL": api}  # inherited by the workers
    # one torch thread per process: the workers' processes share 2 cores, and OpenMP threads of several processes
    # spin against each other (more CPU for the same work)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_unconfigure(config):
    if (started := config.stash.get(_server, None)) is not None:
        server, root = started
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


_server = pytest.StashKey[tuple]()


@pytest.fixture(scope="session", autouse=True)
def shared_prefect_server():
    """Wait (once per worker) until the session's Prefect server answers; None without one."""
    api = os.environ.get(SHARED_SERVER)
    if api is None:
        yield None
        return
    deadline = time.time() + 300
    while True:
        try:
            if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            tail = Path(os.environ[SHARED_LOG]).read_text()[-3000:]
            raise AssertionError(f"the session's Prefect server at {api} did not answer within 300 s: {tail}")
        time.sleep(1)
    yield api


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    folder = shared_scifact()
    if folder is None:
        pytest.skip("SciFact not found (set ANCE_DATA_HOME or put it at ../shared/data/scifact)")
    return folder


@pytest.fixture(scope="session")
def tiny_scifact(scifact_dir, tmp_path_factory) -> Path:
    """~200 SciFact documents: the positives of 40 train and 30 test queries, filled up with random others."""
    return build_tiny_scifact(scifact_dir, tmp_path_factory.mktemp("data") / "scifact-tiny")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, 32-dim random BERT with a WordPiece vocabulary trained here."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_scifact, tiny_model, tmp_path_factory) -> TinyPipeline:
    """The tiny pipeline, run once (ephemeral server): the tests that use it carry xdist_group("tiny-pipeline")."""
    return TinyPipeline.start(tiny_scifact, tiny_model, tmp_path_factory.mktemp("tiny-pipeline"))


@pytest.fixture(scope="module")
def prefect_server(shared_prefect_server, tmp_path_factory):
    """A real `prefect server` on 127.0.0.1 (its API URL): the session's, or one started for the test module."""
    if shared_prefect_server is not None:
        yield shared_prefect_server
        return
    root = tmp_path_factory.mktemp("prefect-server")
    server, api, log = start_prefect_server(root)
    try:
        wait_answering(f"{api}/health", server, "prefect server", 300, log)
        yield api
    finally:
        stop(server)


@pytest.fixture
def ephemeral_prefect(monkeypatch):
    """This test's flows run on Prefect's ephemeral server (`make demo`'s mode), not on the session's server."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


# ---------------------------------------------------------------- scheduling: longest units first


def _test_id(nodeid: str) -> str:
    """A nodeid without the `@group` suffix that pytest-xdist's loadgroup gives a grouped test (not a parameter's
    `@`)."""
    return nodeid[: nodeid.rfind("@")] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def _unit(item) -> str:
    """What pytest-xdist (--dist loadgroup) schedules as one unit: the test's xdist_group, else the test."""
    mark = item.get_closest_marker("xdist_group")
    return mark.kwargs.get("name", mark.args[0] if mark.args else "") if mark else _test_id(item.nodeid)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which marks the grouped tests' nodeids
def pytest_collection_modifyitems(config, items):
    """Order the units longest first (by tests/durations.json), so that no long test starts last; a unit's tests stay
    in their own order. On an xdist worker, refuse to run when the groups did not reach the scheduler (each test of a
    group would build the group's fixture again on its own worker)."""
    if getattr(config.option, "loadgroup", False):
        lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and _test_id(i.nodeid) == i.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist's --dist loadgroup did not mark {len(lost)} grouped tests (first: "
                                    f"{lost[0]}): this pytest and pytest-xdist do not work together (pyproject.toml)")
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    cost = {unit: sum(known.get(_test_id(i.nodeid), DEFAULT_SECONDS) for i in tests) for unit, tests in units.items()}
    items[:] = [i for unit in sorted(units, key=lambda u: -cost[u]) for i in units[unit]]


class DurationRecorder:
    """`--store-durations`: each test's wall time (setup + call + teardown, as the workers report them to the
    controller), written to tests/durations.json when the session ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        test = _test_id(report.nodeid)
        self.seconds[test] = self.seconds.get(test, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(self.seconds.items())}, indent=0) + "\n")
