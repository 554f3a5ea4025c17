"""What a training stage feeds its model: the token ids of the texts its pairs reference, gathered from the corpus by
row and tokenized once per stage, and a torch DataLoader that builds each optimizer step's padded micro-batches from
them off the training thread.

- `PairTokens`: the (query, positive, negatives) rows as integers (token-table positions and corpus rows) and the
  token tables of just the queries and passages they name. A swap of negatives (async refresh) keeps the tokens of
  the documents still referenced and gathers and tokenizes only the new ones (`swapped`), so memory follows the
  table in use, not every table seen.
- `StepBatches`: step -> the step's micro-batches (this rank's slice of each, padded; the in-batch false-negative
  mask), the same rows in the same order as `epoch_order` gives, a pure function of (pairs, step).
- `step_loader`: a DataLoader over the steps left; its workers (`loader_workers`) fork with the token tables
  (numpy arrays: shared copy-on-write, not copied) and draw their seed from a generator of their own, so the
  global torch RNG (dropout) is untouched and any number of workers trains the same weights.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from ance_core.data.corpus import CorpusRows
from ance_core.errors import preview
from ance_core.modeling.model import ModelMeta
from ance_core.modeling.tokenizing import passage_windows
from ance_core.negatives.teacher import group_teacher_scores
from ance_core.training.ranks import Ranks, rank_rows
from ance_core.training.tokens import TokenTable, token_dtype, tokenize


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of the n training pairs in an epoch: a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


@dataclass(frozen=True)
class PassageSource:
    """Where a passage's token ids come from: its corpus row, cut into the checkpoint's MaxP windows (the corpus
    encoding's cut, retrieval/encode.py `passage_windows`) or taken whole (FirstP: truncated by the tokenizer).

    A passage is keyed row * windows + window (`windows` = max_passages with MaxP, else 1)."""

    corpus: CorpusRows
    tokenizer: object
    meta: ModelMeta
    max_length: int  # the training passage length (truncation)

    @property
    def windows(self) -> int:
        return self.meta.max_passages if self.meta.document_mode == "maxp" else 1

    def keys(self, pairs: pd.DataFrame, group: int) -> tuple[np.ndarray, np.ndarray]:
        """(corpus rows (n, G), passage keys (n, G)) of each pair's positive then negatives."""
        ids = [d for pos, negs in zip(pairs["positive_id"], pairs["negative_ids"], strict=True) for d in [pos, *negs]]
        rows = self.corpus.rows_of(ids)
        if (rows < 0).any():
            missing = sorted({d for d, r in zip(ids, rows, strict=True) if r < 0})
            raise ValueError(f"the negatives name {len(missing)} documents that are not in the corpus: "
                             f"{preview(missing)}")
        window = np.zeros(len(ids), np.int64)
        if self.windows > 1 and "negative_windows" in pairs:
            window = np.array([w for pos, negs in zip(pairs["positive_window"], pairs["negative_windows"],
                                                      strict=True) for w in [pos, *negs]], np.int64)
        window = np.minimum(window, self.windows - 1)  # a document has at most `windows`: the last one is kept
        return rows.reshape(-1, group), (rows * self.windows + window).reshape(-1, group)

    def tokens(self, keys: np.ndarray) -> TokenTable:
        """The token ids of the passages `keys` (ascending, unique), in that order: only their rows are read."""
        dtype = token_dtype(self.tokenizer)
        rows, window = np.divmod(keys, self.windows)
        parts, k = [], 0
        for part_rows, texts in self.corpus.passages(np.unique(rows)):
            if self.windows == 1:
                passages = texts
            else:  # each row's windows: its keys are next in `keys` (sorted by row, then window)
                passages = []
                for row, text in zip(part_rows, texts, strict=True):
                    cut = passage_windows(self.tokenizer, text, self.meta.passage_max_length, self.meta.max_passages)
                    while k < len(rows) and rows[k] == row:
                        passages.append(cut[min(int(window[k]), len(cut) - 1)])
                        k += 1
            parts.append(tokenize(self.tokenizer, self.meta.passages(passages), self.max_length, dtype))
        table = TokenTable.concat(parts, dtype)
        assert len(table) == len(keys), (len(table), len(keys))  # every key's row was read
        return table


@dataclass(frozen=True)
class PairTokens:
    """The training pairs as integers, and the tokens of the texts they name (only those).

    queries[i] and passages[i, j] are positions in `query_tokens` / `passage_tokens` (j = 0: the positive, then the
    negatives); rows[i, j] is the corpus row of passage j (the false-negative mask compares documents by it);
    `relevant` holds query position * corpus size + row for every labelled-relevant document of a query."""

    queries: np.ndarray  # (n,) int64
    passages: np.ndarray  # (n, G) int64
    rows: np.ndarray  # (n, G) int64
    query_tokens: TokenTable
    passage_tokens: TokenTable
    passage_keys: np.ndarray  # (passages in the table,) ascending: PassageSource keys of passage_tokens
    relevant: np.ndarray  # ascending int64 codes
    corpus_size: int
    teacher: np.ndarray | None = None  # (n, G) float32: a teacher's scores of each pair's group (negatives/teacher.py)

    @classmethod
    def build(cls, pairs: pd.DataFrame, source: PassageSource, queries: pd.DataFrame,
              relevant: dict[str, set[str]], query_length: int) -> "PairTokens":
        """Tokens of the pairs' queries (from `queries`: query_id, text) and passages (read from the corpus)."""
        query_ids, query_pos = np.unique(pairs["query_id"].astype(str).to_numpy(), return_inverse=True)
        text = pd.Series(queries["text"].to_numpy(), index=queries["query_id"].astype(str))
        missing = [q for q in query_ids if q not in text.index]
        if missing:
            raise ValueError(f"the negatives name {len(missing)} queries that are not in the queries table: "
                             f"{preview(missing)}")
        query_tokens = tokenize(source.tokenizer, source.meta.queries(text.loc[query_ids].tolist()), query_length,
                                token_dtype(source.tokenizer))
        pairs_of = [(k, d) for k, q in enumerate(query_ids) for d in sorted(relevant.get(q, ()))]
        rows = source.corpus.rows_of([d for _, d in pairs_of]) if pairs_of else np.zeros(0, np.int64)
        owner = np.array([k for k, _ in pairs_of], np.int64)
        known = rows >= 0  # an id the corpus lacks never appears in a batch
        codes = np.unique(owner[known] * source.corpus.size + rows[known])
        none = np.zeros((len(pairs), 0), np.int64)
        no_passages = TokenTable.empty(token_dtype(source.tokenizer))
        empty = cls(query_pos.astype(np.int64), none, none, query_tokens, no_passages, np.zeros(0, np.int64), codes,
                    source.corpus.size)
        return empty.swapped(pairs, source)

    def swapped(self, pairs: pd.DataFrame, source: PassageSource) -> "PairTokens":
        """The same queries with the passages of `pairs` (same rows, newer negatives): the tokens of passages already
        held are kept, the others read and tokenized; passages no longer named are dropped."""
        group = 1 + len(pairs["negative_ids"].iloc[0])
        rows, keys = source.keys(pairs, group)
        wanted = np.unique(keys)
        held = np.searchsorted(self.passage_keys, wanted)
        held = np.minimum(held, max(len(self.passage_keys) - 1, 0))
        kept = (self.passage_keys[held] == wanted) if len(self.passage_keys) else np.zeros(len(wanted), bool)
        new = source.tokens(wanted[~kept])
        both = TokenTable.concat([self.passage_tokens.take(held[kept]), new], new.values.dtype)
        order = np.empty(len(wanted), np.int64)  # the table in key order: kept ones first in `both`, then new ones
        order[np.flatnonzero(kept)] = np.arange(int(kept.sum()))
        order[np.flatnonzero(~kept)] = kept.sum() + np.arange(int((~kept).sum()))
        return PairTokens(self.queries, np.searchsorted(wanted, keys), rows, self.query_tokens, both.take(order),
                          wanted, self.relevant, self.corpus_size, group_teacher_scores(pairs))


@dataclass(frozen=True)
class StepPlan:
    """How steps cut the pairs into micro-batches (the loop's schedule): `batch_size` pairs per micro-batch,
    `grad_accumulation` micro-batches per step, `per_epoch` steps per epoch, each epoch in `epoch_order(n, seed,
    epoch)`."""

    batch_size: int
    grad_accumulation: int
    per_epoch: int
    seed: int
    in_batch_negatives: bool
    pad_multiple: int | None = None  # micro-batches padded to a multiple of this many tokens (TokenTable.pad)


class StepBatches(Dataset):
    """step -> {"step", "micro_batches"}: each micro-batch this rank's slice of the step's rows, as the model's
    inputs (queries (b, Lq), passages (b*G, Lp), int64), with `rows` (the global micro-batch's size B) and, with
    in-batch negatives, `mask` (B, B*G) bool: True where passage j is a labelled positive of query i but not i's own
    positive column (training/loss.py `nll_loss`); with a teacher's scores, `teacher` (B, G) float32."""

    def __init__(self, tokens: PairTokens, plan: StepPlan, ranks: Ranks, padding: tuple[int, bool]):
        self.tokens, self.plan, self.ranks = tokens, plan, ranks
        self.pad_id, self.left = padding  # tokens.py `pad_settings`
        self.multiple = plan.pad_multiple
        self._epoch: tuple[int, np.ndarray] | None = None

    def __getitem__(self, step: int) -> dict:
        plan = self.plan
        epoch, k = divmod(step, plan.per_epoch)
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, epoch_order(len(self.tokens.queries), plan.seed, epoch))
        order = self._epoch[1]
        batches = [order[m * plan.batch_size : (m + 1) * plan.batch_size]
                   for m in range(k * plan.grad_accumulation, (k + 1) * plan.grad_accumulation)]
        batches = [idx for idx in batches if len(idx) >= self.ranks.world]  # an epoch's last rows may not go round
        return {"step": step, "micro_batches": [self.micro_batch(idx) for idx in batches]}

    def micro_batch(self, idx: np.ndarray) -> dict:
        t = self.tokens
        mine = idx[rank_rows(len(idx), self.ranks)]
        batch = {"rows": len(idx),
                 "queries": t.query_tokens.pad(t.queries[mine], self.pad_id, self.left, self.multiple),  # (b, Lq)
                 "passages": t.passage_tokens.pad(t.passages[mine].reshape(-1), self.pad_id, self.left,
                                                  self.multiple)}  # (b*G, Lp)
        if self.plan.in_batch_negatives:
            batch["mask"] = torch.from_numpy(false_negative_mask(t.queries[idx], t.rows[idx], t.relevant,
                                                                 t.corpus_size))
        if t.teacher is not None:  # (B, G): the global micro-batch's rows, as the loss spans them
            batch["teacher"] = torch.from_numpy(t.teacher[idx])
        return batch


