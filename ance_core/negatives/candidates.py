"""What the samplers draw from, as arrays: a ranking's rows of the queries being mined (`Ranking`: its top depth,
sorted by query and rank, every labelled-relevant document marked), and each (query, positive) pair's candidates from
it (`Candidates`: (P, D) matrices, D the most rows any of the queries has; which may be drawn: not relevant, kept by
the false-negative controls).

Document ids stay Arrow strings: a part of 20,000 queries at depth 200 is 4M rows, and only the few drawn become
Python strings.
"""

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ance_core.errors import AnceError


def strings(values) -> pa.ChunkedArray | pa.Array:
    """Arrow strings (`string`) of a column, whatever its Arrow type (large_string, dictionary, or null when empty)."""
    values = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values, type=pa.string())
    return values if values.type == pa.string() else values.cast(pa.string())


def positions(column: pa.ChunkedArray | pa.Array, values: pa.Array) -> np.ndarray:
    """(R,) each entry's index in `values` (strings; -1: not there). A dictionary column's dictionary is looked up,
    not each row."""
    out = [np.zeros(0, dtype=np.int64)]
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if pa.types.is_dictionary(chunk.type):
            at = pc.fill_null(pc.index_in(strings(chunk.dictionary), value_set=values), -1).to_numpy()
            out.append(at[chunk.indices.to_numpy(zero_copy_only=False)])
        else:
            out.append(pc.fill_null(pc.index_in(strings(chunk), value_set=values), -1).to_numpy())
    return np.concatenate(out)


def pairs_in(owners: np.ndarray, docs, set_owners: np.ndarray, set_docs) -> np.ndarray:
    """(R,) bool: whether each (owners[i], docs[i]) is one of the pairs (set_owners[j], set_docs[j]) (owners: ints,
    docs: strings). Only the rows whose document is in the set at all are compared as pairs."""
    values = pc.unique(strings(set_docs))
    code = positions(docs if isinstance(docs, pa.ChunkedArray | pa.Array) else strings(docs), values)
    found = np.flatnonzero(code >= 0)
    known = np.asarray(set_owners, dtype=np.int64) * len(values) + positions(strings(set_docs), values)
    out = np.zeros(len(code), dtype=bool)
    out[found] = np.isin(np.asarray(owners, dtype=np.int64)[found] * len(values) + code[found], known)
    return out


@dataclass(frozen=True)
class Ranking:
    """One ranking's rows of the queries being mined, in their top depth, sorted by (query, rank): `query` (R,) the
    query's index in the mined (sorted) query ids, `rank`, `score`, `window` (the MaxP window; None for rankings without
    one), `doc_id` (Arrow strings), and `excluded`: a labelled-relevant document of its query, never a candidate."""

    queries: int  # how many query ids `query` indexes
    query: np.ndarray
    rank: np.ndarray
    score: np.ndarray
    window: np.ndarray | None
    doc_id: pa.ChunkedArray
    excluded: np.ndarray

    def doc_ids(self, rows: np.ndarray) -> pa.Array:
        """The document ids of some rows (Arrow strings)."""
        return pc.take(self.doc_id, pa.array(rows, type=pa.int64())).combine_chunks()


