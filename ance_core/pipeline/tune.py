"""A recipe chosen on the user's own dev split (`ance tune`, `recipe: auto`): a small set of candidate recipes run as
trials with successive halving over seeds, paired with the baseline recipe, the winner required to beat it by a
margin.

The candidates (`candidates`): the base recipe (`TuneConfig.recipe`, the baseline: the first and simplest) and its
variants over the learning rate of both stages, which graded positives train (each query's top grade, the
collection's top grade, every relevant document: one candidate where the qrels are binary) and the warm-up's epochs.
A candidate's simplicity is the number of settings it changes; the order of the lists breaks ties.

The rungs (`Rung`, `rungs`): rung 0 trains every candidate's warm-up only (planned as in its whole recipe), under
the first seed, and scores the warm-up; rung 1 runs the whole recipe of the best 1/eta of the challengers under the
first seed, and each rung after the best 1/eta of the rung before under one more seed, ranked by the mean over its
seeds. The baseline runs every rung beside them (the others are paired with it). A whole recipe's trial scores the
dev nDCG@10 of the dense model the run would deliver: its best on the dev split, the starting (pretrained) model
included.

The decision (`decide`): among the candidates the last rung ran (none whose trial failed), the best mean paired
difference to the baseline over their common seeds; it wins when that difference is above `margin`, else the
baseline stays (the simpler candidate on ties). A time budget (minutes of trials) stops the search early; the
decision is then made on the trials run.

Under `selection: cv` every trial is a cross-validated run (a pipeline run per dev fold) and scores its model's dev
nDCG@10 pooled over every fold's dev queries: for dev splits too small to tell candidates apart, at about
fold_count times each trial's cost.
"""

import dataclasses
import itertools
import json
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from ance_core.data.dataset import QUERY_TOP_GRADE
from ance_core.errors import AnceError
from ance_core.pipeline.report import CV_KEY, DEV_KEY, dense_of, is_hybrid
from ance_core.stage_config import SEED_MAX, StageConfig

if TYPE_CHECKING:
    from ance_core.data.dataset import Dataset
    from ance_core.pipeline.config import PipelineConfig

MAX_BUDGET = 525_600.0  # minutes: a year (a larger budget's seconds overflowed the search's arithmetic)
PositivesRule = Literal["query-top", "collection-top", "all"]
RecipeName = Literal["demo", "full", "full-maxp"]  # the recipes module's RECIPES (a test holds them equal): a choice
# in the UI's run form, where any text was taken and a misspelt recipe ran as the form's config


class TuneConfig(StageConfig):
    """What `ance tune` searches and how long (module docstring)."""

    recipe: RecipeName = Field("demo", description="The recipe the candidates vary (the baseline candidate itself)")
    learning_rates: list[PositiveFloat] = Field([4e-5, 2e-5], min_length=1, description="Learning rates of both "
                                                "training stages (the recipe's own is the baseline's)")
    positives: list[PositivesRule] = Field(
        ["query-top", "collection-top", "all"], min_length=1, description="Which graded positives train: each query's "
        "top grade (train_min_relevance auto), the collection's top grade, every relevant document (grade 1); one "
        "candidate on binary qrels")
    warmup_epochs: list[PositiveInt] = Field([1, 2], min_length=1, description="Epochs of the BM25 warm-up")
    seeds: list[Annotated[int, Field(ge=0, le=SEED_MAX)]] = Field(
        [42, 43, 44], min_length=1, description="The seeds of the rungs: rung 0 (the warm-ups) and rung 1 (whole "
        "recipes) run under the first, each rung after under one more")
    eta: int = Field(3, ge=2, description="Each rung keeps the best 1/eta of the candidates of the rung before")
    margin: float = Field(0.005, ge=0, description="dev nDCG@10 a candidate must beat the baseline by (mean paired "
                          "difference over the seeds both ran)")
    budget_minutes: float = Field(90.0, gt=0, le=MAX_BUDGET, description="Wall minutes of trials (at most a year); "
                                  "the search stops before a trial "
                                  "(or a batch of Ray trials) that the time of those before it says would not fit, "
                                  "and decides on the trials run. Trials reused from an earlier search, and stages "
                                  "reused from runs outside it, count at the minutes they took then: a search resumed "
                                  "after an interruption decides as an uninterrupted one would, one run again with a "
                                  "larger budget goes on where the smaller stopped, and one after `ance run` budgets "
                                  "as one without it. The CLI without --budget-minutes takes the budget of the newest "
                                  "finished search of the same config and settings in the work folder")

    @field_validator("recipe", mode="before")
    @classmethod
    def _not_auto(cls, recipe: Any) -> Any:
        if recipe == "auto":  # (the recipes module's AUTO; `recipe_config` would advise `--recipe auto`)
            raise ValueError("the search varies a fixed recipe (demo, full, full-maxp), not 'auto', which is the "
                             "search")
        return recipe

    @model_validator(mode="after")
    def _distinct(self) -> "TuneConfig":
        for name in ("learning_rates", "positives", "warmup_epochs", "seeds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice: {values}")
        if len({f"{lr:g}" for lr in self.learning_rates}) != len(self.learning_rates):  # (named by "lr {:g}")
            raise ValueError(f"learning_rates lists a value twice to 6 significant digits: {self.learning_rates}")
        return self


