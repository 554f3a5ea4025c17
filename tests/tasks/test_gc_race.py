"""Garbage collection beside a live run, in the windows where a run holds a stage folder it has not recorded yet
(issue 41): a task answered from Prefect's cache, and the stage flows behind the deployments. Real Prefect flows
(the session's server, or an ephemeral one) and a real `collect`."""

import uuid
from pathlib import Path

import pytest
from prefect import flow

from ance_core.artifacts import ArtifactRef, is_complete, run_stage
from ance_core.retention import RetentionConfig, collect
from ance_core.run_records import LIVE, RUNS, live_run
from tasks.common import held_result, run_task, stage_task


@stage_task("gc-race-stage")
def _stage(work_dir: str, name: str) -> ArtifactRef:
    return run_stage(work_dir, "encode", {"name": name}, {}, lambda out: (out / "name.txt").write_text(name) and None)


@stage_task("gc-race-stages")
def _stages(work_dir: str, name: str) -> dict:
    """A result of several folders, as the asynchronous trainer's (its checkpoint and its snapshots)."""
    def build(stage, part):
        return run_stage(work_dir, stage, {"name": name, "part": part}, {},
                         lambda out: (out / "name.txt").write_text(name) and None)
    return {"checkpoint": build("train-async", 0), "snapshots": [build("snapshot", 1), build("snapshot", 2)]}


@flow(name="gc-race")
def _uses(work_dir: str, name: str, gc_between: bool = False, many: bool = False) -> dict:
    """Use the stage through run_task (`many`: the stage of several folders, through held_result, as the
    asynchronous trainer's); `gc_between`: a garbage collection runs between Prefect's (cached) answer and the run's
    record of its folders."""
    calls, stage = [], _stages if many else _stage

    def racing(*args, **kwargs):
        state = stage(*args, **kwargs)
        calls.append(state.name)
        if gc_between and len(calls) == 1:
            collect(work_dir, RetentionConfig(keep_runs=1))  # the folders' only run is no longer a kept one
        return state

    with live_run(work_dir, "user"):
        if many:
            result = held_result(racing, work_dir, name)[1]
            paths = [result["checkpoint"].path, *(r.path for r in result["snapshots"])]
        else:
            paths = [run_task(racing, work_dir, name).path]
        return {"calls": calls, "paths": paths, "whole": all(is_complete(p) for p in paths)}


@pytest.mark.parametrize("many", [False, True], ids=["one folder", "several folders"])
def test_a_cached_answer_whose_folder_gc_removed_meanwhile_is_built_again_and_recorded(tmp_path, many):
    work, name = str(tmp_path / "work"), uuid.uuid4().hex  # (a name of its own: a cache of its own)
    first = _uses(work, name, many=many)
    assert first["calls"] == ["Completed"] and first["whole"]
    with live_run(work, "another"):  # an ended run after it: keep_runs 1 keeps this one's stages, not the first's
        pass
    second = _uses(work, name, gc_between=True, many=many)
    # Prefect answered from its cache, gc then took the folders (no live run had them yet): built again, not handed
    # out
    assert second["calls"] == ["Cached", "Completed"] and second["whole"] and second["paths"] == first["paths"]
    assert collect(work, RetentionConfig(keep_runs=1)).remove == []  # the last run recorded them: kept
    assert all(Path(path, "name.txt").read_text() == name for path in second["paths"])


@flow(name="stage-rule")
def _once(work_dir: str, name: str) -> dict:
    state = _stage(work_dir, name, return_state=True)
    return {"state": state.name, "path": state.result().path}


def test_a_bumped_stage_rule_misses_prefects_record_and_builds_the_new_folder(tmp_path, monkeypatch):
    """A stage's rule bumped (its output changed for the same inputs): Prefect's record of the old answer must not
    hand out the old folder, keyed by the old rule (issue 41: the rule moved only the folder's key)."""
    from ance_core import artifacts

    work, name = str(tmp_path / "work"), uuid.uuid4().hex
    first, again = _once(work, name), _once(work, name)
    assert first["state"] == "Completed" and again == {"state": "Cached", "path": first["path"]}
    monkeypatch.setitem(artifacts.STAGE_RULES, "encode", 1)
    bumped = _once(work, name)
    assert bumped["state"] == "Completed" and bumped["path"] != first["path"] and is_complete(bumped["path"])


def test_the_stage_flows_record_their_stages_as_runs_of_the_work_folder(tiny_scifact, tiny_model, tmp_path):
    """The encode flow (as bm25-warmup) records what it uses while it runs and as an ended run; a trainer's refresh
    (refresh-negatives with a result file) is recorded while it runs and leaves no run of its own: the trainer's run
    records its folders (flows/stages.py; before, these flows were protected only by the hour's grace)."""
    import json

    from ance_core.data.config import DataConfig
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model
    from ance_core.negatives.config import MiningConfig
    from ance_core.retrieval.config import EncodeConfig
    from flows.stages import encode_flow, refresh_negatives_flow

    work, checkpoint = tmp_path / "work", tmp_path / "checkpoint"
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), checkpoint)
    data = DataConfig(dataset=str(tiny_scifact))
    encode_flow(str(checkpoint), data, EncodeConfig(batch_size=64), str(work))
    runs = [json.loads(p.read_text()) for p in (work / RUNS).glob("*.json")]
    assert [r["name"] for r in runs] == ["encode"]
    assert {s["stage"] for s in runs[0]["stages"]} >= {"data", "encode"}
    result = tmp_path / "result.json"
    folders = refresh_negatives_flow(str(checkpoint), data, mining=MiningConfig(sampler="random"),
                                     work_dir=str(work), result_file=str(result))
    assert json.loads(result.read_text()) == folders and is_complete(folders["mine"])
    assert len(list((work / RUNS).glob("*.json"))) == 1 and not list((work / LIVE).glob("*.json"))


