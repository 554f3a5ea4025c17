"""Live logging: the training steps of a stage streamed to MLflow from a background thread while it trains.

The pipeline opens a `LiveMetrics` for a training stage and sets it in the `LIVE` context variable; the training
task adds `live_callbacks()` to its callbacks, so the stage itself knows nothing of MLflow.
"""

import contextvars
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tracking.client import BATCH, Tracker, metric_key

if TYPE_CHECKING:
    from mlflow.entities import Metric

STEP_KEYS = ["loss", "lr", "grad_norm", "grad_norm_bottom", "grad_norm_middle", "grad_norm_top",
             "dev_check_ndcg_at_10", "examples_per_s"]  # (a dev check's score on the steps that have one)
PARENT_KEYS = STEP_KEYS[:-1]  # the parent run's curves span all stages on one global step axis (a stage's own run:
# its steps from 1, so that Compare lays the same stage of two runs, or two samplers from one warm-up, on each other)
LIVE_INTERVAL = float(os.environ.get("ANCE_MLFLOW_LIVE_INTERVAL", "5"))


class LiveMetrics:
    """Streams training steps to MLflow while a stage trains, without slowing it down.

    The training loop only appends to a list (`__call__`); a background thread sends what has accumulated every
    `interval` seconds in one batch per run. A batch that fails stays queued and is retried at the next flush
    (delivered late when the server comes back); what is still queued at `close` is left to the pipeline's final
    logging, which sends it from train_log.jsonl or keeps it in the spool. `delivered` lists the steps that arrived.
    """

    def __init__(self, tracker: Tracker, runs: dict[str, list[str]], step_offset: int | dict[str, int],
                 interval: float = 5.0):
        """`runs`: the keys logged to each run; `step_offset`: added to each run's steps (a run id's own, or one for
        all: the parent's curves span the stages on one step axis, a stage's own run counts from its step 1)."""
        self.tracker, self.runs, self.interval = tracker, runs, interval
        self.offsets = step_offset if isinstance(step_offset, dict) else dict.fromkeys(runs, step_offset)
        self.queue: list[dict] = []
        self.pending: dict[str, list[Metric]] = {run: [] for run in runs}
        self.delivered: dict[str, set[int]] = {run: set() for run in runs}
        self.seen: set[int] = set()  # the steps queued so far
        self.busy_s = 0.0  # wall time spent sending (in the background thread, and in close)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="mlflow-live", daemon=True)
        self._thread.start()

    def __call__(self, record: dict) -> None:
        """Queue a step's record; a step already queued is not sent again (a retried stage resumes from its last
        checkpoint and trains the steps after it again: MLflow would keep both points of each)."""
        with self._lock:
            if record["step"] in self.seen:
                return
            self.seen.add(record["step"])
            self.queue.append(record)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        from mlflow.entities import Metric

        started = time.perf_counter()
        with self._lock:
            records, self.queue = self.queue, []
        now = int(time.time() * 1000)
        for run, keys in self.runs.items():
            carried, offset = len(self.pending[run]), self.offsets.get(run, 0)  # (points a failed flush left queued)
            self.pending[run] += [Metric(metric_key(k), float(r[k]), int(r.get("timestamp", now)),
                                         int(r["step"]) + offset) for r in records for k in keys if k in r]
            if not self.pending[run]:
                continue
            sent: set[int] = set()
            while self.pending[run]:  # batch by batch: a delivered batch leaves the queue at once (were it kept
                batch = self.pending[run][:BATCH]  # until all arrived, a later batch's failure would send it again)
                if not self.tracker.attempt(self.tracker.client.log_batch, run, metrics=batch)[0]:
                    break
                self.tracker.delivered_late += min(carried, len(batch))
                carried = max(0, carried - len(batch))
                sent |= {m.step - offset for m in batch}
                del self.pending[run][:BATCH]
            # a step is delivered when all its points are (one split across batches is sent again whole at the end)
            self.delivered[run] |= sent - {m.step - offset for m in self.pending[run]}
        self.busy_s += time.perf_counter() - started

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()


LIVE: contextvars.ContextVar[LiveMetrics | None] = contextvars.ContextVar("ance_live_metrics", default=None)


def live_callbacks() -> list[Callable[[dict], None]]:
    """The training callback of the current pipeline's live logging, if one is active in this context."""
    live = LIVE.get()
    return [live] if live is not None else []
