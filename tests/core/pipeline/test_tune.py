"""The recipe search's logic (ance_core/pipeline/tune.py): candidates, rungs, survivors and the decision."""

import pandas as pd
import pytest

from ance_core.data.dataset import Dataset
from ance_core.pipeline.tune import Scores, TuneConfig, candidates, decide, rungs, survivors, training_pairs


def test_binary_qrels_have_one_positives_rule_and_the_baseline_comes_first():
    pool = candidates(TuneConfig(), 4e-5, "auto", 1, grades=[1])
    assert [c.name for c in pool] == ["demo (baseline)", "warm-up 2 epochs", "lr 2e-05", "lr 2e-05, warm-up 2 epochs"]
    assert pool[0].overrides == {} and [c.changes for c in pool] == [0, 1, 1, 2]
    assert pool[2].sets() == ["warmup.learning_rate=2e-05", "ance.learning_rate=2e-05"]


def test_graded_qrels_add_the_collections_top_grade_and_every_relevant_document():
    pool = candidates(TuneConfig(warmup_epochs=[1]), 4e-5, "auto", 1, grades=[1, 2, 3])
    rules = {c.overrides.get("data.train_min_relevance") for c in pool}
    assert rules == {None, 3, 1} and len(pool) == 6  # 3 rules x 2 learning rates, the baseline's "auto" unsaid
    assert pool[0].name == "demo (baseline)" and max(c.changes for c in pool) == 2


def _train(qrels: pd.DataFrame) -> Dataset:
    return Dataset(pd.DataFrame(), pd.DataFrame(), qrels.assign(split="train"))


def test_a_positives_rule_that_trains_the_baselines_pairs_is_no_candidate():
    """Graded qrels whose queries each have one grade: every relevant document is its query's top grade, so `all`
    trains what the baseline's `auto` does, and is no trial; the collection's top grade (2) drops q1's pairs: a
    candidate. Where every query has the collection's top grade among its positives, that rule is the baseline too."""
    train = _train(pd.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["a", "b", "c"], "relevance": [1, 1, 2]}))
    pool = candidates(TuneConfig(warmup_epochs=[1], learning_rates=[2e-5]), 4e-5, "auto", 1, [1, 2],
                      pairs=lambda rule: training_pairs(train, "train", rule))
    assert [c.name for c in pool] == ["demo (baseline)", "positives collection-top (train_min_relevance 2)",
                                      "lr 2e-05",
                                      "lr 2e-05, positives collection-top (train_min_relevance 2)"]
    both = _train(pd.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["a", "b", "c"], "relevance": [2, 1, 2]}))
    pool = candidates(TuneConfig(warmup_epochs=[1], learning_rates=[2e-5]), 4e-5, "auto", 1, [1, 2],
                      pairs=lambda rule: training_pairs(both, "train", rule))
    assert [c.overrides.get("data.train_min_relevance") for c in pool] == [None, 1, None, 1]


def test_rungs_add_a_seed_each_after_the_warmups():
    assert [(r.number, r.seeds, r.full) for r in rungs(TuneConfig(seeds=[1, 2, 3]))] == [
        (0, [1], False), (1, [1], True), (2, [1, 2], True), (3, [1, 2, 3], True)]


def _scores(values: dict[str, dict[tuple[int, bool], float]]) -> Scores:
    scores = Scores(list(values))
    for name, runs in values.items():
        for (seed, full), v in runs.items():
            scores.add(name, seed, full, v)
    return scores


def test_survivors_are_the_best_third_and_a_tie_keeps_the_simpler():
    scores = _scores({"base": {(1, False): 0.5}, "a": {(1, False): 0.6}, "b": {(1, False): 0.6},
                      "c": {(1, False): 0.4}})
    rung = rungs(TuneConfig(seeds=[1]))[0]
    assert survivors(scores, ["base", "a", "b", "c"], rung, eta=3) == ["a", "b"]  # ceil(4/3) = 2
    assert survivors(scores, ["base", "a", "b", "c"], rung, eta=4) == ["a"]


def test_a_candidate_wins_only_by_more_than_the_margin_over_the_seeds_it_shares_with_the_baseline():
    runs = {"base": {(1, True): 0.50, (2, True): 0.52, (3, True): 0.51},
            "a": {(1, True): 0.53, (2, True): 0.52, (3, True): 0.52},  # +0.0133
            "b": {(1, True): 0.60}}  # ran one seed: not a finalist beside a candidate that ran three
    winner, evidence = decide(_scores(runs), "base", margin=0.005)
    assert winner == "a" and evidence["table"]["a"]["paired_diff"] == pytest.approx(0.04 / 3)
    assert decide(_scores(runs), "base", margin=0.02)[0] == "base"  # not by more than the margin: the baseline
    tied = {"base": {(1, True): 0.5}, "a": {(1, True): 0.5}}
    winner, evidence = decide(_scores(tied), "base", margin=0.0)
    assert winner == "base" and "no candidate beat" in evidence["reason"]
    assert decide(_scores({"base": {(1, True): 0.5}}), "base", 0.0) == ("base", {
        "table": {"base": {"seeds": [1], "mean": 0.5, "paired_diff": None, "paired_diffs": [], "failed": False}},
        "reason": "no candidate ran the whole recipe beside base", "compared": False})
    assert evidence["compared"]  # (the tie: a whole recipe was compared)


