"""Dev evaluation inside a training stage (training/devcheck.py): the candidate set, its score against the full-corpus
evaluation, and the loop's best step, early stop and resume."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_documents, encode_queries
from ance_core.retrieval.evaluate import evaluate_run
from ance_core.training.config import DevCheckConfig, TrainConfig
from ance_core.training.devcheck import BEST, DEV_METRIC, DevCheck, StageDev, candidate_pairs
from ance_core.training.loop import train
from tests.tiny import training_tables

CFG = TrainConfig(max_steps=6, batch_size=4, learning_rate=1e-3, precision="fp32", warmup_ratio=0.0,
                  checkpoint_seconds=0)  # 10 pairs: 3 steps an epoch, 2 epochs


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("init")
    init_model(ModelConfig(name=str(tiny_model)), ckpt)
    return ckpt, *training_tables()


def _weights(folder):
    return load_file(folder / "model.safetensors") | load_file(folder / "head.safetensors")


def _same(a, b) -> bool:
    a, b = _weights(a), _weights(b)
    return all(torch.equal(a[k], b[k]) for k in a)


def test_candidates_are_each_runs_top_k_and_the_relevant_documents_of_the_dev_queries():
    bm25 = pd.DataFrame({"query_id": ["a"] * 3 + ["b"] * 2 + ["x"], "doc_id": ["d1", "d2", "d3", "d4", "d5", "d9"],
                         "rank": [1, 2, 3, 1, 2, 1]})
    dense = pd.DataFrame({"query_id": ["a", "a", "b"], "doc_id": ["d3", "d7", "d5"], "rank": [2, 1, 1]})
    qrels = pd.DataFrame({"query_id": ["a", "b", "b"], "doc_id": ["d8", "d5", "d6"], "relevance": [1, 2, 0]})
    pairs = candidate_pairs([bm25, dense], qrels, depth=2)
    assert sorted(map(tuple, pairs.to_numpy())) == [("a", "d1"), ("a", "d2"), ("a", "d3"), ("a", "d7"), ("a", "d8"),
                                                    ("b", "d4"), ("b", "d5")]  # d6 is judged not relevant; x: no dev


def test_a_check_over_the_whole_corpus_is_the_full_corpus_evaluation(setup):
    ckpt, _, corpus, queries, relevant = setup
    qrels = pd.DataFrame([(q, d, 1) for q, docs in relevant.items() for d in docs],
                         columns=["query_id", "doc_id", "relevance"])
    pairs = pd.DataFrame([(q, d) for q in queries["query_id"] for d in corpus["doc_id"]],
                         columns=["query_id", "doc_id"])
    check = DevCheck(pairs, queries, qrels, corpus, EncodeConfig(precision="fp32"))
    model, tokenizer, meta = load_checkpoint(ckpt)
    score = check.score(model, tokenizer, meta)
    docs, ids, _ = encode_documents(model, tokenizer, meta, corpus, EncodeConfig(precision="fp32"))
    q = encode_queries(model, tokenizer, queries["text"].tolist(), meta, EncodeConfig(precision="fp32"))
    # every (query, document) score, each the float32 dot product the check computes: a random tiny model's scores
    # lie within float32 rounding of each other, so a matrix product (another order of summation) may reorder them
    rows, cols = np.divmod(np.arange(len(q) * len(docs)), len(docs))
    scores = np.einsum("ij,ij->i", q[rows], docs[cols]).reshape(len(q), len(docs))
    run = pd.DataFrame([(queries["query_id"][i], ids[j], float(scores[i, j]))
                        for i in range(len(q)) for j in np.argsort(-scores[i], kind="stable")[:20]],
                       columns=["query_id", "doc_id", "score"])
    assert score == pytest.approx(evaluate_run(run, qrels)[0]["ndcg_at_10"], abs=1e-6)
    assert check.size == {"dev_check_queries": 10, "dev_check_passages": 30, "dev_check_pairs": 300}


class Crash(RuntimeError):
    pass


def crash_after_4(record):
    if record["step"] == 4:
        raise Crash


class ScriptedCheck:
    """A DevCheck whose scores are given: the loop's decisions, apart from what a model scores."""

    size = {"dev_check_queries": 1, "dev_check_passages": 1, "dev_check_pairs": 1}

    def __init__(self, scores):
        self.scores, self.calls = list(scores), 0

    def score(self, model, tokenizer, meta) -> float:
        self.calls += 1
        return self.scores.pop(0)


def _log(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]


