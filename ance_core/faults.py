"""Named points inside long stage work where a drill may stop a run: after each corpus shard is written, after the
index file is written (before its doc ids), between the data tables. Nothing happens unless a hook is set;
tasks/common.py sets the one that reads ANCE_FAULT (`<name>@<step>[:hang]`).

`drills_armed()` says whether a drill may fire at all, so that work a drill must find done where it stops the process
(a checkpoint being written in the background, training/checkpointing.py) is finished first only then."""

from collections.abc import Callable

_hook: Callable[[str, int | None], None] | None = None
_armed: Callable[[], bool] | None = None


def set_fault_hook(hook: Callable[[str, int | None], None] | None,
                   armed: Callable[[], bool] | None = None) -> None:
    """`hook(name, step)` runs at each fault point; `armed()` says whether it may fire (unset: whenever there is a
    hook)."""
    global _hook, _armed
    _hook, _armed = hook, armed


def fault_point(name: str, step: int | None = None) -> None:
    """Give the hook a chance to fail or hang here (`name` is the task's, `step` the point within it)."""
    if _hook is not None:
        _hook(name, step)


def drills_armed() -> bool:
    """Whether a fault point, or a drill of the task's own (a training callback), may stop the process."""
    return _hook is not None and (_armed is None or _armed())
