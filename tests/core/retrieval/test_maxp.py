"""MaxP (ANCE §5, document ranking): a document split into windows of passage_max_length tokens, each encoded, scored
by its best window in retrieval and in mining; against FirstP, which sees only the first window."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint
from ance_core.modeling.tokenizing import passage_windows
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_corpus
from ance_core.retrieval.index import SearchIndex, build_index
from ance_core.retrieval.search import dense_retrieve_with_positives, score_pairs
from tests.core.modeling.test_tokenizing import straddled
from tests.tiny import run_pipeline_cli, tiny_pipeline_config

FILLER = ("The committee met on Tuesday to review the quarterly budget, the parking arrangements and the schedule of "
          "the annual staff picnic, and agreed to postpone every decision until the next meeting. ")
ANSWER = "Vitamin D supplementation lowers the risk of fractures in elderly women with osteoporosis."


def toy_corpus() -> pd.DataFrame:
    """d-second: the answer in its second 32-token window, after filler; the others: filler and unrelated text."""
    return pd.DataFrame({"doc_id": ["d-second", "d-first", "d-other"], "title": "", "text": [
        FILLER + ANSWER, "Solar panels convert sunlight into electricity on the roofs of houses. " + FILLER,
        "A recipe for bread: flour, water, salt and yeast, kneaded and baked for forty minutes. " + FILLER]})


def test_windows_cut_a_document_on_token_boundaries(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = " ".join(f"word{i}" for i in range(100))
    windows = passage_windows(tokenizer, text, max_length=16, max_passages=3)
    assert len(windows) == 3 and windows[0].startswith("word0")
    for window in windows:  # each window encodes to at most 16 tokens with [CLS] and [SEP]
        assert len(tokenizer(window)["input_ids"]) <= 16
    assert text.startswith(" ".join(windows)[:20])
    assert passage_windows(tokenizer, "short", 16, 3) == ["short"] and passage_windows(tokenizer, "", 16, 3) == [""]


def test_a_huge_document_is_cut_before_its_windows_are_tokenized_to_the_same_windows(tiny_model):
    """MaxP tokenized a document whole before keeping its first windows (a 2 MB one: 1.7 s of each corpus encoding
    on this CPU); it is cut as FirstP's texts are (token_id_chunks), to the same windows, and a cut that holds fewer
    tokens than the windows keep (a DNA sequence: one [UNK] of any length) is read whole."""
    from ance_core.modeling.tokenizing import CHARS_PER_TOKEN

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    seen = []

    class Spied:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text, **kwargs):
            seen.append(len(text))
            return tokenizer(text, **kwargs)

    def uncut(text: str) -> list[str]:  # what the windows were: the whole text tokenized, then truncated
        enc = tokenizer(text, add_special_tokens=False, truncation=True, max_length=14 * 3, return_offsets_mapping=True)
        o = enc["offset_mapping"]
        return [text[o[i][0]:o[min(i + 14, len(o)) - 1][1]] for i in range(0, len(o), 14)]

    huge = "gene cancer patients study " * 20_000  # 540 k characters
    assert passage_windows(Spied(), huge, 16, 3) == uncut(huge) and seen == [14 * 3 * CHARS_PER_TOKEN]
    dna = "ACGT" * 30_000 + " cancer gene expression" * 10
    seen.clear()
    assert passage_windows(Spied(), dna, 16, 3) == uncut(dna) and seen == [14 * 3 * CHARS_PER_TOKEN, len(dna)]
    split = straddled(14 * 3 * CHARS_PER_TOKEN, 41)  # (a review: the 42nd token kept, a piece of a word the cut split)
    seen.clear()
    assert passage_windows(Spied(), split, 16, 3) == uncut(split) and seen == [14 * 3 * CHARS_PER_TOKEN, len(split)]


@pytest.mark.parametrize("mode", ["firstp", "maxp"])
def test_an_answer_in_the_second_window_is_found_by_maxp_only(mode, tmp_path):
    """all-MiniLM-L6-v2 with 32-token passages: MaxP ranks the document whose second window holds the answer first;
    FirstP sees only its filler and does not."""
    ckpt = tmp_path / "model"
    init_model(ModelConfig(name="minilm", passage_max_length=32, document_mode=mode, max_passages=4), ckpt)
    (tmp_path / "enc").mkdir()
    summary = encode_corpus(ckpt, toy_corpus(), EncodeConfig(batch_size=8), tmp_path / "enc")
    (tmp_path / "index").mkdir()
    build_index(tmp_path / "enc", tmp_path / "index")
    queries = pd.DataFrame({"query_id": ["q"], "text": ["Does vitamin D prevent fractures in older women?"]})
    run, positives = dense_retrieve_with_positives(ckpt, tmp_path / "index", queries, 3, {"q": {"d-second"}})
    assert sorted(run["doc_id"]) == ["d-first", "d-other", "d-second"]  # each document once, whatever its windows
    top = run.sort_values("rank").iloc[0]
    if mode == "maxp":
        assert summary["passages"] > summary["documents"] == 3
        assert SearchIndex(tmp_path / "index").max_windows > 1
        assert top["doc_id"] == "d-second" and top["window"] >= 1  # found by a later window
        assert positives.iloc[0]["window"] == top["window"]
        assert positives.iloc[0]["score"] == pytest.approx(top["score"], abs=1e-4)
    else:
        assert summary["passages"] == 3 and (run["window"] == 0).all()
        assert top["doc_id"] != "d-second"
    pairs = score_pairs(ckpt, tmp_path / "index", queries, [("q", "d-second")])
    assert pairs.iloc[0]["score"] == pytest.approx(positives.iloc[0]["score"], abs=1e-4)


def test_maxp_search_keeps_each_documents_best_window_and_k_distinct_documents(tmp_path):
    """A hand-made MaxP index: 4 documents with 1-3 windows; the top-k are documents, each at its best window."""
    import faiss

    vectors = np.array([[1, 0], [0.9, 0], [0.1, 0], [0.8, 0], [0.95, 0], [0.2, 0]], dtype=np.float32)
    docs, windows = ["a", "a", "b", "c", "c", "d"], [0, 1, 0, 0, 1, 0]
    index = faiss.IndexFlatIP(2)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "index"))
    (tmp_path / "docid").write_text("\n".join(docs) + "\n")
    (tmp_path / "window").write_text("\n".join(map(str, windows)) + "\n")
    flat = SearchIndex(tmp_path)
    assert len(flat) == 4 and flat.max_windows == 2
    scores, ids, best = flat.search_windows(np.array([[1.0, 0.0]], dtype=np.float32), 3)
    assert ids[0].tolist() == ["a", "c", "d"] and best[0].tolist() == [0, 1, 0]
    assert scores[0].tolist() == pytest.approx([1.0, 0.95, 0.2])
    s, w = flat.best_scores(np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32), ["c", "b"])
    assert s.tolist() == pytest.approx([0.95, 0.1]) and w.tolist() == [1, 0]


@pytest.mark.slow
def test_the_pipeline_runs_in_maxp_mode(tiny_scifact, tiny_model, tmp_path):
    """The tiny pipeline with maxp documents of 2 x 24-token windows: windows are encoded and indexed, mining records
    each negative's best window, training and evaluation run; compression is refused with a clear error."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config["model"] |= {"document_mode": "maxp", "max_passages": 2, "passage_max_length": 24}
    result, _ = run_pipeline_cli(config, tmp_path)
    stages = {(s["for"], s["stage"]): s["path"] for s in result["stages"]}
    encode = Path(stages[("warmup", "encode")])
    rows = (encode / "docids.txt").read_text().splitlines()
    assert len(rows) > len(set(rows)) == 200 and (encode / "windows.txt").is_file()
    run = pd.read_parquet(Path(stages[("ANCE round 1", "retrieve-train")], "run.parquet"))
    assert not run.duplicated(["query_id", "doc_id"]).any() and run["window"].max() == 1
    mined = pd.read_parquet(Path(stages[("ANCE round 1", "mine")], "negatives.parquet"))
    by_pair = run.set_index(["query_id", "doc_id"])["window"]
    for row in mined.itertuples():  # every negative is trained with the window the ranking found it by
        assert row.negative_windows.tolist() == [by_pair[(row.query_id, d)] for d in row.negative_ids]
    assert 0.0 <= result["ndcg_at_10"] <= 1.0
    _, _, meta = load_checkpoint(result["final_checkpoint"])
    assert (meta.document_mode, meta.max_passages) == ("maxp", 2)
    from ance_core.artifacts import ArtifactRef
    from ance_core.compression.config import CompressConfig
    from ance_core.errors import AnceError
    from ance_core.retrieval.config import IndexConfig
    from flows.compress import check_compression, compress_model

    # refused before any work too (`ance compress` encoded the whole corpus first; found by a review)
    with pytest.raises(AnceError, match="compression of a maxp checkpoint .* is not supported"):
        check_compression(result["final_checkpoint"], CompressConfig(dims=[8]), 200)
    with pytest.raises(AnceError, match="compression of a maxp checkpoint .* is not supported"):
        compress_model(ArtifactRef(result["final_checkpoint"], "x"), ArtifactRef(str(encode), "y"), None,
                       CompressConfig(), "train", "test", EncodeConfig(), IndexConfig(), str(tmp_path / "work"))
