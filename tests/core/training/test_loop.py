import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model
from ance_core.training.config import TrainConfig
from ance_core.training.loop import train
from ance_core.training.plan import planned_steps, steps_per_epoch
from tests.tiny import training_tables, without_dropout


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("init")
    init_model(ModelConfig(name=str(tiny_model)), ckpt)
    negatives, corpus, queries, positives = training_tables()
    return ckpt, negatives, corpus, queries, positives


CFG = TrainConfig(max_steps=4, batch_size=3, learning_rate=1e-3, checkpoint_every=2, precision="fp32",
                  warmup_ratio=0.25)


def _weights(folder):
    return load_file(folder / "model.safetensors") | load_file(folder / "head.safetensors")


def test_training_changes_weights_and_logs_every_step(setup, tmp_path):
    ckpt, *rest = setup
    summary = train(ckpt, *rest, CFG, tmp_path)
    assert summary["steps"] == 4 and summary["group_size"] == 3
    log = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 and r["loss"] > 0 for r in log)
    before, after = _weights(ckpt), _weights(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not (tmp_path / "checkpoints").exists()  # intermediate checkpoints are dropped at the end
    for name in ("optimizer.safetensors", "trainer_state.json", "rng.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / name).is_file(), name


class SimulatedCrash(RuntimeError):
    pass


def test_interrupted_training_resumes_to_identical_weights(setup, tmp_path):
    ckpt, *rest = setup
    straight = tmp_path / "straight"
    train(ckpt, *rest, CFG, straight)

    def stop_after_3(record):
        if record["step"] == 3:
            raise SimulatedCrash("simulated crash")

    resumed = tmp_path / "resumed"
    with pytest.raises(SimulatedCrash):
        train(ckpt, *rest, CFG, resumed, callbacks=[stop_after_3])
    assert (resumed / "checkpoints" / "step-000002").is_dir()
    with open(resumed / "train_log.jsonl", "a") as log:  # killed while writing a record: half of it (found by a
        log.write('{"step": 4, "lo')  # review: every retry failed on it, JSONDecodeError)
    summary = train(ckpt, *rest, CFG, resumed)
    assert summary["resumed_from_step"] == 2
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda f: [json.loads(x)["loss"] for x in (f / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(straight) == losses(resumed)


def test_steps_per_epoch_counts_whole_accumulation_groups_and_planned_steps_follow():
    cfg = TrainConfig(batch_size=3, grad_accumulation=2, epochs=2)
    assert steps_per_epoch(10, cfg) == 2  # 4 batches (the last of 1 pair), 2 steps of 2
    assert steps_per_epoch(13, cfg) == 2  # 5 batches: the fifth starts no step of its own
    assert steps_per_epoch(2, cfg) == 1  # fewer batches than a step accumulates: still one step
    assert planned_steps(10, cfg) == 4 and planned_steps(10, cfg.model_copy(update={"max_steps": 7})) == 7
    # two processes: a last batch of 1 row would leave one of them nothing (an empty step): left out
    ddp = TrainConfig(batch_size=4, world_size=2)
    assert steps_per_epoch(9, ddp) == 2 and steps_per_epoch(10, ddp) == 3 and steps_per_epoch(8, ddp) == 2
    assert steps_per_epoch(9, ddp.model_copy(update={"world_size": 1})) == 3


def test_lamb_update_is_adam_rescaled_by_the_trust_ratio():
    """One LAMB step by hand: m̂ = g, v̂ = g² at step 1, update u = m̂ / (sqrt(v̂) + eps) + wd·w, w -= lr·(|w|/|u|)·u."""
    from ance_core.training.optim import Lamb

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    g = torch.randn(5, 3)
    start = w.detach().clone()
    w.grad = g.clone()
    Lamb([w], lr=0.1, weight_decay=0.01, eps=1e-6).step()
    u = g / (g.abs() + 1e-6) + 0.01 * start
    expected = start - 0.1 * (start.norm() / u.norm()) * u
    assert torch.allclose(w.detach(), expected, atol=1e-6)


@pytest.fixture(scope="module")
def no_dropout(setup, tmp_path_factory):
    """The starting checkpoint without dropout, so that a step's gradient depends on its data only."""
    return without_dropout(setup[0], tmp_path_factory.mktemp("no-dropout"))


def test_gradient_accumulation_equals_one_larger_batch(setup, no_dropout, tmp_path):
    """2 micro-batches of 2 queries, accumulated, take the same step as one batch of 4 (no in-batch negatives: the
    loss is a mean over queries either way)."""
    _, *rest = setup
    base = dict(max_steps=1, in_batch_negatives=False, precision="fp32", checkpoint_every=0, learning_rate=1e-3)
    train(no_dropout, *rest, TrainConfig(batch_size=2, grad_accumulation=2, **base), tmp_path / "accumulated")
    train(no_dropout, *rest, TrainConfig(batch_size=4, grad_accumulation=1, **base), tmp_path / "one-batch")
    a, b, start = _weights(tmp_path / "accumulated"), _weights(tmp_path / "one-batch"), _weights(no_dropout)
    for k in a:  # within 1% of the step (lr 1e-3): AdamW's first step is ~lr * g / |g|, so a gradient near 0 summed
        # in another order can move its weight by ~1e-6; a lost or doubled micro-batch moves many by ~1e-3
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    assert any(not torch.equal(a[k], start[k]) for k in a)
    logs = [json.loads((tmp_path / f / "train_log.jsonl").read_text()) for f in ("accumulated", "one-batch")]
    assert logs[0]["loss"] == pytest.approx(logs[1]["loss"], rel=1e-5)


def test_a_stage_of_fewer_pairs_than_one_accumulated_batch_takes_the_step_of_its_pairs(setup, no_dropout, tmp_path):
    """4 pairs, batch_size 2 × grad_accumulation 4: the one step has 2 micro-batches, not 4. Its gradient and logged
    loss are those of the 4 pairs (as 2 × 2 accumulated), not scaled by 2/4 (issue 41)."""
    _, negatives, *rest = setup
    negatives = negatives.head(4)
    base = dict(max_steps=1, in_batch_negatives=False, precision="fp32", checkpoint_every=0, learning_rate=1e-3)
    train(no_dropout, negatives, *rest, TrainConfig(batch_size=2, grad_accumulation=4, **base), tmp_path / "short")
    train(no_dropout, negatives, *rest, TrainConfig(batch_size=2, grad_accumulation=2, **base), tmp_path / "whole")
    logs = [json.loads((tmp_path / f / "train_log.jsonl").read_text()) for f in ("short", "whole")]
    assert logs[0]["loss"] == pytest.approx(logs[1]["loss"], rel=1e-5)
    assert logs[0]["grad_norm"] == pytest.approx(logs[1]["grad_norm"], rel=1e-4)


def test_bf16_autocast_is_applied_and_stays_close_to_fp32(setup, no_dropout, tmp_path):
    _, *rest = setup
    base = dict(max_steps=1, batch_size=4, precision="fp32", checkpoint_every=0, learning_rate=1e-3)
    losses = {}
    for precision in ("fp32", "bf16"):
        train(no_dropout, *rest, TrainConfig(**base | {"precision": precision}), tmp_path / precision)
        losses[precision] = json.loads((tmp_path / precision / "train_log.jsonl").read_text())["loss"]
    assert losses["bf16"] != losses["fp32"]  # bf16 matmuls round: the autocast was on
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)


def test_lamb_trains_with_accumulation_and_bf16(setup, tmp_path):
    ckpt, *rest = setup
    cfg = TrainConfig(max_steps=2, batch_size=2, grad_accumulation=2, optimizer="lamb", in_batch_negatives=False,
                      precision="bf16", checkpoint_every=0)
    assert train(ckpt, *rest, cfg, tmp_path / "lamb")["steps"] == 2
    train(ckpt, *rest, cfg.model_copy(update={"optimizer": "adamw"}), tmp_path / "adamw")
    state = json.loads((tmp_path / "lamb" / "trainer_state.json").read_text())
    assert all(group["lr"] == 0.0 for group in state["optimizer_param_groups"])  # decayed to zero at the end
    lamb, adamw, start = _weights(tmp_path / "lamb"), _weights(tmp_path / "adamw"), _weights(ckpt)
    assert any(not torch.equal(lamb[k], start[k]) for k in lamb)
    assert any(not torch.allclose(lamb[k], adamw[k]) for k in lamb)  # the optimizer setting took effect


def test_continuous_schedule_spans_stages_and_carries_the_optimizer(setup, tmp_path):
    """Two 2-step stages on one 4-step schedule (1 warm-up step): the learning rates are those of one 4-step run, and
    the second stage starts from the first one's optimizer moments."""
    from ance_core.training.plan import continuous_schedules

    ckpt, *rest = setup
    first, second = continuous_schedules([2, 2], warmup_ratio=0.25)
    assert (first.offset, first.total, first.warmup, first.resume_optimizer) == (0, 4, 1, False)
    assert (second.offset, second.total, second.resume_optimizer) == (2, 4, True)
    cfg = TrainConfig(max_steps=2, batch_size=3, learning_rate=1e-3, precision="fp32", checkpoint_every=0)
    train(ckpt, *rest, cfg, tmp_path / "one", schedule=first)
    train(tmp_path / "one", *rest, cfg, tmp_path / "two", schedule=second)
    fresh_optimizer = dataclasses.replace(second, resume_optimizer=False)
    train(tmp_path / "one", *rest, cfg, tmp_path / "fresh", schedule=fresh_optimizer)
    whole = train(ckpt, *rest, cfg.model_copy(update={"max_steps": 4, "warmup_ratio": 0.25}), tmp_path / "whole")
    lrs = lambda f: [json.loads(x)["lr"] for x in (tmp_path / f / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    assert whole["steps"] == 4 and lrs("one") + lrs("two") == pytest.approx(lrs("whole"))
    assert lrs("two")[-1] > 0 and json.loads((tmp_path / "two" / "trainer_state.json").read_text())[
        "optimizer_param_groups"][0]["lr"] == 0.0  # reaches zero only at the end of the last stage
    two, fresh = _weights(tmp_path / "two"), _weights(tmp_path / "fresh")
    assert any(not torch.allclose(two[k], fresh[k]) for k in two)  # the carried moments changed the updates


def test_out_of_gpu_memory_names_the_batch_and_is_not_retried(setup, tmp_path, monkeypatch):
    """A CUDA out-of-memory error while training becomes one line naming the batch and what to change, an AnceError:
    the stage tasks do not retry it (it would run out of memory the same way)."""
    from prefect.states import Failed

    import ance_core.training.step as step
    from ance_core.errors import OutOfMemory
    from tasks.common import retry_unless_user_error

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)\nmore")

    monkeypatch.setattr(step, "accumulate_gradients", oom)
    with pytest.raises(OutOfMemory) as caught:
        train(*setup, CFG, tmp_path / "out")
    message = str(caught.value)
    assert "training a batch of 3 queries (3 per rank) with 3 passages each" in message
    assert "lower batch_size and raise grad_accumulation" in message and "Tried to allocate 2.00 GiB" in message
    assert "\n" not in message
    assert retry_unless_user_error(None, None, Failed(data=caught.value)) is False
    assert retry_unless_user_error(None, None, Failed(data=RuntimeError("connection reset"))) is True
    import errno

    full = OSError(errno.ENOSPC, "No space left on device")  # (retried twice, seconds apart, to fail the same way)
    assert retry_unless_user_error(None, None, Failed(data=full)) is False
    assert retry_unless_user_error(None, None, Failed(data=ConnectionResetError(errno.ECONNRESET, "reset"))) is True


def test_fp16_training_is_refused_off_cuda_and_bf16_is_named():
    from ance_core.errors import AnceError
    from ance_core.training.plan import check_precision

    with pytest.raises(AnceError, match="warmup.precision: fp16 training needs a CUDA GPU.*bf16"):
        check_precision("fp16", torch.device("cpu"), "warmup.precision")
    check_precision("fp16", torch.device("cuda"))  # the scaler exists there
    for ok in ("bf16", "auto", "fp32"):
        check_precision(ok, torch.device("cpu"))


def _log(folder):
    return [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]


def _losses(folder):
    return [record["loss"] for record in _log(folder)]


def _same_training(a, b):
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and _losses(a) == _losses(b)


def test_a_corpus_mostly_never_referenced_is_read_only_where_the_negatives_point(setup, tmp_path, monkeypatch):
    """The 30 documents the pairs name among 3,000 others (one of them 4 MB) in a corpus.parquet of row groups of 100:
    training reads the id column and the row groups holding the 30 only, and trains the weights and log of the same
    corpus held whole in memory."""
    import pandas as pd
    import pyarrow.parquet as pq

    from ance_core.data.corpus import ParquetCorpus

    ckpt, negatives, small, queries, relevant = setup
    others = pd.DataFrame({"doc_id": [f"x{i}" for i in range(3000)], "title": "unread",
                           "text": [f"risk effect {i}" for i in range(3000)]})
    others.loc[2999, "text"] = "cell " * 800_000  # its own row group (2,900-2,999 come after the 30)
    corpus = pd.concat([others.iloc[:1000], small, others.iloc[1000:]], ignore_index=True)
    folder = tmp_path / "data"
    folder.mkdir()
    corpus.to_parquet(folder / "corpus.parquet", index=False, row_group_size=100)
    decoded, whole_reads = [], []
    iter_batches, read_table = pq.ParquetFile.iter_batches, pq.read_table
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, *a, row_groups=None, **k: decoded.extend(
        row_groups) or iter_batches(self, *a, row_groups=row_groups, **k))
    monkeypatch.setattr(pq, "read_table", lambda *a, columns=None, **k: whole_reads.append(columns) or read_table(
        *a, columns=columns, **k))
    cfg = CFG.model_copy(update={"checkpoint_every": 0})
    train(ckpt, negatives, ParquetCorpus.of_folder(folder), queries, relevant, cfg, tmp_path / "mapped")
    assert decoded == [10]  # rows 1,000-1,029: group 10 (with 1,000-1,069 of the others), never the 4 MB one
    assert whole_reads and all(columns == ["doc_id"] for columns in whole_reads)  # whole reads: the id column
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "in-memory")
    train(ckpt, negatives, small, queries, relevant, cfg, tmp_path / "small")
    _same_training(tmp_path / "mapped", tmp_path / "in-memory")
    _same_training(tmp_path / "mapped", tmp_path / "small")


def _swap(at: int, table):
    return lambda step: table if step == at else None


def test_loader_workers_train_the_weights_of_none_across_a_swap_to_new_documents(setup, tmp_path):
    """Dropout on, negatives swapped at step 2 for ones naming documents the first table did not: a loader with a
    worker (its steps prepared ahead, its seed from its own generator) trains what the training thread alone does;
    a swap at step 0 trains what starting from the new table does, and the swap changed the training."""
    import pandas as pd

    ckpt, negatives, corpus, queries, relevant = setup
    extra = pd.DataFrame({"doc_id": [f"n{i}" for i in range(5)], "title": "",
                          "text": [f"mice blood disease {i}" for i in range(5)]})
    corpus = pd.concat([corpus, extra], ignore_index=True)
    newer = negatives.assign(negative_ids=[[f"n{i % 5}", f"d{(i + 15) % 30}"] for i in range(len(negatives))])
    cfg = CFG.model_copy(update={"checkpoint_every": 0, "max_steps": 5, "attention_dropout": 0.1})
    for workers in (0, 1):
        train(ckpt, negatives, corpus, queries, relevant, cfg.model_copy(update={"loader_workers": workers}),
              tmp_path / f"swap-{workers}", negatives_update=_swap(2, newer))
    _same_training(tmp_path / "swap-0", tmp_path / "swap-1")
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "kept")
    assert _losses(tmp_path / "kept")[:2] == _losses(tmp_path / "swap-0")[:2]
    assert _losses(tmp_path / "kept")[2:] != _losses(tmp_path / "swap-0")[2:]
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "swap-at-0", negatives_update=_swap(0, newer))
    train(ckpt, newer, corpus, queries, relevant, cfg, tmp_path / "newer")
    _same_training(tmp_path / "swap-at-0", tmp_path / "newer")


