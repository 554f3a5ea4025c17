"""Session fixtures: a tiny random BERT with a locally trained WordPiece tokenizer, and a ~200-document SciFact
subset in BEIR layout. Everything offline. And a real Prefect server for the modules that need one."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from tests.tiny import build_tiny_model, build_tiny_scifact, free_port, shared_scifact, wait_answering

# Prefect's ephemeral server gets 20 s to start by default: not enough on a busy machine (as ance_cli.main sets it).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` on a free 127.0.0.1 port (its API URL); stopped with the test module."""
    root = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(root / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = open(root / "server.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        wait_answering(f"{api}/health", server, "prefect server", 300, root / "server.log")
        yield api
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
