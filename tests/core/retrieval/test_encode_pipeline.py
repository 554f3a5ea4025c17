"""The pipelined encoding's producer (encode.batch_tokens): a small first chunk, so that the model starts at once."""

import numpy as np

from ance_core.modeling import tokenizing
from ance_core.retrieval import encode as encode_module
from ance_core.retrieval.encode import encode_texts, padded_chunks

WORDS = "cell protein gene binds mice".split()
TEXTS = [" ".join(WORDS[: 1 + i % 5] * (1 + i % 7)) for i in range(40)]  # 1 to 35 words


def test_the_first_chunk_is_small_and_every_text_comes_once(model_and_tokenizer):
    """The first chunk holds the `first` texts only (the model waits for no more), then CHUNK texts at a time; every
    position comes once, each batch from one chunk."""
    _, tokenizer = model_and_tokenizer
    chunks = list(padded_chunks(tokenizer, TEXTS, 32, 64, pin=False, first=5))
    rows = [np.sort(np.concatenate([r for r, _ in chunk])).tolist() for chunk in chunks]
    assert rows[0] == list(range(5)) and rows[1] == list(range(5, 40))  # (CHUNK 8,192: the rest in one)
    assert sorted(sum(rows, [])) == list(range(40))
    assert len(list(padded_chunks(tokenizer, TEXTS, 32, 64, pin=False))) == 1  # by default the first FIRST_CHUNK


def test_a_small_first_chunk_encodes_as_the_plain_path(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    plain = encode_texts(model, tokenizer, TEXTS, 32, 8, None)
    monkeypatch.setattr(encode_module, "FIRST_CHUNK", 3)
    monkeypatch.setattr(tokenizing.token_id_chunks, "__defaults__", (11,))  # then 11 texts a chunk
    ahead = encode_texts(model, tokenizer, TEXTS, 32, 0, None, batch_tokens=64)
    np.testing.assert_allclose(ahead, plain, rtol=1e-4, atol=1e-5)