@dataclass(frozen=True)
class Candidate:
    name: str
    overrides: dict[str, Any]  # dotted config keys -> values (`--set`), empty for the baseline
    changes: int = 0  # settings changed from the baseline (the learning rate of both stages is one)

    def sets(self) -> list[str]:
        return [f"{key}={value}" for key, value in self.overrides.items()]


def positive_grade(rule: PositivesRule, grades: list[int]) -> int | str:
    """`data.train_min_relevance` of a positives rule on a train split whose positive grades are `grades`."""
    if rule == "query-top":
        return "auto"
    return max(grades) if rule == "collection-top" else min(grades)


def training_pairs(tables: "Dataset", split: str, min_relevance: int | str) -> frozenset[tuple[str, str]]:
    """The (query, document) pairs of a split that train as positives under `min_relevance` ("auto": each query's own
    top grade), as `Dataset.positives` reads them for training."""
    rule = QUERY_TOP_GRADE if min_relevance == "auto" else min_relevance
    positives = dataclasses.replace(tables, min_relevance={split: rule}).positives(split)
    return frozenset((query, doc) for query, docs in positives.items() for doc in docs)


def candidates(cfg: TuneConfig, learning_rate: float | None, min_relevance: int | str, warmup_epochs: int,
               grades: list[int], pairs: Callable[[int | str], frozenset] | None = None) -> list[Candidate]:
    """The distinct candidates, simplest first; the first is the baseline (the recipe's `learning_rate` of both
    training stages, None when they train at two, `min_relevance` and `warmup_epochs`). On binary qrels (fewer than
    two positive grades) every positives rule trains the same pairs: the recipe's rule only. `pairs` (a rule's
    training pairs, `training_pairs`): a rule that trains the same pairs as a simpler one is that one (graded qrels
    whose queries each have one grade: every relevant document is each query's top grade), not a trial that cannot
    differ."""
    grades = sorted(set(grades)) or [1]
    rules = cfg.positives if len(grades) > 1 else [None]
    same: dict[frozenset, int | str] = {}  # training pairs -> the first rule's grade that trains them
    out: dict[tuple, Candidate] = {}
    # the baseline's learning rate as a listed one would name it; None (two stages at two rates): no listed rate is it
    base_rate = f"{learning_rate:g}" if learning_rate is not None else None
    for lr, rule, epochs in itertools.product([None, *cfg.learning_rates], [None, *rules],
                                              [warmup_epochs, *cfg.warmup_epochs]):
        grade = min_relevance if rule is None else positive_grade(rule, grades)
        grade = grade if pairs is None else same.setdefault(pairs(grade), grade)
        key = (base_rate if lr is None else f"{lr:g}", grade, epochs)  # (a rate as its name shows it: one per name)
        if key in out:
            continue
        overrides: dict[str, Any] = {}
        parts = []
        if lr is not None and key[0] != base_rate:
            overrides |= {"warmup.learning_rate": lr, "ance.learning_rate": lr}
            parts.append(f"lr {lr:g}")
        if grade != min_relevance:
            overrides["data.train_min_relevance"] = grade
            parts.append(f"positives {rule} (train_min_relevance {grade})")
        if epochs != warmup_epochs:
            overrides["warmup.epochs"] = epochs
            parts.append(f"warm-up {epochs} epoch{'s' * (epochs != 1)}")
        out[key] = Candidate(", ".join(parts) or f"{cfg.recipe} (baseline)", overrides, len(parts))
    return sorted(out.values(), key=lambda c: c.changes)  # (stable: the lists' order breaks ties)


