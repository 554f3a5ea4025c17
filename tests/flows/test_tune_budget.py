"""The recipe search's budget (flows/tune.py `Search.run`), on a fake clock with trials that take 60 s: the warm-up
rung stops early enough to leave two whole recipes' time, so a budget too short for every warm-up still ends in a
decision between whole recipes; a rung whose next trial would not fit stops the search. Also on the fake clock: the
order the survivors run in, and a failed trial (its candidate leaves; the baseline's stops the search)."""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

import flows.trial as trials
import flows.tune as tune
from ance_core.data.dataset import Dataset
from ance_core.errors import AnceError, AnceWarning
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.tune import (
    Candidate,
    Rung,
    Scores,
    TuneConfig,
    batch_cost,
    candidate_metrics,
    earlier_budget,
    trial_cost,
    trial_score,
)


@dataclass
class Ref:
    cached: bool = False
    path: str = "trial"
    digest: str = "digest"


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1000.0}
    monkeypatch.setattr(tune.time, "time", lambda: now["t"])
    monkeypatch.setattr(tune, "trial_config", lambda *a, **k: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: {"score": 0.5, "model": "m", "seconds": 60.0})
    return now


def _search(clock, minutes: float, seconds_per_trial: dict[bool, float], new_seed: float | None = None
            ) -> tune.Search:
    """Trials of fake seconds: a warm-up's, a whole recipe's (`seconds_per_trial`), and a whole recipe's under a seed
    after the first (`new_seed`: it trains its warm-up too; default the same as under the first)."""
    state = tune.Search(PipelineConfig(), TuneConfig(budget_minutes=minutes), "digest", None, None)

    def mapped(kwargs, part):
        full = kwargs[0]["name"].endswith("warm-up only") is False
        later = part[0][1] != state.cfg.seeds[0]
        clock["t"] += new_seed if full and later and new_seed is not None else seconds_per_trial[full]
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


def test_a_resumed_search_counts_its_reused_trials_and_decides_as_an_uninterrupted_one(clock):
    """Killed after three of its warm-ups, the search is run again: the three come back cached (no time now) and are
    budgeted at the 60 s each took, so the rung stops where the uninterrupted search stopped (six of eight, above),
    where a fresh budget once ran all eight."""
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(7)]
    state = _search(clock, 10, {False: 60.0, True: 120.0})
    first = state._mapped
    done: set[str] = set()

    def resumed(kwargs, part):
        names = [call["name"] for call in kwargs]
        if all(name in done for name in names):
            return [Ref(cached=True) for _ in part]
        done.update(names)
        return first(kwargs, part)

    state._mapped = resumed
    done.update(f"{c.name} · seed 42 · warm-up only" for c in pool[:3])  # the killed search's three trials
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(0, [42], False))
    assert [t["cached"] for t in state.trials] == [True] * 3 + [False] * 3 and state.reused == 180
    assert state.cut == "the warm-up rung stopped after 6 of its 8 trials, to leave the budget to whole recipes"
    assert "the work they reused took 180 s when it ran, counted in the budget" in tune.report(
        pool, state, pool[0], {"table": {}, "reason": "r"})


def test_stages_an_earlier_run_built_count_at_their_seconds_and_the_search_budgets_as_without_them(clock, monkeypatch):
    """`ance run` before `ance tune`: the baseline's warm-up trial finds its stages built (5 s now; they took 55 s to
    build). It costs the search the 60 s it would have taken, so the rung stops where a search without that run
    stops (six of eight warm-ups, above); counted at its 5 s, it made the warm-ups look cheap and let a seventh in."""
    stage = {"stage": "train", "seconds": 55.0, "cached": True}
    monkeypatch.setattr(tune, "read_trial", lambda ref: {  # (each candidate's warm-up a stage of its own)
        "score": 0.5, "model": "m", "seconds": 5.0 if ref.path == "outside" else 60.0,
        "stages": [stage | {"path": f"w/train/{ref.path}", "cached": ref.path == "outside"}]})
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(7)]
    state = tune.Search(PipelineConfig(), TuneConfig(budget_minutes=10), "digest", None, None)

    def mapped(kwargs, part):
        first = not state.trials
        clock["t"] += 5.0 if first else 60.0
        return [Ref(path="outside" if first else f"fresh{len(state.trials)}")]

    state._mapped = mapped
    state.run(Scores([c.name for c in pool]), pool, Rung(0, [42], False))
    assert state.reused == 55.0 and state.batches["warm-up"][:2] == [60.0, 60.0]
    assert state.cut == "the warm-up rung stopped after 6 of its 8 trials, to leave the budget to whole recipes"


