"""When a training stage takes a resumable checkpoint, and writing it while training goes on.

Cadence (`CheckpointCadence`): every `checkpoint_seconds` of wall-clock time (the default), every `checkpoint_every`
optimizer steps, or both, whichever comes first; 0 turns each off. Under DDP every rank must take a checkpoint at the
same step (ranks.py `rng_states` is a collective), so rank 0 alone reads the clock and broadcasts its decision: one
one-element broadcast per step, only while the seconds cadence is on.

Writing (`CheckpointWriter`): the training thread copies the state to CPU memory (state.py `capture_state`: one
consistent step) and a background thread writes it as checkpoints/step-N (state.py `write_checkpoint`: a temporary
folder renamed into place), one write at a time. A write that fails raises on the training thread, at the next
checkpoint or at `wait()`; leaving the writer's `with` block waits for the write in flight.
"""

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from time import monotonic

import torch
import torch.distributed as dist

from ance_core.training.ranks import Ranks
from ance_core.training.state import CHECKPOINTS, TrainingState, write_checkpoint


class CheckpointCadence:
    """Whether a checkpoint is due after an optimizer step: every `every_steps` steps (0: never by steps) or once
    `every_seconds` have passed since the last checkpoint (or the start; 0: never by time). Every rank gets the same
    answer for the same step; call `due` at every step on every rank (with the seconds cadence on under DDP it is a
    collective), and `taken` after each checkpoint, whatever made it due."""

    def __init__(self, every_steps: int, every_seconds: float, ranks: Ranks,
                 clock: Callable[[], float] | None = None):
        self.every_steps, self.every_seconds, self.ranks = every_steps, every_seconds, ranks
        self.clock = clock or monotonic
        self.last = self.clock()

    def due(self, step: int) -> bool:
        by_steps = bool(self.every_steps) and step % self.every_steps == 0
        if not self.every_seconds:
            return by_steps
        by_time = self.ranks.main and self.clock() - self.last >= self.every_seconds
        if self.ranks.world > 1:
            by_time = rank0_decides(by_time)
        return by_steps or by_time

    def taken(self) -> None:
        self.last = self.clock()


def rank0_decides(flag: bool) -> bool:
    """Rank 0's `flag`, on every rank of the process group (a collective)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    shared = torch.tensor([int(flag)], device=device)
    dist.broadcast(shared, src=0)
    return bool(shared.item())


class CheckpointWriter:
    """Writes captured training states as `out`/checkpoints/step-N from one background thread, one at a time."""

    def __init__(self, out: Path):
        self.out = out
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self.pending: tuple[int, Future] | None = None  # the step being written, and its write

    def write(self, state: TrainingState) -> None:
        """Start writing `state` (captured on this thread: nothing of it changes while it is written), once the write
        before it is done."""
        self.wait()
        self.pending = state.step, self.pool.submit(write_checkpoint, self.out, state)

    def wait(self) -> None:
        """Return once no write is in flight; a write that failed raises its error here."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        step, write = pending
        try:
            write.result()
        except BaseException as error:
            error.add_note(f"(while writing the step-{step} checkpoint in {self.out / CHECKPOINTS})")
            raise

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            self.wait()
        except Exception as failed:
            if error is None:
                raise
            error.add_note(f"and writing the last checkpoint failed too: {failed!r}")  # the training's error goes on
        finally:
            self.pool.shutdown()
