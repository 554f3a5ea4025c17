"""`encode.compile`: corpus encodings through torch.compile give the eager embeddings, compile once per model, and
change no stage's key."""

import numpy as np
import torch
from torch._dynamo.utils import counters

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_texts
from ance_core.stage_config import KEY_DUMP

WORDS = "cell protein gene binds mice".split()
TEXTS = [" ".join(WORDS[: 1 + i % 5] * (1 + i % 7)) for i in range(40)]  # 1 to 35 words: many batch shapes


def test_a_compiled_encoding_gives_the_eager_embeddings_and_compiles_once(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    keys = list(model.state_dict())
    eager = encode_texts(model, tokenizer, TEXTS, 32, 8, None)
    before = counters["stats"]["unique_graphs"]
    compiled = encode_texts(model, tokenizer, TEXTS, 32, 8, None, compiled=True)
    graphs = counters["stats"]["unique_graphs"] - before
    assert graphs >= 1  # it did run through dynamo
    np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)
    # again, by tokens (the pipelined path, other batch shapes): the same compiled forward, no new graph
    again = encode_texts(model, tokenizer, TEXTS, 32, 0, None, batch_tokens=64, compiled=True)
    assert counters["stats"]["unique_graphs"] - before == graphs
    np.testing.assert_allclose(again, eager, rtol=1e-4, atol=1e-5)
    assert list(model.state_dict()) == keys and not [k for k in vars(model) if "compiled" in k]  # nothing kept on it


def test_one_compiled_forward_serves_every_model_and_keeps_none_of_them(model_and_tokenizer, tiny_model, tmp_path):
    """A second model (another checkpoint: an async refresh's snapshot) runs the same graph with its own weights; a
    model encoded through it can be deep-copied (training's checkpoint copy, after a dev check) and is freed with its
    last reference (an inferencer's previous snapshot)."""
    import copy
    import gc
    import weakref

    model, tokenizer = model_and_tokenizer
    encode_texts(model, tokenizer, TEXTS, 32, 8, None, compiled=True)
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), tmp_path / "other")
    other, _, _ = load_checkpoint(tmp_path / "other")
    with torch.no_grad():
        other.norm.weight.mul_(3.0)
    before = counters["stats"]["unique_graphs"]
    np.testing.assert_allclose(encode_texts(other, tokenizer, TEXTS, 32, 8, None, compiled=True),
                               encode_texts(other, tokenizer, TEXTS, 32, 8, None), rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == before  # no graph of its own
    copy.deepcopy(other)
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None


def test_a_compiled_encoding_sees_weights_changed_after_it_compiled(model_and_tokenizer):
    """A stage's dev checks encode with the model being trained: the compiled forward reads its current weights."""
    model, tokenizer = model_and_tokenizer
    first = encode_texts(model, tokenizer, TEXTS[:8], 32, 8, None, compiled=True)
    saved = model.norm.weight.detach().clone()
    try:
        with torch.no_grad():
            model.norm.weight.mul_(2.0)
        changed = encode_texts(model, tokenizer, TEXTS[:8], 32, 8, None, compiled=True)
        np.testing.assert_allclose(changed, encode_texts(model, tokenizer, TEXTS[:8], 32, 8, None), rtol=1e-4,
                                   atol=1e-5)
        assert not np.allclose(changed, first)
    finally:
        with torch.no_grad():
            model.norm.weight.copy_(saved)


def test_compile_is_in_no_stage_key_and_unsaid_while_off():
    plain, compiled = EncodeConfig(), EncodeConfig(compile=True)
    assert compiled.model_dump(mode="json", context=KEY_DUMP) == plain.model_dump(mode="json", context=KEY_DUMP)
    assert "compile" not in plain.model_dump(context=KEY_DUMP) and repr(plain) == repr(compiled)
    assert compiled.model_dump()["compile"] is True  # a saved config keeps it
