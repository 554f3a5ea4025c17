"""The asynchronous trainer's refresh state (negatives/refresh_state.py): an event log appended each step, folded
back the same after a kill, a resume, or from a folder written before the log."""

import json

from ance_core.artifacts import ASYNC_STATE, ASYNC_STATE_V1
from ance_core.negatives.refresh_state import MemoryBoard, RefreshState, read_refresh_state


def test_each_step_appends_its_events_and_the_log_folds_back_to_the_state(tmp_path):
    board, state = MemoryBoard(), RefreshState(tmp_path, "first", max_staleness=None)
    sizes = []
    for step in range(6):
        if step == 2:
            board.post(snapshot=2)
        if step == 4:
            board.post(ready=(2, "mined-at-2", 1.5))
        swapped = state.update(step, board)
        assert swapped == ("mined-at-2" if step == 4 else None)
        sizes.append((tmp_path / ASYNC_STATE).stat().st_size)
    lines = (tmp_path / ASYNC_STATE).read_text().splitlines()
    assert len(lines) == 7 and sizes == sorted(set(sizes))  # 6 steps and a swap, appended
    assert state.state["staleness"] == [[0, 0], [1, 1], [2, 2], [3, 3], [4, 2], [5, 3]]
    assert state.state["in_use"] == {"checkpoint_step": 2, "negatives": "mined-at-2"}
    assert read_refresh_state(tmp_path, "first") == state.state


def test_a_line_cut_by_a_kill_is_dropped_and_a_resume_rewrites_the_log(tmp_path):
    board, state = MemoryBoard(), RefreshState(tmp_path, "first", max_staleness=None)
    board.post(snapshot=1)
    board.post(ready=(1, "mined-at-1", 0.5))
    for step in range(4):
        state.update(step, board)  # the swap at step 0
    with open(tmp_path / ASYNC_STATE, "a") as log:
        log.write('{"staleness": [4,')  # killed mid-line
    again = RefreshState(tmp_path, "first", max_staleness=None)
    assert [s for s, _ in again.state["staleness"]] == [0, 1, 2, 3]
    assert again.resume(2) == "mined-at-1"  # the checkpoint was at step 2: the swap at step 0 stands
    assert [s for s, _ in read_refresh_state(tmp_path)["staleness"]] == [0, 1]
    assert not (tmp_path / ASYNC_STATE).read_text().endswith("[4,")
    assert again.resume(0) is None and read_refresh_state(tmp_path, "first")["in_use"]["negatives"] == "first"


def test_a_folder_written_before_the_log_is_read_from_its_json(tmp_path):
    old = {"in_use": {"checkpoint_step": 3, "negatives": "n3"}, "swaps": [], "waits": [], "staleness": [[0, 0]]}
    (tmp_path / ASYNC_STATE_V1).write_text(json.dumps(old, indent=2))
    assert read_refresh_state(tmp_path) == old
    state = RefreshState(tmp_path, "first", max_staleness=None)
    state.resume(1)  # a resumed stage continues in the log and drops the old file
    assert (tmp_path / ASYNC_STATE).is_file() and not (tmp_path / ASYNC_STATE_V1).exists()


def test_an_async_trainer_started_again_from_step_0_forgets_the_steps_of_the_attempt_before(tmp_path, monkeypatch):
    """Killed before its first checkpoint, the asynchronous trainer starts again at step 0: the refresh log of the
    killed attempt's steps was kept (its resume ran only from a checkpoint), and the report counted them twice. The
    task now resumes the refresh state from every start; from step 0 nothing is published again."""
    import logging

    import tasks.train_async
    from ance_core.artifacts import ArtifactRef
    from tasks.train_async import AsyncNegatives

    board, state = MemoryBoard(), RefreshState(tmp_path, str(tmp_path / "first"), max_staleness=None)
    for step in range(3):
        state.update(step, board)
    monkeypatch.setattr(tasks.train_async, "get_run_logger", lambda: logging.getLogger("ance"))
    again = AsyncNegatives(tmp_path, ArtifactRef(str(tmp_path / "first"), "first"), {}, "trainer", str(tmp_path),
                           max_staleness=None, steps_per_round=2)
    assert [s for s, _ in again.refresh.state["staleness"]] == [0, 1, 2]  # the killed attempt's steps
    assert again.resume(0, [2, 4]) is None and again.refresh.state["staleness"] == [] and not again.threads
    assert read_refresh_state(tmp_path)["staleness"] == []