def test_the_best_check_is_the_stages_model_and_a_falling_stage_ends_early(setup, tmp_path):
    ckpt, *tables = setup
    def stop_after_2(record):
        if record["step"] == 2:
            raise Crash

    with pytest.raises(Crash):  # the state after step 2 of the same 6-step schedule, without checks
        train(ckpt, *tables, CFG.model_copy(update={"checkpoint_every": 2}), tmp_path / "plain",
              callbacks=[stop_after_2])
    straight = tmp_path / "plain" / "checkpoints" / "step-000002"
    dev = StageDev(ScriptedCheck([0.3, 0.5, 0.4, 0.45, 0.9]), DevCheckConfig(per_epoch=3, patience=2), 0.2)
    summary = train(ckpt, *tables, CFG, tmp_path / "checked", dev=dev)
    # a check after every step: 0.3, 0.5 (best, step 2), 0.4, 0.45: two without a new best, the stage ends at step 4
    assert summary["steps"] == 4 and summary["best_step"] == 2 and summary["dev_checks"] == 4
    assert [r.get(DEV_METRIC) for r in _log(tmp_path / "checked")] == [0.3, 0.5, 0.4, 0.45]
    assert _same(tmp_path / "checked", straight) and not (tmp_path / "checked" / BEST).exists()
    trained = load_file(tmp_path / "checked" / "optimizer.safetensors")  # the best step's training state too
    assert all(torch.equal(v, load_file(straight / "optimizer.safetensors")[k]) for k, v in trained.items())


def test_no_check_above_the_starting_model_gives_it_back_and_keep_best_off_gives_the_last_step(setup, tmp_path):
    ckpt, *tables = setup
    dev = StageDev(ScriptedCheck([0.1, 0.2]), DevCheckConfig(per_epoch=1, patience=None), 0.5)
    summary = train(ckpt, *tables, CFG, tmp_path / "worse", dev=dev)
    assert summary["best_step"] == 0 and summary["steps"] == 6  # checks at steps 3 and 6 (one an epoch)
    assert _same(tmp_path / "worse", ckpt)
    dev = StageDev(ScriptedCheck([0.1, 0.2]), DevCheckConfig(per_epoch=1, patience=None, keep_best=False), 0.5)
    train(ckpt, *tables, CFG, tmp_path / "last", dev=dev)
    plain = tmp_path / "plain"
    train(ckpt, *tables, CFG, plain)
    assert _same(tmp_path / "last", plain)  # checks change nothing of what is trained


def test_without_a_starting_score_step_zero_is_checked(setup, tmp_path):
    ckpt, *tables = setup
    check = ScriptedCheck([0.4, 0.3, 0.35])
    summary = train(ckpt, *tables, CFG, tmp_path, dev=StageDev(check, DevCheckConfig(per_epoch=1, patience=None)))
    assert check.calls == 3 and summary["best_step"] == 0 and _same(tmp_path, ckpt)


def test_a_resumed_stage_keeps_its_best_and_ends_as_an_uninterrupted_one(setup, tmp_path):
    ckpt, *tables = setup
    scores = [0.3, 0.5, 0.4, 0.45, 0.2, 0.1]
    cfg = DevCheckConfig(per_epoch=3, patience=3)
    whole = train(ckpt, *tables, CFG, tmp_path / "whole", dev=StageDev(ScriptedCheck(scores), cfg, 0.2))

    with pytest.raises(Crash):
        train(ckpt, *tables, CFG, tmp_path / "resumed", dev=StageDev(ScriptedCheck(scores), cfg, 0.2),
              callbacks=[crash_after_4])
    # resumed from step 2 (the new best's checkpoint): the checks of steps 3 and 4 are made again
    resumed = train(ckpt, *tables, CFG, tmp_path / "resumed", dev=StageDev(ScriptedCheck(scores[2:]), cfg, 0.2))
    assert resumed["resumed_from_step"] == 2
    assert resumed["best_step"] == whole["best_step"] == 2 and resumed["steps"] == whole["steps"] == 5
    assert _same(tmp_path / "whole", tmp_path / "resumed")
    assert [r.get(DEV_METRIC) for r in _log(tmp_path / "resumed")] == scores[:5]


def test_a_new_best_whose_save_was_cut_short_is_the_best_of_the_resumed_stage(setup, tmp_path, monkeypatch):
    """Stopped while a new best (step 2) was being saved, after its checkpoint: the resumed stage took the best saved
    before it (step 1, 0.3) and a later, lower check (0.4) as a new best. It keeps step 2, as an uninterrupted stage
    does."""
    from ance_core.training.devcheck import BestStep

    ckpt, *tables = setup
    scores, cfg = [0.3, 0.5, 0.4, 0.45, 0.2, 0.1], DevCheckConfig(per_epoch=3, patience=2)
    whole = train(ckpt, *tables, CFG, tmp_path / "whole", dev=StageDev(ScriptedCheck(scores), cfg, 0.2))
    save = BestStep.save

    def cut_short(self, out, write_state):
        if self.step == 2:
            raise Crash
        save(self, out, write_state)

    monkeypatch.setattr(BestStep, "save", cut_short)
    with pytest.raises(Crash):
        train(ckpt, *tables, CFG, tmp_path / "resumed", dev=StageDev(ScriptedCheck(scores), cfg, 0.2))
    monkeypatch.setattr(BestStep, "save", save)
    resumed = train(ckpt, *tables, CFG, tmp_path / "resumed", dev=StageDev(ScriptedCheck(scores[2:]), cfg, 0.2))
    assert resumed["resumed_from_step"] == 2
    assert resumed["best_step"] == whole["best_step"] == 2 and resumed["steps"] == whole["steps"] == 4
    assert _same(tmp_path / "whole", tmp_path / "resumed")


