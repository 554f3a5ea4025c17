import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from ance_core.data.corpus import FrameCorpus
from ance_core.modeling.model import ModelMeta
from ance_core.modeling.tokenizing import passage_windows
from ance_core.training.batches import (
    PairTokens,
    PassageSource,
    StepBatches,
    StepPlan,
    epoch_order,
    false_negative_mask,
)
from ance_core.training.ranks import Ranks, rank_rows
from ance_core.training.tokens import pad_settings
from tests.tiny import training_tables


class CountingCorpus(FrameCorpus):
    """A FrameCorpus that records the rows each `passages` call reads."""

    def __init__(self, frame):
        super().__init__(frame)
        self.read: list[list[int]] = []

    def passages(self, rows):
        self.read.append(rows.tolist())
        return super().passages(rows)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _source(corpus, tokenizer, mode="firstp", length=16):
    meta = ModelMeta("tiny", "mean", 8, 8 if mode == "maxp" else 24, mode, 3 if mode == "maxp" else 1)
    return PassageSource(corpus, tokenizer, meta, length)


def test_the_false_negative_mask_hides_other_rows_labelled_positives():
    """Query 0 has relevant documents a (row 0) and c (row 2); query 1 has b (row 1) and a. Columns: row 0's positive
    and negative, then row 1's."""
    corpus_size = 10
    relevant = np.array(sorted([0 * corpus_size + 0, 0 * corpus_size + 2, 1 * corpus_size + 1, 1 * corpus_size + 0]))
    rows = np.array([[0, 5], [1, 0]])  # passages a, x | b, a
    mask = false_negative_mask(np.array([0, 1]), rows, relevant, corpus_size)
    assert mask.tolist() == [[False, False, False, True], [True, False, False, True]]
    assert not false_negative_mask(np.array([0, 1]), rows, np.zeros(0, np.int64), corpus_size).any()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_steps_micro_batches_are_the_rows_of_the_epoch_order_tokenized_as_before(tokenizer, rank):
    """Each micro-batch of a step: this rank's slice of the rows `epoch_order` gives, as the tokenizer pads their
    texts (queries, then each row's positive and negatives), and the mask over the global micro-batch."""
    negatives, corpus, queries, relevant = training_tables()
    relevant["q0"] = {"d0", "d15"}  # d15 is q5's negative, in q0's micro-batch of step 1: masked in q0's row
    source = _source(FrameCorpus(corpus), tokenizer)
    tokens = PairTokens.build(negatives, source, queries, relevant, query_length=8)
    plan = StepPlan(batch_size=3, grad_accumulation=2, per_epoch=1, seed=5, in_batch_negatives=True)
    ranks = Ranks(rank, 2)
    step = StepBatches(tokens, plan, ranks, pad_settings(tokenizer))[1]
    order = epoch_order(10, 5, 1)
    assert step["step"] == 1 and len(step["micro_batches"]) == 2
    text = dict(zip(corpus["doc_id"], corpus["text"], strict=True))
    qtext = dict(zip(queries["query_id"], queries["text"], strict=True))
    for m, batch in enumerate(step["micro_batches"]):
        rows = negatives.iloc[order[3 * m : 3 * m + 3]]
        mine = rows.iloc[rank_rows(3, ranks)]
        queries_expected = tokenizer([qtext[q] for q in mine["query_id"]], padding=True, truncation=True,
                                     max_length=8, return_tensors="pt")
        docs = [d for pos, negs in zip(mine["positive_id"], mine["negative_ids"], strict=True) for d in [pos, *negs]]
        passages_expected = tokenizer([text[d] for d in docs], padding=True, truncation=True, max_length=16,
                                      return_tensors="pt")
        for key in ("input_ids", "attention_mask"):
            assert torch.equal(batch["queries"][key], queries_expected[key])
            assert torch.equal(batch["passages"][key], passages_expected[key])
        assert batch["rows"] == 3
        all_docs = [d for pos, negs in zip(rows["positive_id"], rows["negative_ids"], strict=True)
                    for d in [pos, *negs]]
        expected_mask = [[d in relevant.get(q, ()) and j != i * 3 for j, d in enumerate(all_docs)]
                         for i, q in enumerate(rows["query_id"])]
        assert batch["mask"].tolist() == expected_mask
    assert sum(int(b["mask"].sum()) for b in step["micro_batches"]) == 1