def false_negative_mask(queries: np.ndarray, rows: np.ndarray, relevant: np.ndarray, corpus_size: int) -> np.ndarray:
    """(B, B*G) True where passage j (rows (B, G) flattened) is a labelled-relevant document of query i (`relevant`:
    ascending query * corpus_size + row codes) but not i's own positive column (j = i*G)."""
    codes = queries[:, None] * corpus_size + rows.reshape(-1)[None, :]  # (B, B*G)
    at = np.minimum(np.searchsorted(relevant, codes), max(len(relevant) - 1, 0))
    mask = relevant[at] == codes if len(relevant) else np.zeros(codes.shape, bool)
    mask[np.arange(len(queries)), np.arange(len(queries)) * rows.shape[1]] = False
    return mask


def step_loader(batches: StepBatches, steps: Sequence[int], workers: int, pin_memory: bool, seed: int) -> DataLoader:
    """A DataLoader of `batches` over `steps`, in order. One pass over the steps left: with workers they live for the
    rest of the stage (what persistent_workers gives a loader iterated per epoch), each keeping 2 steps ready."""
    return DataLoader(batches, batch_size=None, sampler=steps, num_workers=workers,
                      prefetch_factor=2 if workers else None, pin_memory=pin_memory,
                      generator=torch.Generator().manual_seed(seed))  # not the global RNG: dropout stays as it was