def _stage(kind: str, path: str, seconds: float, cached: bool) -> dict:
    return {"for": kind, "stage": kind, "path": path, "seconds": seconds, "cached": cached}


def test_a_trials_cost_adds_the_stages_it_reused_from_outside_the_search_once():
    seen: set[str] = set()
    built = _stage("zero-shot", "w/encode/a", 10.0, False)
    outside = _stage("BM25", "w/bm25/b", 30.0, True)
    # the encoding built by the trial itself and reused later in it: not outside; the BM25 index: outside, once
    assert trial_cost({"seconds": 40.0, "stages": [built, outside, built | {"cached": True}]}, seen) == 70.0
    assert trial_cost({"seconds": 20.0, "stages": [built | {"cached": True}, outside]}, seen) == 20.0
    assert seen == {"w/encode/a", "w/bm25/b"}
    # the data stage, built by the search's checks before its first trial, is never outside work
    assert trial_cost({"seconds": 5.0, "stages": [_stage("data", "w/data/c", 90.0, True)]}, set()) == 5.0


def test_a_ray_batch_counts_a_stage_one_trial_built_and_its_mate_waited_for_once():
    """Side by side, `c0` builds the shared BM25 stage while `base` waits for it and finds it cached: that stage is
    the batch's own work (in its wall time), not work reused from outside the search."""
    shared = _stage("BM25", "w/bm25/s", 30.0, False)
    base = {"seconds": 55.0, "stages": [shared | {"cached": True}]}  # (costed first: the batch's order)
    mate = {"seconds": 60.0, "stages": [shared]}
    assert batch_cost([base, mate], set()) == 60.0
    assert batch_cost([base], set()) == 85.0  # (alone, the same record's stage was built outside the search)


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


def test_the_first_whole_rung_is_budgeted_before_a_whole_recipe_was_timed(clock):
    """A whole recipe takes 150 s. Before one was timed it is budgeted at twice a warm-up (120 s): the baseline's and
    the best challenger's both run (all of the seed's or none) where the budget once let the baseline in alone."""
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(7)]
    state = _search(clock, 10, {False: 60.0, True: 150.0})
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(0, [42], False))  # six warm-ups (360 s), 240 s left
    state.run(scores, pool[:2], Rung(1, [42], True))
    assert [(t["candidate"], t["full"]) for t in state.trials[6:]] == [("base", True), ("c0", True)]
    assert state.stopped is None


def test_the_first_whole_rung_stops_once_its_pair_ran_when_the_guess_was_short(clock):
    """A whole recipe takes 300 s, five warm-ups, where it was guessed at two (120 s) before one was timed: rung 1's
    five whole recipes were let in on the guess (720 s left: six fit), and ran to 1,980 s of a 1,200 s budget. Once
    the baseline's and the best challenger's ran, the next starts only if it fits what they took."""
    pool = [Candidate("base", {})] + [Candidate(f"c{i}", {"x": i}, 1) for i in range(7)]
    state = _search(clock, 20, {False: 60.0, True: 300.0})
    state.baseline = "base"
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(0, [42], False))  # eight warm-ups (480 s), 720 s left
    assert sum(not t["full"] for t in state.trials) == 8
    state.run(scores, pool[:5], Rung(1, [42], True))
    assert [t["candidate"] for t in state.trials if t["full"]] == ["base", "c0"]
    assert state.seconds_left() >= 0 and "rung 1 ran 2 of its 5 whole recipes" in state.cut