def test_a_stage_resumed_at_the_check_that_spent_its_patience_ends_there(setup, tmp_path):
    """Stopped after the step whose check spent the patience (its checkpoint written) and before the stage ended: the
    resumed stage trained on to the next check. It ends at that step with the same model."""
    ckpt, *tables = setup
    scores, cfg = [0.3, 0.5, 0.4, 0.45], DevCheckConfig(per_epoch=3, patience=2)
    every_4 = CFG.model_copy(update={"checkpoint_every": 4})
    whole = train(ckpt, *tables, every_4, tmp_path / "whole", dev=StageDev(ScriptedCheck(scores), cfg, 0.2))

    with pytest.raises(Crash):
        train(ckpt, *tables, every_4, tmp_path / "resumed", dev=StageDev(ScriptedCheck(scores), cfg, 0.2),
              callbacks=[crash_after_4])
    check = ScriptedCheck([0.2])
    resumed = train(ckpt, *tables, every_4, tmp_path / "resumed", dev=StageDev(check, cfg, 0.2))
    assert resumed["resumed_from_step"] == 4 and check.calls == 0
    assert resumed["steps"] == whole["steps"] == 4 and resumed["best_step"] == whole["best_step"] == 2
    assert _same(tmp_path / "whole", tmp_path / "resumed")


def test_a_best_left_by_an_earlier_attempt_does_not_outlive_a_fresh_start(setup, tmp_path):
    """A stage started again from step 0 (its checkpoints gone) does not take an earlier attempt's best as its own."""
    ckpt, *tables = setup
    stale = tmp_path / BEST
    stale.mkdir(parents=True)
    (stale / "dev_best.json").write_text(json.dumps({"step": 5, "score": 0.99}))
    summary = train(ckpt, *tables, CFG, tmp_path, dev=StageDev(ScriptedCheck([0.3, 0.6]), DevCheckConfig(
        per_epoch=1, patience=None), 0.2))
    assert summary["best_step"] == 6 and summary["best_dev_ndcg_at_10"] == 0.6


def test_a_shorter_check_scores_the_starting_model_itself():
    """A 128-token check overstates a trained model by ~0.025 (RESULTS.md) against the starting model's full
    evaluation: a stage that made the model worse by less than that was kept instead of handed back."""
    from ance_core.training.config import DevCheckConfig

    assert DevCheckConfig().start_score(0.70) == 0.70  # a check scores as the evaluation does
    assert DevCheckConfig(passage_max_length=128).start_score(0.70) is None  # step 0 is checked (test above)


@pytest.mark.parametrize("stopped_in", ["rmtree-old", "between-renames"])
def test_a_stop_in_the_middle_of_a_best_save_does_not_break_the_next_save(tmp_path, monkeypatch, stopped_in):
    """Stopped while a new best was being saved, after its checkpoint (in the removal of the previous best, or between
    the two renames): the resumed stage took the saved best, but its next new best failed to save ("Directory not
    empty" renaming the best onto the leftover `.best-old`), a traceback on every retry (found by a review)."""
    import os
    import shutil

    from ance_core.training import devcheck
    from ance_core.training.devcheck import BestStep

    def write(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_text(f"{best.step}")

    best = BestStep(0, 0.3)
    best.save(tmp_path, write)
    best.checked(10, 0.35)
    real_rmtree, real_replace = shutil.rmtree, os.replace

    def stop_rmtree(path, *args, **kwargs):
        if str(path).endswith(".best-old") and (path / "model.safetensors").exists():
            raise Crash
        return real_rmtree(path, *args, **kwargs)

    def stop_replace(src, dst):
        if str(src).endswith(".best-partial"):
            raise Crash
        return real_replace(src, dst)

    if stopped_in == "rmtree-old":
        monkeypatch.setattr(devcheck.shutil, "rmtree", stop_rmtree)
    else:
        monkeypatch.setattr(devcheck.os, "replace", stop_replace)
    with pytest.raises(Crash):
        best.save(tmp_path, write)
    monkeypatch.undo()

    best = BestStep.resume(tmp_path, [{"step": 10, DEV_METRIC: 0.35}], 0.3)
    assert best.step == 10 and json.loads((tmp_path / BEST / "dev_best.json").read_text())["step"] == 10
    assert best.checked(20, 0.4)
    best.save(tmp_path, write)
    assert (tmp_path / BEST / "model.safetensors").read_text() == "20"
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST]
