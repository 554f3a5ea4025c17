"""A fault hook for training ranks (ANCE_FAULT_HOOK) that also makes each checkpoint write take 3 s: a launcher that
acted on a step's log record before its checkpoint was on disk would stop the ranks first
(tests/core/training/test_distributed.py)."""

import time

import ance_core.training.checkpointing as checkpointing
import tasks.common  # noqa: F401  (the ANCE_FAULT hook, as the training task passes its ranks)

_write = checkpointing.write_checkpoint


def _slow_write(*args, **kwargs):
    time.sleep(3)
    return _write(*args, **kwargs)


checkpointing.write_checkpoint = _slow_write
