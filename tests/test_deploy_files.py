"""The deployment files stay valid: prefect.yaml's deployments point at real flows, the compose file passes
`docker-compose config` (Debian's docker-compose; no Docker engine needed), the images are pinned and non-root."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

REPO = Path(__file__).resolve().parents[1]


def test_prefect_yaml_deployments_resolve_to_flows_with_pydantic_parameters():
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    expected = {"ance-train", "bm25-warmup", "refresh-negatives", "evaluate", "retrain", "ance-train-gpu",
                "compare-negatives", "compress"}
    assert expected <= set(deployments)
    for name, d in deployments.items():
        path, func = d["entrypoint"].split(":")
        flow = load_flow_from_entrypoint(str(REPO / path) + ":" + func)
        assert flow.name in (name, name.removesuffix("-gpu")), (name, flow.name)
        assert d["work_pool"]["name"] == ("gpu" if name.endswith("-gpu") else "cpu")
    schema = load_flow_from_entrypoint(str(REPO / "flows/ance_pipeline.py") + ":ance_pipeline").parameters
    assert "config" in schema.properties and "PipelineConfig" in str(schema.definitions)
    # the UI form offers every sampler as a choice, per stage (warm-up and rounds share MiningConfig)
    sampler = schema.definitions["MiningConfig"]["properties"]["sampler"]
    assert sampler["enum"] == ["ance", "simans", "bm25", "random", "bm25+random", "in-batch", "nce"]
    compare = load_flow_from_entrypoint(str(REPO / "flows/compare.py") + ":compare_negatives").parameters
    assert "samplers" in compare.definitions["CompareConfig"]["properties"]
    assert [s["cron"] for s in deployments["retrain"]["schedules"]] == ["0 3 * * 1"]


def test_compose_file_validates():
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: run `make system-deps` (Debian package docker-compose)")
    proc = subprocess.run(["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert {"postgres", "prefect-server", "worker-cpu", "worker-gpu", "mlflow"} <= set(config["services"])
    server = config["services"]["prefect-server"]
    assert "postgresql+asyncpg://" in server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    mlflow = config["services"]["mlflow"]
    assert "--backend-store-uri postgresql://" in mlflow["command"] and "--artifacts-destination" in mlflow["command"]
    assert "profiles" not in mlflow  # part of the default stack
    assert config["services"]["worker-cpu"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert all(p.get("host_ip", "127.0.0.1") == "127.0.0.1" for s in config["services"].values()
               for p in s.get("ports", []) if isinstance(p, dict))


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu", "Dockerfile.mlflow"])
def test_images_are_pinned_and_non_root(name):
    text = (REPO / "docker" / name).read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert ":" in base and not base.endswith(":latest"), base
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    if name == "Dockerfile.mlflow":
        mlflow_pin = re.search(r"^mlflow==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
        assert f'"mlflow=={mlflow_pin}"' in text
        return
    assert "constraints.txt" in text
    torch_pin = re.search(r"^torch==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
    if name == "Dockerfile.gpu":
        assert f'"torch=={torch_pin}"' in text and "faiss-gpu" in text
