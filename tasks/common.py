"""Task defaults shared by every stage: retries with backoff, but never for user errors."""

from prefect import Task
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

from ance_core.errors import AnceError


def retry_unless_user_error(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry transient failures; a bad dataset or config fails the same way every time."""
    try:
        state.result()
    except (AnceError, ValueError):
        return False
    except Exception:
        return True
    return True


TASK_DEFAULTS = dict(retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_unless_user_error)
