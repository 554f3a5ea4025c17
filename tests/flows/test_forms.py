"""What the Prefect UI's run forms send, refused before any work where it is wrong (found by a review of the forms:
the evaluate deployment's `hybrid` is a free JSON box there, and some flows took any text as their work folder)."""

import re

import pytest

from ance_core.errors import AnceError
from tests.tiny import random_head_checkpoint


@pytest.mark.parametrize("hybrid, said", [
    ({"fusoin": {"method": "convex", "weight": 0.7}}, r"hybrid: 'fusoin' is no key of it; it takes fusion and bm25"),
    ({"fusion": {"method": "convex"}}, r"hybrid.fusion: not a fusion record: .* weight is a number from 0 to 1"),
    ({"bm25": {"k1": -1}}, r"hybrid.bm25.k1: .*greater than 0"),
    ({"bm25": {"kk": 1}}, r"hybrid.bm25.kk: not a setting of hybrid.bm25 \(its settings: k1, b, method"),
    ("rrf", r"hybrid: a mapping of fusion and bm25, not 'rrf'"),
])
def test_a_bad_hybrid_is_refused_naming_its_key_before_any_work(hybrid, said, tmp_path):
    from flows.evaluate import evaluate_checkpoint

    with pytest.raises(AnceError, match=said):
        evaluate_checkpoint.fn(str(tmp_path / "no-checkpoint"), work_dir=str(tmp_path / "work"), hybrid=hybrid)
    assert not (tmp_path / "work").exists()


def test_a_good_hybrid_reads_as_its_bm25_and_fusion():
    from ance_core.retrieval.config import BM25Config
    from flows.evaluate import checked_hybrid

    assert checked_hybrid({}) == (BM25Config(), None)
    assert checked_hybrid({"fusion": {"method": "convex", "weight": 0.7}, "bm25": {"k1": 1.2}}) == (
        BM25Config(k1=1.2), {"method": "convex", "weight": 0.7, "k": 60})


def test_a_split_the_dataset_does_not_have_is_said_before_the_corpus_is_encoded(tiny_model, tiny_scifact, tmp_path):
    from prefect.client.orchestration import get_client

    from ance_core.data.config import DataConfig
    from flows.evaluate import evaluate_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    state = evaluate_checkpoint(str(checkpoint), DataConfig(dataset=str(tiny_scifact), name="tiny"),
                                work_dir=str(tmp_path / "work"), split="tset", return_state=True)
    with pytest.raises(AnceError, match=r"split 'tset': tiny has no such split \(its splits: .*test"):
        state.result()
    assert (tmp_path / "work" / "data").is_dir() and not (tmp_path / "work" / "encode").exists()
    # the run is named after its collection in the UI's lists (and MLflow's), not by two random words alone
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(state.state_details.flow_run_id).name
    assert re.fullmatch(r"tiny-[a-z]+-[a-z]+", name), name


@pytest.mark.parametrize("entrypoint", ["flows.evaluate:evaluate_checkpoint", "flows.evaluate:bm25_baseline",
                                        "flows.stages:refresh_negatives_flow", "flows.stages:encode_flow",
                                        "flows.compress:compress_flow"])
def test_an_empty_work_dir_in_a_form_is_refused_before_the_run_starts(entrypoint):
    """Found by the same review: these flows took any text as their work folder, and an empty one wrote the stages
    into the worker's current folder (the pipeline's config refused it already)."""
    import importlib

    from prefect.exceptions import ParameterTypeError

    module, name = entrypoint.split(":")
    flow = getattr(importlib.import_module(module), name)
    parameters = {"checkpoint": "/c"} if "checkpoint" in flow.parameters.properties else {}
    flow.validate_parameters(parameters | {"work_dir": "work"})
    with pytest.raises(ParameterTypeError, match=r"work_dir[\s\S]*empty: the stages would be written into the current"):
        flow.validate_parameters(parameters | {"work_dir": " "})


def test_a_round_below_one_is_refused_by_the_refresh_negatives_form():
    """The form's round_number took 0 or -3 (it seeds the sampler's draw); its schema now says the minimum."""
    from prefect.exceptions import ParameterTypeError
    from prefect.utilities.callables import parameter_schema

    from flows.stages import refresh_negatives_flow

    assert parameter_schema(refresh_negatives_flow).model_dump()["properties"]["round_number"]["minimum"] == 1
    refresh_negatives_flow.validate_parameters({"checkpoint": "/c", "round_number": 2})
    with pytest.raises(ParameterTypeError, match=r"round_number[\s\S]*greater than or equal to 1"):
        refresh_negatives_flow.validate_parameters({"checkpoint": "/c", "round_number": 0})