class StepFeed:
    """Each step's micro-batches, from a `step_loader` started at the first step asked for; `reset` (a swap of
    negatives) drops it, with the steps it had ready (cut from the old pairs), and the next step starts a new one.
    Closing (or leaving the `with` block) stops its workers."""

    def __init__(self, plan: StepPlan, ranks: Ranks, padding: tuple[int, bool], total: int, workers: int,
                 pin_memory: bool, seed: int):
        self.plan, self.ranks, self.padding, self.total = plan, ranks, padding, total
        self.workers, self.pin_memory, self.seed = workers, pin_memory, seed
        self.tokens: PairTokens | None = None
        self._steps = None

    def reset(self, tokens: PairTokens) -> None:
        self.close()
        self.tokens = tokens

    def next(self, step: int) -> list[dict]:
        if self._steps is None:
            batches = StepBatches(self.tokens, self.plan, self.ranks, self.padding)
            self._steps = iter(step_loader(batches, range(step, self.total), self.workers, self.pin_memory,
                                           self.seed))
        item = next(self._steps)
        assert item["step"] == step, (item["step"], step)  # the loader follows the loop's steps
        return item["micro_batches"]

    def close(self) -> None:
        self._steps = None  # the last reference to the iterator: its workers shut down

    def __enter__(self) -> "StepFeed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
