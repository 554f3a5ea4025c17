"""The negative samplers, as a registry: one small function per sampler, registered by name with what it needs.

A mined sampler (`@mined`) declares the rankings it mines (`dense`: the ANN ranking of the model being trained;
`bm25`: a BM25 ranking; none) and its default depth, and draws the negatives of all the (query, positive) pairs at
once (`Pairs`: arrays over pairs × candidates) from each pair's candidates: each ranking's top-depth minus every
labelled-relevant document, after the false-negative controls (negatives/mining.py does the rest for all of them: the
pairs, their random keys, the fallback, the table). `Pairs.draw` samples without replacement, uniformly or with
probabilities, from counter-based random numbers (negatives/randomness.py). An in-batch sampler (`@in_batch`) mines
nothing and says what it asks of training instead.

Everything else reads this registry: the config's sampler names and their validation (which ones need a trained
model, which mine BM25 candidates), the stages each sampler runs (tasks/refresh.py), its depth. Adding a sampler is
one function here and its test.

- `ance`: uniform from the retrieval top-k (default 200) minus all positives (ANCE eq. 10; the paper's sampler).
- `simans`: from the top-k (default 100) ranked negatives, without replacement, with
  p_i ∝ exp(-a (s(q, d_i) - s(q, d⁺) - b)²) (SimANS eq. 4), s(q, d⁺) the exact dense score of the pair's own
  positive, as the authors' code centres on the positive a query trains on (the retrieval stage scores every
  labelled positive, also one the top-k did not retrieve).
- `bm25`: uniform from the BM25 top-k (default 100); `random`: uniform from the corpus; `bm25+random`: half of each
  (an odd one from either, with probability 1/2), ANCE's "BM25 + Rand Neg".
- `ance+bm25`: half from the model's ANN top-k, half from BM25's top-k (default 200 both; an odd one from either, with
  probability 1/2; never one document twice): hard negatives of both kinds, lexical and semantic.
- `in-batch`: no mined negatives, each query contrasts with the other queries' positives; `nce`: only the hardest of
  those (the `num_negatives` highest-scoring per query), see ance_core.training.loss.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ance_core.errors import AnceError
from ance_core.negatives.candidates import Candidates, pairs_in
from ance_core.negatives.randomness import draw_sequentially, uniforms

RANKINGS = ("dense", "bm25")


@dataclass(frozen=True)
class Drawn:
    """What a sampler drew from one ranking: (P, m) columns of each pair's candidate matrices, in rank order, -1
    after them."""

    ranking: str
    position: np.ndarray

    @property
    def count(self) -> np.ndarray:
        """(P,) how many each pair got."""
        return (self.position >= 0).sum(axis=1)


@dataclass(frozen=True)
class Pairs:
    """The P (query, positive) pairs being mined and what a mined sampler draws from: each ranking's candidates per
    pair ((P, D) matrices in rank order: the top-depth minus every labelled-relevant document, after the false-negative
    controls), the positive's score s(q, d⁺) per pair (NaN when unknown), the SimANS options, and each pair's random
    key (ance_core/negatives/randomness.py)."""

    candidates: Mapping[str, Candidates]
    positive_score: np.ndarray
    simans_a: float
    simans_b: float
    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def coin(self) -> np.ndarray:
        """(P,) one uniform in (0, 1) per pair."""
        return uniforms(self.keys, "coin", np.zeros(len(self.keys), dtype=np.int64))

    def draw(self, ranking: str, n: int | np.ndarray, p: np.ndarray | None = None) -> Drawn:
        """Up to n (per pair) distinct candidates of `ranking` without replacement, uniformly or with probabilities p
        ((P, D)); fewer where fewer can be drawn (those of probability 0 cannot)."""
        c = self.candidates[ranking]
        weights = c.valid.astype(np.float64) if p is None else np.where(c.valid, p, 0.0)
        return Drawn(ranking, draw_sequentially(weights, n, self.keys, ranking))

    def without(self, ranking: str, drawn: Drawn) -> "Pairs":
        """These pairs with the documents `drawn` (from any ranking) no longer candidates of `ranking`."""
        c, source = self.candidates[ranking], self.candidates[drawn.ranking]
        pair, slot = np.nonzero(drawn.position >= 0)
        taken = source.ranking.doc_ids(source.rows(pair, drawn.position[pair, slot]))
        p, j = np.nonzero(c.valid)
        same = pairs_in(p, c.ranking.doc_ids(c.rows(p, j)), pair, taken)
        valid = c.valid.copy()
        valid[p[same], j[same]] = False
        return replace(self, candidates={**self.candidates, ranking: replace(c, valid=valid)})


# (pairs, n) -> (the negatives drawn from each ranking, how many each pair wanted from its rankings: (P,) or one for
# all): wanted - drawn come from the fallback (counted); n - wanted are random documents by design (bm25+random)
Draw = Callable[[Pairs, int], tuple[list[Drawn], np.ndarray | int]]


@dataclass(frozen=True)
class Sampler:
    name: str
    about: str  # one line, for the config's description and the docs
    rankings: tuple[str, ...] = ()
    default_depth: int | None = None
    draw: Draw | None = None  # None: an in-batch sampler, nothing mined
    needs_positive_score: bool = False  # centres on s(q, d⁺), the pair's positive's score (SimANS eq. 4)
    training: Callable[[Any, Any], dict] | None = None  # (train config, mining config) -> fields training must take

    @property
    def mines(self) -> bool:
        """Writes negatives per pair (every sampler but the in-batch ones)."""
        return self.draw is not None

    @property
    def needs_model(self) -> bool:
        """Ranks with the model being trained (so not in the warm-up, which has none yet)."""
        return "dense" in self.rankings

    @property
    def uses_bm25(self) -> bool:
        return "bm25" in self.rankings

    def depth(self, top_k: int | None) -> int | None:
        """The ranking depth it mines from: `top_k`, else its default (None: it mines no ranking)."""
        return (top_k or self.default_depth) if self.rankings else None


SAMPLERS: dict[str, Sampler] = {}


def mined(name: str, about: str, rankings: tuple[str, ...] = (), depth: int | None = None,
          needs_positive_score: bool = False) -> Callable[[Draw], Draw]:
    """Register a mined sampler: `rankings` it mines (dense, bm25), their default `depth`."""
    if unknown := set(rankings) - set(RANKINGS):
        raise ValueError(f"sampler '{name}': unknown ranking {sorted(unknown)}; choose from {RANKINGS}")

    def register(draw: Draw) -> Draw:
        SAMPLERS[name] = Sampler(name, about, rankings, depth, draw, needs_positive_score)
        return draw

    return register


def in_batch(name: str, about: str) -> Callable:
    """Register an in-batch sampler: a function (train config, mining config) -> the training fields it sets."""

    def register(training: Callable[[Any, Any], dict]) -> Callable:
        SAMPLERS[name] = Sampler(name, about, training=training)
        return training

    return register


def get_sampler(name: str) -> Sampler:
    if name not in SAMPLERS:
        raise AnceError(f"unknown sampler '{name}'; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name]


def train_config_for(mining: Any, train: Any) -> Any:
    """The training config a stage runs with: what its sampler asks of training (in-batch samplers need in-batch
    negatives; nce keeps the hardest n)."""
    training = get_sampler(mining.sampler).training
    return train.model_copy(update=training(train, mining)) if training else train


def simans_probabilities(scores: np.ndarray, positive_score: float | np.ndarray, a: float, b: float,
                         drawable: np.ndarray | None = None) -> np.ndarray:
    """SimANS eq. 4 over candidate scores (the last axis), normalised (computed in log space: no underflow for large
    a); 0 where not `drawable`. `positive_score` broadcasts: (P, 1) against (P, D) scores."""
    logits = -a * (np.asarray(scores, dtype=np.float64) - positive_score - b) ** 2
    if drawable is not None:
        logits = np.where(drawable, logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True, initial=-np.inf)
    weights = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(axis=-1, keepdims=True)
    return weights / np.where(total > 0, total, 1.0)


def half(n: int, coin: np.ndarray) -> np.ndarray:
    """1:1 in expectation: an odd one goes either way with p = 1/2 ((P,) coins in (0, 1))."""
    return n // 2 + (n % 2) * (coin < 0.5)


@mined("ance", "uniform from the model's ANN top-k minus all positives (ANCE eq. 10)", ("dense",), 200)
def ance(pairs: Pairs, n: int) -> tuple[list[Drawn], int]:
    return [pairs.draw("dense", n)], n


@mined("simans", "ambiguous negatives around the positive's score, p ∝ exp(-a (s - s⁺ - b)²) (SimANS eq. 4)",
       ("dense",), 100, needs_positive_score=True)
def simans(pairs: Pairs, n: int) -> tuple[list[Drawn], int]:
    c = pairs.candidates["dense"]
    p = simans_probabilities(c.score, pairs.positive_score[:, None], pairs.simans_a, pairs.simans_b, c.valid)
    return [pairs.draw("dense", n, p)], n  # weights far from s⁺ can underflow to 0: not drawable


@mined("bm25", "uniform from BM25's top-k minus positives", ("bm25",), 100)
def bm25(pairs: Pairs, n: int) -> tuple[list[Drawn], int]:
    return [pairs.draw("bm25", n)], n


@mined("random", "uniform from the corpus minus positives")
def random_documents(pairs: Pairs, n: int) -> tuple[list[Drawn], int]:
    return [], 0


@mined("bm25+random", "half from bm25, half random (ANCE's BM25 + Rand Neg)", ("bm25",), 100)
def bm25_random(pairs: Pairs, n: int) -> tuple[list[Drawn], np.ndarray]:
    wanted = half(n, pairs.coin())
    return [pairs.draw("bm25", wanted)], wanted


@mined("ance+bm25", "half from the model's ANN top-k (ance), half from BM25's top-k (bm25)", ("dense", "bm25"), 200)
def ance_bm25(pairs: Pairs, n: int) -> tuple[list[Drawn], int]:
    dense = pairs.draw("dense", half(n, pairs.coin()))
    return [dense, pairs.without("bm25", dense).draw("bm25", n - dense.count)], n


@in_batch("in-batch", "none mined: each query contrasts with the other queries' positives in its batch")
def in_batch_negatives(train: Any, mining: Any) -> dict:
    return {"in_batch_negatives": True, "hardest_in_batch": None}


@in_batch("nce", "none mined: only the num_negatives highest-scoring of those in-batch negatives (NCE Neg)")
def nce(train: Any, mining: Any) -> dict:
    return {"in_batch_negatives": True, "hardest_in_batch": mining.num_negatives}


NAMES = tuple(SAMPLERS)
MINED = tuple(name for name, s in SAMPLERS.items() if s.mines)
WITHOUT_MODEL = tuple(name for name, s in SAMPLERS.items() if not s.needs_model)  # what a warm-up can use
