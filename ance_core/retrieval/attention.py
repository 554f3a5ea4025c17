"""SDPA's attention backends for encoding's forwards: the process's backend flags, held while encodings run."""

import threading
from contextlib import contextmanager

import torch
from torch.nn.attention import SDPBackend

# SDPA's backends for encoding: all but cuDNN's, which builds a plan for every new (batch, length) shape. Encoding's
# length-sorted batches are nearly all new shapes: on an H200 the plans took 5.6 s of a 9.1 s BERT-base-shaped
# encoding of 30k passages (9.5% of the bf16 peak; 24.9% without them: BENCHMARKS.md, bench/encode_pace.py).
# None: torch's choice.
SDPA_BACKENDS: list | None = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


_FLAGS = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "mem_efficient",
          SDPBackend.MATH: "math", SDPBackend.CUDNN_ATTENTION: "cudnn"}  # torch.backends.cuda's name of each
_backends_lock = threading.Lock()
_backends_held: list = []  # [the process's backends before the first holder, holders]: empty when none holds them


def _set_backends(enabled: dict) -> None:
    for name, on in enabled.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


@contextmanager
def attention_backends():
    """The context encoding's forwards run in: SDPA limited to `SDPA_BACKENDS` (a no-op on a CPU). SDPA's backend
    flags are the process's, not a thread's: encodings that overlap in threads (the async inferencer's beside a
    stage's) share one hold, set by the first to enter and restored by the last to leave. torch's `sdpa_kernel`
    alone restores what it found on entry, so overlapping holds left cuDNN off for good."""
    if SDPA_BACKENDS is None:
        yield
        return
    with _backends_lock:
        if not _backends_held:
            before = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in _FLAGS.values()}
            _backends_held[:] = [before, 0]
            _set_backends({name: backend in SDPA_BACKENDS for backend, name in _FLAGS.items()})
        _backends_held[1] += 1
    try:
        yield
    finally:
        with _backends_lock:
            _backends_held[1] -= 1
            if _backends_held[1] == 0:
                _set_backends(_backends_held[0])
                _backends_held.clear()
