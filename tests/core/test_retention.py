"""The work folder's retention: run records, and garbage collection that keeps what the policy and live runs need."""

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ance_core.artifacts import ArtifactRef, link_or_copy, run_stage
from ance_core.retention import GRACE_SECONDS, RetentionConfig, collect, plan_gc, stage_folders
from ance_core.run_records import LIVE, RUNS, live_run


def _stage(work, stage, name, inputs, size=1000, link_from=None):
    """A stage folder holding one file of `size` bytes (or hard links to another folder's files)."""
    def build(out):
        if link_from is not None:
            for path in sorted(link_from.glob("*.npy")):
                link_or_copy(path, out / path.name)
        else:
            np.save(out / "emb_00000.npy", np.zeros(size // 2, dtype=np.float16))
        (out / "name.txt").write_text(name)

    return run_stage(work, stage, {"name": name}, inputs, build)


def _retrain(work, k, start):
    """One retrain: encode its start checkpoint, index, mine, train; then encode and index the result (evaluation)."""
    data = _stage(work, "prepare", "data", {})
    enc = _stage(work, "encode", f"enc{k}a", {"checkpoint": start.digest, "data": data.digest})
    idx = _stage(work, "index", f"idx{k}a", {"embeddings": enc.digest}, link_from=Path(enc.path))
    run = _stage(work, "retrieve", f"run{k}a", {"index": idx.digest, "data": data.digest})
    neg = _stage(work, "mine", f"mine{k}", {"run": run.digest, "data": data.digest}, size=10)
    ckpt = _stage(work, "train", f"train{k}", {"checkpoint": start.digest, "negatives": neg.digest}, size=100)
    enc2 = _stage(work, "encode", f"enc{k}b", {"checkpoint": ckpt.digest, "data": data.digest})
    idx2 = _stage(work, "index", f"idx{k}b", {"embeddings": enc2.digest})
    _stage(work, "retrieve", f"run{k}b", {"index": idx2.digest, "data": data.digest})
    return ckpt


def _names(folders):
    return sorted((f.path / "name.txt").read_text() for f in folders if f.stage != "champion")


def _retrained(work: Path, times: int) -> Path:
    """A work folder after a first run and `times` retrains, each a run of its own."""
    with live_run(work, "first"):
        start = _stage(work, "init", "pretrained", {})
    for k in range(times):
        with live_run(work, "retrain"):
            start = _retrain(work, k, start)
    return work


def test_gc_keeps_the_last_runs_and_their_last_refreshes(tmp_path):
    work = _retrained(tmp_path / "work", 5)
    assert len(list((work / RUNS).glob("*.json"))) == 6 and not list((work / LIVE).glob("*.json"))
    (work / "mlflow.db").write_text("x")
    (work / "champion").mkdir()
    (work / "train" / ".partial-abc").mkdir()

    plan = plan_gc(work, RetentionConfig(keep_runs=2, keep_refreshes=1))
    kept = _names(plan.keep)
    # the stages the last two runs used, but of each run's two encodings only the last (with its index and the
    # rankings searched in it)
    assert kept == ["data", "enc3b", "enc4b", "idx3b", "idx4b", "mine3", "mine4", "run3b", "run4b", "train3",
                    "train4"]
    dry = plan_gc(work, RetentionConfig(keep_runs=2, keep_refreshes=1))
    assert _names(dry.remove) == _names(plan.remove) and len(stage_folders(work)) == len(kept) + len(plan.remove)

    removed = collect(work, RetentionConfig(keep_runs=2, keep_refreshes=1))
    assert _names(stage_folders(work).values()) == kept
    assert removed.freed_bytes > 0 and len(removed.remove) == len(plan.remove)
    assert (work / "mlflow.db").is_file() and (work / "champion").is_dir()
    assert (work / "train" / ".partial-abc").is_dir()
    assert not [p for p in work.glob("*/.gc-*")]


def test_drop_rankings_removes_every_ended_runs_rankings_and_keeps_a_live_runs(tmp_path):
    """keep_rankings false: the kept refreshes lose their `retrieve` folders (the mined negatives, encodings and
    indexes stay); a live run's ranking stays, and so does everything else the policy keeps."""
    work = _retrained(tmp_path / "work", 2)
    policy = RetentionConfig(keep_runs=2, keep_refreshes=1, keep_rankings=False)
    assert policy.active and RetentionConfig(keep_rankings=False).active and not RetentionConfig().active
    with_rankings = _names(plan_gc(work, RetentionConfig(keep_runs=2, keep_refreshes=1)).keep)
    assert {"run0b", "run1b"} <= set(with_rankings)
    with live_run(work, "running"):
        live = _stage(work, "retrieve", "run-live", {"index": "x"})
        plan = collect(work, policy)
        assert _names(plan.keep) == sorted(n for n in [*with_rankings, "run-live"] if n not in ("run0b", "run1b"))
        assert live.digest not in {f.key for f in plan.remove} and Path(live.path).is_dir()
    kept = _names(stage_folders(work).values())
    assert "mine1" in kept and "enc1b" in kept and not {"run0b", "run1b", "run0a", "run1a"} & set(kept)
    assert "run-live" in kept  # still there: the run ended after the collection
    after = collect(work, policy)  # the next collection: that run has ended (and retrain 0 is no longer kept)
    assert live.digest in {f.key for f in after.remove} and not Path(live.path).exists()


def test_hard_linked_files_free_nothing_until_their_last_link_goes(tmp_path):
    work = tmp_path / "work"
    with live_run(work, "r1"):
        enc = _stage(work, "encode", "enc", {}, size=100_000)
        _stage(work, "index", "idx", {"embeddings": enc.digest}, link_from=Path(enc.path))
    (work / RUNS / next(iter(os.listdir(work / RUNS)))).unlink()  # no run keeps them: both may go
    plan = plan_gc(work, RetentionConfig(keep_runs=1), now=time.time() + 2 * GRACE_SECONDS)
    assert _names(plan.remove) == ["enc", "idx"] and plan.freed_bytes >= 100_000
    only_encode = [f for f in plan.remove if f.stage == "encode"]
    from ance_core.retention import _freed_bytes

    assert _freed_bytes([f.path for f in only_encode]) < 1000  # its shard lives on as the index's


def test_a_live_runs_stages_are_never_removed_and_a_killed_run_counts_as_ended(tmp_path):
    work = tmp_path / "work"
    for k in range(3):
        with live_run(work, "old"):
            _stage(work, "train", f"old{k}", {})
    started, finish = threading.Event(), threading.Event()

    def running():
        with live_run(work, "running"):
            _stage(work, "train", "old0", {})  # reused from the cache: in use
            started.set()
            finish.wait(30)

    thread = threading.Thread(target=running)
    thread.start()
    started.wait(30)
    try:
        plan = plan_gc(work, RetentionConfig(keep_runs=1))
        assert _names(plan.remove) == ["old1"]  # old2: the last ended run's; old0: the live run's
        assert len(collect(work, RetentionConfig(keep_runs=1)).remove) == 1
    finally:
        finish.set()
        thread.join()
    # a run killed without a chance to end: its record stays in .live, its lock is free -> an ended run
    record = {"id": "k", "name": "killed", "pid": 0, "started": 1e12, "stages": [
        {"stage": "train", "key": next(f.key for f in stage_folders(work).values() if _names([f]) == ["old2"])}]}
    (work / LIVE / "k.json").write_text(json.dumps(record))
    assert _names(plan_gc(work, RetentionConfig(keep_runs=1)).keep) == ["old2"]


def test_unset_retention_keeps_everything_and_unrecorded_folders_get_an_hour(tmp_path):
    work = tmp_path / "work"
    _stage(work, "encode", "unrecorded", {})
    with live_run(work, "r"):
        _stage(work, "encode", "recorded", {})
    assert not RetentionConfig().active and plan_gc(work, RetentionConfig()).remove == []
    assert plan_gc(work, RetentionConfig(keep_runs=1)).remove == []  # built a moment ago (another process's?)
    later = plan_gc(work, RetentionConfig(keep_runs=1), now=time.time() + 2 * GRACE_SECONDS)
    assert _names(later.remove) == ["unrecorded"]


def test_folders_a_run_gets_without_building_them_are_recorded_too(tmp_path):
    """A stage answered from Prefect's cache (or built on another worker) runs no run_stage in the run's process:
    the flow tells the live run of the references it got (artifacts.observe_refs), so garbage collection keeps them."""
    from ance_core.artifacts import observe_refs

    work = tmp_path / "work"
    with live_run(work, "first"):
        built = _stage(work, "encode", "built", {})
    with live_run(work, "second") as second:
        observe_refs({"refs": [built]})  # e.g. run_task's result, Cached
    assert {"stage": "encode", "key": built.digest} in second.record["stages"]
    assert _names(plan_gc(work, RetentionConfig(keep_runs=1)).keep) == ["built"]


def test_a_deployment_refresh_s_folders_are_recorded_by_the_trainers_run(tmp_path):
    """An inferencer deployment builds a refresh in another process: the trainer's run records every folder its result
    file names, so a garbage collection during a run longer than the grace period keeps them."""
    from tasks.inferencer import _read_result

    work = tmp_path / "work"
    refs = {name: _stage(work, name, name, {}) for name in ("encode", "index", "retrieve", "mine")}  # no run here
    result = tmp_path / "step-6.json"
    result.write_text(json.dumps({name: ref.path for name, ref in refs.items()}))
    later = time.time() + 2 * GRACE_SECONDS
    with live_run(work, "trainer") as trainer:
        assert len(plan_gc(work, RetentionConfig(keep_runs=1), now=later).remove) == 4  # unrecorded, an hour old
        assert _read_result(result) == (None, refs["mine"].path)
        recorded = {(s["stage"], s["key"]) for s in trainer.record["stages"]}
        assert recorded == {(name, ref.digest) for name, ref in refs.items()}
        assert plan_gc(work, RetentionConfig(keep_runs=1), now=later).remove == []


def test_a_folder_a_live_run_reuses_after_the_plan_is_not_removed(tmp_path, monkeypatch):
    """`collect` plans, then removes folder by folder: a run that reuses a planned folder from the cache meanwhile
    records it under the stage's lock, and `collect` checks the live runs again under that lock."""
    from ance_core import retention

    work = tmp_path / "work"
    with live_run(work, "old"):
        old = _stage(work, "bm25", "old", {})
    with live_run(work, "newer"):
        _stage(work, "bm25", "newer", {})
    with live_run(work, "live"):
        plan = plan_gc(work, RetentionConfig(keep_runs=1))
        assert _names(plan.remove) == ["old"]
        assert _stage(work, "bm25", "old", {}).cached  # the cache hit, after the plan
        monkeypatch.setattr(retention, "plan_gc", lambda *a, **k: plan)
        assert collect(work, RetentionConfig(keep_runs=1)).remove == []
    assert Path(old.path, "name.txt").read_text() == "old"


def test_a_part_of_another_run_is_never_an_ended_run_whether_it_fails_or_is_killed(tmp_path):
    """live_run(keep=False) (an asynchronous trainer's refresh on its own worker): protected while it runs, and no
    ended run afterwards, so it never takes a `keep_runs` place: not when it completes, fails or is killed."""
    import pytest

    from ance_core.run_records import run_records

    work = tmp_path / "work"
    with live_run(work, "refresh", keep=False) as part:
        assert part.record["part"] and run_records(work)[1][0]["id"] == part.id  # live while it runs
    with pytest.raises(RuntimeError), live_run(work, "refresh", keep=False):
        raise RuntimeError("the refresh failed")
    assert run_records(work) == ([], [])
    killed = {"id": "killed", "name": "refresh", "pid": 0, "started": time.time(), "stages": [], "part": True}
    (work / LIVE / "killed.json").write_text(json.dumps(killed))  # its lock free: the process is gone
    with live_run(work, "pipeline"):
        pass
    ended, live = run_records(work)
    assert [r["name"] for r in ended] == ["pipeline"] and live == []


def test_the_latest_model_keeps_what_search_reads_when_it_is_not_among_the_last_refreshes(tmp_path):
    """The model a run delivers may be its starting one, or its warm-up (chosen on dev): its encoding is then an early
    refresh of the run, which keep_refreshes lets go, but `ance search --model <it>` reads it (found by a review: gc
    removed it, and search then found no index)."""
    work = _retrained(tmp_path / "work", 1)
    start = next(f for f in stage_folders(work).values() if (f.path / "name.txt").read_text() == "pretrained")
    (work / "latest.json").write_text(json.dumps({"checkpoint": str(start.path), "digest": start.key}))
    kept = _names(plan_gc(work, RetentionConfig(keep_runs=1, keep_refreshes=1)).keep)
    assert {"pretrained", "enc0a", "idx0a", "data"} <= set(kept), kept


def test_the_latest_model_keeps_what_search_reads_whichever_runs_are_kept(tmp_path):
    """After a training run, evaluations and BM25 checks are runs too: with keep_runs 1 the training run is not kept,
    but the model latest.json names keeps its corpus encoding, the index on it and the data (`ance search --model`
    reads them); the ranking searched in that index follows the policy."""
    work = _retrained(tmp_path / "work", 2)
    ckpt = next(f for f in stage_folders(work).values() if (f.path / "name.txt").read_text() == "train1")
    (work / "latest.json").write_text(json.dumps({"checkpoint": str(ckpt.path), "digest": ckpt.key}))
    data = next(f for f in stage_folders(work).values() if f.stage == "prepare")
    with live_run(work, "bm25"):  # (the data's BM25 index, that `ance search --hybrid` fuses with: once removed)
        _stage(work, "bm25-index", "bm25 index", {"data": data.key})
        _stage(work, "bm25-index", "other data's bm25 index", {"data": "0" * 16})
    with live_run(work, "evaluate"):
        _stage(work, "evaluate", "a check", {"checkpoint": ckpt.key})
    kept = _names(plan_gc(work, RetentionConfig(keep_runs=1)).keep)
    assert kept == ["a check", "bm25 index", "data", "enc1b", "idx1b", "train1"]  # run1b (the ranking) goes


# ---------------------------------------------------------------- what a review of the gc lifecycle found (session 14)


def _run_record(work: Path, run_id: str, started: float, finished: float, keys: list[str]) -> None:
    (work / RUNS).mkdir(parents=True, exist_ok=True)
    (work / RUNS / f"{run_id}.json").write_text(json.dumps({
        "id": run_id, "name": run_id, "pid": 0, "started": started, "finished": finished,
        "stages": [{"stage": "train", "key": k} for k in keys]}))


def test_the_last_runs_are_the_last_to_finish(tmp_path):
    """A retrain that started before shorter runs (evaluations, BM25 checks) and ended after them: with keep_runs 1
    its own retention removed its checkpoints (the runs were ordered by their start)."""
    work = tmp_path / "work"
    long, short = _stage(work, "train", "long", {}), _stage(work, "train", "short", {})
    _run_record(work, "a-long", started=100.0, finished=900.0, keys=[long.digest])
    _run_record(work, "b-short", started=200.0, finished=300.0, keys=[short.digest])
    plan = plan_gc(work, RetentionConfig(keep_runs=1))
    assert _names(plan.keep) == ["long"] and _names(plan.remove) == ["short"]


def test_the_latest_model_outside_the_stage_folders_keeps_its_encodings(tmp_path):
    """latest.json may name the champion a retrain started from (no round beat it): a folder of `champion/`, no
    stage folder. Its corpus encodings were removed as older refreshes, and `ance search --model` found no index."""
    work = _retrained(tmp_path / "work", 1)
    champion = work / "champion" / "ance-x-v1"
    champion.mkdir(parents=True)
    start = next(f for f in stage_folders(work).values() if (f.path / "name.txt").read_text() == "pretrained")
    (work / "latest.json").write_text(json.dumps({"checkpoint": str(champion), "digest": start.key}))
    kept = _names(plan_gc(work, RetentionConfig(keep_runs=1, keep_refreshes=1)).keep)
    assert {"enc0a", "idx0a", "data"} <= set(kept), kept
    assert "pretrained" not in kept  # (the champion folder is not a stage folder: never gc's)


def test_a_folder_a_run_reused_and_ended_with_after_the_plan_is_not_removed(tmp_path, monkeypatch):
    """A whole cached re-run between the plan and the removal: it reused a planned folder, named it in latest.json
    and ended (its record is no longer live): `collect` checks the runs that ended since the plan, and latest.json."""
    from ance_core import retention

    work = tmp_path / "work"
    with live_run(work, "old"):
        old = _stage(work, "train", "old", {})
    with live_run(work, "newer"):
        _stage(work, "train", "newer", {})
    plan = plan_gc(work, RetentionConfig(keep_runs=1))
    assert _names(plan.remove) == ["old"]

    def stale_plan(*args, **kwargs):
        with live_run(work, "rerun"):  # after the plan: reuses `old` and ends
            assert _stage(work, "train", "old", {}).cached
        return plan

    monkeypatch.setattr(retention, "plan_gc", stale_plan)
    assert collect(work, RetentionConfig(keep_runs=1)).remove == []
    assert Path(old.path, "name.txt").read_text() == "old"
    with live_run(work, "later"):
        _stage(work, "train", "later", {})
    plan = plan_gc(work, RetentionConfig(keep_runs=1))
    assert _names(plan.remove) == ["newer", "old"]
    (work / "latest.json").write_text(json.dumps({"checkpoint": old.path, "digest": old.digest}))  # named since
    monkeypatch.setattr(retention, "plan_gc", lambda *a, **k: plan)
    assert [f.key for f in collect(work, RetentionConfig(keep_runs=1)).remove] != [] and Path(old.path).is_dir()


def test_records_that_vanish_or_are_no_run_records_do_not_stop_gc(tmp_path, monkeypatch):
    """A part of another run (an inferencer's refresh) deletes its record when it ends: read between the two, gc
    failed on runs/<id>.json (FileNotFoundError), and a pipeline's retention with it; a foreign JSON file in runs/ or
    .live/ failed it with a KeyError."""
    from ance_core import run_records as records

    work = tmp_path / "work"
    with live_run(work, "first"):
        _stage(work, "train", "first", {})
    (work / RUNS / "notes.json").write_text(json.dumps({"note": "mine"}))
    (work / LIVE / "half.json").write_text('{"id": "half", "sta')
    gone = work / LIVE / "gone.json"
    gone.write_text("{}")
    real_record = records.read_record

    def vanishing(path):  # the part ends between the listing and the read
        if path == gone:
            gone.unlink(missing_ok=True)
        return real_record(path)

    monkeypatch.setattr(records, "read_record", vanishing)
    ended, live = records.run_records(work)
    assert [r["name"] for r in ended] == ["first"] and live == []
    assert collect(work, RetentionConfig(keep_runs=1)).remove == []


def test_what_an_earlier_gc_left_aside_is_deleted_and_the_figures_are_what_was_removed(tmp_path, monkeypatch):
    """A gc killed while deleting left its `.gc-*` folder for ever (nothing globbed it); a folder skipped because a
    stage held its lock was still counted in the bytes freed; a stage folder that is a symbolic link was "removed"
    with its target's bytes counted (nothing freed)."""
    from filelock import FileLock

    work = tmp_path / "work"
    for name in ("a", "b", "c"):
        with live_run(work, name):
            _stage(work, "encode", name, {}, size=4000)
    leftover = work / "encode" / ".gc-0123456789abcdef-00000000"
    leftover.mkdir()
    (leftover / "emb_00000.npy").write_bytes(b"\0" * 100)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "manifest.json").write_text(json.dumps({"key": "linked", "stage": "encode"}))
    (work / "encode" / "linked").symlink_to(outside)
    folders = {_names([f])[0]: f for f in stage_folders(work).values()}
    assert set(folders) == {"a", "b", "c"}  # (the link is no stage folder of this work folder)
    b_bytes = sum(p.stat().st_size for p in folders["b"].path.rglob("*") if p.is_file())
    held = FileLock(work / ".locks" / f"encode-{folders['a'].key}.lock")
    held.acquire()  # a stage being built with that key: skipped
    try:
        plan = collect(work, RetentionConfig(keep_runs=1))
    finally:
        held.release()
    assert [f.key for f in plan.remove] == [folders["b"].key] and folders["a"] in plan.keep
    assert plan.freed_bytes == b_bytes  # (it said a's and b's)
    assert not leftover.exists() and (outside / "manifest.json").is_file() and (work / "encode" / "linked").exists()


def test_a_young_unrecorded_folder_is_kept_even_when_it_matches_an_old_refresh(tmp_path):
    """The hour's grace for a folder no run recorded yet (a live run's shard, built on another worker) was taken back
    by the refresh rule when it matched an older refresh's checkpoint and data (another encode config's shards)."""
    work = tmp_path / "work"
    with live_run(work, "run"):
        data = _stage(work, "prepare", "data", {})
        _stage(work, "encode", "old refresh", {"checkpoint": "A", "data": data.digest})
        _stage(work, "encode", "new refresh", {"checkpoint": "B", "data": data.digest})
    _stage(work, "encode-shard", "a new shard of A", {"checkpoint": "A", "data": data.digest})  # no run's yet
    plan = plan_gc(work, RetentionConfig(keep_runs=1, keep_refreshes=1))
    assert _names(plan.remove) == ["old refresh"] and "a new shard of A" in _names(plan.keep)


def test_a_killed_long_run_keeps_its_place_by_the_last_stage_it_recorded(tmp_path):
    """A retrain that started first, went on recording stages while shorter runs ended, then was killed (its re-run
    resumes from those stages): ordered by its start, gc with keep_runs 1 removed them."""
    work = tmp_path / "work"
    long, short = _stage(work, "train", "long", {}), _stage(work, "train", "short", {})
    _run_record(work, "b-short", started=200.0, finished=300.0, keys=[short.digest])
    (work / LIVE).mkdir(parents=True, exist_ok=True)
    killed = work / LIVE / "a-long.json"
    record = {"id": "a-long", "name": "retrain", "pid": 0, "started": 100.0,
              "stages": [{"stage": "train", "key": long.digest}]}
    killed.write_text(json.dumps(record))  # (a record of before `updated`: its file's time)
    os.utime(killed, (900.0, 900.0))  # (its last stage recorded after the short run ended)
    plan = plan_gc(work, RetentionConfig(keep_runs=1))
    assert _names(plan.keep) == ["long"] and _names(plan.remove) == ["short"]
    killed.write_text(json.dumps(record | {"updated": 250.0}))  # copied since (its file's time is now): the record's
    plan = plan_gc(work, RetentionConfig(keep_runs=1))  # own time says it ended before the short run
    assert _names(plan.keep) == ["short"] and _names(plan.remove) == ["long"]


def test_a_linked_stage_folder_is_said_not_to_be_collected(tmp_path):
    """`work/encode` linked to a bigger disk: its stage folders are left alone (another work folder's may be there),
    and gc says so instead of leaving the largest files uncounted without a word."""
    import pytest

    from ance_core.errors import AnceWarning

    work, disk = tmp_path / "work", tmp_path / "disk"
    _stage(disk, "encode", "e", {})
    work.mkdir()
    (work / "encode").symlink_to(disk / "encode")
    with pytest.warns(AnceWarning, match=r"encode/ is a link \(to another disk\?\): the stage folders in it are "
                      "neither collected nor counted"):
        assert stage_folders(work) == {}


def test_a_run_refused_before_any_stage_is_no_ended_run_and_a_failed_one_is(tmp_path):
    """A command refused with one line before it used any stage (an AnceError: bad input) left its run record, which
    counted as the newest ended run: `gc --keep-runs 1` then planned to remove the last good run's stages (found by a
    review). A run that fails after using stages (a crash, or an AnceError such as running out of memory in round 2)
    keeps its record: its re-run resumes from the stages it protects."""
    from ance_core.errors import AnceError

    work = tmp_path / "work"
    with live_run(work, "good"):
        _stage(work, "train", "good", {})
    with pytest.raises(AnceError), live_run(work, "refused"):
        raise AnceError("a damaged checkpoint")
    assert _names(plan_gc(work, RetentionConfig(keep_runs=1)).keep) == ["good"]
    for k, error in enumerate((AnceError("out of memory in round 2"), RuntimeError("killed"))):
        with pytest.raises(type(error)), live_run(work, f"failed{k}"):
            _stage(work, "train", f"failed{k}", {})
            raise error
        plan = plan_gc(work, RetentionConfig(keep_runs=1))
        assert f"failed{k}" in _names(plan.keep) and "good" in _names(plan.remove)


def test_old_champion_copies_go_unless_the_newest_or_a_kept_run_started_from_one(tmp_path, tiny_model, monkeypatch):
    """Every retrain after a promotion downloads the new champion into champion/ (~90 MB for MiniLM, ~440 MB for
    BERT-base), and gc never removed a copy: a weekly retrain's work folder grew by one each week."""
    import shutil

    from ance_core import retention
    from ance_core.modeling.model import checkpoint_digest
    from tests.tiny import random_head_checkpoint

    work = tmp_path / "work"
    first = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    hours = time.time() - 3600 * np.arange(6, 1, -1)  # v1 six hours old ... v5 two hours old (the newest)
    copies = {}
    for version, when in enumerate(hours, 1):
        copy = work / "champion" / f"ance-c-v{version}-0000000{version}"
        shutil.copytree(first, copy)
        meta = json.loads((copy / "ance_model.json").read_text())
        (copy / "ance_model.json").write_text(json.dumps(meta | {"note": version}))  # (its own digest)
        (copy.parent / f"{copy.name}.json").write_text("{}")
        os.utime(copy, (when, when))
        copies[version] = copy
    digest = {v: checkpoint_digest(c) for v, c in copies.items()}
    for version in (1, 2):  # two retrains, from v1 then v2; keep_runs 1 keeps the second's inputs
        with live_run(work, "retrain") as run:  # (as a retrain records it: flows/start.py held_checkpoint)
            run.add("champion", ArtifactRef(str(copies[version]), digest[version]))
    # latest.json names v3 as the run wrote it, in a work folder since moved
    (work / "latest.json").write_text(json.dumps({"checkpoint": f"/moved/work/champion/{copies[3].name}",
                                                  "digest": digest[3]}))
    other = work / "champion" / "ance-other-v7-abcdef12"  # another collection's champion, old: its newest
    shutil.copytree(first, other)
    os.utime(other, (hours[0] - 3600,) * 2)
    (work / "champion" / "backup").mkdir()  # not a copy gc made, nor a link to one: never gc's
    (work / "champion" / "ance-c-v9-00000009").symlink_to(copies[1])

    assert not plan_gc(work, RetentionConfig()).remove  # (unset: every run's inputs stay)
    plan = plan_gc(work, RetentionConfig(keep_runs=1))
    # v2: the kept run started from it; v3: latest.json names it; v5: the newest (and the other model's newest)
    assert sorted(f.path.name for f in plan.remove) == [copies[1].name, copies[4].name]
    assert {f.path.name for f in plan.keep} >= {copies[2].name, copies[3].name, copies[5].name, other.name}
    assert plan.summary()["removed_by_stage"] == {"champion": 2} and plan.freed_bytes > 0
    os.utime(copies[4])  # a retrain answered with it after the plan (champion_checkpoint touches it): kept
    monkeypatch.setattr(retention, "plan_gc", lambda *args: plan)
    done = collect(work, RetentionConfig(keep_runs=1))
    assert [f.path.name for f in done.remove] == [copies[1].name]
    assert not copies[1].exists() and not (work / "champion" / f"{copies[1].name}.json").exists()
    assert all(copies[v].is_dir() for v in (2, 3, 4, 5)) and not list((work / "champion").glob(".gc-*"))
    assert other.is_dir() and (work / "champion" / "backup").is_dir()
    assert (work / "champion" / "ance-c-v9-00000009").is_symlink()


def test_a_collection_waiting_for_another_says_so(tmp_path, capsys):
    """`ance gc`, or a run's retention at its end, waited on another collection's lock without a word: a run that had
    done its work seemed hung."""
    from filelock import FileLock

    work = _retrained(tmp_path / "work", 3)
    held = FileLock(work / ".locks" / "gc.lock")
    held.acquire()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (collect(work, RetentionConfig(keep_runs=1)), done.set()))
    worker.start()
    said, deadline = "", time.time() + 60
    while "waiting for it to finish" not in said and time.time() < deadline:
        time.sleep(0.05)
        said += capsys.readouterr().out
    assert f"gc: another garbage collection of {work.resolve()} is running; waiting for it to finish" in said
    assert not done.is_set()  # (still waiting)
    held.release()
    worker.join(60)
    assert done.is_set()
