"""Negative mining (ANCE eq. 10 and the samplers of ance_core/negatives/samplers.py): one row per (query, positive) with
`num_negatives` negatives, never a labelled-relevant document, never twice, deterministic for (seed, round, query id).

Per query: each ranking the sampler mines is cut to its top-depth minus every relevant document; per pair, the
false-negative controls (`skip_top`: drop the top r ranks; `margin` m: drop candidates scoring above s(q, d⁺) − m·|s(q,
d⁺)|) leave the candidates the sampler draws from. All the pairs are mined at once, as arrays over pairs × candidates
(negatives/candidates.py), with counter-based random numbers (negatives/randomness.py): each random number is a hash of
(seed, round, query id, the positive's place among the query's, what it is for, the draw's number), so mining the
queries in parts, or in another order, gives the same negatives. (Since issue 28; before, each query had a numpy
generator seeded with (seed, round, crc32(query id)): the same laws, other draws for the same seed.)

Fallback: a pair whose candidates are fewer than the sampler wants (BM25 found nothing for the query, or the controls
left too few) gets its missing negatives uniformly from the corpus minus the query's relevant documents and the pair's
other negatives: the first acceptable of its hashed draws of corpus positions. One warning names how many queries and
which; the table's `fallback` column counts them per row.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ance_core.errors import AnceError, preview, warn
from ance_core.negatives.candidates import Candidates, only_judged, pair_candidates, read_ranking
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.randomness import draw_keys, pair_keys, uniforms
from ance_core.negatives.samplers import Drawn, Pairs, Sampler, get_sampler

# fallback: how many of the row's negatives the fallback drew; positive_window / negative_windows: the MaxP window each
# document is trained with (its best under the mining model; 0, the first, when nothing ranked it)
COLUMNS = ["query_id", "positive_id", "negative_ids", "negative_ranks", "negative_scores", "fallback",
           "positive_window", "negative_windows"]


class SortedIds(np.ndarray):
    """Document ids already in sorted order (an object array): `sample_negatives` uses them as they are."""


def sorted_ids(corpus_ids: Sequence[str]) -> SortedIds:
    """The corpus's ids sorted once (at 8.8M passages, seconds: not again for every part of the queries)."""
    return np.asarray(sorted(corpus_ids), dtype=object).view(SortedIds)


