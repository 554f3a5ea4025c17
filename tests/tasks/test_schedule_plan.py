"""The learning-rate schedules of a run's training stages (`schedule: continuous`), and a restart from an earlier
model: the stages left become one schedule of their own, warmed up again, with a fresh optimizer."""

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.training.config import TrainConfig
from ance_core.training.loop import Schedule
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