@dataclass
class Scores:
    """The trials' scores: candidate name -> {(seed, whole recipe?): dev nDCG@10}."""

    order: list[str]  # the candidates, simplest first (the baseline first)
    values: dict[str, dict[tuple[int, bool], float]] = field(default_factory=dict)

    def add(self, name: str, seed: int, full: bool, score: float) -> None:
        self.values.setdefault(name, {})[(seed, full)] = score

    def mean(self, name: str, seeds: list[int], full: bool) -> float | None:
        got = [self.values.get(name, {}).get((s, full)) for s in seeds]
        return statistics.fmean(got) if got and None not in got else None

    def ranked(self, names: list[str], seeds: list[int], full: bool) -> list[str]:
        """`names` with a score on every seed, best mean first; on a tie the simpler."""
        scored = [(self.mean(n, seeds, full), n) for n in names if self.mean(n, seeds, full) is not None]
        return [n for _, n in sorted(scored, key=lambda x: (-round(x[0], 10), self.order.index(x[1])))]

    def paired(self, name: str, baseline: str) -> list[float]:
        """Per common seed of the whole recipe: the candidate's score minus the baseline's."""
        mine, base = self.values.get(name, {}), self.values.get(baseline, {})
        return [mine[k] - base[k] for k in sorted(mine) if k[1] and k in base]


@dataclass(frozen=True)
class Rung:
    number: int
    seeds: list[int]
    full: bool  # the whole recipe, or the warm-up only (rung 0)


# a whole recipe's trial against a warm-up trial's wall seconds, before one has been timed: the whole recipe reuses
# the warm-up rung's warm-up and adds a round (two epochs, a corpus encoding and evaluations)
FULL_OVER_WARM = 2.0


def whole_reserve(warm: float, whole: float) -> float:
    """Seconds the warm-up rung leaves for the next rung's first two whole recipes (the baseline's and the best
    challenger's), so that a budget too short for every warm-up still ends with a decision between whole recipes:
    twice a whole trial's measured seconds, or FULL_OVER_WARM x a warm-up trial's before one ran."""
    return 2 * (whole or FULL_OVER_WARM * warm)


def trial_cost(record: dict, seen: set[str]) -> float:
    """What a trial costs the search (its budget and its estimates): the seconds it took when it ran (a trial reused
    from an earlier search: then), plus the seconds that the stages it reused took when they were built, for stages
    that no trial of this search built or reused before it (`seen`: their folders; built by a run outside the search,
    such as `ance run` before `ance tune`). So the search budgets as one that found none of that work done: where its
    first trials reuse an earlier run, the estimates of the trials after them are not a reused trial's seconds. The
    data stage is never outside: the search builds it (its checks) before the first trial. Under `selection: cv`, the
    stages of the trial's own run (fold 0's). Adds the trial's stages to `seen`."""
    outside = 0.0
    for stage in record.get("stages", ()):
        if stage["cached"] and stage["path"] not in seen and stage.get("for") != "data":
            outside += stage["seconds"]
        seen.add(stage["path"])  # (a stage built earlier in the trial itself and reused by it is not outside)
    return record["seconds"] + outside


def batch_costs(named: list[tuple[str, dict]], seen: set[str]) -> dict[str, float]:
    """What each trial of a batch (one, or side by side on Ray; by candidate) costs the search: its `trial_cost`, once
    every stage that one of them built is `seen` (a stage one trial built while its batch-mate waited for it is the
    batch's own work, already in its wall time)."""
    seen.update(stage["path"] for _, record in named for stage in record.get("stages", ()) if not stage["cached"])
    return {name: trial_cost(record, seen) for name, record in named}


def batch_cost(records: list[dict], seen: set[str]) -> float:
    """A batch's cost: its longest trial's (`batch_costs`)."""
    return max(batch_costs(list(enumerate(records)), seen).values(), default=0.0)


def rungs(cfg: TuneConfig) -> list[Rung]:
    """Rung 0: the warm-ups under the first seed; rung k: the whole recipe under the first k seeds (k >= 1)."""
    return [Rung(0, cfg.seeds[:1], False), *(Rung(k, cfg.seeds[:k], True) for k in range(1, len(cfg.seeds) + 1))]


def survivors(scores: Scores, names: list[str], rung: Rung, eta: int) -> list[str]:
    """The challengers (`names`: the baseline is not one) the rung after `rung` runs, best first: the best
    ceil(n/eta) of the n that the rung scored (a rung the budget cut ranks only the trials it ran)."""
    ranked = scores.ranked(names, rung.seeds, rung.full)
    return ranked[:max(1, math.ceil(len(ranked) / eta))]


