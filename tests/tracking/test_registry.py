"""The registry's name for a collection (`data.name`, else its folder's name), and two collections in folders of the
same name told apart: the second is warned that it shares the first's registered model and champion (embedded
store)."""

import pytest

from ance_core.data.config import DataConfig
from ance_core.pipeline.report import DEV_KEY
from tracking.closing import closing_lines


def test_a_collection_is_registered_under_its_name_else_its_folders():
    from tracking.registry import model_name

    assert model_name(DataConfig(dataset="/data/a/corpus").collection) == "ance-corpus"
    assert model_name(DataConfig(dataset="/data/a/corpus", name="med-2024").collection) == "ance-med-2024"
    assert model_name(DataConfig().collection) == "ance-scifact"
    with pytest.raises(ValueError, match="name"):
        DataConfig(name="a/b")  # a registry URI's separator


def test_a_second_collection_in_a_folder_of_the_same_name_is_told_it_shares_the_registered_model(tmp_path):
    """Told: another folder with other content. Not told: the same folder (its files changed or not), nor the same
    collection copied to another path (a worker on another machine reads it there)."""
    import shutil

    from tracking.client import Tracker
    from tracking.registry import SOURCE_TAGS, dataset_source, register_models

    first, copy, second = (tmp_path / side / "corpus" for side in ("a", "copy", "b"))
    for folder, text in ((first, "one"), (second, "two")):
        folder.mkdir(parents=True)
        (folder / "corpus.jsonl").write_text(f'{{"_id": "d1", "text": "{text}"}}\n')
    shutil.copytree(first, copy)
    tracker = Tracker(tmp_path / "work", "ance-train")

    def register(folder, dev):
        run = tracker.start_run("ANCE round 1")
        tracker.end_run(run)
        data = DataConfig(dataset=str(folder))
        summary = tracker.summary() | {"run_id": run, "run_url": None}
        summary["champion"] = register_models(tracker, "ance-corpus", [("ANCE round 1", run, {DEV_KEY: dev})],
                                              data.dataset, "test", "ANCE round 1", "dev abc", dataset_source(data))
        return summary

    def warned(summary) -> list[str]:
        return [line for line in closing_lines(summary) if line.startswith("WARNING")]

    assert "shared_with" not in register(first, 0.5)["champion"]
    assert not warned(register(first, 0.6)) and not warned(register(copy, 0.6))
    (first / "corpus.jsonl").write_text('{"_id": "d1", "text": "one, corrected"}\n')  # the same folder, updated
    assert not warned(register(first, 0.6))
    other = register(second, 0.1)
    assert other["champion"]["shared_with"] == str(first.resolve())
    warning = warned(other)
    assert len(warning) == 1 and "ance-corpus" in warning[0] and str(first.resolve()) in warning[0]
    assert "data.name" in warning[0]
    tags = tracker.client.get_registered_model("ance-corpus").tags
    assert tags[SOURCE_TAGS["folder"]] == str(first.resolve()) and len(tags[SOURCE_TAGS["content"]]) == 16


def test_the_champion_moves_only_to_a_better_model_on_the_same_dev_split_whatever_the_datasets_path(tmp_path,
                                                                                                    monkeypatch):
    """A review found the alias moved to a worse model when the same collection was named by another path (the
    comparison asked for the same `data.dataset` string), or when the champion could not be read (a timeout counted
    as no champion); and a model whose MLflow run was never created was registered as runs:/None/checkpoint."""
    from tracking.client import Tracker
    from tracking.registry import register_models

    tracker = Tracker(tmp_path / "work", "ance-train")

    def register(dataset: str, dev: float, run_id: str | None = "new", dev_setting: str = "dev 0123456789abcdef"
                 ) -> dict:
        if run_id == "new":
            run_id = tracker.start_run("ANCE round 1")
            tracker.end_run(run_id)
        return register_models(tracker, "ance-scifact", [("ANCE round 1", run_id, {DEV_KEY: dev})], dataset, "test",
                               "ANCE round 1", dev_setting)

    assert register("scifact", 0.70)["promoted"]
    worse = register(str(tmp_path / "data" / "scifact"), 0.50)  # the same collection, by its folder's path
    assert not worse["promoted"] and worse["champion_dev_ndcg_at_10_before"] == 0.70
    assert register("data/scifact", 0.75)["promoted"]
    # another dev split (another dev_seed): not compared, so not promoted (it took the alias as "no champion")
    elsewhere = register("scifact", 0.40, dev_setting="dev fedcba9876543210")
    assert not elsewhere["promoted"] and "chosen on another dev split" in elsewhere["reason"]
    client = tracker.client
    monkeypatch.setattr(client, "get_model_version_by_alias",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("read timed out")))
    unseen = register("scifact", 0.30)
    assert not unseen["promoted"] and "could not be read (ConnectionError: read timed out)" in unseen["reason"]
    monkeypatch.undo()
    assert client.get_model_version_by_alias("ance-scifact", "champion").tags[DEV_KEY] == "0.750000"
    versions = len(client.search_model_versions("name='ance-scifact'"))
    assert "versions" not in register("scifact", 0.90, run_id=None)  # nothing registered, no alias moved
    assert len(client.search_model_versions("name='ance-scifact'")) == versions