def pairs_of(positives: dict[str, set[str]], query_ids: list[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The (query, positive) pairs in (query, positive) order: (P,) each one's query index, its positive, and the
    positive's place among its query's (sorted) positives."""
    pair_query, positive_ids, ordinals = [], [], []
    for q, query_id in enumerate(query_ids):
        ids = sorted(positives[query_id])
        pair_query += [q] * len(ids)
        positive_ids += ids
        ordinals += range(len(ids))
    return np.asarray(pair_query, dtype=np.int64), positive_ids, np.asarray(ordinals, dtype=np.int64)


def excluded_documents(query_ids: list[str], positives: dict[str, set[str]],
                       relevant: dict[str, set[str]]) -> list[list[str]]:
    """Per query: the documents never a negative, sorted: its labelled-relevant ones, its positives, and the document
    of its own id (the query itself, where the corpus holds the queries: ArguAna, Quora; evaluation drops it too,
    `eval.ignore_identical_ids`)."""
    return [sorted(relevant.get(q, set()) | positives[q] | {q}) for q in query_ids]


def own_positive_scores(query_ids: list[str], pair_query: np.ndarray, positive_ids: list[str],
                        scores: dict[tuple[str, str], float]) -> np.ndarray:
    """(P,) s(q, d⁺) of each pair's own positive (NaN: unknown)."""
    return np.array([scores.get((query_ids[q], d), np.nan) for q, d in zip(pair_query, positive_ids, strict=True)],
                    dtype=np.float64)


def pair_positive_scores(sampler: Sampler, query_ids: list[str], pair_query: np.ndarray, positive_ids: list[str],
                         positive_scores: dict[tuple[str, str], float] | None) -> np.ndarray:
    """(P,) s(q, d⁺) of each pair's own positive (NaN: unknown), which a sampler that centres on it (SimANS) must
    have. SimANS eq. 4 centres on "a randomly sampled positive" of the query; its authors' code draws the positive a
    query trains on and centres on that one. Here every (query, positive) pair is a training instance, so each centres
    on its own: centring on another positive of the query gave a pair whose positive scores low negatives around a
    higher-scoring one (too hard, likely unlabelled positives), and one whose positive scores high easy ones."""
    out = own_positive_scores(query_ids, pair_query, positive_ids, positive_scores or {})
    if sampler.needs_positive_score and len(missing := np.flatnonzero(np.isnan(out))):
        i = int(missing[0])
        raise AnceError(f"no score for positive '{positive_ids[i]}' of query '{query_ids[pair_query[i]]}'")
    return out


def first_in_row(values: np.ndarray) -> np.ndarray:
    """(F, B) bool: whether each value is the first of its row equal to it."""
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, 1)
    first = np.ones(values.shape, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    out = np.empty_like(first)
    np.put_along_axis(out, order, first, 1)
    return out


def random_docs(docs: SortedIds, keys: np.ndarray, need: np.ndarray, banned: list[list[str]]) -> list[list[str]]:
    """need[i] distinct documents uniformly from the corpus minus banned[i], for each row i (keys[i] its random key):
    the first acceptable (not banned, not drawn before) of its hashed draws 0, 1, 2, ... of corpus positions, so the
    same whatever other rows are drawn with it."""
    size, owners = len(docs), np.repeat(np.arange(len(banned)), [len(b) for b in banned])
    flat = np.asarray([d for b in banned for d in b], dtype=object)
    at = np.minimum(np.searchsorted(docs, flat), max(size - 1, 0)) if len(flat) else np.zeros(0, dtype=np.int64)
    known = np.asarray(docs[at] == flat, dtype=bool) if len(flat) else np.zeros(0, dtype=bool)
    banned_keys = np.unique(owners[known] * size + at[known])  # (row, corpus position) pairs
    if (size - np.bincount(banned_keys // max(size, 1), minlength=len(need)) < need).any():
        raise AnceError(f"the corpus has fewer than {int(need.max())} documents that are not positives")
    out: list[list[str]] = [[] for _ in need]
    todo, block = np.flatnonzero(need > 0), 2 * int(need.max(initial=0)) + 8
    while len(todo):  # the first `block` draws of each row left; rows still short draw more, from draw 0 again
        drawn = np.minimum((uniforms(keys[todo], "fallback", np.arange(block)[None]) * size).astype(np.int64), size - 1)
        fresh = first_in_row(drawn) & ~np.isin(todo[:, None] * size + drawn, banned_keys)
        take = fresh & (np.cumsum(fresh, axis=1) <= need[todo, None])
        done = take.sum(axis=1) == need[todo]
        for row, positions, chosen in zip(todo[done], drawn[done], take[done], strict=True):
            out[row] = docs[positions[chosen]].tolist()
        todo, block = todo[~done], 4 * block
    return out


def sample_negatives(
    cfg: MiningConfig,
    positives: dict[str, set[str]],
    round_: int,
    rankings: Mapping[str, pd.DataFrame | pa.Table] | None = None,
    corpus_ids: Sequence[str] | None = None,
    positive_scores: dict[tuple[str, str], float] | None = None,
    relevant: dict[str, set[str]] | None = None,
    positive_windows: dict[tuple[str, str], int] | None = None,
    warn_short: bool = True,
    draws: int = 1,
    judged: dict[str, set[str]] | None = None,
) -> pd.DataFrame:
    """One row per (query, positive): `cfg.num_negatives` negatives of `cfg.sampler` (COLUMNS; rank and score are those
    of the ranking they were mined from, 0 and NaN for random documents). In-batch samplers get empty negative lists.

    `draws` > 1: as many independent draws from the same candidates (one per training epoch: each epoch trains on
    other negatives of the mined pool, as tevatron resamples its group each epoch). Draw 0 fills COLUMNS, as a single
    draw would; draws 1 .. draws-1 follow in REDRAWN (`epoch_negatives` gives a draw's table).

    `corpus_ids`: the corpus's document ids (random documents, the fallback), sorted here unless `sorted_ids` did it
    once for a caller that mines the queries in parts. `rankings`: each ranking the sampler mines (`dense`, `bm25`:
    query_id, doc_id, rank, score[, window]; a DataFrame or an Arrow table; rows of other queries are ignored).
    `positives`: the training positives; `relevant` (default: the positives) every labelled-relevant document of a
    query, none of which is ever a negative (graded qrels may train on the top grades only). `positive_scores`:
    s(q, d⁺) (SimANS, margin). `positive_windows`: the MaxP window of each (query, positive) under the mining model
    (default 0). `warn_short`: warn about the queries given fallback negatives (`warn_fallback`); off for a caller
    that mines the queries in parts and warns once for all of them. `judged`: with `cfg.judged_only`, the documents each
    query is judged non-relevant to (`Dataset.judged_nonrelevant`): a query that has some draws its negatives from
    those alone. The list columns hold numpy arrays, as the table reads back from parquet."""
    sampler, n, depth = get_sampler(cfg.sampler), cfg.num_negatives, cfg.depth
    query_ids = sorted(positives)
    pair_query, positive_ids, ordinals = pairs_of(positives, query_ids)
    windows = np.array([(positive_windows or {}).get((query_ids[q], d), 0)
                        for q, d in zip(pair_query, positive_ids, strict=True)], dtype=np.int64)
    if not sampler.mines:
        return negatives_table(query_ids, pair_query, positive_ids, windows, [], np.zeros(len(pair_query), np.int64))
    check_inputs(sampler, rankings, corpus_ids, positive_scores)
    docs = corpus_ids if isinstance(corpus_ids, SortedIds) else sorted_ids(corpus_ids)
    keys = pair_keys(cfg.seed, round_, query_ids, pair_query, ordinals)  # (P,)
    own = s_pos = pair_positive_scores(sampler, query_ids, pair_query, positive_ids, positive_scores)
    if cfg.margin is not None and sampler.rankings and np.isnan(own).any():
        i = int(np.flatnonzero(np.isnan(own))[0])
        raise AnceError(f"mining.margin needs the positives' scores, which this ranking does not have (none for "
                        f"positive '{positive_ids[i]}' of query '{query_ids[pair_query[i]]}')")
    excluded = excluded_documents(query_ids, positives, relevant or positives)
    by_query = (np.repeat(np.arange(len(query_ids)), [len(e) for e in excluded]), [d for e in excluded for d in e])
    candidates = {r: pair_candidates(read_ranking(rankings[r], query_ids, depth, by_query), pair_query, cfg.skip_top,
                                     cfg.margin, own) for r in sampler.rankings}
    if cfg.judged_only and judged:
        restricted = np.array([bool(judged.get(q)) for q in query_ids], dtype=bool)
        pairs = (np.repeat(np.arange(len(query_ids)), [len(judged.get(q, ())) for q in query_ids]),
                 [d for q in query_ids for d in sorted(judged.get(q, ()))])
        candidates = {r: only_judged(c, pairs, restricted) for r, c in candidates.items()}
    tables = []
    for draw in range(draws):
        keys_d = draw_keys(keys, draw)
        drawn, wanted = sampler.draw(Pairs(candidates, s_pos, cfg.simans_a, cfg.simans_b, keys_d), n)
        parts = [drawn_negatives(candidates[d.ranking], d) for d in drawn]
        got = sum((d.count for d in drawn), np.zeros(len(keys), dtype=np.int64))
        if len(short := np.flatnonzero(got < n)):  # the fallback (and bm25+random's random half)
            banned = [excluded[pair_query[i]] + given for i, given in zip(short, given_to(parts, short), strict=True)]
            parts.append(random_negatives(short, random_docs(docs, keys_d[short], n - got[short], banned)))
        tables.append(negatives_table(query_ids, pair_query, positive_ids, windows, parts,
                                      np.broadcast_to(wanted, len(keys)) - got))
    table = with_redraws(tables[0], tables[1:])
    if warn_short:
        warn_fallback(cfg, table)
    return table


# the later draws of a mined table (`draws` > 1): draw d's negatives are redrawn_ids[(d-1)*n : d*n] (and windows)
# (and the teacher's scores of them: negatives/teacher.py)
REDRAWN = {"redrawn_ids": "negative_ids", "redrawn_windows": "negative_windows", "redrawn_teacher": "teacher_negatives"}


def with_redraws(table: pd.DataFrame, later: list[pd.DataFrame]) -> pd.DataFrame:
    """Draw 0's table with the negatives of the later draws of the same pairs in REDRAWN's columns."""
    if not later or table.empty:
        return table
    columns = {}
    for column, source in REDRAWN.items():
        if source not in later[0]:
            continue
        stacked = np.concatenate([np.stack(list(t[source])) for t in later], axis=1)  # (P, (draws-1)·n)
        columns[column] = list(stacked)
    return table.assign(**columns)


def negative_draws(table: pd.DataFrame) -> int:
    """How many draws a mined table holds (1 when it has no REDRAWN columns)."""
    if "redrawn_ids" not in table or table.empty:
        return 1
    n = len(table["negative_ids"].iloc[0])
    return 1 + (len(table["redrawn_ids"].iloc[0]) // n if n else 0)


def read_training_pairs(path: str | Path) -> pd.DataFrame:
    """A mined table as training reads it: without the negatives' ranks and scores (kept for the statistics and
    the UI; ~100 MB of per-row arrays at 500k pairs)."""
    names = pq.read_schema(path).names
    return pd.read_parquet(path, columns=[c for c in names if c not in ("negative_ranks", "negative_scores")])


def epoch_negatives(table: pd.DataFrame, draw: int) -> pd.DataFrame:
    """The table with draw `draw`'s negatives (their MaxP windows, their teacher scores) in negative_ids /
    negative_windows / teacher_negatives (draw 0: as it is; ranks and scores stay draw 0's: training reads only
    those)."""
    if draw == 0:
        return table
    n = len(table["negative_ids"].iloc[0])
    cut = slice((draw - 1) * n, draw * n)
    return table.assign(**{source: [np.asarray(v)[cut] for v in table[column]] for column, source in REDRAWN.items()
                           if column in table})


def check_inputs(sampler: Sampler, rankings: Mapping | None, corpus_ids: Sequence[str] | None,
                 positive_scores: dict | None) -> None:
    """What a mined sampler cannot do without: the corpus ids, its rankings, the positives' scores (SimANS)."""
    if corpus_ids is None:
        raise AnceError(f"sampler '{sampler.name}' needs the corpus ids (random documents, and the fallback)")
    if missing := [r for r in sampler.rankings if (rankings or {}).get(r) is None]:
        raise AnceError(f"sampler '{sampler.name}' needs a {' and a '.join(missing)} ranking to mine from")
    if sampler.needs_positive_score and positive_scores is None:
        raise AnceError(f"sampler '{sampler.name}' needs the positives' scores (a dense retrieval stage writes them)")


# what some pairs were given: (pair index, doc ids, ranks, scores, MaxP windows), one entry per negative
Negatives = tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray, np.ndarray]


def drawn_negatives(candidates: Candidates, drawn: Drawn) -> Negatives:
    """The negatives a sampler drew from one ranking, pair by pair, each pair's in rank order."""
    pair, slot = np.nonzero(drawn.position >= 0)
    rows, ranking = candidates.rows(pair, drawn.position[pair, slot]), candidates.ranking
    window = ranking.window[rows] if ranking.window is not None else np.zeros(len(rows), dtype=np.int64)
    return pair, ranking.doc_ids(rows), ranking.rank[rows], ranking.score[rows].astype(np.float64), window


def given_to(parts: list[Negatives], pairs: np.ndarray) -> list[list[str]]:
    """The documents `parts` gave each of some pairs."""
    out: dict[int, list[str]] = {int(i): [] for i in pairs}
    for pair, doc_ids, *_ in parts:
        mine = np.isin(pair, pairs)
        for i, doc_id in zip(pair[mine].tolist(), doc_ids.filter(pa.array(mine)).to_pylist(), strict=True):
            out[i].append(doc_id)
    return [out[int(i)] for i in pairs]


def random_negatives(pairs: np.ndarray, docs: list[list[str]]) -> Negatives:
    """Random documents given to some pairs: rank 0, score NaN, window 0."""
    size = sum(len(d) for d in docs)
    return (np.repeat(pairs, [len(d) for d in docs]), pa.array([d for ds in docs for d in ds], type=pa.string()),
            np.zeros(size, dtype=np.int64), np.full(size, np.nan), np.zeros(size, dtype=np.int64))


def negatives_table(query_ids: list[str], pair_query: np.ndarray, positive_ids: list[str], positive_windows: np.ndarray,
                    parts: list[Negatives], fallback: np.ndarray) -> pd.DataFrame:
    """The mined table (COLUMNS): a pair's negatives are those of `parts` in their order; the list columns hold numpy
    arrays, as a parquet file of the table reads back (built as Arrow lists: no Python list per pair)."""
    parts = parts or [(np.zeros(0, dtype=np.int64), pa.array([], type=pa.string()), np.zeros(0, dtype=np.int64),
                       np.zeros(0), np.zeros(0, dtype=np.int64))]
    pair = np.concatenate([part[0] for part in parts])
    order = np.argsort(pair, kind="stable")  # by pair; within one, in the order of the parts
    offsets = pa.array(np.searchsorted(pair[order], np.arange(len(pair_query) + 1)), type=pa.int32())
    doc_ids = pa.concat_arrays([part[1].cast(pa.string()) for part in parts]).take(pa.array(order))
    columns = [doc_ids] + [pa.array(np.concatenate([part[k] for part in parts])[order]) for k in (2, 3, 4)]
    ids, ranks, scores, windows = (pa.ListArray.from_arrays(offsets, values).to_numpy(zero_copy_only=False)
                                   for values in columns)
    return pd.DataFrame({"query_id": [query_ids[q] for q in pair_query], "positive_id": positive_ids,
                         "negative_ids": ids, "negative_ranks": ranks, "negative_scores": scores,
                         "fallback": np.asarray(fallback, dtype=np.int64), "positive_window": positive_windows,
                         "negative_windows": windows}, columns=COLUMNS)


def warn_fallback(cfg: MiningConfig, table: pd.DataFrame) -> None:
    """One warning naming the queries of a mined table that had too few candidates (their rows' `fallback` > 0)."""
    queries = list(dict.fromkeys(table.loc[table["fallback"] > 0, "query_id"]))
    if not queries:
        return
    warn(f"mining ({cfg.sampler}, top-{cfg.depth}{f', skip_top {cfg.skip_top}' if cfg.skip_top else ''}"
         f"{f', margin {cfg.margin}' if cfg.margin is not None else ''}): {len(queries)} of "
         f"{table['query_id'].nunique()} queries had fewer than the {cfg.num_negatives} candidate negatives they need "
         f"(nothing retrieved, or too few left after the false-negative controls); their "
         f"{int(table['fallback'].sum())} missing negatives were drawn uniformly from the corpus minus their "
         f"relevant documents: {preview(queries)}")


def fallback_stats(table: pd.DataFrame) -> dict[str, int]:
    """How many queries and negatives of a mined table came from the fallback (see the module docstring)."""
    used = table["fallback"] > 0 if "fallback" in table else pd.Series(False, index=table.index)
    return {"fallback_queries": int(table.loc[used, "query_id"].nunique()),
            "fallback_negatives": int(table["fallback"].sum()) if "fallback" in table else 0}
