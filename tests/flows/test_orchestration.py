"""Orchestration through the real CLI and Prefect: content-keyed caching, invalidation of a deleted artifact, a
transient failure recovered by a retry, a killed run resumed, and the asynchronous refresh.

The `base` run is the tiny pipeline's (tests/conftest.py `tiny_pipeline`: the same stages, without compression) in a
work folder of its own that starts with a copy of that run's stage folders; the tests that change or break it work on
that copy."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ance_core.negatives.refresh_state import read_refresh_state
from tests.tiny import command, env_for, failure_report, kill_when_hung, run

pytestmark = pytest.mark.slow
BASE = pytest.mark.xdist_group("tiny-pipeline")  # the tests of the one tiny pipeline run: on one worker
TRAIN = {"max_steps": 3, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3, "checkpoint_every": 2}


def tiny_config(data: Path, work: Path, **overrides) -> dict:
    config = {
        "data": {"dataset": str(data)},
        "model": {"passage_max_length": 48},
        "warmup": TRAIN,
        "ance": TRAIN,
        "mining": {"top_k": 50},
        "encode": {"batch_size": 32, "shard_size": 64},
        "rounds": 2,
        "work_dir": str(work),
    }
    for key, value in overrides.items():
        config[key] = config[key] | value if isinstance(value, dict) and key in config else value
    return config


def by_stage(result: dict) -> dict[tuple[str, str], bool]:
    return {(s["for"], s["stage"]): s["cached"] for s in result["stages"]}


@pytest.fixture(scope="module")
def base(tiny_pipeline, tiny_scifact, tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("orchestration")
    tiny_pipeline.copy_stages(root / "work")
    config = tiny_config(tiny_scifact, root / "work", model={"name": str(tiny_model)})
    first, _ = run(root, config)
    stages = by_stage(first)
    assert all(stages.values()), stages  # the same stage keys as the tiny pipeline's: every stage found built
    outside = [s["path"] for s in first["stages"] if not s["path"].startswith(str(root / "work"))]
    assert not outside, outside
    assert first["results"] == tiny_pipeline.first["results"]
    return root, config, first


@BASE
def test_rerun_recomputes_nothing(base):
    root, config, first = base
    again, _ = run(root, config)
    assert all(again_cached for again_cached in by_stage(again).values()), by_stage(again)
    assert again["results"] == first["results"]


@BASE
def test_changed_ance_config_recomputes_only_downstream(base):
    root, config, first = base
    changed = config | {"ance": TRAIN | {"learning_rate": 5e-4}}
    result, _ = run(root, changed)
    stages = by_stage(result)
    upstream = [k for k in stages if k[0] in ("data", "BM25", "zero-shot", "warmup")]
    upstream += [("ANCE round 1", "retrieve-train"), ("ANCE round 1", "mine")]  # mined with the warm-up checkpoint
    assert upstream and all(stages[k] for k in upstream), [k for k in upstream if not stages[k]]
    downstream = [("ANCE round 1", "train"), ("ANCE round 1", "encode"), ("ANCE round 2", "train"),
                  ("ANCE round 2", "evaluate")]
    assert not any(stages[k] for k in downstream), {k: stages[k] for k in downstream}
    rows = {r["model"]: r for r in result["results"]}
    assert rows["warmup"] == {r["model"]: r for r in first["results"]}["warmup"]


@BASE
def test_dev_checks_train_each_stage_on_its_candidates_and_the_bm25_depth_leaves_them_trained(base):
    """`dev_check` on: each training stage is checked on its dev candidate set (records carry the check's score) and
    keyed by that set; a changed `bm25.top_k` (BM25's evaluation depth, the dev run's too) re-runs BM25's
    evaluations and the candidate sets, not the training (issue 41 item 6)."""
    from ance_core.training.devcheck import DEV_METRIC

    root, config, _ = base
    checked = config | {"dev_check": {"per_epoch": 1, "depth": 10, "patience": None}}
    result, _ = run(root, checked)
    stages = by_stage(result)
    trains = [k for k in stages if k[1] == "train"]
    assert len(trains) == 3 and not any(stages[k] for k in trains), stages  # other keys: trained again
    assert {k[0] for k in stages if k[1] == "dev-candidates"} == {"warmup", "ANCE round 1", "ANCE round 2"}
    for stage in (s for s in result["stages"] if s["stage"] == "train"):
        records = [json.loads(line) for line in Path(stage["path"], "train_log.jsonl").read_text().splitlines()]
        assert any(DEV_METRIC in r for r in records), stage["for"]
    deeper, _ = run(root, checked | {"bm25": {"top_k": 500}})
    again = by_stage(deeper)
    assert all(again[k] for k in trains), again
    assert not again[("BM25", "bm25")]  # (its evaluation depth changed)

@BASE
def test_deleted_artifact_is_rebuilt_not_returned_dangling(base):
    root, config, first = base
    zero_shot_encode = next(s for s in first["stages"] if (s["for"], s["stage"]) == ("zero-shot", "encode"))
    shutil.rmtree(zero_shot_encode["path"])
    result, _ = run(root, config)
    stages = by_stage(result)
    assert not stages[("zero-shot", "encode")]  # rebuilt into the same folder
    assert Path(zero_shot_encode["path"], "manifest.json").is_file()
    assert stages[("zero-shot", "index")] and stages[("warmup", "train")]  # same content key: reused
    assert result["results"] == first["results"]


@BASE
def test_a_start_checkpoint_inside_the_work_folder_is_recorded_by_the_run_that_starts_from_it(
        tiny_pipeline, base, tmp_path):
    """Retraining from a model of the same work folder (latest.json's, or one named): the run records the folder as
    one it uses, so a garbage collection meanwhile keeps it; one that gc took (half there) stops the run with a line
    naming it, before any training (issue 41, item 4)."""
    from ance_core.artifacts import read_manifest
    from ance_core.run_records import RUNS

    _, config, first = base
    tiny_pipeline.copy_stages(tmp_path / "work")
    trained_last = [s for s in first["stages"] if s["stage"] == "train"][-1]  # not the final checkpoint: dev may pick
    start = tmp_path / "work" / "train" / Path(trained_last["path"]).name     # the zero-shot model (a model/ folder)
    assert read_manifest(start)["key"] == start.name  # a stage folder of this work folder
    retrain = config | {"work_dir": str(tmp_path / "work"), "start_checkpoint": str(start), "rounds": 1}
    result, _ = run(tmp_path, retrain)
    records = list((tmp_path / "work" / RUNS).glob("*.json"))
    assert len(records) == 1
    used = {(s["stage"], s["key"]) for s in json.loads(records[0].read_text())["stages"]}
    assert ("train", start.name) in used
    gone = start.parent / ("f" * 16)  # a folder gc was removing (its manifest goes first): the pre-flight can still
    shutil.copytree(start, gone, ignore=lambda folder, names: ["manifest.json"])  # load the model, the run cannot
    trained = {p.name for p in start.parent.iterdir()}                           # use it
    proc = subprocess.run(command(tmp_path, retrain | {"start_checkpoint": str(gone)}), capture_output=True,
                          text=True, env=env_for(tmp_path), timeout=900)
    assert proc.returncode == 2, failure_report(proc)
    assert f"start_checkpoint {gone}: the folder is incomplete or was removed" in proc.stdout + proc.stderr
    assert {p.name for p in start.parent.iterdir()} == trained  # nothing trained


@BASE
def test_transient_failures_are_retried_and_training_resumes(base, tiny_scifact, tmp_path):
    """encode fails once, the warm-up training fails once after its step-2 checkpoint: retries finish the run."""
    _, config, first = base
    result, log = run(tmp_path, config | {"work_dir": str(tmp_path / "work")},
                      ANCE_FAULT="encode-corpus,train@2")
    assert "injected failure of task 'encode-corpus'" in log and "injected failure of task 'train' at step 2" in log
    assert "Retry 1/2" in log
    warmup = next(s for s in result["stages"] if (s["for"], s["stage"]) == ("warmup", "train"))
    manifest = json.loads(Path(warmup["path"], "manifest.json").read_text())
    assert manifest["summary"]["resumed_from_step"] == 2
    assert len(Path(warmup["path"], "train_log.jsonl").read_text().splitlines()) == 3
    assert result["results"] == first["results"]  # same metrics as the run that never failed


@BASE
def test_killed_run_resumes_from_completed_stages_and_last_checkpoint(base, tmp_path):
    """SIGKILL the whole process group in the middle of ANCE round 1 (its step 3, after its step-2 checkpoint), run
    again: the same metrics as the uninterrupted `base` run."""
    _, config, reference = base
    config = config | {"work_dir": str(tmp_path / "work")}
    kill_when_hung(tmp_path, config, "train@3#2")  # step 3 of the second training stage: the warm-up's is the first
    partial = list((tmp_path / "work" / "train").glob(".partial-*/checkpoints/step-000002"))
    assert len(partial) == 1  # killed mid-round, with its step-2 checkpoint on disk

    resumed, _ = run(tmp_path, config)
    stages = by_stage(resumed)
    assert stages[("warmup", "train")] and stages[("zero-shot", "encode")]  # completed before the kill
    assert not stages[("ANCE round 1", "train")]
    round1 = next(s for s in resumed["stages"] if (s["for"], s["stage"]) == ("ANCE round 1", "train"))
    assert json.loads(Path(round1["path"], "manifest.json").read_text())["summary"]["resumed_from_step"] == 2
    assert resumed["results"] == reference["results"]  # the same metrics as the uninterrupted run


def test_async_refresh_swaps_in_fresh_negatives(tiny_scifact, tiny_model, tmp_path):
    """Async mode: the trainer keeps going on round-1 negatives, then swaps in those mined with its step-6
    checkpoint; max_staleness=7 makes it wait at step 8 at the latest (tiny steps outrun the inferencer). The rounds
    mine the ANN and the run's own BM25 (not BM25's defaults: one BM25 index for the whole run)."""
    config = tiny_config(tiny_scifact, tmp_path / "work", model={"name": str(tiny_model)},
                         ance=TRAIN | {"max_steps": 6}, refresh="async", max_staleness=7, bm25={"k1": 1.2},
                         mining={"sampler": "ance+bm25"})
    result, log = run(tmp_path, config)
    refresh = result["async_refresh"]
    assert refresh["steps_per_round"] == 6 and not refresh["refresh_errors"]
    assert [s["checkpoint_step"] for s in refresh["swaps"]] == [6]
    swap_step = refresh["swaps"][0]["swapped_at_step"]
    assert 6 <= swap_step <= 8
    assert refresh["rounds"][0] == {"round": 1, "mean_staleness": 2.5, "max_staleness": 5}
    assert refresh["rounds"][1]["max_staleness"] == max(swap_step - 1, 11 - swap_step)
    if swap_step == 8:
        assert refresh["waits"] and refresh["waits"][0]["step"] == 8
    models = [r["model"] for r in result["results"]]
    assert models[:-1] == ["BM25", "zero-shot", "warmup", "ANCE round 1", "ANCE round 2"]
    assert models[-1].endswith(" + BM25")  # the hybrid row
    stages = by_stage(result)
    assert stages[("ANCE round 1", "encode")]  # the inferencer encoded the step-6 checkpoint; evaluation reused it
    assert "async refresh: staleness" in log
    # tracked: the trainer's per-step staleness, per-round staleness and negatives statistics, its model registered
    from mlflow.tracking import MlflowClient

    client = MlflowClient(result["mlflow_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    children = {r.info.run_name: r for r in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    trainer = children["ANCE (async)"].info.run_id
    # the trainer's own steps (its run counts from 1), the parent's after the warm-up's 3 on one axis
    assert [m.step for m in client.get_metric_history(trainer, "staleness")] == list(range(1, 13))
    assert [m.step for m in client.get_metric_history(trainer, "loss")] == list(range(1, 13))
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "loss")] == list(range(1, 16))
    assert children["ANCE round 2"].data.metrics["staleness_max"] == refresh["rounds"][1]["max_staleness"]
    assert set(result["negatives"]) == {"warmup", "ANCE round 1", "ANCE round 2"}
    versions = client.search_model_versions(f"run_id = '{trainer}'")
    assert len(versions) == 1 and versions[0].tags["label"] == "ANCE (async)"
    assert len(list((tmp_path / "work" / "bm25-index").glob("[!.]*"))) == 1  # the inferencer's BM25 is the run's
    again, _ = run(tmp_path, config)
    assert all(by_stage(again).values()) and again["async_refresh"] == refresh


def test_async_trainer_killed_between_its_checkpoint_and_its_snapshot_resumes(tiny_scifact, tiny_model, tmp_path):
    """Killed at step 6 with the step's checkpoint written and its snapshot stage not yet published (issue 41: the
    re-run found no snapshot and stopped, naming a folder that does not exist): the re-run resumes from that
    checkpoint, publishes the snapshot from it, refreshes with it and completes."""
    config = tiny_config(tiny_scifact, tmp_path / "work", model={"name": str(tiny_model)},
                         ance=TRAIN | {"max_steps": 6}, refresh="async")
    kill_when_hung(tmp_path, config, "snapshot@6")
    work = tmp_path / "work"
    assert len(list(work.glob("train-async/.partial-*/checkpoints/step-000006"))) == 1
    assert not list(work.glob("snapshot/[!.]*"))  # the window: checkpointed, not published

    result, _ = run(tmp_path, config)
    trainer = next(s for s in result["stages"] if s["stage"] == "train" and s["for"] == "ANCE (async)")
    assert json.loads(Path(trainer["path"], "manifest.json").read_text())["summary"]["resumed_from_step"] == 6
    assert len(list(work.glob("snapshot/[!.]*"))) == 1 and not result["async_refresh"]["refresh_errors"]
    assert [r["model"] for r in result["results"]][-3:-1] == ["ANCE round 1", "ANCE round 2"]  # (+ the hybrid)


def test_async_trainer_killed_after_its_snapshot_resumes(tiny_scifact, tiny_model, tmp_path):
    """Kill the async trainer at step 8 (after the step-6 snapshot, with a refresh maybe in flight); the re-run
    resumes from the step-8 checkpoint, re-launches the refresh and records every step's staleness once."""
    config = tiny_config(tiny_scifact, tmp_path / "work", model={"name": str(tiny_model)},
                         ance=TRAIN | {"max_steps": 6}, refresh="async")
    kill_when_hung(tmp_path, config, "train-async@8")

    result, _ = run(tmp_path, config)
    refresh = result["async_refresh"]
    trainer = next(s for s in result["stages"] if s["stage"] == "train" and s["for"] == "ANCE (async)")
    assert json.loads(Path(trainer["path"], "manifest.json").read_text())["summary"]["resumed_from_step"] == 8
    steps = [step for step, _ in read_refresh_state(Path(trainer["path"]))["staleness"]]
    assert steps == list(range(12))
    assert refresh["rounds"][0] == {"round": 1, "mean_staleness": 2.5, "max_staleness": 5}
    assert [s["checkpoint_step"] for s in refresh["swaps"]] in ([], [6]) and not refresh["refresh_errors"]
    assert [r["model"] for r in result["results"]][-3:-1] == ["ANCE round 1", "ANCE round 2"]  # (+ the hybrid)


