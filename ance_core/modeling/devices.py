"""Where a model runs and at which precision: the device, bf16 in hardware, autocast's dtype, and accelerator
out-of-memory errors as one line."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ance_core.errors import OutOfMemory, warn
from ance_core.modeling.config import Precision


def pick_device(prefer: str = "auto") -> torch.device:
    if prefer in ("auto", "cuda", "gpu") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@contextmanager
def out_of_memory_advice(doing: str, advice: str) -> Iterator[None]:
    """An accelerator out-of-memory error inside becomes `OutOfMemory`, one line naming what was `doing` (the batch)
    and what to change (`advice`): not retried, since the same batch runs out of memory the same way."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        raise OutOfMemory(f"out of GPU memory {doing}: {advice} ({first})") from None


def cpu_has_native_bf16() -> bool:
    """Does this CPU multiply bf16 in hardware (AVX512-BF16 or AMX)? Without them oneDNN emulates bf16 matmuls:
    a MiniLM training step under bf16 autocast took 25x its fp32 time on an AVX2-only EPYC (BENCHMARKS.md)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these probes: assume none
        return False


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """None means full fp32. 'auto': bf16 on a CPU that multiplies bf16 in hardware (about 1.5x faster than fp32 on
    one) and fp32 on one that does not (emulated bf16 is many times slower); on CUDA bf16 where supported, else
    fp16. An explicit 'bf16' on a CPU without it is honoured, with a warning."""
    if precision == "fp32":
        return None
    if precision == "fp16":
        return torch.float16
    if device.type == "cpu" and not cpu_has_native_bf16():
        if precision == "auto":
            return None
        warn("precision bf16 on a CPU without bf16 in hardware (no AVX512-BF16 or AMX): bf16 is emulated and "
                  "runs many times slower than fp32 here; set precision: auto or fp32")
        return torch.bfloat16
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16
