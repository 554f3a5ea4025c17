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
