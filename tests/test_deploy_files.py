"""The deployment files stay valid: prefect.yaml's deployments point at real flows, the compose file passes
`docker-compose config` (Debian's docker-compose; no Docker engine needed), the images are pinned and non-root."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint
from pydantic import BaseModel

from ance_core.negatives.samplers import NAMES
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.recipes import RECIPES, recipe_config
from ance_core.pipeline.tune import TuneConfig

REPO = Path(__file__).resolve().parents[1]


def test_prefect_yaml_deployments_resolve_to_flows_with_pydantic_parameters():
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    expected = {"ance-train", "bm25-warmup", "refresh-negatives", "evaluate", "retrain", "ance-train-gpu",
                "refresh-negatives-gpu",
                "compare-negatives", "compress"}
    assert expected <= set(deployments)
    recipes = {f"ance-train-{r}": r for r in RECIPES}  # `ance run --recipe` from the UI: the form opens with them
    assert {*recipes, "ance-train-auto", "ance-tune"} <= set(deployments)
    for name, d in deployments.items():
        path, func = d["entrypoint"].split(":")
        flow = load_flow_from_entrypoint(str(REPO / path) + ":" + func)
        assert flow.name in (name, name.removesuffix("-gpu"), "ance-train" if name in recipes else name), (name,
                                                                                                        flow.name)
        assert d["work_pool"]["name"] == ("gpu" if name.endswith("-gpu") else
                                          "infer" if name == "refresh-negatives" else "cpu")
    schema = load_flow_from_entrypoint(str(REPO / "flows/ance_pipeline.py") + ":ance_pipeline").parameters
    assert "config" in schema.properties and "PipelineConfig" in str(schema.definitions)
    # the UI form offers every sampler as a choice, per stage (warm-up and rounds share MiningConfig)
    sampler = schema.definitions["MiningConfig"]["properties"]["sampler"]
    assert sampler["enum"] == list(NAMES) and {"ance", "simans", "bm25", "random", "in-batch", "nce"} <= set(NAMES)
    # issue 30's levers are fields of the form: prefixes, cached in-batch negatives, distillation, the FN margin
    properties = {name: schema.definitions[name]["properties"] for name in ("ModelConfig", "TrainConfig",
                                                                             "MiningConfig", "TeacherConfig")}
    assert {"query_prefix", "passage_prefix"} <= set(properties["ModelConfig"])
    assert {"grad_cache_chunk", "distill_weight"} <= set(properties["TrainConfig"])
    assert {"teacher", "margin", "num_negatives"} <= set(properties["MiningConfig"])
    assert {"model", "kind", "temperature"} <= set(properties["TeacherConfig"])
    compare = load_flow_from_entrypoint(str(REPO / "flows/compare.py") + ":compare_negatives").parameters
    assert "samplers" in compare.definitions["CompareConfig"]["properties"]
    for name, d in deployments.items():  # the run form says what each field is (the flows' Args, the configs' fields,
        form = load_flow_from_entrypoint(str(REPO / d["entrypoint"])).parameters  # every section's, at every depth)
        assert all(p.get("description") for p in form.properties.values()), (name, list(form.properties))
        unsaid = [f"{section}.{field}" for section, definition in (form.definitions or {}).items()
                  for field, p in definition.get("properties", {}).items() if not p.get("description")]
        assert not unsaid, (name, unsaid)
    sections = {k: f for k, f in PipelineConfig.model_fields.items() if isinstance(f.default, BaseModel)}
    assert len(sections) > 10 and all(f.description for f in sections.values()), sorted(
        k for k, f in sections.items() if not f.description)
    for name, recipe in recipes.items():  # the recipe's overrides as the code has them, nothing else
        assert deployments[name]["parameters"]["config"] == RECIPES[recipe], name
        assert PipelineConfig.model_validate(deployments[name]["parameters"]["config"]) == recipe_config(recipe)
    for entrypoint in ("flows/auto.py:tune_and_train", "flows/tune.py:tune_recipe"):  # the search's base recipe
        form = load_flow_from_entrypoint(str(REPO / entrypoint)).parameters.properties["config"]["default"]
        assert PipelineConfig.model_validate(form) == recipe_config(TuneConfig().recipe) != PipelineConfig()
    assert [s["cron"] for s in deployments["retrain"]["schedules"]] == ["0 3 * * 1"]
    # the weekly retrain keeps the work folder bounded (a partial config: the rest are PipelineConfig's defaults)
    retrain = PipelineConfig.model_validate(deployments["retrain"]["parameters"]["config"]).retention
    assert retrain.keep_runs and retrain.keep_refreshes


def test_compose_file_validates():
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: run `make system-deps` (Debian package docker-compose)")
    proc = subprocess.run(["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    services = {"postgres", "prefect-server", "worker-cpu", "worker-infer", "worker-gpu", "mlflow"}
    assert services <= set(config["services"])
    server = config["services"]["prefect-server"]
    assert "postgresql+asyncpg://" in server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    mlflow = config["services"]["mlflow"]
    assert "--backend-store-uri postgresql://" in mlflow["command"] and "--artifacts-destination" in mlflow["command"]
    assert "profiles" not in mlflow  # part of the default stack
    assert config["services"]["worker-cpu"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert {"prefect-server", "mlflow"} <= {name for name, s in config["services"].items() if s.get("ports")}
    assert ports_on_all_interfaces(config["services"]) == []


LOOPBACK = ("127.", "::1", "localhost")


def ports_on_all_interfaces(services: dict) -> list[str]:
    """The published ports that a compose file binds to every interface, in either syntax: a string
    ("80", "8080:80", "0.0.0.0:8080:80", "127.0.0.1:8080:80/udp", "[::1]:8080:80") or a mapping (`docker-compose
    config` writes this one), where a missing host_ip means every interface."""
    found = []
    for name, service in services.items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host = port.get("host_ip") or ""
            else:
                spec = str(port).split("/")[0]
                if spec.startswith("["):  # [IPv6]:host:container
                    host = spec[1:spec.index("]")]
                else:
                    parts = spec.split(":")
                    host = parts[0] if len(parts) == 3 else ""
            if not host.startswith(LOOPBACK):
                found.append(f"{name}: {port}")
    return found


def test_the_port_check_catches_every_way_of_publishing_on_all_interfaces(tmp_path):
    raw = {"a": {"ports": ["80", "8080:80", "0.0.0.0:81:81", "127.0.0.1:82:82", "[::1]:83:83", "127.0.0.1::84/udp"]},
           "b": {"ports": [{"target": 85, "published": 85}, {"target": 86, "host_ip": "0.0.0.0"},
                           {"target": 87, "published": 87, "host_ip": "127.0.0.1"}]}}
    assert ports_on_all_interfaces(raw) == ["a: 80", "a: 8080:80", "a: 0.0.0.0:81:81",
                                            "b: {'target': 85, 'published': 85}",
                                            "b: {'target': 86, 'host_ip': '0.0.0.0'}"]
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed: run `make system-deps` (Debian package docker-compose)")
    # the same through docker-compose's own normalisation, as the compose-file test sees it
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump({"services": {
        "web": {"image": "nginx:1.27", "ports": ["0.0.0.0:8080:80", "9090:90", "127.0.0.1:7070:70"]}}}))
    proc = subprocess.run(["docker-compose", "-f", str(tmp_path / "compose.yaml"), "config"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    flagged = ports_on_all_interfaces(yaml.safe_load(proc.stdout)["services"])
    assert len(flagged) == 2 and all("7070" not in f for f in flagged)


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
    assert "constraints.txt" in text and any("-c /tmp/constraints.txt" in r or "-c constraints.txt" in r
                                             for r in run_instructions(text) if "pip install" in r)
    if name == "Dockerfile.mlflow":
        return
    # the worker images run every process on mimalloc (ance_core/allocator.py): the library the wheel installs, linked
    # where LD_PRELOAD names it
    link = next(r for r in run_instructions(text) if "ance_core.allocator" in r)
    preload = re.search(r"^ENV LD_PRELOAD=(\S+)$", text, re.M).group(1)
    assert f'ln -s "$(python -m ance_core.allocator)" {preload}' in link and f"test -f {preload}" in link
    torch_pin = re.search(r"^torch==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
    if name == "Dockerfile.gpu":
        assert f'"torch=={torch_pin}"' in text
        assert installs_faiss_gpu(text)
        faiss_pin = re.search(r"^faiss-cpu==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
        assert f'"faiss-gpu=={faiss_pin}"' in text, "the GPU image's faiss is constraints.txt's faiss-cpu version"


def run_instructions(dockerfile: str) -> list[str]:
    """The RUN instructions of a Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in dockerfile.splitlines():
        if line.lstrip().startswith("#"):
            continue
        current += " " + line.rstrip().removesuffix("\\")
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [x[4:] for x in logical if x.startswith("RUN ")]