def test_a_setting_listed_twice_is_refused():
    with pytest.raises(ValueError, match="seeds lists a value twice"):
        TuneConfig(seeds=[1, 1])
    with pytest.raises(ValueError, match="learning_rates lists a value twice to 6 significant digits"):
        TuneConfig(learning_rates=[1.5e-5, 1.50000001e-5])  # (both would be the candidate "lr 1.5e-05")
    with pytest.raises(ValueError, match="finite number"):
        TuneConfig(budget_minutes=float("inf"))
    with pytest.raises(ValueError, match="the search varies a fixed recipe"):  # (its error advised `--recipe auto`)
        TuneConfig(recipe="auto")


def test_the_recipe_searched_is_one_of_the_recipes_a_choice_in_the_run_form():
    """Found by a review: any text was taken (from the UI's run form; the CLI refused it), and a misspelt recipe
    searched the form's config under the misspelt name."""
    import typing

    from prefect.utilities.callables import parameter_schema

    from ance_core.pipeline.recipes import RECIPES
    from flows.tune import tune_recipe

    assert set(typing.get_args(TuneConfig.model_fields["recipe"].annotation)) == set(RECIPES)
    with pytest.raises(ValueError, match="Input should be 'demo', 'full' or 'full-maxp'"):
        TuneConfig(recipe="ful")
    schema = parameter_schema(tune_recipe).model_dump()["definitions"]["TuneConfig"]["properties"]["recipe"]
    assert schema["enum"] == ["demo", "full", "full-maxp"] and schema["default"] == "demo"


def test_a_learning_rate_shown_as_the_baselines_is_the_baseline():
    """A candidate is one trial per name: a listed rate that reads as the recipe's is the baseline, not a copy of it
    under the name "lr 4e-05" (its scores were kept by name)."""
    pool = candidates(TuneConfig(learning_rates=[4.0000001e-5]), 4e-5, "auto", 1, grades=[1])
    assert [c.name for c in pool] == ["demo (baseline)", "warm-up 2 epochs"]


def test_survivors_are_counted_among_the_trials_the_rung_ran_best_first():
    """A warm-up rung the budget cut scored 3 of 5 challengers: the best third of those 3 goes on (not of 5), and
    the survivors come best first (a budget that then fits one whole recipe gives it to the best)."""
    scores = _scores({"c1": {}, "c2": {(1, False): 0.53}, "c3": {(1, False): 0.55}, "c4": {(1, False): 0.60},
                      "c5": {}})
    rung = rungs(TuneConfig(seeds=[1]))[0]
    assert survivors(scores, ["c1", "c2", "c3", "c4", "c5"], rung, eta=3) == ["c4"]  # ceil(3/3), not ceil(5/3)
    assert survivors(scores, ["c1", "c2", "c3", "c4", "c5"], rung, eta=2) == ["c4", "c3"]


def test_a_difference_equal_to_the_margin_keeps_the_baseline():
    """0.705 - 0.700 is 0.0050000000000000044 in floats: not above a margin of 0.005."""
    runs = {"base": {(1, True): 0.700, (2, True): 0.700}, "a": {(1, True): 0.705, (2, True): 0.705}}
    winner, evidence = decide(_scores(runs), "base", margin=0.005)
    assert winner == "base" and "no candidate beat base by more than 0.005" in evidence["reason"]
    assert decide(_scores(runs), "base", margin=0.0049)[0] == "a"


def test_a_candidate_whose_trial_failed_cannot_win():
    """A crashed under seed 43 after leading under 42: its recipe is one that crashed, so the next best decides."""
    runs = {"base": {(42, True): 0.50}, "a": {(42, True): 0.60}, "b": {(42, True): 0.52}}
    winner, evidence = decide(_scores(runs), "base", margin=0.005, failed=["a"])
    assert winner == "b" and evidence["table"]["a"]["failed"] and not evidence["table"]["b"]["failed"]
    assert decide(_scores(runs), "base", margin=0.005, failed=["a", "b"])[0] == "base"


@pytest.mark.parametrize("setting", [{"learning_rates": [-1e-5]}, {"learning_rates": [0.0]}, {"warmup_epochs": [0]}])
def test_a_learning_rate_or_epochs_that_cannot_train_are_refused(setting):
    with pytest.raises(ValueError, match="greater than 0"):
        TuneConfig(**setting)



def test_a_listed_rate_is_a_candidate_when_the_baselines_two_stages_train_at_two_rates():
    """A review: with the warm-up at 2e-5 and the rounds at 4e-5, a listed 2e-5 was merged into the baseline (keyed
    by the warm-up's rate alone), so "2e-5 in both stages" was never tried."""
    pool = candidates(TuneConfig(learning_rates=[2e-5], warmup_epochs=[1]), None, "auto", 1, grades=[1])
    assert [c.name for c in pool] == ["demo (baseline)", "lr 2e-05"]
    assert pool[1].overrides == {"warmup.learning_rate": 2e-5, "ance.learning_rate": 2e-5}