def test_each_epoch_trains_on_its_own_draw_of_negatives_and_resumes_on_it(setup, tmp_path):
    """A mined table of two draws (negatives/mining.py REDRAWN), two epochs of 4 steps: epoch 1 trains on draw 1, as
    a swap to draw 1's table at step 4 would; a run stopped in epoch 1 resumes on draw 1 to the same weights."""
    import numpy as np
    import pandas as pd

    ckpt, negatives, corpus, queries, relevant = setup
    extra = pd.DataFrame({"doc_id": [f"n{i}" for i in range(5)], "title": "",
                          "text": [f"mice blood disease {i}" for i in range(5)]})
    corpus = pd.concat([corpus, extra], ignore_index=True)
    second = [[f"n{i % 5}", f"d{(i + 15) % 30}"] for i in range(len(negatives))]
    drawn = negatives.assign(redrawn_ids=[np.array(ids, dtype=object) for ids in second])
    cfg = CFG.model_copy(update={"max_steps": None, "epochs": 2})
    assert steps_per_epoch(len(negatives), cfg) == 4
    train(ckpt, drawn, corpus, queries, relevant, cfg, tmp_path / "drawn")
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "swapped",
          negatives_update=_swap(4, negatives.assign(negative_ids=second)))
    _same_training(tmp_path / "drawn", tmp_path / "swapped")
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "one-draw")
    assert _losses(tmp_path / "one-draw")[:4] == _losses(tmp_path / "drawn")[:4]
    assert _losses(tmp_path / "one-draw")[4:] != _losses(tmp_path / "drawn")[4:]

    def stop_after_7(record):
        if record["step"] == 7:
            raise SimulatedCrash("simulated crash")

    with pytest.raises(SimulatedCrash):
        train(ckpt, drawn, corpus, queries, relevant, cfg, tmp_path / "resumed", callbacks=[stop_after_7])
    assert train(ckpt, drawn, corpus, queries, relevant, cfg, tmp_path / "resumed")["resumed_from_step"] == 6
    _same_training(tmp_path / "drawn", tmp_path / "resumed")


