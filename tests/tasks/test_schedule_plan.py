"""The learning-rate schedules of a run's training stages (`schedule: continuous`), and a restart from an earlier
model: the stages left become one schedule of their own, warmed up again, with a fresh optimizer."""

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.training.config import TrainConfig
from ance_core.training.plan import Schedule
from tasks.train import SchedulePlan


def _negatives(tmp_path, pairs: int) -> ArtifactRef:
    return run_stage(str(tmp_path), "mine", {"pairs": pairs}, {}, lambda out: {"pairs": pairs})


def test_continuous_stages_share_one_schedule(tmp_path):
    stages = [TrainConfig(epochs=1, batch_size=10), TrainConfig(epochs=2, batch_size=10)]
    plan = SchedulePlan("continuous", stages)
    negatives = _negatives(tmp_path, 100)  # 10 steps an epoch
    assert plan.next(negatives) == Schedule(0, 30, 3, False)
    assert plan.next(negatives) == Schedule(10, 30, 3, True)


def test_a_stage_that_restarts_from_an_earlier_model_gets_a_schedule_of_its_own(tmp_path):
    stages = [TrainConfig(epochs=1, batch_size=10), TrainConfig(epochs=2, batch_size=10),
              TrainConfig(epochs=1, batch_size=10)]
    plan = SchedulePlan("continuous", stages)
    assert plan.next(_negatives(tmp_path, 100)) == Schedule(0, 40, 4, False)
    # the second stage starts from the model before the first: it and the third are planned anew, from its own pairs
    assert plan.next(_negatives(tmp_path, 50), restart=True) == Schedule(0, 15, 1, False)
    assert plan.next(_negatives(tmp_path, 50)) == Schedule(10, 15, 1, True)


def test_per_stage_schedules_are_none(tmp_path):
    plan = SchedulePlan("per-stage", [TrainConfig()])
    assert plan.next(_negatives(tmp_path, 10), restart=True) is None


def test_each_stage_is_planned_from_its_own_pairs_when_they_are_known(tmp_path):
    """A sample of the queries per stage (`queries`): the rounds train on other pairs than the warm-up, in another
    number. Planned from the warm-up's negatives they would overrun the schedule or never reach its end (issue 41);
    with each stage's own pairs the schedule ends with the last stage, whatever restarts."""
    stages = [TrainConfig(epochs=1, batch_size=10), TrainConfig(epochs=2, batch_size=10),
              TrainConfig(epochs=1, batch_size=10)]
    plan = SchedulePlan("continuous", stages, pairs=[50, 200, 120])  # 5 + 40 + 12 steps
    warmup = _negatives(tmp_path, 50)
    assert plan.next(warmup) == Schedule(0, 57, 5, False)
    assert plan.next(_negatives(tmp_path, 200)) == Schedule(5, 57, 5, True)
    assert plan.next(_negatives(tmp_path, 120)) == Schedule(45, 57, 5, True)  # 45 + 12 = the schedule's end
    again = SchedulePlan("continuous", stages, pairs=[50, 200, 120])
    again.next(warmup)
    assert again.next(warmup, restart=True) == Schedule(0, 52, 5, False)  # the rounds' own 40 + 12, not 5 + 5
    assert again.next(warmup) == Schedule(40, 52, 5, True)


def test_a_round_over_a_sample_of_queries_counts_the_samples_pairs(tiny_scifact, tmp_path):
    """stage_pairs draws the sample mine_negatives draws: its count is the mined table's rows."""
    from ance_core.data.config import DataConfig
    from ance_core.negatives.config import MiningConfig
    from ance_core.negatives.mining import read_training_pairs
    from tasks.data import prepare_data
    from tasks.mine import mine_negatives, stage_pairs

    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), str(tmp_path))
    for cfg in (MiningConfig(sampler="random"), MiningConfig(sampler="random", queries=7)):
        for round_ in (1, 2):
            mined = mine_negatives.fn({}, data, "train", cfg, round_, str(tmp_path))
            rows = len(read_training_pairs(f"{mined.path}/negatives.parquet"))
            assert stage_pairs(data, "train", cfg, round_) == rows
    # the warm-up (round 0) over a sample of the queries, mined as a run mines it: its BM25 negatives
    from ance_core.negatives.config import WarmupMiningConfig
    from ance_core.retrieval.config import BM25Config, EncodeConfig, IndexConfig
    from tasks.refresh import refresh_negatives

    for cfg in (WarmupMiningConfig(), WarmupMiningConfig(queries=7)):
        mined = refresh_negatives(None, data, "train", EncodeConfig(), IndexConfig(), cfg, 0, str(tmp_path),
                                  BM25Config())["mine"]
        assert stage_pairs(data, "train", cfg, 0) == len(read_training_pairs(f"{mined.path}/negatives.parquet"))
    sampled, every = (stage_pairs(data, "train", WarmupMiningConfig(queries=q), 0) for q in (7, None))
    assert sampled < every
