"""Counter-based randomness: uniforms keyed by (seed, round, query, pair, stream, counter), and sequential weighted
draws without replacement."""

import itertools

import numpy as np

from ance_core.negatives.randomness import draw_sequentially, pair_keys, uniforms


def test_a_pair_key_depends_on_its_query_seed_round_and_place_only():
    keys = pair_keys(42, 1, ["qa", "qb", "qc"], np.array([0, 0, 1, 2]), np.array([0, 1, 0, 0]))
    alone = pair_keys(42, 1, ["qb"], np.array([0]), np.array([0]))
    assert keys[2] == alone[0]  # qb's first positive, whichever queries are keyed with it
    assert len(set(keys.tolist())) == 4
    assert pair_keys(43, 1, ["qb"], np.array([0]), np.array([0]))[0] != alone[0]
    assert pair_keys(42, 2, ["qb"], np.array([0]), np.array([0]))[0] != alone[0]
    assert pair_keys(-1, 0, ["qb"], np.array([0]), np.array([0])).dtype == np.uint64  # any int seed


def test_uniforms_are_uniform_in_the_open_interval_and_keyed():
    keys = pair_keys(0, 0, [f"q{i}" for i in range(2000)], np.arange(2000), np.zeros(2000, dtype=np.int64))
    u = uniforms(keys, "dense", np.tile(np.arange(50), (2000, 1)))  # (2000, 50)
    assert u.shape == (2000, 50) and (u > 0).all() and (u < 1).all()
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.abs(counts / u.size - 0.1).max() < 0.01  # 100,000 draws: ±0.001 expected
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.1  # neighbouring counters
    assert np.array_equal(uniforms(keys, "dense", np.arange(50)[None]), u)  # (1, k) counters: the same for all
    assert not np.array_equal(uniforms(keys, "bm25", np.arange(50)[None]), u)
    assert np.array_equal(uniforms(keys[5:6], "dense", np.arange(50)[None])[0], u[5])


def test_sequential_draws_respect_weights_counts_and_zeros():
    weights = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 2.0, 0.0], [0.0] * 4, [1.0] * 4])
    keys = pair_keys(1, 1, ["a", "b", "c", "d"], np.arange(4), np.zeros(4, dtype=np.int64))
    drawn = draw_sequentially(weights, np.array([2, 3, 1, 4]), keys, "dense")
    assert drawn.shape == (4, 4)
    assert drawn[0, 2:].tolist() == [-1, -1] and 1 not in drawn[0] and drawn[0, 0] < drawn[0, 1]
    assert drawn[1].tolist() == [2, -1, -1, -1]  # only one has weight: one drawn, not three
    assert drawn[2].tolist() == [-1] * 4
    assert drawn[3].tolist() == [0, 1, 2, 3]
    assert draw_sequentially(weights, 0, keys, "dense").shape == (4, 0)


def test_sequential_draws_of_two_follow_plackett_luce():
    """Two without replacement from weights 1:2:3:4, over 40,000 rows: each unordered pair {i, j} is drawn with
    probability p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j), the law of numpy's choice(replace=False, p=p)."""
    rows, p = 40_000, np.array([1.0, 2.0, 3.0, 4.0]) / 10
    keys = pair_keys(7, 0, [f"q{i}" for i in range(rows)], np.arange(rows), np.zeros(rows, dtype=np.int64))
    drawn = draw_sequentially(np.tile(p, (rows, 1)), 2, keys, "dense")
    seen = {pair: 0 for pair in itertools.combinations(range(4), 2)}
    for i, j in drawn.tolist():
        seen[(i, j)] += 1
    for (i, j), count in seen.items():
        expected = p[i] * p[j] / (1 - p[i]) + p[j] * p[i] / (1 - p[j])
        assert abs(count / rows - expected) < 0.01, (i, j, count / rows, expected)
