"""Flows that deployments run from the Prefect UI, called as a worker calls them (not through the CLI, whose checks
they must make themselves): `ance-train-auto` (the recipe search, then its winner trained) and `compress` refusing
what it cannot do before the corpus is encoded. On Prefect's ephemeral server, the work folder's MLflow store."""

import json
import os
import subprocess
import sys

import pytest

from tests.tiny import failure_report, random_head_checkpoint, tiny_pipeline_config

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys
from pathlib import Path
from ance_core.compression.config import CompressConfig
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.tune import TuneConfig
from flows.auto import tune_and_train
from flows.compress import compress_flow

config = PipelineConfig.model_validate(json.loads(Path(sys.argv[1]).read_text()))
out = {}
try:
    compress_flow(sys.argv[2], DataConfig(dataset=config.data.dataset), compression=CompressConfig(dims=[64, 512]),
                  work_dir=sys.argv[3])
except AnceError as e:
    out["compress"] = str(e)
search = TuneConfig(learning_rates=[config.warmup.learning_rate], warmup_epochs=[1], seeds=[42])  # the baseline only
result = tune_and_train(config, search)
out["auto"] = {"search": result["recipe_search"], "models": [r["model"] for r in result["results"]]}
print(json.dumps(out))
"""


def test_ance_train_auto_trains_the_searchs_winner_and_compress_refuses_before_encoding(tiny_scifact, tiny_model,
                                                                                      tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    (tmp_path / "c.json").write_text(json.dumps(config))
    (tmp_path / "ui.py").write_text(SCRIPT)
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")  # (32 dimensions)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ANCE_FAULT", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run([sys.executable, str(tmp_path / "ui.py"), str(tmp_path / "c.json"), str(checkpoint),
                           str(tmp_path / "cw")], capture_output=True, text=True, timeout=1200, cwd=os.getcwd(),
                          env=env | {"PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, failure_report(proc)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "compression.dims [64, 512]: none is below the model's dimension 32" in out["compress"]
    assert not (tmp_path / "cw" / "encode").exists()  # refused after the data stage, before the corpus encoding
    search = out["auto"]["search"]
    assert search["winner"] == "demo (baseline)" and search["reason"]
    assert (tmp_path / "work" / "tune").is_dir() and str(tmp_path / "work" / "tune") in search["report_dir"]
    assert "ANCE round 1" in out["auto"]["models"]  # the winner trained in full, its run recorded (trials are not)
    assert (tmp_path / "work" / "latest.json").is_file()
