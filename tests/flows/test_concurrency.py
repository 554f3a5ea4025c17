"""Four `ance run`s of the same tiny pipeline at once, against one real Prefect server on 127.0.0.1, sharing one work
folder: every stage is built by exactly one of them (the others wait on its lock and reuse it), all four complete
with identical metrics, and no partial folder is left behind."""

import json
import os
import subprocess
import sys
from collections import Counter

import httpx
import pytest

from tests.tiny import tiny_pipeline_config

pytestmark = pytest.mark.slow
RUNS = 4


def test_concurrent_runs_build_each_stage_once_and_agree(prefect_server, tiny_scifact, tiny_model, tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=3)
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    env = os.environ | {"PREFECT_API_URL": prefect_server, "PREFECT_HOME": str(tmp_path / "prefect")}
    procs = [subprocess.Popen([sys.executable, "-m", "ance_cli", "run", "--config", str(tmp_path / "tiny.json"),
                               "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(RUNS)]
    outputs = [p.communicate(timeout=1800) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    # all four flow runs completed on the server (which may hold other tests' runs: ours are those of this work folder)
    query = {"flows": {"name": {"any_": ["ance-train"]}}, "sort": "START_TIME_DESC", "limit": 200}
    runs = httpx.post(f"{prefect_server}/flow_runs/filter", json=query, timeout=30).json()
    runs = [r for r in runs if r["parameters"]["config"]["work_dir"] == config["work_dir"]]
    assert len(runs) == RUNS and {r["state_type"] for r in runs} == {"COMPLETED"}
    # identical metrics and the same result model and checkpoint
    assert all(r["results"] == results[0]["results"] for r in results)
    assert len({(r["selected"], r["final_checkpoint"]) for r in results}) == 1
    # each stage folder was built by one run; the others reused it (the data stage: by the CLIs' validation)
    builders = Counter(s["path"] for r in results for s in r["stages"] if not s["cached"])
    paths = {s["path"] for r in results for s in r["stages"]}
    assert max(builders.values()) == 1, [p for p, n in builders.items() if n > 1]
    data = {s["path"] for s in results[0]["stages"] if s["stage"] == "prepare"}
    assert set(builders) == paths - data
    work = tmp_path / "work"
    assert not list(work.glob("*/.partial-*")) and not list(work.glob("train/*/checkpoints"))
    print(f"\nconcurrency: {RUNS} runs COMPLETED with identical metrics; {len(builders)} stage folders, each built "
          f"once ({sum(len(r['stages']) for r in results) - len(builders)} stage uses reused another run's build "
          f"or the CLI's validation); 0 partial folders")  # the figure in BENCHMARKS.md (pytest -s)
