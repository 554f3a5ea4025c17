"""The negative samplers, as a registry: one small function per sampler, registered by name with what it needs.

A mined sampler (`@mined`) declares the rankings it mines (`dense`: the ANN ranking of the model being trained;
`bm25`: a BM25 ranking; none) and its default depth, and draws one (query, positive) pair's negatives from that pair's
candidates: each ranking's top-depth minus every labelled-relevant document, after the false-negative controls
(negatives/mining.py does the rest for all of them: the seeded generator, the fallback, the table). An in-batch
sampler (`@in_batch`) mines nothing and says what it asks of training instead.

Everything else reads this registry: the config's sampler names and their validation (which ones need a trained
model, which mine BM25 candidates), the stages each sampler runs (tasks/refresh.py), its depth. Adding a sampler is
one function here and its test.

- `ance`: uniform from the retrieval top-k (default 200) minus all positives (ANCE eq. 10; the paper's sampler).
- `simans`: from the top-k (default 100) ranked negatives, without replacement, with
  p_i ∝ exp(-a (s(q, d_i) - s(q, d⁺) - b)²) (SimANS eq. 4), s(q, d⁺) the exact dense score of a positive drawn at
  random per pair (the retrieval stage scores every labelled positive, also one the top-k did not retrieve).
- `bm25`: uniform from the BM25 top-k (default 100); `random`: uniform from the corpus; `bm25+random`: half of each
  (an odd one from either, with probability 1/2), ANCE's "BM25 + Rand Neg".
- `ance+bm25`: half from the model's ANN top-k, half from BM25's top-k (default 200 both; an odd one from either, with
  probability 1/2; never one document twice): hard negatives of both kinds, lexical and semantic.
- `in-batch`: no mined negatives, each query contrasts with the other queries' positives; `nce`: only the hardest of
  those (the `num_negatives` highest-scoring per query), see ance_core.training.loss.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ance_core.errors import AnceError

RANKINGS = ("dense", "bm25")
EMPTY_RANKING = pd.DataFrame({"doc_id": pd.Series(dtype=object), "rank": pd.Series(dtype=np.int64),
                              "score": pd.Series(dtype=np.float32)})


@dataclass(frozen=True)
class Pair:
    """What a mined sampler draws from for one (query, positive) pair: each ranking's candidates in rank order
    (doc_id, rank, score, and window for MaxP rankings), the positive's score s(q, d⁺) when known, and the SimANS
    options."""

    query_id: str
    candidates: Mapping[str, pd.DataFrame]
    positive_score: float | None
    simans_a: float
    simans_b: float


# (pair, n, rng) -> (the negatives drawn, how many the sampler wanted from its rankings): wanted - drawn come from the
# fallback (counted); n - wanted are random documents by design (bm25+random)
Draw = Callable[[Pair, int, np.random.Generator], tuple[pd.DataFrame, int]]


@dataclass(frozen=True)
class Sampler:
    name: str
    about: str  # one line, for the config's description and the docs
    rankings: tuple[str, ...] = ()
    default_depth: int | None = None
    draw: Draw | None = None  # None: an in-batch sampler, nothing mined
    needs_positive_score: bool = False  # draws s(q, d⁺) of a random positive of the query first (SimANS §4.1)
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


def simans_probabilities(scores: np.ndarray, positive_score: float, a: float, b: float) -> np.ndarray:
    """SimANS eq. 4 over candidate scores, normalised (computed in log space: no underflow for large a)."""
    logits = -a * (np.asarray(scores, dtype=np.float64) - positive_score - b) ** 2
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def sample_uniform(candidates: pd.DataFrame, n: int, rng: np.random.Generator,
                   p: np.ndarray | None = None) -> pd.DataFrame:
    """n distinct candidates without replacement, uniformly (or with probabilities `p`), kept in rank order."""
    if len(candidates) < n:
        raise AnceError(f"only {len(candidates)} negative candidates but {n} requested")
    picked = np.sort(rng.choice(len(candidates), size=n, replace=False, p=p))
    return candidates.iloc[picked]


def draw_at_most(candidates: pd.DataFrame, n: int, rng: np.random.Generator,
                 p: np.ndarray | None = None) -> pd.DataFrame:
    """Up to n of the candidates (fewer when fewer can be drawn: those of probability 0 cannot); the generator is not
    touched when none can."""
    take = min(n, len(candidates) if p is None else int((p > 0).sum()))
    return sample_uniform(candidates, take, rng, p) if take else EMPTY_RANKING


def half(n: int, rng: np.random.Generator) -> int:
    """1:1 in expectation: an odd one goes either way with p = 1/2."""
    return n // 2 + (int(rng.random() < 0.5) if n % 2 else 0)


@mined("ance", "uniform from the model's ANN top-k minus all positives (ANCE eq. 10)", ("dense",), 200)
def ance(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    return draw_at_most(pair.candidates["dense"], n, rng), n


@mined("simans", "ambiguous negatives around the positive's score, p ∝ exp(-a (s - s⁺ - b)²) (SimANS eq. 4)",
       ("dense",), 100, needs_positive_score=True)
def simans(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    candidates = pair.candidates["dense"]
    p = (simans_probabilities(candidates["score"].to_numpy(), pair.positive_score, pair.simans_a, pair.simans_b)
         if len(candidates) else None)
    return draw_at_most(candidates, n, rng, p), n  # weights far from s⁺ can underflow to 0: not drawable


@mined("bm25", "uniform from BM25's top-k minus positives", ("bm25",), 100)
def bm25(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    return draw_at_most(pair.candidates["bm25"], n, rng), n


@mined("random", "uniform from the corpus minus positives")
def random_documents(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    return EMPTY_RANKING, 0


@mined("bm25+random", "half from bm25, half random (ANCE's BM25 + Rand Neg)", ("bm25",), 100)
def bm25_random(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    wanted = half(n, rng)
    return draw_at_most(pair.candidates["bm25"], wanted, rng), wanted


@mined("ance+bm25", "half from the model's ANN top-k (ance), half from BM25's top-k (bm25)", ("dense", "bm25"), 200)
def ance_bm25(pair: Pair, n: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    dense = draw_at_most(pair.candidates["dense"], half(n, rng), rng)
    lexical = pair.candidates["bm25"]
    lexical = draw_at_most(lexical[~lexical["doc_id"].isin(dense["doc_id"])], n - len(dense), rng)
    return pd.concat([dense, lexical], ignore_index=True) if len(lexical) else dense, n


@in_batch("in-batch", "none mined: each query contrasts with the other queries' positives in its batch")
def in_batch_negatives(train: Any, mining: Any) -> dict:
    return {"in_batch_negatives": True, "hardest_in_batch": None}


@in_batch("nce", "none mined: only the num_negatives highest-scoring of those in-batch negatives (NCE Neg)")
def nce(train: Any, mining: Any) -> dict:
    return {"in_batch_negatives": True, "hardest_in_batch": mining.num_negatives}


NAMES = tuple(SAMPLERS)
MINED = tuple(name for name, s in SAMPLERS.items() if s.mines)
WITHOUT_MODEL = tuple(name for name, s in SAMPLERS.items() if not s.needs_model)  # what a warm-up can use