@pytest.mark.parametrize("name", ["refresh_negatives_flow", "encode_flow"])
def test_a_checkpoint_that_is_not_there_is_said_before_the_data_stage(name, tiny_scifact, tmp_path):
    """Found by a review of the forms: refresh-negatives and encode read the corpus into a data stage first, and
    only then found that the checkpoint's path was mistyped."""
    import flows.stages
    from ance_core.data.config import DataConfig

    flow = getattr(flows.stages, name)
    with pytest.raises(AnceError, match=r"nope: no such checkpoint folder"):
        flow.fn(str(tmp_path / "nope"), DataConfig(dataset=str(tiny_scifact)), work_dir=str(tmp_path / "work"))
    assert not (tmp_path / "work" / "data").exists()


@pytest.mark.parametrize("flow, setting, said", [
    ("flows.ance_pipeline:retrain", {"warmup_only": True}, r"retrain trains ANCE rounds from the champion, and "
                                                           r"config.warmup_only is true"),
    ("flows.ance_pipeline:retrain", {"selection": "cv", "data": {"dev_fraction": 0.3}},
     r"retrain starts from the champion, and config.selection is cv"),
    ("flows.stages:bm25_warmup", {"start_checkpoint": "/some/model"},
     r"bm25-warmup trains the warm-up from config.model.name, and config.start_checkpoint is set \(/some/model\)"),
])
def test_a_setting_the_flow_cannot_take_is_said_in_the_forms_terms(flow, setting, said, tmp_path):
    """Found by the same review: retrain with warmup_only or selection cv was refused once its champion was resolved,
    naming a start_checkpoint its form does not have; bm25-warmup with a start_checkpoint gave pydantic's error
    naming warmup_only, which its user never set."""
    import importlib

    from ance_core.pipeline.config import PipelineConfig

    module, name = flow.split(":")
    config = PipelineConfig.model_validate(setting | {"work_dir": str(tmp_path / "work")})
    with pytest.raises(AnceError, match=said):
        getattr(importlib.import_module(module), name).fn(config)
    assert not (tmp_path / "work").exists()


def test_a_form_opens_with_every_setting_at_the_value_the_run_uses():
    """Found by the same review: the form's starting values (the flow's default, as Prefect's schema holds it) left
    out the options added after the stage keys existed (hybrid, selection, dev_check, retention.keep_rankings, ...)
    at their defaults, so a form could show hybrid and keep_rankings unset while the run used true. The dump a cache
    key is made of still leaves them out (the keys do not change: tests/core/test_stage_keys.py)."""
    from prefect.utilities.callables import parameter_schema

    from ance_core.pipeline.config import PipelineConfig
    from ance_core.stage_config import KEY_DUMP
    from flows.ance_pipeline import ance_pipeline

    opened = parameter_schema(ance_pipeline).model_dump()["properties"]["config"]["default"]
    assert set(opened) == set(PipelineConfig.model_fields)
    assert opened["hybrid"] is True and opened["retention"]["keep_rankings"] is True
    assert opened["selection"] == "best" and opened["bm25_negatives"]["judged_only"] is False
    assert "hybrid" not in PipelineConfig().model_dump(mode="json", context=KEY_DUMP)


def test_a_run_name_the_user_gave_is_kept(monkeypatch):
    """A review: Prefect calls a flow's flow_run_name for every run, so `prefect deployment run --flow-run-name
    nightly` was renamed; the two words Prefect makes up are replaced, a name the user gave is kept."""
    from types import SimpleNamespace

    import flows.names as names

    def context(name):
        run = SimpleNamespace(name=name)
        return SimpleNamespace(flow_run=run, parameters={"data": {"dataset": "/x/nfcorp", "name": "med"}})

    monkeypatch.setattr(names.FlowRunContext, "get", staticmethod(lambda: context("nightly-retrain-3")))
    assert names.dataset_run_name() == "nightly-retrain-3"
    monkeypatch.setattr(names.FlowRunContext, "get", staticmethod(lambda: context("witty-otter")))
    assert re.fullmatch(r"med-[a-z]+-[a-z]+", names.dataset_run_name())


def test_a_dataset_that_is_not_there_is_said_before_a_registered_model_is_looked_up(tmp_path):
    """Found by a review of the forms: the evaluate flow downloaded a registered model (or said it was not found)
    before it found that the form's dataset does not exist."""
    from ance_core.data.config import DataConfig
    from flows.evaluate import evaluate_checkpoint

    for download in (False, True):  # (not a BEIR name: nothing to download either way)
        with pytest.raises(AnceError, match=r"dataset '.*nope' not found"):
            evaluate_checkpoint.fn("models:/ance-nope@champion",
                                   DataConfig(dataset=str(tmp_path / "nope"), download=download),
                                   work_dir=str(tmp_path / "work"))
    assert not (tmp_path / "work").exists()
    # a BEIR name still to download is downloaded after the checkpoint is found: its lookup is said first
    with pytest.raises(AnceError, match=r"models:/ance-nope@champion"):
        evaluate_checkpoint.fn("models:/ance-nope@champion",
                               DataConfig(dataset="fiqa", data_home=str(tmp_path / "home"), download=True),
                               work_dir=str(tmp_path / "work"))
    assert not (tmp_path / "home").exists()
