"""Dense retrieval with a checkpoint and an index: queries in, a run (query_id, doc_id, rank, score) out."""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ance_core.artifacts import replaced_file
from ance_core.data.lines import LeftOut, read_lines
from ance_core.errors import AnceError, DataError, preview, warn
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.encode import encode_queries
from ance_core.retrieval.index import SearchIndex

RUN_COLUMNS = ["query_id", "doc_id", "rank", "score"]  # dense runs add `window`: the MaxP window a document scored by


@dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float


def run_frame(query_ids: list[str], doc_ids: np.ndarray, scores: np.ndarray,
              windows: np.ndarray | None = None) -> pd.DataFrame:
    """(n, k) doc ids and scores (and windows), best first -> long run table with 1-based ranks. Empty places (doc id
    None: an approximate index found fewer than k) are left out."""
    n, k = doc_ids.shape
    frame = pd.DataFrame({
        "query_id": np.repeat(np.asarray(query_ids, dtype=object), k),
        "doc_id": doc_ids.reshape(-1),
        "rank": np.tile(np.arange(1, k + 1), n),
        "score": scores.reshape(-1).astype(np.float32),
    })
    frame = frame if windows is None else frame.assign(window=windows.reshape(-1).astype(np.int64))
    found = frame["doc_id"].notna()
    return frame if found.all() else frame[found].reset_index(drop=True)


QUERY_CHUNK = 50_000  # queries encoded and searched at a time by `write_dense_run`
# Run files are written in query-id order in row groups of this many rows (~1,300 queries at depth 200): mining reads
# the rows of a range of query ids, and the row groups' statistics let it skip the others (tasks/mine.py)
RUN_ROW_GROUP = 2**18


class RunWriter:
    """A run (or a positive-score table) written to parquet a part at a time, the parts in query-id order, in row
    groups of RUN_ROW_GROUP rows. A context manager: the file is complete once it closes."""

    def __init__(self, path: Path):
        self.path, self.writer = path, None

    def write(self, part: pd.DataFrame | pa.Table) -> None:
        table = part if isinstance(part, pa.Table) else pa.Table.from_pandas(
            part, schema=self.writer.schema if self.writer else None, preserve_index=False)
        if self.writer is None:  # an empty first part has columns of no type: they hold strings
            table = table.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f
                                          for f in table.schema], metadata=table.schema.metadata))
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table, row_group_size=RUN_ROW_GROUP)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self.writer is not None:
            self.writer.close()


def write_run(run: pd.DataFrame, path: Path) -> None:
    """A whole run table to parquet (RunWriter's layout), sorted by query id first unless it is (a stable sort: each
    query's rows keep their rank order)."""
    if not run["query_id"].is_monotonic_increasing:
        run = run.sort_values("query_id", kind="stable")
    with RunWriter(path) as writer:
        writer.write(run)


def _search_chunks(checkpoint: str | Path, index_dir: str | Path, queries: pd.DataFrame, top_k: int,
                   encode_cfg: EncodeConfig, index_cfg: IndexConfig, chunk: int | None = None
                   ) -> Iterator[tuple[pd.DataFrame, pd.DataFrame, np.ndarray, SearchIndex]]:
    """(the queries, their top-k run, their embeddings, the loaded index) for `chunk` queries at a time (all at once
    by default): memory grows with the chunk, not with the number of queries."""
    model, tokenizer, meta = load_checkpoint(checkpoint, pick_device())
    index = SearchIndex(index_dir, index_cfg)
    step = chunk or max(1, len(queries))
    for start in range(0, max(1, len(queries)), step):
        part = queries.iloc[start : start + step]
        q = encode_queries(model, tokenizer, part["text"].tolist(), meta, encode_cfg)
        if q.shape[1] != index.index.d:
            raise AnceError(f"{index_dir}: the index holds {index.index.d}-dim vectors but {checkpoint} encodes "
                            f"{q.shape[1]}-dim queries; a compressed model searches the index built from its own "
                            "compressed embeddings, and its teacher the full one")
        scores, ids, windows = index.search_windows(q, top_k)
        yield part, run_frame(part["query_id"].tolist(), ids, scores, windows), q, index


