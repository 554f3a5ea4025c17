"""Dense retrieval with a checkpoint and an index: queries in, a run (query_id, doc_id, rank, score) out."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ance_core.config import EncodeConfig, IndexConfig
from ance_core.encode import encode_queries
from ance_core.errors import AnceError
from ance_core.index import FlatIndex
from ance_core.model import load_checkpoint, pick_device

RUN_COLUMNS = ["query_id", "doc_id", "rank", "score"]


@dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float


def run_frame(query_ids: list[str], doc_ids: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    """(n, k) doc ids and scores, best first -> long run table with 1-based ranks."""
    n, k = doc_ids.shape
    return pd.DataFrame({
        "query_id": np.repeat(np.asarray(query_ids, dtype=object), k),
        "doc_id": doc_ids.reshape(-1),
        "rank": np.tile(np.arange(1, k + 1), n),
        "score": scores.reshape(-1).astype(np.float32),
    })


def dense_retrieve(
    checkpoint: str | Path,
    index_dir: str | Path,
    queries: pd.DataFrame,
    top_k: int,
    encode_cfg: EncodeConfig = EncodeConfig(),
    index_cfg: IndexConfig = IndexConfig(),
    positives: dict[str, set[str]] | None = None,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """The top-k run; with `positives`, also every labelled positive's exact score (query_id, doc_id, score),
    retrieved or not (SimANS needs s(q, d+))."""
    model, tokenizer, meta = load_checkpoint(checkpoint, pick_device())
    q = encode_queries(model, tokenizer, queries["text"].tolist(), meta.query_max_length, encode_cfg)
    index = FlatIndex(index_dir, index_cfg)
    if q.shape[1] != index.index.d:
        raise AnceError(f"{index_dir}: the index holds {index.index.d}-dim vectors but {checkpoint} encodes "
                        f"{q.shape[1]}-dim queries; a compressed model searches the index built from its own "
                        "compressed embeddings, and its teacher the full one")
    scores, ids = index.search(q, top_k)
    run = run_frame(queries["query_id"].tolist(), ids, scores)
    if positives is None:
        return run
    row = {query_id: i for i, query_id in enumerate(queries["query_id"])}
    pairs = [(query_id, d) for query_id in row for d in sorted(positives.get(query_id, ()))]
    docs = index.vectors([d for _, d in pairs])
    qs = q[[row[query_id] for query_id, _ in pairs]]
    scored = pd.DataFrame(pairs, columns=["query_id", "doc_id"]).assign(
        score=np.einsum("ij,ij->i", qs.astype(np.float32), docs).astype(np.float32) if pairs else [])
    return run, scored


def search_text(checkpoint: str | Path, index_dir: str | Path, text: str, top_k: int = 10) -> list[Hit]:
    run = dense_retrieve(checkpoint, index_dir, pd.DataFrame({"query_id": ["q"], "text": [text]}), top_k)
    return [Hit(d, float(s)) for d, s in zip(run["doc_id"], run["score"], strict=True)]


def write_trec(run: pd.DataFrame, path: str | Path, tag: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for q, d, r, s in run[RUN_COLUMNS].itertuples(index=False):
            f.write(f"{q} Q0 {d} {r} {s:.6f} {tag}\n")
