"""The token ids of many texts, a chunk at a time, from a fast tokenizer's Rust core when the tokenizer has one.

`tokenizer(texts, truncation=True, max_length=n)["input_ids"]` sets the truncation on the tokenizer's Rust backend,
calls its `encode_batch` and converts every Encoding into Python lists of every field (ids, token types, attention
mask), then keeps only the ids. `token_ids` calls `encode_batch` on a private copy of the backend set the same way
and reads the ids alone: the same ids (tests/core/modeling/test_tokenizing.py), 1.7-1.9x faster on 100k passages on a
16-core GPU machine, where tokenizing was 20-32% of encoding the corpus (BENCHMARKS.md). The copy (one per tokenizer
and length, kept while the tokenizer lives) leaves the shared tokenizer's settings alone, so threads that tokenize
with other lengths at the same time (the async inferencer's) cannot change each other's truncation. A tokenizer
without a Rust backend is called as before.
"""

import threading
import weakref
from collections.abc import Iterator, Sequence
from itertools import chain

CHUNK = 8192  # texts per call: a fast tokenizer holds a full Encoding (~5 KB: offsets, words) per text of a call
# a text whose start is kept (truncation on the right) is cut to this many characters per token kept before it is
# tokenized: a tokenizer reads the whole text before it truncates (a 30 MB document took ~23 s of each corpus
# encoding). A cut text that gives fewer tokens than kept (WordPiece reads a word of any length over 100 characters as
# one [UNK]: a DNA sequence), or whose last token kept is not of a word wholly before the cut (`kept_whole`), is
# tokenized whole, so the ids are the tokenizer's own
CHARS_PER_TOKEN = 1000


def cut_at(tokenizer, tokens: int) -> int | None:
    """The characters a text is cut to before its first `tokens` tokens are read (CHARS_PER_TOKEN each); None for a
    tokenizer that keeps a text's end (truncation on the left): never cut."""
    return tokens * CHARS_PER_TOKEN if getattr(tokenizer, "truncation_side", "right") == "right" else None


def kept_whole(cut: str, end: int) -> bool:
    """Whether the tokens of a cut text up to character `end` (its last token kept) are those of the whole text: they
    end at or before the cut's last whitespace, so no word the cut split is among them (a word over 100 characters
    is one [UNK] whole and word pieces cut)."""
    return end <= max(cut.rfind(c) for c in " \n\t\r")


_copies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> {settings: its set copy}
_copying = threading.Lock()


def _backend(tokenizer, max_length: int):
    """A copy of the tokenizer's Rust backend that truncates like `tokenizer(..., truncation=True, max_length=...)`
    and pads nothing, made once per tokenizer and settings (~20 ms for a 30k vocabulary: a query encoded alone pays
    it once) and never changed after; None for a tokenizer without one."""
    from tokenizers import Tokenizer

    shared = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if shared is None:
        return None
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    settings = (max_length, tokenizer.truncation_side, split)
    with _copying:
        made = _copies.setdefault(tokenizer, {})
        if settings not in made:
            backend = Tokenizer.from_str(shared.to_str())
            backend.no_padding()
            backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=settings[1])
            backend.encode_special_tokens = split
            made[settings] = backend
        return made[settings]


