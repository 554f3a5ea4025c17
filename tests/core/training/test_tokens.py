import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from ance_core.training.tokens import TokenTable, pad_settings, token_dtype, tokenize

TEXTS = ["cell protein", "", "gene cancer patients study risk effect mice treatment blood disease cell protein gene",
         "mice", "risk effect"]


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_selection_is_what_the_tokenizer_gives_those_texts(tiny_model, side):
    """Texts tokenized once, then any selection padded: the tensors of tokenizer(texts, padding=True, truncation=True,
    max_length) for the selected texts, on either padding side."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.padding_side = side
    table = tokenize(tokenizer, TEXTS, 8, token_dtype(tokenizer))
    assert len(table) == len(TEXTS) and table.values.dtype == np.uint16
    for positions in ([0, 1, 2, 3, 4], [3, 0], [2, 2, 4], [1]):
        expected = tokenizer([TEXTS[p] for p in positions], padding=True, truncation=True, max_length=8,
                             return_tensors="pt")
        padded = table.pad(np.array(positions), *pad_settings(tokenizer))
        for key in ("input_ids", "attention_mask"):
            assert padded[key].dtype == torch.int64
            assert torch.equal(padded[key], expected[key]), (positions, key)


def test_take_and_concat_keep_each_texts_ids(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    dtype = token_dtype(tokenizer)
    first, second = tokenize(tokenizer, TEXTS[:2], 8, dtype), tokenize(tokenizer, TEXTS[2:], 8, dtype)
    both = TokenTable.concat([first, second], dtype)
    whole = tokenize(tokenizer, TEXTS, 8, dtype)
    assert np.array_equal(both.values, whole.values) and np.array_equal(both.offsets, whole.offsets)
    picked = whole.take(np.array([4, 0, 2]))
    again = tokenize(tokenizer, [TEXTS[4], TEXTS[0], TEXTS[2]], 8, dtype)
    assert np.array_equal(picked.values, again.values) and np.array_equal(picked.offsets, again.offsets)
    chunked = whole.take(np.array([4, 0, 2]), chunk=2)  # the flat indices a chunk of texts at a time: the same table
    assert np.array_equal(chunked.values, again.values) and np.array_equal(chunked.offsets, again.offsets)
    assert len(whole.take(np.array([], np.int64))) == 0


def test_tokenizing_in_chunks_gives_the_ids_of_one_call(tiny_model, monkeypatch):
    """`tokenize` calls the tokenizer a chunk at a time (a round's 500k queries in one call held GBs of encodings):
    chunk boundaries (including an empty last text) change nothing."""
    import ance_core.training.tokens as tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    dtype = token_dtype(tokenizer)
    whole = tokenize(tokenizer, TEXTS, 8, dtype)
    monkeypatch.setattr(tokens, "TOKENIZE_CHUNK", 2)
    chunked = tokenize(tokenizer, TEXTS, 8, dtype)
    assert np.array_equal(chunked.values, whole.values) and np.array_equal(chunked.offsets, whole.offsets)
    expected = tokenizer(TEXTS, truncation=True, max_length=8)["input_ids"]
    spans = zip(chunked.offsets[:-1], chunked.offsets[1:], strict=True)
    assert [chunked.values[a:b].tolist() for a, b in spans] == expected
    assert len(tokenize(tokenizer, [], 8, dtype)) == 0


@pytest.mark.parametrize("left", [False, True])
def test_padding_to_a_multiple_rounds_the_width_up_to_the_longest_text_at_most(left):
    """`pad_multiple`: the width is the batch's longest rounded up to the multiple, capped at the table's longest text;
    the extra columns are padding (mask 0) on the tokenizer's side."""
    table = TokenTable.from_lists([[5] * 3, [6] * 7, [7] * 20], np.uint16)
    plain = table.pad(np.array([0, 1]), 0, left)
    rounded = table.pad(np.array([0, 1]), 0, left, multiple=8)
    assert plain["input_ids"].shape == (2, 7) and rounded["input_ids"].shape == (2, 8)
    assert rounded["attention_mask"].sum() == plain["attention_mask"].sum() == 10
    kept = rounded["attention_mask"].bool()
    assert torch.equal(rounded["input_ids"][kept], plain["input_ids"][plain["attention_mask"].bool()])
    assert (rounded["input_ids"][:, 0 if left else -1] == 0).all()  # the added column is padding
    assert table.pad(np.array([2]), 0, left, multiple=16)["input_ids"].shape == (1, 20)  # not past the longest (20)
    assert table.pad(np.array([0]), 0, left, multiple=16)["input_ids"].shape == (1, 16)