def test_a_failure_while_logging_the_end_leaves_no_run_running(tmp_path):
    """`finish_safely` turns a logging bug into a warning (the pipeline trained fine); its runs were left RUNNING in
    MLflow's runs table (a review reproduced it with an empty report)."""
    from ance_core.pipeline.config import PipelineConfig
    from tracking.run import PipelineTracking

    config = PipelineConfig(work_dir=str(tmp_path / "work"))
    tracking = PipelineTracking(config, {"prefect.flow_run_name": "test"})
    child = tracking.child("warmup")
    with pytest.warns(UserWarning, match="MLflow logging at the end of the run failed"):
        tracked = tracking.finish_safely({}, [], [], str(tmp_path))
    assert "error" in tracked
    client = tracking.tracker.client
    assert [client.get_run(r).info.status for r in (child, tracking.parent)] == ["FAILED", "FAILED"]


def test_a_checkpoint_whose_files_did_not_arrive_reports_it(tmp_path, tiny_model):
    """log_checkpoint says whether every model file reached MLflow; the run registers only those that did (a version
    registered while its files were in the spool downloaded as an empty folder, and `retrain` failed on it)."""
    from tests.tiny import random_head_checkpoint
    from tracking.client import Tracker
    from tracking.uploads import log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    tracker = Tracker(tmp_path / "work", "ance-train")
    run = tracker.start_run("ANCE round 1")
    assert log_checkpoint(tracker, run, checkpoint) == run
    with pytest.warns(UserWarning, match="did not take a call"):  # (warned once per tracker)
        assert not log_checkpoint(tracker, None, checkpoint)  # no run to hold them
    assert tracker.failed_since is None  # (no outage: the next calls are tried)

    def flaky(run_id, path, artifact_path=None):
        if path.endswith(".safetensors"):
            raise ConnectionError("connection reset")
        return real(run_id, path, artifact_path)

    tracker = Tracker(tmp_path / "work", "ance-train-2")  # (a run of the same experiment would point at `run`)
    second = tracker.start_run("ANCE round 2")
    assert second is not None
    spooled, real = tracker.undelivered.get("log_artifact", 0), tracker.client.log_artifact
    tracker.client.log_artifact = flaky
    assert not log_checkpoint(tracker, second, checkpoint)
    assert tracker.undelivered["log_artifact"] > spooled


def test_a_dev_score_kept_identical_ids_is_another_setting():
    from ance_core.retrieval.config import EvalConfig
    from tracking.registry import dev_setting

    assert dev_setting("dev", "0123456789abcdef", EvalConfig()) == "dev 0123456789abcdef"  # the tags runs have
    assert dev_setting("dev", "0123456789abcdef", EvalConfig(ignore_identical_ids=False)) != "dev 0123456789abcdef"


def _registered_champion(tmp_path, tiny_model, dev: float = 0.5, store: str = "work"):
    """A tracker of an embedded store (in tmp_path / `store`) whose `ance-corpus` champion is a logged checkpoint;
    (tracker, checkpoint)."""
    from tests.tiny import random_head_checkpoint
    from tracking.client import Tracker
    from tracking.registry import register_models
    from tracking.uploads import log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / f"checkpoint-{dev}")
    tracker = Tracker(tmp_path / store, "ance-train")
    run = tracker.start_run("ANCE round 1")
    assert log_checkpoint(tracker, run, checkpoint)
    tracker.end_run(run)
    decision = register_models(tracker, "ance-corpus", [("ANCE round 1", run, {DEV_KEY: dev})], "corpus", "test",
                               "ANCE round 1", "dev 0123456789abcdef")
    assert decision["promoted"]
    return tracker, checkpoint