def read_ranking(table: pa.Table | pd.DataFrame, query_ids: list[str], depth: int,
                 excluded: tuple[np.ndarray, list[str]]) -> Ranking:
    """The rows of a ranking (query_id, doc_id, rank, score[, window]) of the queries `query_ids` (sorted) in their
    top `depth` ranks, the `excluded` (query index, document) pairs marked: every labelled-relevant document. Rows of
    other queries are ignored; rows in another order (an old run, a shuffled frame) are sorted."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if missing := {"query_id", "doc_id", "rank", "score"} - set(table.column_names):
        raise AnceError(f"a ranking has no column {sorted(missing)}; it has {table.column_names}")
    query = positions(table["query_id"], strings(query_ids))
    rank = np.asarray(table["rank"].to_numpy(), dtype=np.int64)
    keep = (query >= 0) & (rank <= depth)
    if not keep.all():  # (one range of rows, in a run in query-id order of all its ranks: a slice, no copy)
        rows = np.flatnonzero(keep)
        contiguous = len(rows) == 0 or rows[-1] - rows[0] + 1 == len(rows)
        table = table.slice(rows[0] if len(rows) else 0, len(rows)) if contiguous else table.filter(pa.array(keep))
        query, rank = query[rows], rank[rows]
    step = np.diff(query)
    if not (np.all(step >= 0) and np.all((step > 0) | (np.diff(rank) > 0))):
        order = np.lexsort((rank, query))
        table, query, rank = table.take(pa.array(order)), query[order], rank[order]
    doc_id = strings(table["doc_id"])
    window = (np.asarray(pc.fill_null(table["window"], 0).to_numpy(), dtype=np.int64)
              if "window" in table.column_names else None)
    return Ranking(len(query_ids), query, rank, table["score"].to_numpy(), window, doc_id,
                   pairs_in(query, doc_id, *excluded))


@dataclass(frozen=True)
class Candidates:
    """Each pair's candidates from one ranking, as (P, D) matrices in rank order (D: the most rows a query has): pair
    i's are the ranking's rows start[i] .. start[i] + count[i] - 1, and `valid` says which may be drawn (present, not
    relevant, kept by the false-negative controls)."""

    ranking: Ranking
    pair_query: np.ndarray  # (P,)
    start: np.ndarray  # (P,)
    count: np.ndarray  # (P,)
    width: int
    blocks: bool  # every query has `width` rows: a per-row array reshapes to (queries, D)
    valid: np.ndarray  # (P, D)

    def rows(self, pair: np.ndarray, column: np.ndarray) -> np.ndarray:
        """The ranking's rows of some (pair, column) places."""
        return self.start[pair] + column

    def gather(self, values: np.ndarray, fill=0) -> np.ndarray:
        """(P, D) of a per-row array of the ranking (`fill` where a pair has fewer candidates)."""
        if self.width == 0:
            return np.full((len(self.pair_query), 0), fill)
        if self.blocks:  # whole rows per pair, and no copy at all when the pairs are the queries
            by_query = values.reshape(-1, self.width)
            same = len(self.pair_query) == len(by_query) and (self.pair_query == np.arange(len(by_query))).all()
            return by_query if same else by_query[self.pair_query]
        present = np.arange(self.width) < self.count[:, None]
        return np.where(present, values[np.minimum(self.start[:, None] + np.arange(self.width), len(values) - 1)],
                        fill)

    @property
    def score(self) -> np.ndarray:
        return self.gather(self.ranking.score, np.nan)


def false_negative_controls(rank: np.ndarray, score: np.ndarray | None, skip_top: int, margin: float | None,
                            positive_score: np.ndarray) -> np.ndarray:
    """Which candidates the controls keep: not in the top `skip_top` ranks, and (margin m) scoring at most
    s(q, d⁺) − m·|s(q, d⁺)| (NV-Retriever's relative margin; (1 − m)·s(q, d⁺) for a positive score, and still below
    the positive when its score is negative, as inner products can be); `positive_score` broadcasts against rank and
    score."""
    keep = rank > skip_top
    if margin is not None:
        keep &= score <= positive_score - margin * np.abs(positive_score)
    return keep


def pair_candidates(ranking: Ranking, pair_query: np.ndarray, skip_top: int, margin: float | None,
                    positive_score: np.ndarray) -> Candidates:
    """The candidates of each pair (`pair_query`: its query's index) from the ranking, after the controls
    (`positive_score`: (P,) s(q, d⁺) of each pair, for the margin)."""
    counts = np.bincount(ranking.query, minlength=ranking.queries)
    starts = np.cumsum(counts) - counts
    width = int(counts.max(initial=0))
    c = Candidates(ranking, pair_query, starts[pair_query], counts[pair_query], width, bool((counts == width).all()),
                   np.zeros(0))
    valid = ~c.gather(ranking.excluded, True)  # (P, D); a place past a pair's candidates counts as excluded
    if skip_top or margin is not None:
        valid &= false_negative_controls(c.gather(ranking.rank), c.score if margin is not None else None, skip_top,
                                         margin, positive_score[:, None])
    return replace(c, valid=valid)


def only_judged(candidates: Candidates, judged: tuple[np.ndarray, list[str]], restricted: np.ndarray) -> Candidates:
    """The candidates with those of a `restricted` query ((queries,) bool) that are not among its `judged` (query
    index, document) pairs no longer drawable: such a query's negatives come from its judged non-relevant documents."""
    ranking = candidates.ranking
    allowed = ~restricted[ranking.query] | pairs_in(ranking.query, ranking.doc_id, *judged)
    return replace(candidates, valid=candidates.valid & candidates.gather(allowed, False))
