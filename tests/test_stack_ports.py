"""`scripts/stack.sh up` on a port another server holds (the compose stack binds 4200 and 5000 too): one line naming
the port and the variable that moves it, and nothing started. Before, the MLflow server it had started was left
running while the Prefect server failed to bind."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.tiny import free_port

REPO = Path(__file__).resolve().parents[1]


def test_up_refuses_a_port_another_server_holds(tmp_path):
    env = os.environ | {"STACK_DIR": str(tmp_path / "stack"), "VENV": str(Path(sys.executable).parents[1]),
                        "MLFLOW_STORE_DIR": str(tmp_path / "mlflow")}
    for variable in ("PREFECT_PORT", "MLFLOW_PORT"):
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            ports = {"PREFECT_PORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
            ports[variable] = str(other.getsockname()[1])
            try:
                up = subprocess.run([str(REPO / "scripts" / "stack.sh"), "up"], env=env | ports, capture_output=True,
                                    text=True, timeout=300)
            finally:
                subprocess.run([str(REPO / "scripts" / "stack.sh"), "down"], env=env | ports, capture_output=True,
                               timeout=120)
        assert up.returncode == 1, up.stdout + up.stderr
        assert f"port {ports[variable]} (127.0.0.1) is in use" in up.stderr and f"set {variable} to a free" in up.stderr
        assert "started" not in up.stdout, up.stdout