def test_two_runs_starting_from_the_champion_at_once_get_one_whole_copy(tmp_path, tiny_model, monkeypatch):
    """Two retrains (or a retrain and `ance compress`) downloading the champion at once shared one temporary folder:
    one removed the other's download in flight, so a run failed, started from latest.json on a false "the tracking
    server was unreachable", or started from a copy missing files (a review reproduced all three)."""
    import threading
    import time
    from pathlib import Path

    from tracking import registry

    tracker, checkpoint = _registered_champion(tmp_path, tiny_model)
    real, downloads = registry._download, []

    def slow(*args):
        downloads.append(args)
        time.sleep(0.5)  # both runs inside the download at once, were it not for the lock
        return real(*args)

    monkeypatch.setattr(registry, "_download", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(registry.champion_checkpoint(tmp_path / "work", "corpus")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(downloads) == 1 and len({folder for folder, _ in got}) == 1, got
    folder = Path(got[0][0])
    for name in ("model.safetensors", "head.safetensors", "ance_model.json"):
        assert (folder / name).read_bytes() == (checkpoint / name).read_bytes()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".partial-")]


def test_a_registry_made_anew_does_not_start_from_the_old_registrys_copy_of_its_version(tmp_path, tiny_model):
    """The champion's copy was named by its version number alone: a registry made anew (mlflow.db removed, or another
    tracking store on the same work folder) has a version 1 of another model, answered with the old one's copy."""
    from pathlib import Path

    from tracking.registry import champion_checkpoint

    first, _ = _registered_champion(tmp_path, tiny_model, 0.5, store="a")
    old, _ = champion_checkpoint(tmp_path / "work", "corpus", first.uri)
    second, checkpoint = _registered_champion(tmp_path, tiny_model, 0.6, store="b")
    new, source = champion_checkpoint(tmp_path / "work", "corpus", second.uri)
    assert "(version 1)" in source and new != old
    assert Path(new, "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()


def test_a_failed_alias_move_is_not_reported_as_a_promotion(tmp_path, tiny_model, monkeypatch):
    """The alias call's failure was spooled and the run said "champion is version N (promoted now)": the next retrain
    started from the old champion."""
    from tracking.registry import register_models

    tracker, _ = _registered_champion(tmp_path, tiny_model, 0.5)
    run = tracker.start_run("ANCE round 1")
    tracker.end_run(run)
    monkeypatch.setattr(tracker.client, "set_registered_model_alias",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("connection reset")))
    decision = register_models(tracker, "ance-corpus", [("ANCE round 1", run, {DEV_KEY: 0.9})], "corpus", "test",
                               "ANCE round 1", "dev 0123456789abcdef")
    assert not decision["promoted"] and str(decision["champion_version"]) == "1"
    assert "moving the alias failed (ConnectionError: connection reset)" in decision["reason"]
    monkeypatch.undo()
    assert str(tracker.client.get_model_version_by_alias("ance-corpus", "champion").version) == "1"