def test_rounds_are_seeded_apart_from_the_warm_up(setup, tmp_path):
    """The same config's seed gives the warm-up (round 0) its seed as it is and each round another: round 1's first
    step sees other batches than the warm-up's (it replayed them before)."""
    from ance_core.training.plan import stage_seed

    assert stage_seed(42, 0) == 42 and len({stage_seed(42, r) for r in range(4)}) == 4
    assert stage_seed(42, 1) == stage_seed(42, 1) != stage_seed(43, 1)
    ckpt, *rest = setup
    cfg = CFG.model_copy(update={"checkpoint_every": 0, "max_steps": 1})
    train(ckpt, *rest, cfg, tmp_path / "warmup")
    train(ckpt, *rest, cfg, tmp_path / "round-1", round_=1)
    assert _losses(tmp_path / "warmup") != _losses(tmp_path / "round-1")


def test_cached_in_batch_negatives_take_the_step_of_the_whole_batch(setup, no_dropout, tmp_path):
    """grad_cache_chunk: a batch of 5 with in-batch negatives encoded 2 queries at a time (with accumulation too)
    takes the step of the batch encoded at once, and logs its loss."""
    _, *rest = setup
    base = dict(max_steps=2, batch_size=5, precision="fp32", checkpoint_every=0, learning_rate=1e-3)
    for name, extra in (("plain", {}), ("cached", {"grad_cache_chunk": 2})):
        train(no_dropout, *rest, TrainConfig(**base | extra), tmp_path / name)
        train(no_dropout, *rest, TrainConfig(**base | extra | {"batch_size": 2, "grad_accumulation": 2}),
              tmp_path / f"{name}-accumulated")
    for plain, cached in (("plain", "cached"), ("plain-accumulated", "cached-accumulated")):
        a, b = _weights(tmp_path / plain), _weights(tmp_path / cached)
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
        assert _losses(tmp_path / plain) == pytest.approx(_losses(tmp_path / cached), rel=1e-5)
    assert TrainConfig(grad_cache_chunk=4) != TrainConfig() and "grad_cache" not in repr(TrainConfig())


