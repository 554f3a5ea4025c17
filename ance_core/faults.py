"""Named points inside long stage work where a drill may stop a run: after each corpus shard is written, after the
index file is written (before its doc ids), between the data tables. Nothing happens unless a hook is set;
tasks/common.py sets the one that reads ANCE_FAULT (`<name>@<step>[:hang]`)."""

from collections.abc import Callable

_hook: Callable[[str, int | None], None] | None = None


def set_fault_hook(hook: Callable[[str, int | None], None] | None) -> None:
    global _hook
    _hook = hook


def fault_point(name: str, step: int | None = None) -> None:
    """Give the hook a chance to fail or hang here (`name` is the task's, `step` the point within it)."""
    if _hook is not None:
        _hook(name, step)