def test_a_swap_reads_and_tokenizes_only_the_documents_it_adds(tokenizer):
    """Negatives swapped for ones naming documents not seen before: only those rows are read; documents no longer
    named are dropped; the tokens equal those of a fresh build on the new table."""
    negatives, corpus, queries, relevant = training_tables()
    corpus = pd.concat([corpus, pd.DataFrame({"doc_id": [f"n{i}" for i in range(5)], "title": "t",
                                              "text": [f"mice risk {i}" for i in range(5)]})], ignore_index=True)
    reader = CountingCorpus(corpus)
    source = _source(reader, tokenizer)
    first = PairTokens.build(negatives, source, queries, relevant, query_length=8)
    assert reader.read == [list(range(30))]
    newer = negatives.assign(negative_ids=[[f"n{i % 5}", f"d{i + 20}"] for i in range(10)])
    swapped = first.swapped(newer, source)
    assert reader.read[1] == list(range(30, 35))  # n0..n4 (rows 30-34), nothing already held
    fresh = PairTokens.build(newer, _source(FrameCorpus(corpus), tokenizer), queries, relevant, query_length=8)
    assert len(swapped.passage_tokens) == 25  # d0-d9, d20-d29, n0-n4: d10-d19 dropped
    for name in ("queries", "passages", "rows", "passage_keys", "relevant"):
        assert np.array_equal(getattr(swapped, name), getattr(fresh, name)), name
    for table in ("query_tokens", "passage_tokens"):
        for part in ("values", "offsets"):
            assert np.array_equal(getattr(getattr(swapped, table), part), getattr(getattr(fresh, table), part))


def test_maxp_passages_are_the_windows_the_rows_name(tokenizer):
    """With a MaxP checkpoint each passage is its document's window (cut as the corpus encoding cuts it; a window past
    the document's last is its last), tokenized at the training length."""
    negatives, corpus, queries, relevant = training_tables()
    corpus["text"] = [t + " " + " ".join(["cell protein gene"] * (i % 4) * 2) for i, t in enumerate(corpus["text"])]
    negatives = negatives.assign(positive_window=[i % 3 for i in range(10)],
                                 negative_windows=[[(i + 1) % 5, 0] for i in range(10)])
    source = _source(FrameCorpus(corpus), tokenizer, mode="maxp", length=6)
    tokens = PairTokens.build(negatives, source, queries, relevant, query_length=8)
    text = dict(zip(corpus["doc_id"], corpus["text"], strict=True))
    pad_id, left = pad_settings(tokenizer)
    cut_at = set()
    for i, row in negatives.iterrows():
        for j, (doc, window) in enumerate(zip([row["positive_id"], *row["negative_ids"]],
                                              [row["positive_window"], *row["negative_windows"]], strict=True)):
            windows = passage_windows(tokenizer, text[doc], 8, 3)
            expected = tokenizer([windows[min(window, len(windows) - 1)]], truncation=True, max_length=6,
                                 return_tensors="pt")["input_ids"]
            got = tokens.passage_tokens.pad(np.array([tokens.passages[i, j]]), pad_id, left)["input_ids"]
            assert torch.equal(got, expected), (doc, window)
            cut_at.add(min(window, len(windows) - 1))
    assert cut_at == {0, 1, 2}  # first, middle and last windows were asked for


def test_negatives_naming_documents_outside_the_corpus_are_refused(tokenizer):
    negatives, corpus, queries, relevant = training_tables()
    negatives.at[3, "negative_ids"] = ["d13", "gone"]
    with pytest.raises(ValueError, match="1 documents that are not in the corpus: gone"):
        PairTokens.build(negatives, _source(FrameCorpus(corpus), tokenizer), queries, relevant, query_length=8)
    with pytest.raises(ValueError, match="1 queries that are not in the queries table: q9"):
        PairTokens.build(training_tables()[0], _source(FrameCorpus(corpus), tokenizer), queries.head(9), relevant,
                         query_length=8)


@pytest.mark.parametrize("mode", ["firstp", "maxp"])
def test_training_tokenizes_queries_and_passages_after_the_checkpoints_prefixes(tokenizer, mode):
    """A checkpoint with prefixes trains on the texts it encodes: each query after query_prefix, each passage (a
    MaxP window) after passage_prefix."""
    from dataclasses import replace

    from ance_core.training.tokens import token_dtype, tokenize

    negatives, corpus, queries, relevant = training_tables()
    plain = _source(FrameCorpus(corpus), tokenizer, mode)
    prefixed = replace(plain, meta=replace(plain.meta, query_prefix="cell ", passage_prefix="gene "))
    dtype = token_dtype(tokenizer)
    tokens = PairTokens.build(negatives, prefixed, queries, relevant, query_length=8)
    expected = tokenize(tokenizer, ["cell " + t for t in queries["text"]], 8, dtype)
    assert np.array_equal(tokens.query_tokens.values, expected.values)
    keys = np.array([0, 3 * plain.windows])  # documents d0 and d3, first window
    texts = [passage_windows(tokenizer, corpus["text"][r], plain.meta.passage_max_length, plain.meta.max_passages)[0]
             for r in (0, 3)]
    got = prefixed.tokens(keys)
    assert np.array_equal(got.values, tokenize(tokenizer, ["gene " + t for t in texts], plain.max_length, dtype).values)
    assert not np.array_equal(got.values, plain.tokens(keys).values)