def _search(checkpoint: str | Path, index_dir: str | Path, queries: pd.DataFrame, top_k: int, encode_cfg: EncodeConfig,
            index_cfg: IndexConfig) -> tuple[pd.DataFrame, np.ndarray, SearchIndex]:
    """(the top-k run, the query embeddings, the loaded index)."""
    _, run, q, index = next(_search_chunks(checkpoint, index_dir, queries, top_k, encode_cfg, index_cfg))
    return run, q, index


def dense_retrieve(
    checkpoint: str | Path,
    index_dir: str | Path,
    queries: pd.DataFrame,
    top_k: int,
    encode_cfg: EncodeConfig = EncodeConfig(),
    index_cfg: IndexConfig = IndexConfig(),
) -> pd.DataFrame:
    """The top-k run of the queries (query_id, text) with a checkpoint and its index."""
    return _search(checkpoint, index_dir, queries, top_k, encode_cfg, index_cfg)[0]


def dense_retrieve_with_positives(
    checkpoint: str | Path,
    index_dir: str | Path,
    queries: pd.DataFrame,
    top_k: int,
    positives: dict[str, set[str]],
    encode_cfg: EncodeConfig = EncodeConfig(),
    index_cfg: IndexConfig = IndexConfig(),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the top-k run, every labelled positive's exact score (query_id, doc_id, score, window)), the positives scored
    whether retrieved or not (SimANS needs s(q, d+)); one query encoding serves both."""
    run, q, index = _search(checkpoint, index_dir, queries, top_k, encode_cfg, index_cfg)
    pairs = [(query_id, d) for query_id in queries["query_id"] for d in sorted(positives.get(query_id, ()))]
    return run, _pair_scores(q, queries["query_id"].tolist(), index, pairs)


def write_dense_run(checkpoint: str | Path, index_dir: str | Path, queries: pd.DataFrame, top_k: int,
                    positives: dict[str, set[str]], run_path: Path, positives_path: Path,
                    encode_cfg: EncodeConfig = EncodeConfig(), index_cfg: IndexConfig = IndexConfig(),
                    chunk: int = QUERY_CHUNK, progress: Callable[[int], None] | None = None) -> None:
    """`dense_retrieve_with_positives` streamed to two parquet files, `chunk` queries at a time: neither the run nor a
    score matrix of all the queries is ever held. The queries are searched in id order, so both files are in query-id
    order (`RunWriter`). `progress(done)` is told the queries done after each chunk."""
    queries = queries.sort_values("query_id", kind="stable").reset_index(drop=True)
    done = 0
    with RunWriter(run_path) as runs, RunWriter(positives_path) as scores:
        for part, run, q, index in _search_chunks(checkpoint, index_dir, queries, top_k, encode_cfg, index_cfg,
                                                  chunk):
            pairs = [(query_id, d) for query_id in part["query_id"] for d in sorted(positives.get(query_id, ()))]
            runs.write(run)
            scores.write(_pair_scores(q, part["query_id"].tolist(), index, pairs))
            done += len(part)
            if progress is not None:
                progress(done)


def _pair_scores(q: np.ndarray, query_ids: list[str], index: SearchIndex, pairs: list[tuple[str, str]]
                 ) -> pd.DataFrame:
    """(query_id, doc_id, score, window) of each pair: the query's embedding (row of `q`) against the document's
    indexed vector (its best window's, MaxP)."""
    row = {query_id: i for i, query_id in enumerate(query_ids)}
    qs = q[[row[query_id] for query_id, _ in pairs]] if pairs else np.zeros((0, index.index.d), dtype=np.float32)
    scores, windows = index.best_scores(qs, [d for _, d in pairs])
    return pd.DataFrame(pairs, columns=["query_id", "doc_id"]).assign(score=scores, window=windows)


def score_pairs(checkpoint: str | Path, index_dir: str | Path, queries: pd.DataFrame, pairs: list[tuple[str, str]],
                encode_cfg: EncodeConfig = EncodeConfig()) -> pd.DataFrame:
    """The model's exact score of each (query id, doc id) pair (query_id, doc_id, score), the documents' vectors read
    from the model's own index."""
    model, tokenizer, meta = load_checkpoint(checkpoint, pick_device())
    wanted = queries[queries["query_id"].isin({q for q, _ in pairs})]
    q = encode_queries(model, tokenizer, wanted["text"].tolist(), meta, encode_cfg)
    return _pair_scores(q, wanted["query_id"].tolist(), SearchIndex(index_dir), pairs)


def search_text(checkpoint: str | Path, index_dir: str | Path, text: str, top_k: int = 10) -> list[Hit]:
    run = dense_retrieve(checkpoint, index_dir, pd.DataFrame({"query_id": ["q"], "text": [text]}), top_k)
    return [Hit(d, float(s)) for d, s in zip(run["doc_id"], run["score"], strict=True)]


def write_trec(run: pd.DataFrame, path: str | Path, tag: str) -> None:
    """A run as a TREC run file: `qid Q0 docid rank score tag` per line (the tag's spaces as `_`: a column is one
    word). Written beside and renamed into place when whole: a failure leaves no half-written file."""
    tag = "_".join(str(tag).split()) or "run"
    # each score exactly, so that it reads back in its rank: at 6 decimals, float32 scores 0.5000004 and 0.5000001
    # were read back as a tie (and ance evaluate --run scored another ranking); a fused run's float64 scores need
    # more digits than float32's 9 (RRF sums of 1/(k + rank) differ in the 10th)
    exact = "{:.9g}".format if run["score"].dtype == np.float32 else repr
    with replaced_file(path, encoding="utf-8") as f:
        for q, d, r, s in run[RUN_COLUMNS].itertuples(index=False):
            f.write(f"{q} Q0 {d} {r} {exact(float(s))} {tag}\n")


def read_trec(path: str | Path) -> pd.DataFrame:
    """A TREC run file (`qid Q0 docid rank score tag`, whitespace-separated; any system's) as a run table, ranked by
    score within each query as trec_eval ranks it. A malformed line is left out with one warning naming it (a file
    none of whose lines can be read is an error naming the first); a document listed twice for a query keeps its
    first line, with one warning."""
    path = Path(path)
    rows, left_out = [], LeftOut(path)
    for number, line in read_lines(path):  # UTF-8 (a BOM and CRLF accepted), blank lines skipped
        parts = line.split()
        if len(parts) != 6:
            left_out.add(DataError(path, f"expected 6 whitespace-separated columns (qid Q0 docid rank score tag), got "
                                   f"{len(parts)}", number))
            continue
        try:
            score = float(parts[4])
        except ValueError:
            score = math.nan
        if math.isnan(score):  # (nan ranks nowhere in particular: read, it moved other documents' ranks; inf ranks)
            left_out.add(DataError(path, f"score '{parts[4]}' is not a number", number))
            continue
        rows.append((parts[0], parts[2], score))
        left_out.keep()
    left_out.done()
    if not rows:
        raise DataError(path, "empty run file")
    run = pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])
    run = run.sort_values(["query_id", "score"], ascending=[True, False], kind="stable").reset_index(drop=True)
    twice = run.duplicated(["query_id", "doc_id"])
    if twice.any():  # (kept where it scored best, as the pipeline's evaluation ranks a document listed twice)
        warn(f"{path}: {int(twice.sum())} lines repeat a (query, document) pair already listed; the best-scoring "
             f"line is kept: {preview([f'{q}/{d}' for q, d in run.loc[twice, ['query_id', 'doc_id']].values])}")
        run = run[~twice].reset_index(drop=True)
    return run.assign(rank=run.groupby("query_id").cumcount() + 1)[RUN_COLUMNS]
