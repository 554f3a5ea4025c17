"""A checkpoint with what it needs to retrieve on its own: the corpus's dense embeddings (its encode stage's shards and
doc ids), the corpus's BM25 index and the fusion the run chose on its dev split. A registered version whose run's
result was a hybrid row carries this package as `checkpoint/retrieval/` (a FirstP, uncompressed model's, up to 512 MB:
flows/book.py `retrieval_package`), so the served MLflow model searches as the run's result did (tracking/pyfunc.py,
`params={"kind": "search"}`):

    searcher = HybridSearch("<checkpoint folder with retrieval/>")
    searcher.search(["does vitamin D lower cancer risk"], k=10)             # hybrid: the run's fusion
    searcher.search([...], k=10, mode="dense")                              # or the dense ranking alone, or "bm25"

Scores: dense ones are inner products of the query's embedding with the stored (float16) passage embeddings, exact
(a matrix product in blocks); BM25's come from the stored index; both are fused by the recorded fusion over each
ranking's top `depth` (the run's `eval.top_k`; BM25's top `bm25.top_k` where that is shallower: as the pipeline fused
them).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from ance_core.artifacts import DOCIDS, EMBEDDING_SHARDS, id_lines, link_or_copy, shard_paths
from ance_core.errors import AnceError
from ance_core.export.encoder import Encoder, check_texts
from ance_core.retrieval.bm25 import BM25
from ance_core.retrieval.config import BM25Config
from ance_core.retrieval.evaluate import trec_order
from ance_core.retrieval.fusion import Fusion, fuse

RETRIEVAL = "retrieval"  # the package's folder inside a checkpoint folder
PACKAGE = "package.json"  # the fusion, the BM25 config and the sizes
MODES = ("hybrid", "dense", "bm25")
DEPTH = 1000
BLOCK = 65_536  # passages scored per matrix product
QUERY_CHUNK = 64  # queries scored against the corpus at once


def write_package(out: Path, encode: str | Path, bm25_index: str | Path, bm25: BM25Config, fusion: Fusion,
                  depth: int = DEPTH) -> dict:
    """The retrieval package of a checkpoint into `out`: hard links (or copies) of its corpus encoding's shards and doc
    ids and of the BM25 index's files, and package.json (`depth`: how deep each ranking is fused, the pipeline's
    `eval.top_k`)."""
    out.mkdir(parents=True, exist_ok=True)
    shards = shard_paths(encode)
    if not shards:
        raise AnceError(f"{encode}: no embedding shards to package")
    for path in [*shards, Path(encode) / DOCIDS]:
        link_or_copy(path, out / path.name)
    (out / "bm25").mkdir(exist_ok=True)
    for path in Path(bm25_index).iterdir():
        if path.is_file() and path.name != "manifest.json":
            link_or_copy(path, out / "bm25" / path.name)
    record = {"fusion": fusion.as_dict(), "bm25": bm25.model_dump(mode="json"), "depth": depth,
              "passages": sum(len(np.load(p, mmap_mode="r")) for p in shards)}
    (out / PACKAGE).write_text(json.dumps(record, indent=1))
    return record


def package_bytes(encode: str | Path, bm25_index: str | Path) -> int:
    files = [*Path(encode).glob(EMBEDDING_SHARDS), *Path(bm25_index).iterdir()]
    return sum(p.stat().st_size for p in files if p.is_file())


def copy_package(package: Path, checkpoint_copy: Path) -> None:
    """Put a package into a (downloaded or exported) checkpoint folder as its `retrieval/`."""
    shutil.copytree(package, checkpoint_copy / RETRIEVAL, dirs_exist_ok=True)


def package_refusal(encoder) -> str | None:
    """What a model is that a retrieval package cannot serve (its search ranks FirstP, uncompressed passage
    embeddings), or None: a compressed model, a MaxP model. (An ONNX export is never compressed.)"""
    if encoder.onnx is None and encoder.model.projector is not None:
        return "a compressed model (ConAE or PCA)"
    return "a MaxP model (its encoding has a row per window)" if encoder.meta.document_mode != "firstp" else None


class HybridSearch:
    """Search with a checkpoint folder that holds a retrieval package (module docstring)."""

    def __init__(self, checkpoint: str | Path, encoder: Encoder | None = None):
        folder = Path(checkpoint) / RETRIEVAL
        if not (folder / PACKAGE).is_file():
            raise AnceError(f"{checkpoint}: no retrieval package ({RETRIEVAL}/{PACKAGE}); only a version whose run's "
                            "result was a hybrid row carries one")
        try:  # a file missing or not what it should be (a package half uploaded, or edited by hand)
            record = json.loads((folder / PACKAGE).read_text())
            self.fusion, self.depth = Fusion.of(record["fusion"]), record.get("depth", DEPTH)
            self.shards = [np.load(p, mmap_mode="r") for p in shard_paths(folder)]
            self.doc_ids = np.array(id_lines(folder / DOCIDS), dtype=object)
            bm25 = BM25Config.model_validate(record["bm25"])
            self.bm25 = BM25.load(folder / "bm25", bm25)
        except (AnceError, OSError, ValueError, KeyError, TypeError) as e:
            what = str(e) if isinstance(e, AnceError) else f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            raise AnceError(f"{folder}: a damaged retrieval package ({what}); log the run's package again") from None
        self.encoder = encoder or Encoder(checkpoint)
        self.bm25_depth = min(bm25.top_k, self.depth)  # as deep as the run's BM25 ranking the fusion was chosen on
        rows = sum(len(s) for s in self.shards)  # a package put together by hand, or half uploaded: said, not fused
        counts = {"embedding rows": rows, DOCIDS: len(self.doc_ids), "BM25 documents": len(self.bm25.doc_ids)}
        counts |= {f"{PACKAGE}'s passages": record["passages"]} if "passages" in record else {}
        if len(set(counts.values())) > 1 or set(self.bm25.doc_ids) != set(self.doc_ids):
            raise AnceError(f"{folder}: an inconsistent retrieval package ("
                            + ", ".join(f"{k} {v:,}" for k, v in counts.items())
                            + (", the same counts of other documents" if len(set(counts.values())) == 1 else "")
                            + "): its encoding and BM25 index are not of one corpus; log the run's package again")
        if package_refusal(self.encoder) is not None:
            raise AnceError(f"{checkpoint}: a retrieval package serves a FirstP, uncompressed checkpoint")

    def _dense(self, queries: pd.DataFrame, depth: int) -> pd.DataFrame:
        """Each query's top `depth` by inner product, `QUERY_CHUNK` queries at a time (their scores against the whole
        corpus held at once: 64 x N float32)."""
        q = self.encoder.encode(queries["text"].tolist(), kind="query")
        rows = []
        for start in range(0, len(q), QUERY_CHUNK):
            part = q[start:start + QUERY_CHUNK]
            scores = np.concatenate([part @ block[s:s + BLOCK].astype(np.float32).T for block in self.shards
                                     for s in range(0, len(block), BLOCK)], axis=1)
            k = min(depth, scores.shape[1])
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            for i, query_id in enumerate(queries["query_id"].iloc[start:start + QUERY_CHUNK]):
                order = top[i][np.argsort(-scores[i, top[i]], kind="stable")]
                rows += [(query_id, self.doc_ids[j], float(scores[i, j])) for j in order]
        return pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])

    def search(self, texts: list[str], k: int = 10, mode: str = "hybrid") -> pd.DataFrame:
        """The top `k` of each text: (query, rank, doc_id, score), `query` the text's position in `texts`."""
        if mode not in MODES:
            raise AnceError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        if k < 1:
            raise AnceError(f"k {k}: ask for at least one hit")
        queries = pd.DataFrame({"query_id": [str(i) for i in range(len(texts))], "text": check_texts(texts)})
        if (blank := next((i for i, text in enumerate(queries["text"]) if not text.strip()), None)) is not None:
            raise AnceError(f"text {blank} is empty: a search needs a query (`ance search` refuses one too)")
        if queries.empty:
            return pd.DataFrame(columns=["query", "rank", "doc_id", "score"])
        dense = self._dense(queries, self.depth) if mode != "bm25" else None
        sparse = self.bm25.search(queries, self.bm25_depth, progress=False) if mode != "dense" else None
        if mode == "hybrid":
            run = fuse(dense, sparse, self.fusion, self.depth)
        elif mode == "dense":
            run = dense[["query_id", "doc_id", "score"]]
        else:  # (BM25's matches: the rows of score 0 filling its ranking to its depth match no query term, and the
            # pipeline scores and fuses none of them)
            run = sparse.loc[sparse["score"] > 0, ["query_id", "doc_id", "score"]]
        run = trec_order(run)  # equal scores as the run's evaluation ranked them: the greater document id first
        run = run.groupby("query_id", sort=False).head(k).copy()
        run["rank"] = run.groupby("query_id").cumcount() + 1
        run["query"] = run["query_id"].astype(int)
        return run.sort_values(["query", "rank"])[["query", "rank", "doc_id", "score"]].reset_index(drop=True)