def test_the_cached_pass_replays_each_chunks_dropout():
    """cached_gradients on an encoder with dropout: each chunk's second pass (with its graph) gives the embeddings of
    its first (the gradient cached for them is theirs), and a plain step of the same function takes its gradient."""
    from ance_core.training.gradients import cached_gradients
    from ance_core.training.loss import nll_loss

    torch.manual_seed(0)
    embedding, dropout = torch.nn.Embedding(20, 8), torch.nn.Dropout(0.5)
    seen = []

    def embed(queries, passages):
        pool = lambda x: (dropout(embedding(x["input_ids"])) * x["attention_mask"][..., None]).sum(1)  # noqa: E731
        out = pool(queries), pool(passages)
        seen.append([o.detach().clone() for o in out])
        return out

    ids = torch.randint(1, 20, (6, 5))
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0
    batch = {"queries": {"input_ids": ids, "attention_mask": mask},
             "passages": {"input_ids": ids.repeat_interleave(2, 0), "attention_mask": mask.repeat_interleave(2, 0)}}
    loss_of = lambda b, q, p: nll_loss(q, p, 2, True)  # noqa: E731
    cached_gradients(embedding, [batch], embed, loss_of, 4, 2, False, 1)
    first, second = seen[:2], seen[2:]
    for a, b in zip(first, second, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    dropout.p = 0.0
    grad, embedding.weight.grad = embedding.weight.grad.clone(), None
    cached_gradients(embedding, [batch], embed, loss_of, 4, 2, False, 1)
    cached = embedding.weight.grad.clone()
    embedding.weight.grad = None
    loss_of(batch, *embed(batch["queries"], batch["passages"])).backward()
    torch.testing.assert_close(cached, embedding.weight.grad, atol=1e-6, rtol=1e-5)
    assert not torch.equal(grad, cached)  # dropout changed the first step


def test_a_teachers_scores_add_the_distillation_term(setup, tmp_path):
    """Negatives carrying a teacher's scores (mining.teacher) train with NLL + distill_weight x KL: weight 0 trains
    what the same table without scores does, weight 1 another model and a higher first loss (KL >= 0)."""
    import numpy as np

    ckpt, negatives, corpus, queries, relevant = setup
    taught = negatives.assign(teacher_positive=np.full(len(negatives), 3.0, np.float32),
                              teacher_negatives=[np.array([0.0, -1.0], np.float32)] * len(negatives))
    cfg = CFG.model_copy(update={"checkpoint_every": 0, "max_steps": 3})
    train(ckpt, negatives, corpus, queries, relevant, cfg, tmp_path / "plain")
    train(ckpt, taught, corpus, queries, relevant, cfg.model_copy(update={"distill_weight": 0.0}), tmp_path / "w0")
    train(ckpt, taught, corpus, queries, relevant, cfg, tmp_path / "w1")
    _same_training(tmp_path / "plain", tmp_path / "w0")
    assert _losses(tmp_path / "w1")[0] > _losses(tmp_path / "plain")[0]
    assert _weights(tmp_path / "w1")["norm.weight"].ne(_weights(tmp_path / "plain")["norm.weight"]).any()


def test_weight_averaging_ends_with_the_average_and_resumes_to_the_same_one(setup, tmp_path):
    ckpt, *rest = setup
    plain = tmp_path / "plain"
    train(ckpt, *rest, CFG, plain)
    ema = CFG.model_copy(update={"ema_decay": 0.5})
    averaged = tmp_path / "ema"
    train(ckpt, *rest, ema, averaged)
    a, p = _weights(averaged), _weights(plain)
    assert any(not torch.equal(a[k], p[k]) for k in a)  # the average of the steps' weights, not the last step's
    near = tmp_path / "near"  # a decay near 0 keeps the last step's weights
    train(ckpt, *rest, CFG.model_copy(update={"ema_decay": 1e-9}), near)
    n = _weights(near)
    assert all(torch.allclose(n[k], p[k], atol=1e-6) for k in n)

    def stop_after_3(record):
        if record["step"] == 3:
            raise SimulatedCrash("simulated crash")

    resumed = tmp_path / "resumed"
    with pytest.raises(SimulatedCrash):
        train(ckpt, *rest, ema, resumed, callbacks=[stop_after_3])
    train(ckpt, *rest, ema, resumed)  # from the step-2 checkpoint: the average is in the optimizer's saved state
    r = _weights(resumed)
    assert all(torch.equal(a[k], r[k]) for k in a)


def _nan_losses(monkeypatch, nan_at) -> list[int]:
    """The training loss made NaN at the calls `nan_at(call)` picks (1, 2, ...); returns the count of calls, [n]."""
    import ance_core.training.step as step

    calls, nll = [0], step.nll_loss

    def diverging(*args, **kwargs):
        calls[0] += 1
        loss = nll(*args, **kwargs)
        return loss * float("nan") if nan_at(calls[0]) else loss

    monkeypatch.setattr(step, "nll_loss", diverging)
    return calls


def test_a_non_finite_loss_stops_the_stage_at_its_step_with_nothing_kept(setup, tmp_path, monkeypatch):
    """A learning rate that makes the loss NaN stops training at the first such step, one line naming the stage, the
    step and the learning rate, before a checkpoint of it is written (issue 41: it trained every step on NaN)."""
    from ance_core.errors import AnceError
    from ance_core.training.state import latest_checkpoint

    calls = _nan_losses(monkeypatch, lambda call: call >= 2)
    cfg = CFG.model_copy(update={"checkpoint_every": 1, "learning_rate": 3.0})
    message = (r"^ANCE round 2: the loss is nan at step 2 \(learning_rate 3, precision fp32\); training stopped and "
               "nothing was published: lower the learning rate")
    with pytest.raises(AnceError, match=message):
        train(*setup, cfg, tmp_path / "out", round_=2)
    assert calls[0] == 2 and latest_checkpoint(tmp_path / "out").name.endswith("1")  # step 1's, not step 2's
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_non_finite_gradient_under_a_finite_loss_stops_the_stage_at_its_step(setup, tmp_path, monkeypatch):
    """Without fp16's loss scaler (which skips such a step), an infinite gradient norm under a finite loss went
    through clipping as NaN gradients into the weights, and the stop came a step later, after a checkpoint of NaN
    weights could be written: it stops at the step itself."""
    import ance_core.training.step as step
    from ance_core.errors import AnceError
    from ance_core.training.state import latest_checkpoint

    calls, nll = [0], step.nll_loss

    def exploding(*args, **kwargs):
        calls[0] += 1
        loss = nll(*args, **kwargs)
        if calls[0] >= 2:  # the loss as it is, its gradient infinite
            loss.register_hook(lambda grad: grad * float("inf"))
        return loss

    monkeypatch.setattr(step, "nll_loss", exploding)
    cfg = CFG.model_copy(update={"checkpoint_every": 1})
    with pytest.raises(AnceError, match=r"^the warm-up: the gradient norm is (inf|nan) at step 2 \(loss [\d.]+, "
                       r"learning_rate 0.001, precision fp32\); training stopped and nothing was published"):
        train(*setup, cfg, tmp_path / "out")
    assert calls[0] == 2 and latest_checkpoint(tmp_path / "out").name.endswith("1")  # step 1's, not step 2's
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_fewer_pairs_than_training_processes_are_refused(setup):
    """One pair for two processes: each step's second process had no row, and the stage logged steps of loss 0."""
    from ance_core.errors import AnceError

    ckpt, negatives, *rest = setup
    with pytest.raises(AnceError, match=r"^1 training pair\(s\) for world_size 2: every training process needs a "
                       "pair of each step; set world_size to at most 1"):
        train(ckpt, negatives.head(1), *rest, CFG.model_copy(update={"world_size": 2}), "unused")


def test_a_non_finite_loss_in_the_asynchronous_trainer_names_the_round_of_its_step(setup, tmp_path, monkeypatch):
    """One trainer over all rounds (refresh: async, rounds ending at the snapshot steps): a NaN after the first
    snapshot names round 2, not the round the trainer started in, and publishes nothing."""
    from ance_core.errors import AnceError

    _nan_losses(monkeypatch, lambda call: call >= 3)
    snapshots = []
    cfg = CFG.model_copy(update={"max_steps": 4})
    with pytest.raises(AnceError, match=r"^ANCE round 2 \(the asynchronous trainer\): the loss is nan at step 3 "):
        train(*setup, cfg, tmp_path / "out", snapshot_steps={2}, round_=1,
              on_snapshot=lambda at, save: snapshots.append(at))
    assert snapshots == [2] and not (tmp_path / "out" / "model.safetensors").exists()


def test_a_step_read_after_the_next_is_queued_logs_in_order_and_a_late_nan_publishes_nothing(setup, tmp_path,
                                                                                               monkeypatch):
    """Steps with nothing due at them are read once the next step is queued: every step still logged and called back
    once, in order; a NaN at such a step (step 2, read after step 3 is taken) stops the stage before step 3's
    checkpoint is written, naming step 2."""
    from ance_core.errors import AnceError
    from ance_core.training.state import latest_checkpoint

    seen: list[int] = []
    cfg = CFG.model_copy(update={"max_steps": 6, "checkpoint_every": 3})
    train(*setup, cfg, tmp_path / "straight", callbacks=[lambda record: seen.append(record["step"])])
    assert seen == [1, 2, 3, 4, 5, 6] and [r["step"] for r in _log(tmp_path / "straight")] == seen

    calls = _nan_losses(monkeypatch, lambda call: call == 2)
    with pytest.raises(AnceError, match=r"the loss is nan at step 2 "):
        train(*setup, cfg, tmp_path / "late")
    assert calls[0] == 3  # step 3 was taken before step 2 was read
    assert latest_checkpoint(tmp_path / "late") is None and not (tmp_path / "late" / "model.safetensors").exists()
    assert [r["step"] for r in _log(tmp_path / "late")] == [1]


def test_padded_shapes_train_as_the_batch_longest_and_a_compiled_step_trains_as_eager(setup, no_dropout, tmp_path):
    """`pad_multiple` only adds masked columns: the same losses and weights as padding to each batch's longest. With
    `compile` (torch.compile; CUDA graphs on a GPU) the steps are those of the eager step, to rounding. One shape
    throughout (queries and passages cut at 16 tokens), so inductor compiles once."""
    _, *rest = setup
    base = dict(max_steps=2, batch_size=4, precision="fp32", checkpoint_every=0, learning_rate=1e-3,
                query_max_length=16, passage_max_length=16)
    from torch._dynamo.utils import counters

    runs = {"longest": {}, "padded": {"pad_multiple": 32}, "compiled": {"compile": True}}
    graphs = {}
    for name, extra in runs.items():
        before = counters["stats"]["unique_graphs"]
        train(no_dropout, *rest, TrainConfig(**base | extra), tmp_path / name)
        graphs[name] = counters["stats"]["unique_graphs"] - before
    assert graphs["longest"] == graphs["padded"] == 0 and graphs["compiled"] >= 1  # compiled there only
    losses = {name: _losses(tmp_path / name) for name in runs}
    assert losses["padded"] == pytest.approx(losses["longest"], rel=1e-5)
    assert losses["compiled"] == pytest.approx(losses["longest"], rel=1e-4)
    longest, compiled = _weights(tmp_path / "longest"), _weights(tmp_path / "compiled")
    for k in longest:
        torch.testing.assert_close(compiled[k], longest[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_compile_is_refused_with_several_processes_or_gradcache():
    with pytest.raises(ValueError, match="compile runs one training process"):
        TrainConfig(compile=True, world_size=2, batch_size=4)
    with pytest.raises(ValueError, match="grad_cache_chunk"):
        TrainConfig(compile=True, grad_cache_chunk=2)
    assert TrainConfig(compile=True).padding_multiple == 32 and TrainConfig().padding_multiple is None
