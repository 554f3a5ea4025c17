"""Where a flow that needs a trained model starts (flows/start.py): the work folder's newest model is a fallback for
the collection it was trained on only (a probe: `ance compress --dataset other` compressed a model of another
collection, saying only that the champion was not found)."""

import json

import pytest

import flows.start as start
from ance_core.errors import AnceError


def test_the_newest_model_of_another_collection_is_no_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(start, "champion_checkpoint", lambda work_dir, collection: (None, "no champion"))
    latest = tmp_path / start.LATEST
    latest.write_text(json.dumps({"checkpoint": "work/train/abc", "collection": "toy"}))
    assert start.trained_checkpoint(tmp_path, "toy") == ("work/train/abc", str(latest))
    with pytest.raises(AnceError, match="was trained on 'toy', not 'other': name the checkpoint to start from"):
        start.trained_checkpoint(tmp_path, "other")
    assert start.trained_checkpoint(tmp_path, "other", "ck") == ("ck", "the given checkpoint")
    latest.write_text(json.dumps({"checkpoint": "work/train/abc"}))  # written before the collection was: as before
    assert start.trained_checkpoint(tmp_path, "other")[0] == "work/train/abc"