def test_a_retrain_from_the_champion_compares_with_the_champion_scored_again_on_its_own_dev_split(tmp_path,
                                                                                                 tiny_model):
    """The champion's dev score is a tag measured on the data of its day. A retrain from it after the corpus grew (the
    same dev queries, more distractors: every score lower) could never beat the tag; after training queries were added
    (some carved into the dev split: another dev setting) the alias was frozen for good. A run that started from the
    champion scores it again (its `start` row) and is compared with that."""
    from tracking.registry import champion_checkpoint, champion_folder, register_models

    tracker, _ = _registered_champion(tmp_path, tiny_model, 0.70)
    start, _ = champion_checkpoint(tmp_path / "work", "corpus")

    def retrain(candidate: float, start_score: float, setting: str = "dev 0123456789abcdef", from_: str = start):
        run = tracker.start_run("ANCE round 1")
        tracker.end_run(run)
        return register_models(tracker, "ance-corpus", [("ANCE round 1", run, {DEV_KEY: candidate})], "corpus",
                               "test", "ANCE round 1", setting, start=(from_, start_score))

    assert not retrain(0.58, 0.60)["promoted"]  # below the champion as it scores now
    grown = retrain(0.65, 0.60)  # above it now, below its tag (0.70)
    assert grown["promoted"] and grown["champion_dev_ndcg_at_10_before"] == 0.60
    assert "scored again on this run's dev split" in grown["reason"]
    champion = tracker.client.get_model_version_by_alias("ance-corpus", "champion")  # (version 2, no files logged)
    start = str(tmp_path / "work" / "champion" / champion_folder("ance-corpus", champion))
    assert retrain(0.62, 0.61, "dev fedcba9876543210", start)["promoted"]  # another dev split: compared all the same
    other = retrain(0.99, 0.50, "dev 0123456789abcdef", str(tmp_path / "checkpoint-0.7"))  # not from the champion
    assert not other["promoted"] and "chosen on another dev split" in other["reason"]


def test_two_runs_ending_at_once_leave_the_better_one_champion(tmp_path, tiny_model, monkeypatch):
    """Each run read the champion, then moved the alias: two runs of one work folder ending at once both beat the
    champion they read, and the last to write won, the worse of the two here (0.7 over 0.9)."""
    import threading
    import time

    from tracking.registry import register_models

    tracker, _ = _registered_champion(tmp_path, tiny_model, 0.5)
    client = tracker.client
    real = client.get_model_version_by_alias

    def stale(*args, **kwargs):
        read = real(*args, **kwargs)
        time.sleep(0.5)  # what it read is what it decides on
        return read

    monkeypatch.setattr(client, "get_model_version_by_alias", stale)
    runs = {}
    for dev in (0.9, 0.7):
        runs[dev] = tracker.start_run("ANCE round 1")
        tracker.end_run(runs[dev])

    def end(dev):
        register_models(tracker, "ance-corpus", [("ANCE round 1", runs[dev], {DEV_KEY: dev})], "corpus", "test",
                        "ANCE round 1", "dev 0123456789abcdef")

    threads = [threading.Thread(target=end, args=(dev,)) for dev in (0.9, 0.7)]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert client.get_model_version_by_alias("ance-corpus", "champion").tags[DEV_KEY] == "0.900000"


def test_a_damaged_checkpoint_is_neither_logged_nor_registered(tmp_path, tiny_model):
    """Found by a new user's probe: a cached training stage whose weights were cut short (a disk that filled) was
    logged with a raw UserWarning and registered as a version `mlflow.pyfunc` cannot load. It is one warning line
    now, and log_checkpoint says the files did not arrive, so the run registers nothing of it."""
    from ance_core.errors import AnceWarning
    from tests.tiny import random_head_checkpoint
    from tracking.client import Tracker
    from tracking.uploads import log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    tracker = Tracker(tmp_path / "work", "ance-train")
    run = tracker.start_run("warmup")
    with pytest.warns(AnceWarning, match="a damaged checkpoint .*not logged to MLflow nor registered"):
        assert not log_checkpoint(tracker, run, checkpoint)
    assert not tracker.client.list_artifacts(run, "checkpoint")


def test_a_checkpoint_whose_mlflow_description_fails_otherwise_is_still_logged(tmp_path, tiny_model, monkeypatch):
    """Only a damaged checkpoint keeps a version out of the registry: another refusal of the description (a newer
    MLflow writing files it does not know, an AnceError too) logs the model files without it, as before."""
    from ance_core.errors import AnceError, AnceWarning
    from tests.tiny import random_head_checkpoint
    from tracking import pyfunc
    from tracking.client import Tracker
    from tracking.uploads import log_checkpoint

    def refuse(*args):
        raise AnceError("MLflow 9.0 wrote conda.lock; add them to SERVING_FILES")

    monkeypatch.setattr(pyfunc, "mlflow_model_files", refuse)
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    tracker = Tracker(tmp_path / "work", "ance-train")
    run = tracker.start_run("warmup")
    with pytest.warns(AnceWarning, match="logged without its MLflow model description"):
        assert log_checkpoint(tracker, run, checkpoint)
    assert tracker.client.list_artifacts(run, "checkpoint")


