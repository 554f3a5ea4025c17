"""This process's place in a training process group, and the collectives the training loop needs from it: each rank's
slice of a global batch, every rank's rows gathered (in-batch negatives across ranks), every rank's RNG state.

Without a process group (one process) they are the identity: rank 0 of 1. The launcher that starts the group is
training/distributed.py.
"""

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place in the training process group (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


@contextmanager
def process_group(backend: str, **kwargs) -> Iterator[None]:
    """`dist.init_process_group(backend, **kwargs)` for the block, destroyed after it once the objects that use it
    are gone. A DDP module that outlives its group's destruction (held by a local still in scope, or by a reference
    cycle such as the training loop's closures, freed only by the cyclic collector at exit) can abort its rank as it
    is freed ("terminate called without an active exception", SIGABRT): 9 and 13 of 30 runs of a two-rank gloo
    script here, none of 30 with the collection first. Code in the block keeps its DDP module in a function it calls,
    so that it is unreferenced when the block ends."""
    dist.init_process_group(backend, **kwargs)
    try:
        yield
    finally:
        gc.collect()  # (while an exception propagates its traceback still holds the frames: the rank fails anyway)
        dist.destroy_process_group()


def current_ranks() -> Ranks:
    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


def split_sizes(n: int, world: int) -> list[int]:
    """Rows of an n-row batch on each rank: contiguous, the first n % world ranks one more."""
    base, extra = divmod(n, world)
    return [base + (r < extra) for r in range(world)]


def rank_rows(n: int, ranks: Ranks) -> slice:
    """This rank's contiguous slice of an n-row global batch."""
    sizes = split_sizes(n, ranks.world)
    start = sum(sizes[: ranks.rank])
    return slice(start, start + sizes[ranks.rank])


def gather_rows(local: torch.Tensor, sizes: Sequence[int], ranks: Ranks) -> torch.Tensor:
    """Every rank's rows (sizes[r] on rank r) concatenated in rank order; the gradient flows only into this rank's own
    rows, which are `local` itself (the other ranks' are copies)."""
    if ranks.world == 1:
        return local
    width = max(sizes)
    padded = local.new_zeros((width, *local.shape[1:]))
    padded[: len(local)] = local.detach()
    parts = [torch.empty_like(padded) for _ in range(ranks.world)]
    dist.all_gather(parts, padded)
    rows = [part[:size] for part, size in zip(parts, sizes, strict=True)]
    rows[ranks.rank] = local
    return torch.cat(rows)


def rng_states(ranks: Ranks) -> dict[str, torch.Tensor]:
    """The RNG states of every rank (a collective: all ranks call it), keyed `torch_cpu`, `cuda_<i>` for rank 0 and
    with a `_rank<r>` suffix for the others."""
    own = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        own |= {f"cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    if ranks.world == 1:
        return own
    gathered: list = [None] * ranks.world
    dist.all_gather_object(gathered, own)
    return {key + (f"_rank{r}" if r else ""): value
            for r, states in enumerate(gathered) for key, value in states.items()}


def restore_rng(saved: dict[str, torch.Tensor], ranks: Ranks) -> None:
    suffix = f"_rank{ranks.rank}" if ranks.rank else ""
    mine = {key[: len(key) - len(suffix)]: value for key, value in saved.items()
            if key.endswith(suffix) and (suffix or "_rank" not in key)}
    torch.set_rng_state(mine["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [mine[k] for k in sorted((k for k in mine if k.startswith("cuda_")), key=lambda k: int(k[5:]))]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)


def inferencer_gpu(count: int, trainer_gpus: int) -> tuple[int | None, str | None]:
    """(the GPU an in-process inferencer encodes on, a warning or None): paper A.3's 1:1 allocation, the training
    ranks on GPUs 0..trainer_gpus-1 and the inferencer on the first GPU none of them uses; with none free, the last
    one, shared with a rank (whose steps every other rank then waits for). None with one GPU or none."""
    if count <= 1:
        return None, None
    if count > trainer_gpus:
        return trainer_gpus, None
    return count - 1, (f"the inferencer shares GPU {count - 1} with a training rank (ance.world_size {trainer_gpus} "
                       f"on {count} GPUs): every rank's step waits for that one; leave it a GPU of its own "
                       f"(ance.world_size {count - 1})")