def decide(scores: Scores, baseline: str, margin: float, failed: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """The winner (module docstring) and the evidence: per candidate its seeds of the whole recipe, mean score and
    mean paired difference to the baseline. A candidate whose trial `failed` (under any seed) keeps its row but
    cannot win: its recipe is one that crashed."""
    table = {}
    for name in scores.order:
        diffs = scores.paired(name, baseline)
        full = {s: v for (s, f), v in scores.values.get(name, {}).items() if f}
        if full:
            table[name] = {"seeds": sorted(full), "mean": statistics.fmean(full.values()),
                           "paired_diff": statistics.fmean(diffs) if diffs and name != baseline else None,
                           "paired_diffs": diffs if name != baseline else [], "failed": name in failed}
    rivals = [n for n in table if n != baseline and table[n]["paired_diff"] is not None and n not in failed]
    most = max((len(table[n]["seeds"]) for n in rivals), default=0)
    finalists = [n for n in rivals if len(table[n]["seeds"]) == most]
    best = max(finalists, key=lambda n: (round(table[n]["paired_diff"], 10), -scores.order.index(n)), default=None)
    if best is not None and round(table[best]["paired_diff"], 10) > margin:  # (a difference of margin ties)
        return best, {"table": table, "compared": True, "reason": f"{best} beat {baseline} by "
                      f"{table[best]['paired_diff']:+.4f} dev nDCG@10 (mean over seeds {table[best]['seeds']}; margin "
                      f"{margin})"}
    crashed = f" ({', '.join(dict.fromkeys(failed))} failed)" if failed else ""
    reason = (f"no candidate beat {baseline} by more than {margin} (the best, {best}: "
              f"{table[best]['paired_diff']:+.4f} over seeds {table[best]['seeds']})" if best is not None
              else f"no candidate ran the whole recipe beside {baseline}{crashed}")
    return baseline, {"table": table, "reason": reason, "compared": best is not None}


BUDGET = re.compile(r"budget_minutes=([0-9.e+-]+)")


def earlier_budget(base: "PipelineConfig", cfg: TuneConfig) -> tuple[float, str] | None:
    """(budget minutes, folder) of the newest finished search in the work folder of the same base config and search
    settings but its budget: what a search run again without a budget of its own takes (`ance run --recipe auto`
    after `ance tune --budget-minutes N`), so that the trials it reuses are budgeted as they were and it decides as
    that search did. (A search's stage key holds each config's repr.)"""
    want_base, want_tune = str(base), BUDGET.sub("", str(cfg))
    found = []
    for manifest in Path(base.work_dir, "tune").glob("*/manifest.json"):
        try:
            config = json.loads(manifest.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(config, dict) or config.get("base") != want_base:
            continue
        tune = str(config.get("tune", ""))
        if BUDGET.sub("", tune) == want_tune and (budget := BUDGET.search(tune)):
            found.append((manifest.stat().st_mtime, float(budget.group(1)), str(manifest.parent)))
    return max(found)[1:] if found else None


def candidate_metrics(table: dict[str, dict]) -> dict[str, float]:
    """The search run's metric per candidate, `mean_dev_ndcg_at_10.<its name>` (MLflow's characters, the first 60;
    two names alike that far apart by their place in the table)."""
    metrics: dict[str, float] = {}
    for n, (name, row) in enumerate(table.items()):
        safe = "".join(ch if ch.isalnum() else "_" for ch in name)[:60]
        if f"mean_dev_ndcg_at_10.{safe}" in metrics:
            safe = f"{safe[:55]}_{n}"
        metrics[f"mean_dev_ndcg_at_10.{safe}"] = row["mean"]
    return metrics


def trial_score(result: dict, full: bool) -> tuple[str, float]:
    """What a trial scores on the dev split (nDCG@10), and of which model: a whole recipe, the dense model it delivers
    (the run's result, or the dense model of its hybrid row: under `selection: best` the best dense model, the
    starting one included; under `one-se` the simplest within one standard error; under `cv` the best pooled over
    the dev folds); the warm-up rung, the warm-up. Under `cv` the score is the model's dev nDCG@10 pooled over every
    fold's dev queries (CV_KEY), not its own fold's."""
    dense = [r for r in result["results"] if r["model"] != "BM25" and not is_hybrid(r["model"]) and DEV_KEY in r]
    if not dense:
        raise AnceError("a trial's models have no dev score: the search needs a dev split")
    if not full:
        dense = [r for r in dense if r["model"] == "warmup"] or dense
    key = CV_KEY if result.get("selection") == "cv" else DEV_KEY  # (the rule the run chose by: every trial of a
    # search runs under the base config's, so their scores are alike and their paired differences compare like)
    delivered = dense_of(result.get("selected") or "")
    if full and delivered in {r["model"] for r in dense}:
        best = next(r for r in dense if r["model"] == delivered)
    else:
        # (a tie: the later, as the run's own selection; a row without the score only when none has it: refused)
        best = max(reversed(dense), key=lambda r: r.get(key, float("-inf")))
    if key not in best:
        raise AnceError(f"a trial under selection cv has no score of {best['model']} pooled over the dev folds (a "
                        "fold's run without that model): the search cannot compare it with the others")
    return best["model"], best[key]
