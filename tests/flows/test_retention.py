"""Scheduled retraining with the retention policy (the `retrain` deployment's): five retrains leave a bounded work
folder, and every version they registered still loads from the MLflow registry."""

import json
import os
import subprocess
import sys

import pytest

from tests.tiny import failure_report, tiny_pipeline_config

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from ance_core.pipeline.config import PipelineConfig
from ance_core.retention import stage_folders
from flows.ance_pipeline import ance_pipeline, retrain
from tracking.registry import model_name

config = json.loads(Path(sys.argv[1]).read_text())
work = Path(config["work_dir"])


def disk(folder):
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and (st := path.stat()).st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


def stages():
    folders = stage_folders(work).values()
    return {"encode": sum(f.stage == "encode" for f in folders), "index": sum(f.stage == "index" for f in folders),
            "train": sum(f.stage == "train" for f in folders),
            "bytes": sum(disk(f.path) for f in folders)}


def champions():
    return sorted(p.name for p in (work / "champion").iterdir() if p.is_dir() and not p.name.startswith("."))


first = ance_pipeline(PipelineConfig.model_validate(config))
after = [stages()]
for k in range(5):  # a week's new training order each time (another seed)
    for copy in (work / "champion").glob("*") if k else ():  # a week passed: the champion copies are days old
        os.utime(copy, (copy.stat().st_mtime - 7 * 86400,) * 2)
    weekly = config | {"retention": {"keep_runs": 2, "keep_refreshes": 1}, "ance": config["ance"] | {"seed": 100 + k}}
    result = retrain(PipelineConfig.model_validate(weekly))
    after.append(stages() | {"retention": result["retention"], "champions": champions()})
uri = result["mlflow_uri"]
mlflow.set_tracking_uri(uri)
name = model_name(config["data"]["dataset"])
versions = MlflowClient(uri).search_model_versions(f"name='{name}'")
shapes = [list(mlflow.pyfunc.load_model(f"models:/{name}/{v.version}").predict(["a query"]).shape) for v in versions]
print(json.dumps({"after": after, "versions": len(versions), "shapes": shapes}))
"""


def test_five_scheduled_retrains_leave_a_bounded_work_folder_and_every_version_still_loads(tiny_scifact, tiny_model,
                                                                                             tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "retrain.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ANCE_FAULT", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run([sys.executable, str(tmp_path / "retrain.py"), str(tmp_path / "config.json")],
                          capture_output=True, text=True, timeout=1200, cwd=os.getcwd(),
                          env=env | {"PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, failure_report(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    first, *retrains = out["after"]
    assert first["encode"] == 3  # zero-shot, warm-up, round 1: no retention on the first run (unset)
    for k, state in enumerate(retrains):
        # the two kept runs' last refresh each (the first run, unrecorded by the policy's runs once two retrains
        # ended, goes with them), and the encoding of the model latest.json names when a retrain kept its start (the
        # champion, a folder of champion/: `ance search --model` reads its encoding); never more
        assert state["encode"] <= 3 and state["index"] <= 3, (k, state)
        assert state["retention"]["removed"] > 0 or k == 0
        # of the champion copies downloaded to retrain from (one per promotion): the two kept runs' starts at most
        assert 1 <= len(state["champions"]) <= 2, (k, state["champions"])
    # bounded: a retrain adds what the policy removes. Not to the byte: what a kept run holds depends on what it
    # chose (measured: 8.01 MB when its result was the round's hybrid, 8.41 MB when it was the start's hybrid, one
    # more evaluation and negatives kept; CI once saw 7.26 and 8.02), so the bound is a quarter, not a growth
    steady = [s["bytes"] for s in retrains[2:]]
    assert max(steady) <= 1.25 * min(steady), steady
    assert out["versions"] >= 1 + 5 and len(out["shapes"]) == out["versions"]
    assert all(shape[0] == 1 for shape in out["shapes"])
