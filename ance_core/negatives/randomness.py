"""Counter-based randomness for mining: every random number is a hash of (seed, round, query id, pair, stream,
counter), so a pair's negatives do not depend on which other queries are mined with it, in what order, or in how many
parts, and whole arrays of them are drawn at once (numpy, no generator per query).

A (query, positive) pair's key mixes the seed, the round, a 64-bit hash of the query id (blake2b) and the positive's
place among the query's sorted positives (SplitMix64's finaliser). A stream (what the numbers are for: a ranking's
draws, a coin, the fallback) and a counter (the draw's number) then give one uniform in (0, 1).

Sampling n without replacement (`draw_sequentially`) is n draws one after another, each of one candidate with
probability ∝ its weight among those left (inverse CDF: the first whose cumulative weight exceeds u·total): uniformly
with weights 1, or SimANS's p_i. This is the law of numpy's `choice(size=n, replace=False, p=p)`; one uniform per
(pair, draw), so a draw over all the pairs is a few passes over a (pairs × candidates) array.
"""

import hashlib
from collections.abc import Sequence

import numpy as np

GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment, 2^64 / golden ratio
STREAMS = {"dense": 1, "bm25": 2, "coin": 3, "fallback": 5, "sample": 6}  # (4: a positive drawn, until session 29)
_U64 = 2**64


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise over uint64 (at least 1-d: numpy wraps array products silently): a
    bijection whose outputs for neighbouring inputs look independent."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def query_hash(query_id: str) -> int:
    """64 bits of blake2b of the id (crc32's 32 would give ~30 pairs of colliding ids among 500k queries)."""
    return int.from_bytes(hashlib.blake2b(query_id.encode(), digest_size=8).digest(), "little")


def pair_keys(seed: int, round_: int, query_ids: Sequence[str], pair_query: np.ndarray,
              ordinals: np.ndarray) -> np.ndarray:
    """(P,) uint64 key of each pair: its query `query_ids[pair_query[i]]`, the positive's place `ordinals[i]`."""
    base = mix(mix(np.array([seed % _U64], dtype=np.uint64)) + np.uint64(round_ % _U64))
    queries = mix(base ^ np.array([query_hash(q) for q in query_ids], dtype=np.uint64).reshape(-1))
    return mix(queries[pair_query] + np.asarray(ordinals, dtype=np.uint64) * GAMMA)


def draw_keys(keys: np.ndarray, draw: int) -> np.ndarray:
    """The pairs' keys for another draw of the same candidates (an epoch's negatives, `mining.sample_negatives`
    draws): draw 0 is `keys` themselves (the negatives a single draw gives), draw d > 0 an independent mix."""
    if draw == 0:
        return keys
    return mix(keys ^ mix(np.array([draw], dtype=np.uint64) * GAMMA))


def round_sample(query_ids: Sequence[str], n: int | None, seed: int, round_: int) -> list[str]:
    """The n of `query_ids` a round mines (`mining.queries`), sorted: those of the n smallest hashes of (seed, round,
    query id), a uniform sample without replacement that does not depend on the ids' order, drawn again each round.
    All of them (sorted) when n is None or covers them. (The negatives analysis's sample, the same every round, is
    negatives/analysis.py `query_sample`.)"""
    ids = sorted(query_ids)
    if n is None or n >= len(ids):
        return ids
    keys = uniforms(pair_keys(seed, round_, ids, np.arange(len(ids)), np.zeros(len(ids))), "sample",
                    np.zeros(len(ids)))
    return [ids[i] for i in np.sort(np.argpartition(keys, n - 1)[:n])]


def uniforms(keys: np.ndarray, stream: str, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), float64, one per (key, counter): (P,) keys with (P,) counters -> (P,); with 2-d counters,
    (P, k) or (1, k) for the same k for every key -> (P, k)."""
    streams = mix(keys + np.uint64(STREAMS[stream] * int(GAMMA) % _U64))
    counters = np.asarray(counters).astype(np.uint64)
    x = mix((streams if counters.ndim == 1 else streams[:, None]) + (counters + np.uint64(1)) * GAMMA)
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # 53 random bits, never 0 or 1


def draw_sequentially(weights: np.ndarray, n: np.ndarray | int, keys: np.ndarray, stream: str) -> np.ndarray:
    """Up to n[i] distinct columns of row i, drawn one after another with probability ∝ the weights left ((P, D),
    0: cannot be drawn; fewer where fewer have weight) -> (P, m) the columns drawn, ascending (rank order), then -1;
    m = max(n), at most D. Draw k of row i uses the uniform of (keys[i], stream, k)."""
    rows, width = weights.shape
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), (rows,))
    m = min(int(n.max(initial=0)), width)
    drawn = np.full((rows, m), width, dtype=np.int64)
    weights = weights.copy() if m > 1 else weights
    for k in range(m):
        cumulative = np.cumsum(weights, axis=1)  # (P, D)
        total = cumulative[:, -1]
        target = uniforms(keys, stream, np.full(rows, k)) * total
        column = (cumulative <= target[:, None]).sum(axis=1)  # the first whose cumulative weight exceeds the target
        if (over := column >= width).any():  # u·total rounded up to the total: the last column of weight > 0
            column[over] = width - 1 - np.argmax(weights[over, ::-1] > 0, axis=1)
        live = np.flatnonzero((k < n) & (total > 0))
        drawn[live, k] = column[live]
        if k + 1 < m:
            weights[live, column[live]] = 0
    drawn.sort(axis=1)
    return np.where(drawn < width, drawn, -1)
