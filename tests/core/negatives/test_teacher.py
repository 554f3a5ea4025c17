"""Distillation from a teacher (mining.teacher): its scores of every pair's group, every draw included, in the mined
table; the KL term they feed in training."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from ance_core.data.corpus import FrameCorpus
from ance_core.errors import AnceError
from ance_core.negatives.config import MiningConfig, TeacherConfig
from ance_core.negatives.mining import epoch_negatives, sample_negatives
from ance_core.negatives.teacher import Teacher, group_teacher_scores, with_teacher_scores
from ance_core.stage_config import KEY_DUMP
from ance_core.training.loss import distill_loss
from tests.tiny import build_tiny_cross_encoder, random_head_checkpoint, training_tables


@pytest.fixture(scope="module")
def cross_encoder(tiny_model, tmp_path_factory):
    return build_tiny_cross_encoder(tiny_model, tmp_path_factory.mktemp("cross") / "model")


def _mined(draws=1):
    negatives, corpus, queries, relevant = training_tables()
    ranking = negatives.explode("negative_ids")[["query_id", "negative_ids"]].rename(columns={"negative_ids": "doc_id"})
    ranking = ranking.assign(rank=ranking.groupby("query_id").cumcount() + 1, score=0.0)
    cfg = MiningConfig(sampler="ance", num_negatives=1, top_k=5)
    table = sample_negatives(cfg, relevant, 1, {"dense": ranking}, corpus["doc_id"].tolist(), draws=draws)
    return table, corpus, queries


def test_a_cross_encoder_scores_each_groups_pairs_once_every_draw_included(cross_encoder):
    """A sequence classifier is a cross-encoder (auto); the table gets its score of each positive and of every
    negative of every draw, divided by the temperature, and a draw's view carries its own negatives' scores."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    table, corpus, queries = _mined(draws=2)
    cfg = TeacherConfig(model=str(cross_encoder), temperature=0.5, max_length=32)
    teacher = Teacher(cfg)
    assert teacher.kind == "cross-encoder"
    scored = with_teacher_scores(table, cfg, FrameCorpus(corpus), queries, teacher)
    model, tokenizer = (f.from_pretrained(cross_encoder) for f in (AutoModelForSequenceClassification, AutoTokenizer))
    text = dict(zip(corpus["doc_id"], corpus["text"], strict=True))
    qtext = dict(zip(queries["query_id"], queries["text"], strict=True))

    def expected(q, d):
        with torch.no_grad():
            inputs = tokenizer(qtext[q], text[d], truncation=True, max_length=32, return_tensors="pt")
            return float(model(**inputs).logits[0, 0]) / 0.5

    row = scored.iloc[3]
    assert row["teacher_positive"] == pytest.approx(expected(row["query_id"], row["positive_id"]), abs=1e-4)
    for draw in (0, 1):
        view = epoch_negatives(scored, draw).iloc[3]
        assert [pytest.approx(expected(row["query_id"], d), abs=1e-4) for d in view["negative_ids"]] == list(
            view["teacher_negatives"])
    groups = group_teacher_scores(epoch_negatives(scored, 1))
    assert groups.shape == (len(table), 2) and groups.dtype == np.float32
    assert group_teacher_scores(table) is None


def test_a_plain_encoder_is_a_bi_encoder_and_bad_teachers_are_refused(tiny_model, tmp_path):
    teacher = Teacher(TeacherConfig(model=str(tiny_model)))
    assert teacher.kind == "bi-encoder"
    scores = teacher.score(["cell protein", "mice"], ["cell protein", "gene cancer"])
    assert scores[0] == pytest.approx(1.0, abs=1e-5) and -1 <= scores[1] < 1  # cosine
    with pytest.raises(AnceError, match="mining.teacher.model: cannot load"):
        Teacher(TeacherConfig(model=str(tmp_path / "missing")))
    with pytest.raises(ValidationError, match="sampler 'in-batch' mines no negatives"):
        MiningConfig(sampler="in-batch", teacher={"model": "x"})
    assert "teacher" not in repr(MiningConfig()) and "teacher" not in MiningConfig().model_dump(context=KEY_DUMP)