def test_the_bm25_baseline_flow_records_the_stages_prefect_answered_from_its_cache(tiny_scifact, tmp_path):
    """`ance bm25` (flows/evaluate.py) called its tasks directly: a second run, answered from Prefect's cache, ran no
    run_stage and recorded none of the folders it read, which gc could then remove under it."""
    import json

    from ance_core.data.config import DataConfig
    from ance_core.retrieval.config import BM25Config
    from flows.evaluate import bm25_baseline

    work, data = tmp_path / "work", DataConfig(dataset=str(tiny_scifact))
    bm25 = BM25Config(top_k=int(uuid.uuid4().int % 1000) + 1000)  # a key of its own: this test's cache
    first = bm25_baseline(data, bm25, str(work))
    assert bm25_baseline(data, bm25, str(work)) == first
    runs = sorted((json.loads(p.read_text()) for p in (work / RUNS).glob("*.json")), key=lambda r: r["started"])
    assert len(runs) == 2
    used = {"data", "bm25", "evaluate"}  # (the BM25 index too, the first time: the cached run needs it no more)
    assert used <= {s["stage"] for s in runs[0]["stages"]} and used <= {s["stage"] for s in runs[1]["stages"]}


def test_a_missing_snapshot_names_the_trainers_real_folder(tmp_path):
    """An asynchronous trainer's snapshot gone on resume: the error names the folder to delete as it is on disk (its
    `.partial-` one while it trains; issue 41 item 1: it named train-async/<key>, which did not exist)."""
    from ance_core.errors import AnceError
    from tasks.train_async import snapshot_ref

    partial = tmp_path / "work" / "train-async" / ".partial-abc"
    with pytest.raises(AnceError, match=rf"step-4 checkpoint of trainer abc is missing; delete {partial} to train"):
        snapshot_ref(str(tmp_path / "work"), "abc", 4, partial)


def test_the_bm25_warmup_flow_records_its_stages_as_a_run_of_the_work_folder(tiny_scifact, tiny_model, tmp_path):
    """The third stage flow behind the deployments (flows/stages.py `bm25-warmup`): what it trained and read is
    recorded as its run, so gc leaves it (issue 41 item 4). Its warm-up is the pipeline's, planned as in the whole run
    (a review found it trained without the run's learning-rate schedule, so under another key, and crashed with
    `bm25_negatives.margin`, a valid config, for want of the zero-shot scorer)."""
    import json

    from ance_core.pipeline.config import PipelineConfig
    from flows.stages import bm25_warmup
    from tests.tiny import tiny_pipeline_config

    work = tmp_path / "work"
    raw = tiny_pipeline_config(tiny_scifact, tiny_model, work, rounds=1)
    config = PipelineConfig.model_validate(raw | {"bm25_negatives": raw.get("bm25_negatives", {}) | {"margin": 0.1}})
    result = bm25_warmup(config)
    trained = json.loads((Path(result["checkpoint"]) / "manifest.json").read_text())["config"]
    assert "schedule" in trained, trained  # the whole run's continuous schedule (warm-up and round), as the pipeline
    runs = [json.loads(p.read_text()) for p in (work / RUNS).glob("*.json")]
    assert [r["name"] for r in runs] == ["bm25-warmup"] and not list((work / LIVE).glob("*.json"))
    stages = {s["stage"]: s for s in runs[0]["stages"]}
    assert {"data", "bm25", "mine", "model", "train", "encode", "evaluate"} <= set(stages)
    assert ("train", Path(result["checkpoint"]).name) in {(s["stage"], s["key"]) for s in runs[0]["stages"]}
    assert collect(work, RetentionConfig(keep_runs=1)).remove == []
    # its own MLflow experiment (it was logged as an ance-train run, its Prefect artifacts under ance-train's keys)
    from mlflow.tracking import MlflowClient

    from tracking.stores import resolve_tracking_uri

    client = MlflowClient(resolve_tracking_uri(work))
    assert client.get_experiment(client.get_run(result["mlflow_run_id"]).info.experiment_id).name == "bm25-warmup"
    # the warm-up evaluated again (`ance evaluate`, the evaluate deployment): the checkpoint is a stage the run used,
    # kept by gc with the encoding and index it built (a review found them kept and the checkpoint removed)
    from flows.evaluate import evaluate_checkpoint

    evaluate_checkpoint(result["checkpoint"], config.data, config.encode, work_dir=str(work), split="train")
    (work / "latest.json").unlink()  # (gc keeps the model it names: the newest run's, here the warm-up)
    removed = {f.path.resolve() for f in collect(work, RetentionConfig(keep_runs=1)).remove}
    assert Path(result["checkpoint"]).resolve() not in removed and removed
