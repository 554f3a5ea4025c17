"""Where a flow that needs a trained model starts (flows/start.py): the work folder's newest model is a fallback for
the collection it was trained on only (a probe: `ance compress --dataset other` compressed a model of another
collection, saying only that the champion was not found)."""

import json
import re

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
    latest.unlink()  # a message names the setting as the caller's user sets it (a flow's form has no --checkpoint)
    with pytest.raises(AnceError, match=r"no trained model yet; .* name a checkpoint \(config.start_checkpoint\)$"):
        start.trained_checkpoint(tmp_path, "other", setting="config.start_checkpoint")
    with pytest.raises(AnceError, match=r"checkpoint models:/ance-x@champion: "):
        start.trained_checkpoint(tmp_path, "other", "models:/ance-x@champion", "checkpoint")


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


def test_a_run_says_when_a_firstp_model_reads_only_the_start_of_many_documents(tiny_scifact, tiny_model, tmp_path,
                                                                             capsys):
    """Documents longer than the model's passage tokens are cut without a word (a collection of 36k-word pages): one
    line with the share of a sample, and what reads more of them; nothing where they fit, or under MaxP."""
    from ance_core.artifacts import ArtifactRef
    from ance_core.data.config import DataConfig
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model
    from flows.book import RunBook
    from tasks.data import prepare_data

    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), str(tmp_path / "w"))
    book = RunBook.__new__(RunBook)  # (its data alone: no run, no tracking)
    book.data, book.trial = data, None
    said = {}
    for name, cfg in {"short": ModelConfig(name=str(tiny_model), passage_max_length=32),
                      "long": ModelConfig(name=str(tiny_model), passage_max_length=100_000),
                      "maxp": ModelConfig(name=str(tiny_model), passage_max_length=32, document_mode="maxp")}.items():
        init_model(cfg, tmp_path / name)
        book.say_long_documents(ArtifactRef(str(tmp_path / name), name))
        said[name] = capsys.readouterr().out
    assert re.search(r"corpus: \d+ of \d+ documents sampled \(\d+%\) are longer than the model's 32 passage tokens: "
                     r"FirstP .* maxp encodes up to model.max_passages windows", said["short"]), said
    assert said["long"] == said["maxp"] == ""