def installs_faiss_gpu(dockerfile: str) -> bool:
    """A RUN line pip-installs a pinned faiss-gpu package and removes faiss-cpu (which would shadow it)."""
    runs = run_instructions(dockerfile)
    installs = any(re.search(r"pip install[^&;]*\bfaiss-gpu[\w-]*==\S+", r) for r in runs)
    return installs and any(re.search(r"pip uninstall[^&;]*\bfaiss-cpu\b", r) for r in runs)


def test_the_gpu_image_check_reads_install_lines_not_comments():
    good = (REPO / "docker" / "Dockerfile.gpu").read_text()
    assert installs_faiss_gpu(good)
    commented = "FROM x:1\n# pip uninstall -y faiss-cpu && pip install faiss-gpu-cu12==1.0\nRUN pip install faiss-cpu\n"
    assert not installs_faiss_gpu(commented)
    unpinned = re.sub(r'"faiss-gpu==[^"]+"', "faiss-gpu", good)
    assert unpinned != good and not installs_faiss_gpu(unpinned)


def gpu_pool_env() -> dict[str, str]:
    """docker/gpu-pool.env as `make deploy` reads it (KEY=VALUE lines; # comments)."""
    lines = (REPO / "docker" / "gpu-pool.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_the_gpu_pool_runs_keep_their_work_and_log_to_the_stack(monkeypatch):
    """The container settings the docker worker would create for an ance-train-gpu flow run: Prefect's base job
    template for docker workers, filled with prefect.yaml's job variables as `prefect deploy` resolves them (from
    docker/gpu-pool.env), prepared for a flow run. There is no Docker engine here: the client only reports a
    version."""
    import asyncio
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

    env = gpu_pool_env()
    for key, value in env.items():  # what `make deploy` exports before `prefect deploy` reads prefect.yaml
        monkeypatch.setenv(key, value)
    deployment = next(d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
                      if d["name"] == "ance-train-gpu")
    values = apply_values(deployment["work_pool"]["job_variables"], dict(os.environ), remove_notset=False)
    template = DockerWorker.get_default_base_job_template()
    job = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(template, values))
    job.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="tiny-run"))

    class Engine:  # what the worker asks a Docker engine while it builds the settings
        def version(self) -> dict:
            return {"Version": "27.3.1"}

    settings = DockerWorker(work_pool_name="gpu")._build_container_settings(Engine(), job)
    assert settings["image"] == env["ANCE_GPU_IMAGE"] == "ance-worker-gpu:latest"
    # built on the host, pushed nowhere: never pulled (a :latest tag is otherwise always pulled, and fails)
    assert job._determine_image_pull_policy().value == "Never"
    # the work folder (stage folders, checkpoints, Prefect's task results) and the data home outlive the container
    assert set(settings["volumes"]) == {f"{env['ANCE_GPU_WORK']}:/app/work", f"{env['ANCE_GPU_DATA']}:/data"}
    environment = settings["environment"]
    assert environment["PREFECT_LOCAL_STORAGE_PATH"].startswith("/app/work/")
    assert environment["ANCE_DATA_HOME"] == "/data" and environment["ANCE_PROJECT_DIR"] == "/app"
    assert environment["MLFLOW_TRACKING_URI"] == env["ANCE_GPU_MLFLOW_URI"] == "http://mlflow:5000"
    assert settings["network"] == env["ANCE_GPU_NETWORK"] == "ance"
    assert settings["device_requests"] == [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]
    assert settings["shm_size"] == "8g" and settings["auto_remove"] is True  # (64 MiB /dev/shm; a container a run)
    # the links between the UIs name the host's addresses, not the network's (which no browser resolves)
    assert environment["PREFECT_UI_URL"] == env["ANCE_GPU_PREFECT_UI_URL"] == "http://127.0.0.1:4200"
    assert environment["ANCE_MLFLOW_UI_URL"] == env["ANCE_GPU_MLFLOW_UI_URL"] == "http://127.0.0.1:5000"
    assert "{{" not in str(settings)  # every placeholder resolved
    # the stack's cpu worker shares that volume at the same path, on that network, with the same result storage
    proc = subprocess.run(["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    compose = yaml.safe_load(proc.stdout)
    cpu = compose["services"]["worker-cpu"]
    mounts = {(v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2]) for v in cpu["volumes"]}
    assert (env["ANCE_GPU_WORK"], "/app/work") in mounts
    assert cpu["environment"]["PREFECT_LOCAL_STORAGE_PATH"] == environment["PREFECT_LOCAL_STORAGE_PATH"]
    assert (cpu["environment"]["PREFECT_UI_URL"], cpu["environment"]["ANCE_MLFLOW_UI_URL"]) == (
        "http://127.0.0.1:4200", "http://127.0.0.1:5000")
    assert compose["volumes"]["ance-work"]["name"] == env["ANCE_GPU_WORK"]
    assert compose["networks"]["default"]["name"] == env["ANCE_GPU_NETWORK"]
    # the gpu launcher (uid 1000) may use the host's Docker socket: it joins the socket's group
    launcher = compose["services"]["worker-gpu"]
    assert "/var/run/docker.sock" in str(launcher["volumes"]) and launcher["group_add"]
