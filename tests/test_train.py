import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from ance_core.config import ModelConfig, TrainConfig
from ance_core.model import init_model
from ance_core.train import TrainingInterrupted, false_negative_mask, train

WORDS = "cell protein gene cancer patients study risk effect mice treatment blood disease".split()


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("init")
    init_model(ModelConfig(name=str(tiny_model)), ckpt)
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(30)], "title": "",
                           "text": [" ".join(WORDS[(i + j) % 12] for j in range(8)) for i in range(30)]})
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(10)], "text": [WORDS[i] for i in range(10)]})
    positives = {f"q{i}": {f"d{i}"} for i in range(10)}
    negatives = pd.DataFrame({"query_id": [f"q{i}" for i in range(10)], "positive_id": [f"d{i}" for i in range(10)],
                              "negative_ids": [[f"d{i + 10}", f"d{i + 20}"] for i in range(10)],
                              "negative_ranks": [[1, 2]] * 10, "negative_scores": [[0.0, 0.0]] * 10})
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


def test_interrupted_training_resumes_to_identical_weights(setup, tmp_path):
    ckpt, *rest = setup
    straight = tmp_path / "straight"
    train(ckpt, *rest, CFG, straight)

    def stop_after_3(record):
        if record["step"] == 3:
            raise TrainingInterrupted("simulated crash")

    resumed = tmp_path / "resumed"
    with pytest.raises(TrainingInterrupted):
        train(ckpt, *rest, CFG, resumed, callbacks=[stop_after_3])
    assert (resumed / "checkpoints" / "step-000002").is_dir()
    summary = train(ckpt, *rest, CFG, resumed)
    assert summary["resumed_from_step"] == 2
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = lambda f: [json.loads(x)["loss"] for x in (f / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(straight) == losses(resumed)


def test_lamb_and_accumulation_train(setup, tmp_path):
    ckpt, *rest = setup
    cfg = TrainConfig(max_steps=2, batch_size=2, grad_accumulation=2, optimizer="lamb", in_batch_negatives=False,
                      precision="bf16", checkpoint_every=0)
    assert train(ckpt, *rest, cfg, tmp_path)["steps"] == 2


def test_false_negative_mask_hides_other_rows_positives():
    mask = false_negative_mask(["q1", "q2"], ["a", "x", "b", "a"], 2, {"q1": {"a"}, "q2": {"b", "a"}})
    assert mask.tolist() == [[False, False, False, True], [True, False, False, True]]