@pytest.mark.parametrize("left, ran", [(300, False), (400, True)])
def test_a_later_seeds_trials_are_budgeted_with_the_warm_up_they_train(clock, left, ran):
    """Under seed 42 a whole recipe reuses its warm-up (120 s); under 43 it trains one too (180 s): seed 43's two
    trials need 360 s, so with 300 s left neither runs (once, the 120 s of seed 42's let them in and the budget
    stopped the search between them, leaving the baseline's seed 43 unpaired); with 400 s both run."""
    pool = [Candidate("base", {}), Candidate("c0", {"x": 0}, 1)]
    state = _search(clock, (120 + 240 + left) / 60, {False: 60.0, True: 120.0}, new_seed=180.0)
    scores = Scores([c.name for c in pool])
    state.run(scores, pool, Rung(0, [42], False))
    state.run(scores, pool, Rung(1, [42], True))
    state.run(scores, pool, Rung(2, [42, 43], True))
    seed_43 = [t["candidate"] for t in state.trials if t["seed"] == 43]
    assert seed_43 == (["base", "c0"] if ran else [])
    assert (state.stopped is None) == ran


def _train_qrels(monkeypatch, queries: list[str], docs: list[str], grades: list[int]) -> None:
    """The search reads a dataset whose train split has these qrels (and nothing else)."""
    qrels = pd.DataFrame({"query_id": queries, "doc_id": docs, "relevance": grades, "split": "train"})
    monkeypatch.setattr(tune, "read_tables", lambda *a, **k: Dataset(pd.DataFrame(), pd.DataFrame(), qrels))


