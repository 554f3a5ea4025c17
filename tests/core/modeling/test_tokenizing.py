"""`token_ids` (modeling/tokenizing.py) gives the ids `tokenizer(texts, truncation=True, max_length=n)` gives, through
a private copy of the fast tokenizer's Rust backend, and leaves the shared tokenizer's settings alone; `pad_ids` pads
them as `tokenizer.pad` does."""

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ance_core.modeling.model import resolve_model_name
from ance_core.modeling.tokenizing import pad_ids, token_ids

TEXTS = ["cell protein", "", "  ", "gene cancer patients study risk effect mice treatment blood disease cell protein "
         "gene " * 40, "Ünïcode — naïve café 北京 🙂", "a [SEP] inside and a [MASK] too", "mice\r\nrisk\teffect",
         "x" * 3000]


@pytest.fixture(params=["tiny", "minilm"])
def tokenizer(request):
    if request.param == "minilm":
        if not Path(resolve_model_name("minilm")).is_dir():
            pytest.skip("all-MiniLM-L6-v2 is not installed")
        return AutoTokenizer.from_pretrained(resolve_model_name("minilm"))
    return AutoTokenizer.from_pretrained(request.getfixturevalue("tiny_model"))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("max_length", [8, 64, 512])
def test_the_ids_are_the_tokenizers_own(tokenizer, side, max_length):
    tokenizer.truncation_side = side
    expected = tokenizer(TEXTS, truncation=True, max_length=max_length)["input_ids"]
    assert tokenizer.is_fast and list(token_ids(tokenizer, TEXTS, max_length)) == expected
    assert list(token_ids(tokenizer, TEXTS, max_length, chunk=3)) == expected  # chunk boundaries change nothing
    assert list(token_ids(tokenizer, [], max_length)) == []


def test_the_shared_tokenizer_keeps_its_settings(tokenizer):
    """The copy is set, not the tokenizer another thread may be using with another length."""
    tokenizer(["cell"], truncation=True, max_length=16, padding="max_length")
    before = tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding
    list(token_ids(tokenizer, TEXTS, 8))
    assert (tokenizer.backend_tokenizer.truncation, tokenizer.backend_tokenizer.padding) == before
    assert before[0]["max_length"] == 16 and before[1] is not None


def test_a_tokenizer_without_a_rust_backend_is_called_as_before():
    class Plain:
        is_fast = False

        def __call__(self, texts, truncation, max_length, **_):
            assert truncation
            return {"input_ids": [[len(t), max_length] for t in texts]}

    assert list(token_ids(Plain(), ["ab", "c", "def"], 9, chunk=2)) == [[2, 9], [1, 9], [3, 9]]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_ids_are_the_tokenizers_own(tokenizer, side):
    import torch

    tokenizer.padding_side = side
    for rows in (list(token_ids(tokenizer, TEXTS, 64)), [[101, 102]], [[7, 8, 9]] * 3):
        for multiple in (None, 8):
            expected = tokenizer.pad({"input_ids": rows}, return_tensors="pt", pad_to_multiple_of=multiple)
            got = pad_ids(tokenizer, rows, multiple)
            assert got.keys() == {"input_ids", "attention_mask"} <= expected.keys()
            for key, value in got.items():
                assert value.dtype == torch.int64 and torch.equal(value, expected[key]), (key, multiple)


def test_a_huge_text_is_cut_before_it_is_tokenized_to_the_same_ids(tokenizer, monkeypatch):
    """A probe: one 30 MB document made every corpus encoding ~23 s longer (a tokenizer reads the whole text before it
    truncates). Cut to CHARS_PER_TOKEN characters a token first, its ids are the same; a text cut at its start
    (truncation_side left) is read whole."""
    import ance_core.modeling.tokenizing as tokenizing

    seen = []
    backend = tokenizing._backend

    def spied(tok, max_length):
        made = backend(tok, max_length)

        class Spy:
            def encode_batch(self, texts, **kwargs):
                seen.extend(len(t) for t in texts)
                return made.encode_batch(texts, **kwargs)

        return Spy()

    monkeypatch.setattr(tokenizing, "_backend", spied)
    huge = "gene cancer patients study " * 200_000  # 5.4 M characters
    expected = tokenizer([huge], truncation=True, max_length=64)["input_ids"]
    assert list(token_ids(tokenizer, [huge, "cell"], 64)) == [*expected, tokenizer(["cell"])["input_ids"][0]]
    assert seen == [64 * tokenizing.CHARS_PER_TOKEN, 4]
    tokenizer.truncation_side = "left"
    seen.clear()
    list(token_ids(tokenizer, [huge], 64))
    assert seen == [len(huge)]
    tokenizer.truncation_side = "right"  # a cut that gives fewer tokens than kept (a review: a DNA sequence is one
    dna = "ACGT" * 70_000 + " cancer gene expression" * 10  # [UNK] of any length): tokenized whole, the same ids
    assert list(token_ids(tokenizer, [dna], 64)) == tokenizer([dna], truncation=True, max_length=64)["input_ids"]


def straddled(cut: int, words: int) -> str:
    """`words` words of over 100 characters (each one [UNK] to WordPiece), then a word that starts 100 characters
    before character `cut` and ends after it: cut there, its start is word pieces; whole, one [UNK]."""
    size = (cut - 100 - words) // words
    return " ".join("x" * size for _ in range(words)).ljust(cut - 101) + " " + "the" * 100


def test_a_cut_inside_a_word_among_the_tokens_kept_is_read_whole(tokenizer):
    """A review: a cut text can give as many tokens as are kept while its last one is a piece of a word the cut split
    (whole, the word is one [UNK]); such a text is tokenized whole, so the ids stay the tokenizer's own."""
    from ance_core.modeling.tokenizing import CHARS_PER_TOKEN

    text = straddled(44 * CHARS_PER_TOKEN, 41)  # 42 tokens kept besides [CLS] and [SEP]: the 42nd the split word's
    expected = tokenizer([text], truncation=True, max_length=44)["input_ids"]
    cut = tokenizer([text[:44 * CHARS_PER_TOKEN]], truncation=True, max_length=44)["input_ids"]
    assert cut != expected  # (the case: the cut alone would give other ids)
    assert list(token_ids(tokenizer, [text], 44)) == expected