def test_async_trainer_killed_before_its_first_checkpoint_counts_each_step_once(tiny_scifact, tiny_model, tmp_path):
    """Killed at step 3 with no checkpoint yet: the re-run trains again from step 0, and the refresh log of the killed
    attempt's steps (kept in the stage's partial folder; its state was resumed only from a checkpoint) counted steps
    0-3 twice in the staleness report."""
    config = tiny_config(tiny_scifact, tmp_path / "work", model={"name": str(tiny_model)},
                         ance=TRAIN | {"max_steps": 6, "checkpoint_every": 0}, refresh="async")
    kill_when_hung(tmp_path, config, "train-async@3")
    work = tmp_path / "work"
    assert list(work.glob("train-async/.partial-*")) and not list(work.glob("train-async/.partial-*/checkpoints/*"))

    result, _ = run(tmp_path, config)
    trainer = next(s for s in result["stages"] if s["stage"] == "train" and s["for"] == "ANCE (async)")
    assert json.loads(Path(trainer["path"], "manifest.json").read_text())["summary"]["resumed_from_step"] == 0
    steps = [step for step, _ in read_refresh_state(Path(trainer["path"]))["staleness"]]
    assert steps == list(range(12))
    assert result["async_refresh"]["rounds"][0] == {"round": 1, "mean_staleness": 2.5, "max_staleness": 5}