def token_id_chunks(tokenizer, texts: Sequence[str], max_length: int, chunk: int = CHUNK) -> Iterator[list[list[int]]]:
    """The ids `tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]` gives (special tokens
    included), `chunk` texts per call and per list yielded, in order."""
    backend = _backend(tokenizer, max_length)
    most = cut_at(tokenizer, max_length)

    def ids(part: list[str]) -> tuple[list[list[int]], list | None]:
        """Each text's ids, and its Encoding (None without a Rust backend)."""
        if backend is not None:
            encodings = backend.encode_batch(part, add_special_tokens=True)
            return [e.ids for e in encodings], encodings
        return tokenizer(part, truncation=True, max_length=max_length, return_attention_mask=False,
                         return_token_type_ids=False)["input_ids"], None

    def split_a_word(encoding, cut: str) -> bool:  # (its last token that is not a special one: not kept_whole)
        ends = [end for (_, end), special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
                if not special]
        return bool(ends) and not kept_whole(cut, ends[-1])

    for start in range(0, len(texts), chunk):
        whole = list(texts[start:start + chunk])
        cut = [j for j, text in enumerate(whole) if most is not None and len(text) > most]
        parts = [text[:most] for text in whole] if cut else whole
        got, encodings = ids(parts)
        # (the cut ended before the tokens kept did, or inside a word among them)
        if again := [j for j in cut if len(got[j]) < max_length
                     or (encodings is not None and split_a_word(encodings[j], parts[j]))]:
            for j, ids_again in zip(again, ids([whole[j] for j in again])[0], strict=True):
                got[j] = ids_again
        yield got


def passage_windows(tokenizer, text: str, max_length: int, max_passages: int) -> list[str]:
    """A text's consecutive windows of `max_length` tokens with the model's special tokens (at most `max_passages`),
    cut on token boundaries and returned as the text they cover (MaxP's passages). The first window is what FirstP
    encodes. A long text is cut first, as `token_id_chunks` cuts."""
    size = max(1, max_length - tokenizer.num_special_tokens_to_add(pair=False))
    kept = size * max_passages

    def offsets_of(part: str) -> list[tuple[int, int]]:
        return tokenizer(part, add_special_tokens=False, truncation=True, max_length=kept,
                         return_offsets_mapping=True)["offset_mapping"]

    most = cut_at(tokenizer, kept)
    part = text[:most] if most is not None and len(text) > most else text
    offsets = offsets_of(part)
    if part is not text and (len(offsets) < kept or not kept_whole(part, offsets[-1][1])):
        offsets = offsets_of(text)  # (the cut ended before the tokens kept did, or inside a word among them)
    if not offsets:
        return [text]
    return [text[offsets[start][0]:offsets[min(start + size, len(offsets)) - 1][1]]
            for start in range(0, len(offsets), size)]


def token_ids(tokenizer, texts: Sequence[str], max_length: int, chunk: int = CHUNK) -> Iterator[list[int]]:
    """Each text's ids, in order (`token_id_chunks`, one text at a time)."""
    return chain.from_iterable(token_id_chunks(tokenizer, texts, max_length, chunk))


def padded_width(longest: int, multiple: int | None) -> int:
    """`longest` rounded up to a multiple of `multiple` (unchanged without one)."""
    return longest if not multiple else -(-longest // multiple) * multiple


def pad_ids(tokenizer, ids: Sequence[Sequence[int]], pad_multiple: int | None = None) -> dict:
    """`tokenizer.pad({"input_ids": ids}, return_tensors="pt", pad_to_multiple_of=pad_multiple)` built with numpy:
    int64 `input_ids` and `attention_mask` of the longest row's length (rounded up to `pad_multiple`), padded with
    the tokenizer's pad id on its padding side. The same tensors (tests/core/modeling/test_tokenizing.py), ~8x
    faster (the wrapper checks and converts row by row): the encoding's producer pads every batch of the corpus."""
    import numpy as np
    import torch

    if tokenizer.pad_token_id is None:  # the wrapper's own error (or its own padding rule)
        return tokenizer.pad({"input_ids": [list(row) for row in ids]}, return_tensors="pt",
                             pad_to_multiple_of=pad_multiple)
    width = padded_width(max((len(row) for row in ids), default=0), pad_multiple)
    input_ids = np.full((len(ids), width), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    left = tokenizer.padding_side == "left"
    for j, row in enumerate(ids):
        cut = slice(width - len(row), width) if left else slice(0, len(row))
        input_ids[j, cut] = row
        mask[j, cut] = 1
    return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