def test_the_survivors_run_best_first(clock, monkeypatch):
    """The warm-up rung ranks lr 2e-05, warm-up 2 epochs (0.60) over lr 2e-05 (0.55): the whole rung runs the baseline,
    then them in that order (a budget that ends between them keeps the better one), not the simpler first."""
    warm = {"demo (baseline)": 0.50, "warm-up 2 epochs": 0.51, "lr 2e-05": 0.55, "lr 2e-05, warm-up 2 epochs": 0.60}
    _train_qrels(monkeypatch, ["q"], ["d"], [1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: {"score": warm[ref.path], "model": "m", "seconds": 60.0})

    def mapped(self, kwargs, part):
        clock["t"] += 60
        return [Ref(path=c.name) for c, _ in part]

    monkeypatch.setattr(tune.Search, "_mapped", mapped)
    base = PipelineConfig.model_validate({"warmup": {"learning_rate": 4e-5},  # the demo recipe's
                                          "ance": {"learning_rate": 4e-5}})
    _, _, _, state = tune.search(base, TuneConfig(eta=2, seeds=[42]), Ref(), None, None)
    assert [t["candidate"] for t in state.trials if t["full"]] == [
        "demo (baseline)", "lr 2e-05, warm-up 2 epochs", "lr 2e-05"]


def test_a_short_budget_runs_the_baseline_and_the_best_challengers_whole(clock, monkeypatch):
    """The real search over graded qrels (12 candidates), warm-ups 60 s, whole recipes 120 s, 10 minutes: the warm-up
    rung stops after six, leaving two whole recipes' time; rung 1's survivors (three with the baseline) would not all
    fit. It runs the baseline and the best challenger whole, and decides between them (it ran no whole recipe at all:
    'no candidate ran the whole recipe')."""
    scores = iter([0.50, 0.52, 0.55, 0.51, 0.53, 0.54] + [0.60, 0.62, 0.0, 0.0])
    _train_qrels(monkeypatch, ["q", "q", "r"], ["d", "e", "f"], [1, 2, 1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: {"score": float(ref.path), "model": "m", "seconds": 60.0})

    def mapped(self, kwargs, part):
        clock["t"] += 120 if not kwargs[0]["name"].endswith("warm-up only") else 60
        return [Ref(path=str(next(scores))) for _ in part]

    monkeypatch.setattr(tune.Search, "_mapped", mapped)
    base = PipelineConfig.model_validate({"warmup": {"learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5}})
    winner, evidence, pool, state = tune.search(base, TuneConfig(budget_minutes=10), Ref(), None, None)
    assert len(pool) == 12 and sum(not t["full"] for t in state.trials) == 6
    whole = [t["candidate"] for t in state.trials if t["full"]]
    assert whole[0] == pool[0].name and len(whole) == 2  # the baseline, then the warm-up rung's best (0.55)
    assert whole[1] == [t["candidate"] for t in state.trials if t["score"] == 0.55][0]
    assert winner.name == whole[1] and "beat" in evidence["reason"] and "rung 1 ran 2 of its 3" in state.cut


def test_a_challenger_whose_trial_fails_leaves_the_search_and_the_baselines_failure_stops_it(clock, monkeypatch):
    """A learning rate that diverges is one of the things a search tries: its AnceError (the loss is nan) drops that
    candidate, the other trials go on. The baseline's failure stops the search (everything is paired with it)."""
    failing = {"c0"}

    def run_mapped(task, kwargs, execution, errors=False):  # (a failed trial's place holds its error)
        return [AnceError("warmup: the loss is nan at step 3 (learning rate 1)")
                if k["name"].split(" · ")[0] in failing else Ref() for k in kwargs]

    monkeypatch.setattr(tune, "run_mapped", run_mapped)
    pool = [Candidate("base", {}), Candidate("c0", {"x": 0}, 1), Candidate("c1", {"x": 1}, 1)]
    state = tune.Search(PipelineConfig(), TuneConfig(), "digest", None, None)
    state.baseline = "base"
    with pytest.warns(AnceWarning, match="the trial of c0 under seed 42 failed; c0 leaves"):
        state.run(Scores([c.name for c in pool]), pool, Rung(0, [42], False))
    assert [t["candidate"] for t in state.trials] == ["base", "c1"] and state.failed == ["c0"]
    failing.add("base")
    with pytest.raises(AnceError, match="the loss is nan"):
        state.run(Scores([c.name for c in pool]), pool, Rung(1, [42], True))


def test_a_candidate_the_config_refuses_stops_the_search_before_any_trial():
    bad = Candidate("lr -1", {"warmup.learning_rate": -1.0, "ance.learning_rate": -1.0}, 1)
    with pytest.raises(AnceError, match=r"the candidate lr -1 \(warmup.learning_rate=-1.0, ance.learning_rate=-1.0\) "
                       "is refused"):
        tune.check_candidates(PipelineConfig(), [bad], [42])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a driver without CUDA")
def test_trials_on_gpu_ray_workers_are_not_refused_the_gpu_this_driver_lacks():
    """fp16 training and a GPU index are refused on a CPU-only machine that would run them, not on the driver of a
    search whose trials run on Ray workers given GPUs (each trial's own run checks its devices there)."""
    gpu_only = {"ance": {"precision": "fp16"}, "index": {"device": "gpu"}}
    here = PipelineConfig.model_validate(gpu_only)
    with pytest.raises(AnceError, match="ance.precision: fp16 training needs a CUDA GPU"):
        tune.check_candidates(here, [Candidate("base", {})], [42])
    cpu_workers = PipelineConfig.model_validate(gpu_only | {"execution": {"task_runner": "ray"}})
    with pytest.raises(AnceError, match="fp16 training needs a CUDA GPU"):
        tune.check_candidates(cpu_workers, [Candidate("base", {})], [42])
    gpu_workers = PipelineConfig.model_validate(gpu_only | {"execution": {"task_runner": "ray", "gpus_per_task": 1}})
    tune.check_candidates(gpu_workers, [Candidate("base", {})], [42])



def _row(model: str, dev: float) -> dict:
    return {"model": model, "ndcg_at_10": 0.0, "dev_ndcg_at_10": dev}


def test_a_trial_scores_the_dense_model_its_run_delivers():
    """Under `selection: best` the best dense model (the dense model of a hybrid row chosen); under one-se the
    simplest within one standard error (here the warm-up's hybrid row: the warm-up), not the best dense model."""
    results = [_row("BM25", 0.40), _row("zero-shot", 0.50), _row("warmup", 0.58), _row("ANCE round 1", 0.60),
               _row("ANCE round 1 + BM25", 0.62)]
    assert trial_score({"results": results, "selected": "ANCE round 1 + BM25"}, full=True) == (
        "ANCE round 1", 0.60)
    assert trial_score({"results": results, "selected": "warmup + BM25"}, full=True) == ("warmup", 0.58)
    assert trial_score({"results": results, "selected": "zero-shot"}, full=True) == ("zero-shot", 0.50)
    assert trial_score({"results": results[:3], "selected": "zero-shot"}, full=False) == ("warmup", 0.58)


def test_a_trial_under_cv_scores_its_model_pooled_over_the_dev_folds():
    """Under `selection: cv` the run chose on the pooled scores: the trial scores its delivered model's pooled score
    (here the warm-up, below the round on its own fold's queries), and the warm-up rung the warm-up's pooled one."""
    results = [_row("BM25", 0.40), _row("zero-shot", 0.50) | {"cv_ndcg_at_10": 0.55},
               _row("warmup", 0.58) | {"cv_ndcg_at_10": 0.61}, _row("ANCE round 1", 0.60) | {"cv_ndcg_at_10": 0.57}]
    cv = {"selection": "cv"}
    assert trial_score(cv | {"results": results, "selected": "warmup"}, full=True) == ("warmup", 0.61)
    assert trial_score(cv | {"results": results[:3], "selected": "warmup"}, full=False) == ("warmup", 0.61)
    assert trial_score(cv | {"results": results, "selected": None}, full=True) == ("warmup", 0.61)
    # a model without a pooled score is refused, never scored on its own fold beside pooled trials
    lone = [*results[:3], _row("ANCE round 1", 0.60)]
    with pytest.raises(AnceError, match="no score of ANCE round 1 pooled over the dev folds"):
        trial_score(cv | {"results": lone, "selected": "ANCE round 1 + BM25"}, full=True)


def test_a_whole_trial_trains_the_whole_recipe_whatever_the_base_says():
    """A base config with `warmup_only: true` would make every whole trial a warm-up: the trial decides."""
    base = PipelineConfig(warmup_only=True)
    candidate = Candidate("lr 1e-05", {"warmup.learning_rate": 1e-5, "ance.learning_rate": 1e-5}, 1)
    whole = tune.trial_config(base, candidate, 43, full=True)
    assert not whole.warmup_only and tune.trial_config(base, candidate, 43, full=False).warmup_only
    assert whole.ance.learning_rate == 1e-5 and whole.warmup.seed == whole.mining.seed == 43


def test_ray_batches_never_straddle_two_seeds(clock):
    """Two trials at once (Ray): a rung whose seed 42 lacks one trial and whose seed 43 lacks three runs batches of
    one seed each, so the budget's all-or-none check sees every seed's group from its start."""
    execution = {"task_runner": "ray", "workers": 2}
    state = tune.Search(PipelineConfig.model_validate({"execution": execution}), TuneConfig(), "digest", None, None)
    batches = []

    def mapped(kwargs, part):
        batches.append([(c.name, seed) for c, seed in part])
        return [Ref() for _ in part]

    state._mapped = mapped
    pool = [Candidate("base", {}), Candidate("c0", {"x": 0}, 1), Candidate("c1", {"x": 1}, 1)]
    scores = Scores([c.name for c in pool])
    scores.add("base", 42, True, 0.5)
    scores.add("c0", 42, True, 0.5)
    state.run(scores, pool, Rung(2, [42, 43], True))
    assert batches == [[("c1", 42)], [("base", 43), ("c0", 43)], [("c1", 43)]]


def test_a_ray_batch_mixing_reused_and_new_trials_budgets_the_reused_ones_time_beyond_its_own(clock):
    """Killed in the middle of a Ray batch, a search run again finds one trial of the batch reused (it took 60 s) and
    runs its mate (20 s now): the batch counts as the 60 s the reused one took, 40 s more than its wall time."""
    execution = {"task_runner": "ray", "workers": 2}
    state = tune.Search(PipelineConfig.model_validate({"execution": execution}), TuneConfig(), "digest", None, None)

    def mapped(kwargs, part):
        clock["t"] += 20.0
        return [Ref(cached=True), Ref()]

    state._mapped = mapped
    pool = [Candidate("base", {}), Candidate("c0", {"x": 0}, 1)]
    state.run(Scores([c.name for c in pool]), pool, Rung(0, [42], False))
    assert state.reused == 40.0 and state.batches["warm-up"] == [60.0]
    assert state.seconds_left() == 90 * 60 - 20 - 40


def test_a_search_run_again_without_a_budget_takes_the_earlier_searchs(tmp_path, monkeypatch):
    """`ance run --recipe auto` after `ance tune --budget-minutes 300` (same base, same search): the budget of that
    search, so that its reused trials fit as they did; another base or search setting, or a budget given, is its own."""
    import json

    import ance_cli.train_commands as commands
    import flows.ance_pipeline

    base = PipelineConfig(work_dir=str(tmp_path / "w"))
    folder = tmp_path / "w" / "tune" / "k1"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"config": {"base": str(base), "tune": str(
        TuneConfig(budget_minutes=300))}}))
    assert earlier_budget(base, TuneConfig()) == (300.0, str(folder))
    assert earlier_budget(base, TuneConfig(eta=2)) is None
    assert earlier_budget(PipelineConfig(work_dir=str(tmp_path / "w"), rounds=2), TuneConfig()) is None
    seen = []
    monkeypatch.setattr(tune, "tune_recipe", lambda base, cfg: seen.append(cfg.budget_minutes))
    import types

    import pandas as pd

    with_dev = types.SimpleNamespace(qrels=pd.DataFrame({"split": ["dev"]}))  # (the tables of a data stage)
    monkeypatch.setattr(commands, "preflight", lambda *a, **k: with_dev)
    monkeypatch.setattr(flows.ance_pipeline, "check_pipeline", lambda *a, **k: None)
    import ance_core.pipeline.recipes as recipes

    monkeypatch.setattr(recipes, "recipe_config", lambda *a, **k: base)
    commands._tune(None, None, None)
    commands._tune(None, None, 20.0)
    commands._tune(None, None, None, tune_sets=["budget_minutes=15"])
    assert seen == [300.0, 20.0, 15.0]


def test_only_seeds_the_user_set_are_said_to_be_unused():
    base = PipelineConfig()  # every seed its default, 42
    assert tune.unused_seeds(base, [1, 2]) == {} and tune.unused_seeds(base, [42]) == {}
    set_one = PipelineConfig.model_validate({"warmup": {"seed": 7}})
    assert tune.unused_seeds(set_one, [42, 43]) == {"warmup.seed": 7} and tune.unused_seeds(set_one, [7]) == {}


def test_a_failed_trial_of_a_ray_batch_is_not_run_again_and_its_batch_mates_count_as_built(clock, monkeypatch):
    """Ray: in a batch where c0 failed (after its retries) every trial ran to its end; c0 leaves the search without
    running again, its batch-mate c2 is this search's build (not reused: no pointer run, its seconds counted)."""
    calls = []

    def run_mapped(task, kwargs, execution, errors=False):
        assert errors  # a failed trial is an answer, not the batch's end
        calls.append([k["name"].split(" · ")[0] for k in kwargs])
        return [RuntimeError("worker died") if k["name"].startswith("c0") else Ref() for k in kwargs]

    monkeypatch.setattr(tune, "run_mapped", run_mapped)
    execution = {"task_runner": "ray", "workers": 2}
    state = tune.Search(PipelineConfig.model_validate({"execution": execution}), TuneConfig(), "digest", None, None)
    state.baseline = "base"
    pool = [Candidate("base", {}), Candidate("c1", {"x": 1}, 1), Candidate("c0", {"x": 0}, 1),
            Candidate("c2", {"x": 2}, 1)]
    with pytest.warns(AnceWarning, match=r"c0 leaves the search \(RuntimeError: worker died\)"):
        state.run(Scores([c.name for c in pool]), pool, Rung(0, [42], False))
    assert calls == [["base", "c1"], ["c0", "c2"]] and state.failed == ["c0"]
    assert [(t["candidate"], t["cached"]) for t in state.trials] == [("base", False), ("c1", False), ("c2", False)]


def test_a_search_whose_challengers_all_fail_stops_after_the_warm_ups(clock, monkeypatch):
    _train_qrels(monkeypatch, ["q"], ["d"], [1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)

    def run_mapped(task, kwargs, execution, errors=False):
        return [Ref() if "baseline" in k["name"] else AnceError("the loss is nan") for k in kwargs]

    monkeypatch.setattr(tune, "run_mapped", run_mapped)
    base = PipelineConfig.model_validate({"warmup": {"learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5}})
    with pytest.warns(AnceWarning):
        winner, evidence, _, state = tune.search(base, TuneConfig(seeds=[42, 43]), Ref(), None, None)
    assert winner.name == "demo (baseline)" and [t["full"] for t in state.trials] == [False]  # no baseline-only rungs
    assert evidence["reason"] == ("no candidate ran the whole recipe beside demo (baseline) (warm-up 2 epochs, "
                                  "lr 2e-05, lr 2e-05, warm-up 2 epochs failed)")


def test_a_trials_key_is_unchanged_under_best_and_new_under_one_se(tmp_path, monkeypatch):
    """Under one-se a trial now scores the model that rule delivers: its folders from before are not reused; under
    `best` the scores did not change, nor the key (a search's trials stay cached)."""
    from ance_core.artifacts import stage_key

    results = [_row("zero-shot", 0.5), _row("warmup", 0.58)]
    monkeypatch.setattr(trials, "train_and_evaluate", lambda config, trial: {"results": results, "selected": "warmup",
                                                                           "stages": []})
    best = PipelineConfig(work_dir=str(tmp_path))
    ref = trials.trial.fn(best, "d" * 16)
    assert Path(ref.path).name == stage_key("trial", {"pipeline": best}, {"data": "d" * 16})
    config = best.model_copy(update={"selection": "one-se"})
    one_se = trials.trial.fn(config, "d" * 16)
    assert Path(one_se.path).name not in (Path(ref.path).name,  # (nor the key its folders had before)
                                          stage_key("trial", {"pipeline": config}, {"data": "d" * 16}))


def test_a_trials_key_does_not_depend_on_where_its_shards_run(tmp_path, monkeypatch):
    """A local search with execution.workers 4 and the same search on Ray trained every trial again (the execution
    settings were in the key); the trials' results do not depend on them."""
    from ance_core.artifacts import stage_key

    keys = []
    monkeypatch.setattr(trials, "run_stage", lambda work_dir, stage, config, inputs, build: keys.append(
        stage_key(stage, config, inputs)))
    for execution in ({}, {"workers": 4}, {"task_runner": "ray", "workers": 3, "threads_per_worker": 2}):
        config = PipelineConfig.model_validate({"work_dir": str(tmp_path), "execution": execution})
        trials.trial.fn(config, "digest")
    assert len(keys) == 3 and len(set(keys)) == 1
    trials.trial.fn(PipelineConfig.model_validate({"work_dir": str(tmp_path), "rounds": 2}), "digest")
    assert keys[-1] != keys[0]


def test_candidates_alike_in_their_first_60_characters_log_two_metrics():
    a = "lr 1.5e-05, positives collection-top (train_min_relevance 3)"
    metrics = candidate_metrics({a: {"mean": 0.5}, f"{a}, warm-up 2 epochs": {"mean": 0.6}, "demo": {"mean": 0.4}})
    assert sorted(metrics.values()) == [0.4, 0.5, 0.6] and all(len(k) <= 80 for k in metrics)


def _quick_trials(clock, monkeypatch) -> None:
    _train_qrels(monkeypatch, ["q"], ["d"], [1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: {"score": 0.5, "model": "m", "seconds": 60.0})

    def mapped(self, kwargs, part):
        clock["t"] += 60
        return [Ref() for _ in part]

    monkeypatch.setattr(tune.Search, "_mapped", mapped)


def test_a_budget_that_compares_no_whole_recipe_says_so(clock, monkeypatch):
    """A budget that ran one warm-up kept the baseline, untried against the others, with exit 0 and no warning (a
    review found `ance run --recipe auto` promoting it after a smoke test's budget). On a dev split of a few queries
    the report says its comparisons are noise."""
    _quick_trials(clock, monkeypatch)
    with pytest.warns(AnceWarning) as said:
        winner, evidence, pool, state = tune.search(PipelineConfig(), TuneConfig(budget_minutes=0.5), Ref(), None,
                                                    None)
    messages = [str(w.message) for w in said]
    assert winner == pool[0] and not evidence["compared"] and len(state.trials) == 1
    assert any("no whole recipe was compared" in m and "--budget-minutes, 0.5 now" in m for m in messages), messages
    assert any("the dev split holds 0 queries" in m and "selection=cv" in m for m in messages), messages
    assert "The dev split holds 0 queries" in tune.report(pool, state, winner, evidence)


def test_warm_up_epochs_are_not_searched_when_max_steps_fixes_the_warm_up(clock, monkeypatch):
    """`warmup.max_steps` overrides the epochs: each 'warm-up 2 epochs' candidate trained the baseline's warm-up
    again (half the trials of a search, a review found)."""
    _quick_trials(clock, monkeypatch)
    with pytest.warns(AnceWarning, match="warmup.max_steps 2 is set"):
        _, _, pool, _ = tune.search(PipelineConfig.model_validate({"warmup": {"max_steps": 2}}),
                                    TuneConfig(budget_minutes=0.5), Ref(), None, None)
    assert [c.name for c in pool] == ["demo (baseline)", "lr 4e-05"]
    _, _, pool, _ = tune.search(PipelineConfig(), TuneConfig(budget_minutes=0.5), Ref(), None, None)
    assert len(pool) == 4  # (without max_steps: the epochs are searched)


def test_work_every_trial_shares_leaves_the_estimate_of_the_trial_that_paid_it(clock, monkeypatch):
    """The first warm-up pays for what every trial reuses (the zero-shot model's encoding: 400 s here, built in its
    trial, or reused from `ance run` and counted at its seconds). Estimated as every warm-up's cost, it made the
    warm-up rung reserve two whole recipes at 2 x 260 s and the first whole rung fit none: on a DL19 pool a 60-minute
    search after `ance run` compared no whole recipe. Taken out of the estimate, 20 minutes run the 4 warm-ups and
    compare two whole recipes."""
    _train_qrels(monkeypatch, ["q"], ["d"], [1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: ref.path)

    def mapped(self, kwargs, part):
        first = not self.trials
        clock["t"] += (460 if first else 60) if kwargs[0]["name"].endswith("warm-up only") else 120
        shared = {"for": "zero-shot", "stage": "encode", "path": "zs", "cached": not first, "seconds": 400.0}
        return [Ref(path={"score": 0.5 + len(self.trials) / 100, "model": "m", "seconds": 60.0,
                          "stages": [shared]}) for _ in part]

    monkeypatch.setattr(tune.Search, "_mapped", mapped)
    base = PipelineConfig.model_validate({"warmup": {"learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5}})
    winner, evidence, pool, state = tune.search(base, TuneConfig(budget_minutes=20), Ref(), None, None)
    assert sum(not t["full"] for t in state.trials) == 4 and sum(t["full"] for t in state.trials) == 2
    assert evidence["compared"] and state.estimate("warm-up") == 60.0


def test_a_warm_up_of_new_positives_is_estimated_with_the_shared_work_it_builds_again(clock, monkeypatch):
    """Graded qrels: a positives candidate's trials read a data stage of their own, so its first warm-up builds its
    own BM25 and zero-shot stages (400 s here) instead of reusing the baseline's: estimated at the others' 60 s, it
    started with too little time left and ate the whole recipes' reserve."""
    _train_qrels(monkeypatch, ["q", "q", "r"], ["d", "e", "f"], [1, 2, 1])
    monkeypatch.setattr(tune, "check_candidates", lambda *a: None)
    monkeypatch.setattr(tune, "read_trial", lambda ref: ref.path)
    started = []

    def mapped(self, kwargs, part):
        rule = part[0][0].overrides.get("data.train_min_relevance", "base")
        built = rule not in self.positives_run  # (its data's zero-shot encoding: built by this trial)
        warm_up = kwargs[0]["name"].endswith("warm-up only")
        started.append((kwargs[0]["name"], self.seconds_left(), built and warm_up))
        clock["t"] += (460 if built else 60) if warm_up else 120
        shared = {"for": "zero-shot", "stage": "encode", "path": f"zs-{rule}", "cached": not built, "seconds": 400.0}
        return [Ref(path={"score": 0.5, "model": "m", "seconds": 60.0, "stages": [shared]}) for _ in part]

    monkeypatch.setattr(tune.Search, "_mapped", mapped)
    base = PipelineConfig.model_validate({"warmup": {"learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5}})
    winner, evidence, pool, state = tune.search(base, TuneConfig(budget_minutes=16), Ref(), None, None)
    assert evidence["compared"], state.stopped
    late = [(name, left) for name, left, builds in started[1:] if builds and left < 460 + 240]
    assert not late, started  # each warm-up of new positives started with its 460 s and two whole recipes' left