def test_a_pipeline_checkpoint_teaches_with_the_scores_it_retrieves_by(tiny_model, tmp_path):
    """A checkpoint this pipeline wrote (ance_model.json) is loaded whole — head, LayerNorm, prefixes — and scores a
    pair by the inner product of its own query and passage embeddings, as retrieval does; not as a plain encoder."""
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model, load_checkpoint
    from ance_core.retrieval.encode import encode_texts

    init_model(ModelConfig(name=str(tiny_model), query_max_length=16, passage_max_length=32, query_prefix="q: ",
                           passage_prefix="p: "), tmp_path / "ckpt")
    teacher = Teacher(TeacherConfig(model=str(tmp_path / "ckpt"), max_length=24))
    queries, passages = ["cell protein", "mice"], ["cell protein binds gene", "gene cancer in mice"]
    scores = teacher.score(queries, passages)
    model, tokenizer, meta = load_checkpoint(tmp_path / "ckpt")
    q = encode_texts(model, tokenizer, meta.queries(queries), 16, 8, None)
    p = encode_texts(model, tokenizer, meta.passages(passages), 24, 8, None)
    assert scores == pytest.approx((q * p).sum(1), abs=1e-4)
    plain = Teacher(TeacherConfig(model=str(tiny_model), max_length=24)).score(queries, passages)
    assert not np.allclose(scores, plain, atol=1e-3)  # the head and LayerNorm are part of the score
    with pytest.raises(AnceError, match="not a cross-encoder"):
        Teacher(TeacherConfig(model=str(tmp_path / "ckpt"), kind="cross-encoder"))


def test_the_distillation_term_is_the_kl_of_the_groups_softmaxes():
    torch.manual_seed(0)
    q, p = torch.randn(3, 4), torch.randn(3 * 2, 4)
    student = torch.einsum("bh,bgh->bg", q, p.view(3, 2, 4))
    assert float(distill_loss(q, p, 2, student + 5.0)) == pytest.approx(0.0, abs=1e-6)  # same softmax
    teacher = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    t, s = teacher.softmax(1), student.softmax(1)
    expected = float((t * (t.log() - s.log())).sum(1).mean())
    assert float(distill_loss(q, p, 2, teacher)) == pytest.approx(expected, rel=1e-5)


def test_the_teachers_batch_size_is_in_no_key_and_an_unused_teacher_is_refused(tiny_model):
    from ance_core.artifacts import digest_of, stage_key
    from ance_core.pipeline.config import PipelineConfig

    small, large = (MiningConfig(teacher={"model": "x", "batch_size": b}) for b in (8, 64))
    assert digest_of(small) == digest_of(large)
    key = lambda m: stage_key("mine", {"mining": m, "split": "train"}, {"run": "r" * 16})  # noqa: E731
    assert key(small) == key(large) != key(MiningConfig(teacher={"model": "x", "temperature": 2.0}))
    with pytest.raises(ValidationError, match="mining.teacher is set but ance.distill_weight is 0"):
        PipelineConfig(mining={"teacher": {"model": "x"}}, ance={"distill_weight": 0})
    cls = Teacher(TeacherConfig(model=str(tiny_model), pooling="cls", query_prefix="cell "))
    assert cls.score(["protein"], ["cell protein"])[0] == pytest.approx(1.0, abs=1e-5)  # the prefix makes them one


def test_a_teacher_retrained_at_the_same_path_is_another_teacher(tiny_model, tiny_scifact, tmp_path):
    """The mine stage (folder and task cache) is keyed by the teacher's content, not its path: a checkpoint written
    again at the same path with other weights scores again (issue 41: its old scores were reused)."""
    import shutil

    from ance_core.data.config import DataConfig
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model
    from tasks.data import prepare_data
    from tasks.mine import _teacher_key, mine_negatives, teacher_digest

    work, teacher = str(tmp_path / "work"), tmp_path / "teacher"
    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), work)
    cfg = MiningConfig(sampler="random", queries=4, teacher={"model": str(teacher), "max_length": 24})
    mine = lambda: mine_negatives.fn({}, data, "train", cfg, 1, work)  # noqa: E731
    init_model(ModelConfig(name=str(tiny_model)), teacher)
    first, again = mine(), mine()
    assert again.path == first.path and again.cached
    shutil.rmtree(teacher)
    random_head_checkpoint(tiny_model, teacher)  # another head: another model at the same path
    retrained = mine()
    assert retrained.path != first.path and not retrained.cached
    assert _teacher_key({"cfg": cfg}) == {"teacher": teacher_digest(cfg)}  # the task cache's key moves with it
    assert teacher_digest(MiningConfig()) is None and _teacher_key({"cfg": MiningConfig(teacher={"model": "x"})}) == {}
