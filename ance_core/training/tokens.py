"""Token ids held once per training stage: every text a stage trains on is tokenized once (truncated, not padded)
into one flat array with offsets, and each micro-batch is padded from it as the tokenizer pads a batch
(`tokenizer(texts, padding=True, truncation=True, max_length=...)`: to the longest of the batch, on the tokenizer's
padding side), so the tensors are those the texts would give.

Memory: the ids as uint16 (int32 for vocabularies over 65,536 tokens) plus one int64 offset per text, e.g. 1M
MS MARCO passages of ~75 tokens in ~0.16 GB; a text's characters are not kept.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from ance_core.errors import AnceError
from ance_core.modeling.tokenizing import token_id_chunks


@dataclass(frozen=True)
class TokenTable:
    """The token ids of n texts: text i is values[offsets[i] : offsets[i + 1]]."""

    values: np.ndarray  # (total tokens,) uint16 or int32
    offsets: np.ndarray  # (n + 1,) int64, offsets[0] = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def empty(cls, dtype: np.dtype) -> "TokenTable":
        return cls(np.zeros(0, dtype), np.zeros(1, np.int64))

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[int]], dtype: np.dtype) -> "TokenTable":
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return cls(np.fromiter(chain.from_iterable(ids), dtype, count=int(offsets[-1])), offsets)

    @classmethod
    def concat(cls, tables: Sequence["TokenTable"], dtype: np.dtype) -> "TokenTable":
        if not tables:
            return cls.empty(dtype)
        lengths = np.concatenate([np.diff(t.offsets) for t in tables])
        return cls(np.concatenate([t.values for t in tables]).astype(dtype, copy=False),
                   np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    def _spans(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths (k,), the flat indices of the k texts' ids, one after another)."""
        starts, lengths = self.offsets[positions], self.offsets[positions + 1] - self.offsets[positions]
        before = np.cumsum(lengths) - lengths  # where each text starts in the result
        return lengths, np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))

    @functools.cached_property
    def longest(self) -> int:
        """The longest text's tokens."""
        return int(np.diff(self.offsets).max(initial=0))

    def take(self, positions: np.ndarray, chunk: int = 65_536) -> "TokenTable":
        """The texts at `positions`, in that order; `chunk` texts' flat indices at a time (int64 indices of every
        token at once are 4x the uint16 ids: ~1 GB transient for a round's 730k passages at 2M, BENCHMARKS.md)."""
        positions = np.asarray(positions, np.int64)
        lengths = self.offsets[positions + 1] - self.offsets[positions]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = np.empty(int(offsets[-1]), self.values.dtype)
        for start in range(0, len(positions), chunk):
            stop = min(start + chunk, len(positions))
            values[offsets[start]:offsets[stop]] = self.values[self._spans(positions[start:stop])[1]]
        return TokenTable(values, offsets)

    def pad(self, positions: np.ndarray, pad_id: int, left: bool = False,
            multiple: int | None = None) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask (k, longest) int64 of the texts at `positions`, padded with `pad_id` on the
        right (or the left): what the tokenizer returns for those texts with padding=True. With `multiple`, the
        length is rounded up to a multiple of it, but never past the table's longest text (few shapes recur: what a
        compiled step needs)."""
        lengths, flat = self._spans(np.asarray(positions, np.int64))
        width = int(lengths.max())
        if multiple is not None:
            width = max(width, min(-(-width // multiple) * multiple, self.longest))
        columns = np.arange(width)[None, :]
        filled = columns >= (columns.shape[1] - lengths)[:, None] if left else columns < lengths[:, None]  # (k, L)
        ids = np.full(filled.shape, pad_id, np.int64)
        ids[filled] = self.values[flat]  # row-major: each row's ids in order
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(filled.astype(np.int64))}


def token_dtype(tokenizer) -> np.dtype:
    """uint16 while every id fits, else int32."""
    return np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.int32)


TOKENIZE_CHUNK = 10_000  # texts per tokenizer call


def tokenize(tokenizer, texts: Sequence[str], max_length: int, dtype: np.dtype) -> TokenTable:
    """The ids the tokenizer gives each text with truncation=True, max_length (special tokens included).

    `TOKENIZE_CHUNK` texts at a time, ids only (modeling/tokenizing.py): a fast tokenizer keeps a full Encoding
    (tokens, offsets, word ids) per text of a call, so one call over a round's 500k queries held ~2.5 GB (measured:
    BENCHMARKS.md)."""
    parts = [TokenTable.from_lists(ids, dtype)
             for ids in token_id_chunks(tokenizer, list(texts), max_length, TOKENIZE_CHUNK)]
    return TokenTable.concat(parts, dtype)


def pad_settings(tokenizer) -> tuple[int, bool]:
    """(pad id, pad on the left) as the tokenizer pads a batch."""
    if tokenizer.pad_token_id is None:
        raise AnceError(f"the tokenizer of {tokenizer.name_or_path} has no padding token: training pads each batch")
    return int(tokenizer.pad_token_id), tokenizer.padding_side == "left"