def test_a_registered_models_uri_is_a_checkpoint_to_start_from_or_evaluate(tmp_path, tiny_model, capsys):
    """`start_checkpoint` and the evaluate flow's checkpoint take `models:/<name>@<alias>` or `models:/<name>/<n>`
    (`ance export` did; they took it for a Hugging Face id, or a damaged checkpoint): downloaded once into
    <work_dir>/champion/; a version that is not there, a malformed URI, a mistyped folder are each one clear line."""
    from pathlib import Path

    from ance_core.errors import AnceError
    from ance_core.modeling.model import checkpoint_files
    from ance_core.pipeline.config import PipelineConfig
    from flows.start import local_checkpoint, with_local_start

    _, checkpoint = _registered_champion(tmp_path, tiny_model)
    work = tmp_path / "work"
    by_alias = local_checkpoint(work, "models:/ance-corpus@champion")
    assert Path(by_alias).parent == work.resolve() / "champion"
    assert "checkpoint models:/ance-corpus@champion (version 1): " in capsys.readouterr().out
    assert local_checkpoint(work, "models:/ance-corpus/1") == by_alias  # the same version: the same copy
    assert Path(by_alias, "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    config = with_local_start(PipelineConfig(work_dir=str(work), start_checkpoint="models:/ance-corpus/1"))
    assert config.start_checkpoint == by_alias
    assert local_checkpoint(work, str(checkpoint)) == str(checkpoint)  # a folder stays as it is
    with pytest.raises(AnceError, match=r"^start_checkpoint models:/ance-corpus/7: not found at sqlite"):
        with_local_start(PipelineConfig(work_dir=str(work), start_checkpoint="models:/ance-corpus/7"))
    with pytest.raises(AnceError, match="models:/ance-corpus: not a registered model URI; use models:/<name>@"):
        local_checkpoint(work, "models:/ance-corpus")
    with pytest.raises(AnceError, match="typo: no such checkpoint folder"):
        checkpoint_files(tmp_path / "typo")


def test_the_same_checkpoint_with_the_same_figures_is_one_version(tmp_path):
    """A run again of the same config (every stage reused) registered each of its models again: versions 3 and 4 the
    same as 1 and 2. The same checkpoint (its stage's digest) with the same tags is now that version; another digest,
    or the same checkpoint scored otherwise, is a new one."""
    from tracking.client import Tracker
    from tracking.registry import DIGEST_TAG, register_models

    tracker = Tracker(tmp_path / "work", "ance-train")

    def register(digest: str, dev: float) -> dict:
        run_id = tracker.start_run("ANCE round 1")
        tracker.end_run(run_id)
        return register_models(tracker, "ance-scifact", [("ANCE round 1", run_id, {DEV_KEY: dev})], "scifact", "test",
                               "ANCE round 1", "dev 0123456789abcdef", digests={"ANCE round 1": digest})

    first = register("a" * 16, 0.7)
    assert first["versions"] == [1] and first["promoted"]
    again = register("a" * 16, 0.7)
    assert again["versions"] == [1] and not again["promoted"]  # (it is the champion already: not better than itself)
    assert register("b" * 16, 0.7)["versions"] == [2] and register("a" * 16, 0.6)["versions"] == [3]
    versions = tracker.client.search_model_versions("name='ance-scifact'")
    assert sorted(v.tags[DIGEST_TAG] for v in versions) == ["a" * 16, "a" * 16, "b" * 16]


def test_a_checkpoint_an_earlier_run_of_the_experiment_holds_is_not_uploaded_again(tmp_path, tiny_model):
    """A run again whose stages were reused (or a flow run retried after a late failure) uploaded every checkpoint
    again: ~90 MB each, a retrieval package up to 512 MB. The run that holds the same files is pointed at instead,
    and a version registered from it downloads whole; the same model with another retrieval package, or with its
    holder deleted, is uploaded."""
    from pathlib import Path

    from tests.tiny import random_head_checkpoint
    from tracking.client import Tracker
    from tracking.registry import register_models
    from tracking.uploads import HELD_IN_TAG, LOGGED_TAG, log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    tracker = Tracker(tmp_path / "work", "ance-train")
    client = tracker.client
    first, again = tracker.start_run("ANCE round 1"), tracker.start_run("ANCE round 1")
    assert log_checkpoint(tracker, first, checkpoint) == first
    assert log_checkpoint(tracker, again, checkpoint) == first
    assert client.list_artifacts(again) == []  # (nothing uploaded)
    assert client.get_run(again).data.tags[HELD_IN_TAG] == first and LOGGED_TAG not in client.get_run(again).data.tags
    decision = register_models(tracker, "ance-corpus", [("ANCE round 1", first, {DEV_KEY: 0.5})], "corpus", "test",
                               "ANCE round 1", "dev 0123456789abcdef")
    assert decision["versions"] == [1]
    downloaded = Path(client.download_artifacts(client.get_model_version("ance-corpus", "1").run_id, "checkpoint",
                                                tmp_path / "download"))
    assert (downloaded / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    package = tmp_path / "retrieval"
    package.mkdir()
    (package / "package.json").write_text("{}")
    served = tracker.start_run("ANCE round 1 + BM25")
    assert log_checkpoint(tracker, served, checkpoint, package) == served  # (another package: another upload)
    listed = {a.path for a in client.list_artifacts(served, "checkpoint/retrieval")}
    assert "checkpoint/retrieval/package.json" in listed
    client.delete_run(first)
    last = tracker.start_run("ANCE round 1")
    assert log_checkpoint(tracker, last, checkpoint) == last
    assert "checkpoint/model.safetensors" in {a.path for a in client.list_artifacts(last, "checkpoint")}


def test_a_version_whose_files_an_earlier_run_holds_describes_its_own_run(tmp_path, tiny_model, monkeypatch):
    """From a review of the upload once per experiment: a version registered from a run whose checkpoint an earlier
    run held took its model card (params, results) from the earlier run (another config, or another collection of
    the shared experiment); a holder deleted between its search and its listing was pointed at; and another work
    folder's MLflow description of the same model (its own uuid and time) did not match, so it uploaded again."""
    from tests.tiny import random_head_checkpoint
    from tracking.client import Tracker
    from tracking.registry import RUN_TAG, download_registered_model, register_models
    from tracking.uploads import log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs, trackers = {}, {}
    for name, rounds in (("a", "3"), ("b", "5")):  # two work folders, one store (workers of one server)
        tracker = trackers[name] = Tracker(tmp_path / f"work-{name}", "ance-train", tracking_uri=store)
        parent = tracker.start_run("pipeline")
        tracker.log_params(parent, {"ance.rounds": rounds})
        runs[name] = tracker.start_run("ANCE round 1", parent_id=parent)
    first = runs["a"]
    assert log_checkpoint(trackers["a"], first, checkpoint) == first
    assert log_checkpoint(tracker, runs["b"], checkpoint) == first  # (work-b's own description: the same model)
    decision = register_models(tracker, "ance-corpus", [("ANCE round 1", first, {DEV_KEY: 0.5})], "corpus", "test",
                               logged_by={"ANCE round 1": runs["b"]})
    version = tracker.client.get_model_version("ance-corpus", str(decision["versions"][0]))
    assert version.run_id == first and version.tags[RUN_TAG] == runs["b"]
    _, card = download_registered_model("models:/ance-corpus/1", tmp_path / "export", tmp_path / "work-b", store)
    assert card["params"] == {"ance.rounds": "5"}
    again = register_models(tracker, "ance-corpus", [("ANCE round 1", first, {DEV_KEY: 0.5})], "corpus", "test",
                            logged_by={"ANCE round 1": runs["a"]}, digests={"ANCE round 1": "c" * 16})
    assert again["versions"] == [2]  # (with a digest, a run again finds it whatever run registered it)
    assert register_models(tracker, "ance-corpus", [("ANCE round 1", first, {DEV_KEY: 0.5})], "corpus", "test",
                           logged_by={"ANCE round 1": runs["b"]}, digests={"ANCE round 1": "c" * 16})["versions"] == [2]
    real = tracker.client.list_artifacts

    def deleted_meanwhile(run_id, path=None):
        tracker.client.delete_run(run_id)
        return real(run_id, path)

    monkeypatch.setattr(tracker.client, "list_artifacts", deleted_meanwhile)
    late = tracker.start_run("ANCE round 1")
    assert log_checkpoint(tracker, late, checkpoint) == late  # (the holder deleted meanwhile: uploaded)
