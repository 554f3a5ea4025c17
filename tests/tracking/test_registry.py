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


def test_a_second_folder_of_the_same_name_is_told_it_shares_the_registered_model(tmp_path):
    from tracking.client import Tracker
    from tracking.registry import FOLDER_TAG, dataset_folder, register_models

    first, second = (tmp_path / side / "corpus" for side in ("a", "b"))
    for folder in (first, second):
        folder.mkdir(parents=True)
    tracker = Tracker(tmp_path / "work", "ance-train")

    def register(folder, dev):
        run = tracker.start_run("ANCE round 1")
        tracker.end_run(run)
        data = DataConfig(dataset=str(folder))
        summary = tracker.summary() | {"run_id": run, "run_url": None}
        summary["champion"] = register_models(tracker, "ance-corpus", [("ANCE round 1", run, {DEV_KEY: dev})],
                                              data.dataset, "test", "ANCE round 1", "dev abc", dataset_folder(data))
        return summary

    alone = register(first, 0.5)
    again = register(first, 0.6)  # the same collection: no warning
    assert "shared_with" not in alone["champion"] and "shared_with" not in again["champion"]
    assert not [line for line in closing_lines(again) if line.startswith("WARNING")]
    other = register(second, 0.1)
    assert other["champion"]["shared_with"] == str(first.resolve())
    warning = [line for line in closing_lines(other) if line.startswith("WARNING")]
    assert len(warning) == 1 and "ance-corpus" in warning[0] and str(first.resolve()) in warning[0]
    assert "data.name" in warning[0]
    assert tracker.client.get_registered_model("ance-corpus").tags[FOLDER_TAG] == str(first.resolve())
