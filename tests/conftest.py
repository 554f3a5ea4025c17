"""Session fixtures: a tiny random BERT with a locally trained WordPiece tokenizer, and a ~200-document SciFact
subset in BEIR layout. Everything offline."""

import json
import os
import random
from pathlib import Path

import pytest
import transformers

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = Path(__file__).resolve().parents[1]


def shared_scifact() -> Path | None:
    for root in (os.environ.get("ANCE_DATA_HOME"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "scifact" / "corpus.jsonl").is_file():
            return Path(root) / "scifact"
    return None


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    folder = shared_scifact()
    if folder is None:
        pytest.skip("SciFact not found (set ANCE_DATA_HOME or put it at ../shared/data/scifact)")
    return folder


def write_beir(folder: Path, corpus: list[dict], queries: list[dict], qrels: dict[str, list[tuple]]) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in rows)]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session")
def tiny_scifact(scifact_dir, tmp_path_factory) -> Path:
    """~200 SciFact documents: the positives of 40 train and 30 test queries, filled up with random others."""
    rng = random.Random(0)
    corpus = [json.loads(x) for x in (scifact_dir / "corpus.jsonl").read_text().splitlines() if x.strip()]
    queries = {q["_id"]: q for q in map(json.loads, (scifact_dir / "queries.jsonl").read_text().splitlines())}
    qrels = {}
    for split, n in (("train", 40), ("test", 30)):
        rows = [ln.split("\t") for ln in (scifact_dir / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]]
        chosen = sorted({r[0] for r in rows})[:n]
        qrels[split] = [(q, d, s) for q, d, s in rows if q in chosen]
    needed = {d for rows in qrels.values() for _, d, _ in rows}
    others = [d for d in corpus if d["_id"] not in needed]
    docs = [d for d in corpus if d["_id"] in needed] + rng.sample(others, 200 - len(needed))
    used_queries = [queries[q] for q in sorted({q for rows in qrels.values() for q, _, _ in rows})]
    return write_beir(tmp_path_factory.mktemp("data") / "scifact-tiny", docs, used_queries, qrels)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, 32-dim random BERT with a WordPiece vocabulary trained here (on SciFact text when present, so
    real passages do not collapse to [UNK])."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    text_file = folder / "train.txt"
    words = ("cell protein gene cancer patients study risk effect mice treatment increase expression "
             "blood disease clinical results human response level activity associated reduced").split()
    rng = random.Random(0)
    lines = [" ".join(rng.choices(words, k=12)) for _ in range(400)]
    if (scifact := shared_scifact()) is not None:
        docs = (scifact / "corpus.jsonl").read_text().splitlines()[:3000]
        lines += [json.loads(d)["title"] + " " + json.loads(d)["text"] for d in docs]
        lines += [json.loads(q)["text"] for q in (scifact / "queries.jsonl").read_text().splitlines()]
    text_file.write_text("\n".join(lines))
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train([str(text_file)], vocab_size=4000, min_frequency=2, show_progress=False)
    text_file.unlink()
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece._tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    assert tokenizer.vocab_size > 100
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
