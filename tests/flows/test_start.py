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


def test_a_retrain_of_a_maxp_model_under_a_firstp_config_is_refused_before_any_work(tmp_path, tiny_model):
    """The retrain deployment's config is a FirstP one (ance.passage_max_length 128): a MaxP champion of 256-token
    windows was retrained on each window's first 128 tokens, without a word, where a run of the same settings with
    document_mode maxp is refused (its config's validators never saw the checkpoint's mode; found by a review)."""
    from ance_core.modeling.model import META_FILE
    from ance_core.pipeline.config import PipelineConfig
    from flows.ance_pipeline import check_pipeline
    from tests.tiny import random_head_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "maxp", document_mode="maxp", max_passages=4)
    meta = json.loads((checkpoint / META_FILE).read_text())
    (checkpoint / META_FILE).write_text(json.dumps(meta | {"passage_max_length": 256}))
    config = PipelineConfig(work_dir=str(tmp_path / "work"))
    assert config.ance.passage_max_length == 128
    with pytest.raises(AnceError, match=r"start_checkpoint .*maxp is a MaxP model: document_mode maxp trains on whole "
                                        r"windows of model.passage_max_length \(256\) tokens, but "
                                        r"ance.passage_max_length is 128"):
        check_pipeline(config.model_copy(update={"start_checkpoint": str(checkpoint)}))
    whole = config.model_copy(update={"start_checkpoint": str(checkpoint),
                                      "ance": config.ance.model_copy(update={"passage_max_length": None})})
    check_pipeline(whole)  # whole windows: taken


def test_a_retrain_from_a_newest_model_removed_since_says_so(tmp_path, monkeypatch):
    """latest.json names a model whose folder was removed by hand: the retrain said "not an ANCE checkpoint (no
    ance_model.json)" (found by a review)."""
    from ance_core.pipeline.config import PipelineConfig
    from flows.ance_pipeline import retrain

    monkeypatch.setattr(start, "champion_checkpoint", lambda work_dir, collection: (None, "no champion"))
    gone = tmp_path / "work" / "train" / "abc"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / start.LATEST).write_text(json.dumps({"checkpoint": str(gone), "collection": "scifact"}))
    with pytest.raises(AnceError, match=f"{gone}: no such checkpoint folder"):
        retrain.fn(PipelineConfig(work_dir=str(tmp_path / "work")))
