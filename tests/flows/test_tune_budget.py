"""The recipe search's budget (flows/tune.py `Search.run`), on a fake clock with trials that take 60 s: the warm-up
rung stops early enough to leave two whole recipes' time, so a budget too short for every warm-up still ends in a
decision between whole recipes; a rung whose next trial would not fit stops the search."""

from dataclasses import dataclass

import pytest

import flows.tune as tune
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.tune import Candidate, Rung, Scores, TuneConfig


@dataclass
class Ref:
    cached: bool = False
    path: str = "trial"


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1000.0}
    monkeypatch.setattr(tune.time, "time", lambda: now["t"])
    monkeypatch.setattr(tune, "trial_config", lambda *a, **k: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: {"score": 0.5, "model": "m", "seconds": 60.0})
    return now


def _search(clock, minutes: float, seconds_per_trial: dict[bool, float]) -> tune.Search:
    state = tune.Search(PipelineConfig(), TuneConfig(budget_minutes=minutes), "digest", None, None)

    def mapped(kwargs, part):
        clock["t"] += seconds_per_trial[kwargs[0]["name"].endswith("warm-up only") is False]
        return [Ref() for _ in part]

    state._mapped = mapped
    return state


def test_the_warm_up_rung_leaves_two_whole_recipes_time(clock):
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(7)]
    state = _search(clock, 10, {False: 60.0, True: 120.0})
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(0, [42], False))
    # 600 s: a warm-up trial 60 s, two whole recipes reserved at 2 x 60 s each before one ran (240 s): trials start
    # while 60 + 240 s are left, at 0, 60, ..., 300 s: six of eight
    assert len(state.trials) == 6 and state.stopped is None
    assert state.cut == "the warm-up rung stopped after 6 of its 8 trials, to leave the budget to whole recipes"
    state.run(scores, pool[:2], Rung(1, [42], True))  # 240 s left: the baseline's and the best challenger's
    assert [t["full"] for t in state.trials[6:]] == [True, True] and state.stopped is None
    state.run(scores, pool[:2], Rung(2, [42, 43], True))  # none left, a whole trial takes 120: the search stops
    assert len(state.trials) == 8 and state.stopped.startswith("the budget of 10 minutes stopped the search at rung 2")


def test_a_budget_for_everything_cuts_nothing(clock):
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(3)]
    state = _search(clock, 60, {False: 60.0, True: 120.0})
    state.run(Scores([c.name for c in pool]), pool, Rung(0, [42], False))
    assert len(state.trials) == 4 and state.cut is None and state.stopped is None


def test_a_seeds_whole_recipes_run_all_or_none(clock):
    """Rung 2 adds seed 43 to the baseline and a challenger: with time for one whole trial, neither runs (the
    baseline's alone would leave the decision a comparison of unpaired seeds)."""
    pool = [Candidate("base", {}), Candidate("c0", {"x": 0}, 1)]
    state = _search(clock, 10, {False: 60.0, True: 120.0})
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(1, [42], True))  # 240 s
    clock["t"] += 600 - 240 - 180  # 180 s left: one whole trial's time, not two
    state.run(scores, pool, Rung(2, [42, 43], True))
    assert [(t["candidate"], t["seed"]) for t in state.trials] == [("base", 42), ("c0", 42)]
    assert "seed 43's 2 trials would not fit" in state.stopped
