"""The Prefect UI's artifacts as the flows publish them (unit level; tests/test_server_e2e.py reads them from a real
server): keys of a flow and collection, best effort, and progress bars that finish and survive a retry."""

import prefect.artifacts
import pytest

from ance_core.errors import AnceWarning
from flows.publish import artifact_key, publish
from tasks.common import _BARS, Progress


def test_artifact_keys_are_prefects_alphabet_and_tell_flows_and_collections_apart():
    assert artifact_key("ance-train", "scifact", "results") == "ance-train-scifact-results"
    assert artifact_key("compare-negatives", "SciFact", "results") == "compare-negatives-scifact-results"
    assert artifact_key("ance-train", "My Data_v2.1", "stage-times") == "ance-train-my-data-v2-1-stage-times"


def test_an_artifact_the_api_refuses_is_a_warning_not_a_failed_run():
    def refused(*args, **kwargs):
        raise RuntimeError("503 Service Unavailable")

    with pytest.warns(AnceWarning, match="ance-train-x-results was not published .*503"):
        publish(refused, [{"a": 1}], key="ance-train-x-results")


@pytest.fixture
def calls(monkeypatch):
    made = []
    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact",
                        lambda progress, description: made.append(("create", progress)) or f"id{len(made)}")
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact",
                        lambda artifact, progress: made.append((artifact, progress)))
    yield made
    _BARS.clear()


def test_a_stage_that_stops_early_fills_its_bar(calls):
    """Dev checks stop a stage at step 370 of 1,000: the bar stayed where the last update left it."""
    bar = Progress(1000, "training", every_s=3600, task_run="run-1")
    for step in range(1, 371):
        bar(step)
    bar.finish()
    assert calls == [("create", 0.1), ("id1", 100.0)]


def test_the_first_update_is_sent_however_long_the_machine_has_been_up(calls, monkeypatch):
    """The last update's time started at 0 on the monotonic clock, which counts from boot: on a machine up for less
    than `every_s` the first update waited (the test above failed on a machine up for 46 minutes)."""
    monkeypatch.setattr("tasks.common.time.monotonic", lambda: 12.0)  # 12 s after boot
    bar = Progress(1000, "encoding", every_s=60, task_run="run-1")
    bar(5)
    bar(6)  # (within a minute of the first: not sent)
    assert calls == [("create", 0.5)]


def test_a_retried_attempt_moves_the_same_bar(calls):
    """Each attempt made a bar of its own; the first one's stayed behind where it stopped."""
    Progress(100, "training", every_s=0, task_run="run-1")(43)
    Progress(100, "training", every_s=0, task_run="run-1")(50)  # the retry, resumed from its checkpoint
    Progress(100, "other", every_s=0, task_run="run-2")(10)
    Progress(100, "outside a task run", every_s=0, task_run=None)(10)
    assert calls == [("create", 43.0), ("id1", 50.0), ("create", 10.0)]
