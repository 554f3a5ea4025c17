"""One optimizer step's gradients: the micro-batches of gradient accumulation (one all-reduce per step under DDP),
and cached in-batch negatives (GradCache), each with its loss read once per step; the gradient norms the training
log records (the whole model's and each third of its layers'), read with the loss in one transfer."""

import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch

from ance_core.modeling.model import BiEncoder


class PairEncoder(torch.nn.Module):
    """Queries and passages through one encoder in one forward call: the module DDP wraps (DDP expects one forward
    per backward)."""

    def __init__(self, model: BiEncoder):
        super().__init__()
        self.model = model

    def forward(self, queries: dict[str, torch.Tensor], passages: dict[str, torch.Tensor]):
        return self.model(**queries), self.model(**passages)



def accumulate_gradients(encoder: torch.nn.Module, micro_batches: Sequence, loss_of: Callable[[object], torch.Tensor],
                         world: int, scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """Forward and backward of the micro-batches of one optimizer step; returns the step's loss (a tensor on the
    device: reading it is the caller's one device sync per step): the mean of the micro-batches' losses, however
    many the step has (grad_accumulation, or fewer when the pairs run out: a stage of fewer pairs than one batch).

    Under DDP (`world` > 1) the gradient is all-reduced once, in the last micro-batch's backward: the others run
    forward and backward inside `no_sync()`, since DDP decides at forward time whether the backward all-reduces.
    Each rank's loss is the whole batch's (ranks.py), so its gradient is scaled by `world` for DDP's average."""
    total = None
    for b, batch in enumerate(micro_batches):
        last = b == len(micro_batches) - 1
        with encoder.no_sync() if world > 1 and not last else nullcontext():
            loss = loss_of(batch) / len(micro_batches)
            scaled = loss * world
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total if total is not None else torch.zeros(())  # (an epoch's last rows may not go round the ranks)


def chunk_inputs(batch: dict, chunk: int, group: int, left: bool) -> list[tuple[dict, dict]]:
    """A micro-batch's (queries, passages) inputs cut `chunk` queries (and their `group` passages each) at a time,
    each chunk's columns trimmed to its own longest text (right padding: the trimmed columns are padding only)."""

    def rows(inputs: dict, start: int, stop: int) -> dict:
        part = {k: v[start:stop] for k, v in inputs.items()}
        if not left:
            width = int(part["attention_mask"].sum(dim=1).max())
            part = {k: v[:, :width] for k, v in part.items()}
        return part

    b = len(batch["queries"]["input_ids"])
    ends = [(s, min(s + chunk, b)) for s in range(0, b, chunk)]
    return [(rows(batch["queries"], s, e), rows(batch["passages"], s * group, e * group)) for s, e in ends]


def cached_gradients(encoder: torch.nn.Module, micro_batches: Sequence[dict], embed: Callable, loss_of: Callable,
                     chunk: int, group: int, left: bool, world: int, scaler: torch.amp.GradScaler | None = None
                     ) -> torch.Tensor:
    """`accumulate_gradients` with cached in-batch negatives (GradCache, Gao et al. 2021): each micro-batch is
    embedded `chunk` queries at a time without a graph (`embed(queries, passages)` -> float (q, p)), the loss of the
    whole micro-batch (`loss_of(batch, q, p)`) is backpropagated to those embeddings only, and each chunk is embedded
    again with its graph, under the RNG state of its first pass (the same dropout), and backpropagated with its rows'
    cached gradients. The weights' gradient is that of the whole micro-batch at once; its activations are one chunk's.

    Under DDP one backward per step all-reduces: the last chunk's of the last micro-batch (the others in `no_sync()`).
    """
    total = None
    for b, batch in enumerate(micro_batches):
        chunks = chunk_inputs(batch, chunk, group, left)
        states, qs, ps = [], [], []
        with torch.no_grad():
            for queries, passages in chunks:
                states.append(_rng_state())
                q, p = embed(queries, passages)
                qs.append(q), ps.append(p)
        q, p = torch.cat(qs).requires_grad_(), torch.cat(ps).requires_grad_()
        loss = loss_of(batch, q, p) / len(micro_batches)
        scaled = loss * world
        (scaler.scale(scaled) if scaler is not None else scaled).backward()  # into q.grad, p.grad only
        q_grad, p_grad = q.grad.split([len(x) for x in qs]), p.grad.split([len(x) for x in ps])
        for k, (queries, passages) in enumerate(chunks):
            last = b == len(micro_batches) - 1 and k == len(chunks) - 1
            with encoder.no_sync() if world > 1 and not last else nullcontext():
                _set_rng_state(states[k])
                qk, pk = embed(queries, passages)
                torch.autograd.backward([qk, pk], [q_grad[k], p_grad[k]])
        total = loss.detach() if total is None else total + loss.detach()
    return total if total is not None else torch.zeros(())


def _rng_state() -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


# ---------------------------------------------------------------- the step's gradient norms (train_log.jsonl)

LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")


def layer_groups(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The transformer layers' parameters in thirds (ANCE ICLR Fig. 4): bottom, middle, top.

    Layer i of n goes to third i*3//n; with fewer than 3 layers the first is "bottom" and the last "top".
    Embeddings and the head belong to no third (they count in the overall norm only)."""
    indexed = [(int(m.group(1)), p) for name, p in model.named_parameters()
               if p.requires_grad and (m := LAYER_INDEX.search(name))]
    if not indexed:
        return {}
    n = max(i for i, _ in indexed) + 1
    names = ("bottom", "middle", "top")
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for i, p in indexed:
        third = names[i * 3 // n] if n >= 3 else ("bottom" if i == 0 else "top")
        groups.setdefault(third, []).append(p)
    return groups


def group_grad_norms(groups: dict[str, list[torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """L2 norm of each group's gradients (call before clipping: the pre-clip norms), as tensors on the device: read
    with the step's other figures (`read_once`)."""
    out = {}
    for name, params in groups.items():
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            out[f"grad_norm_{name}"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return out


def read_once(figures: dict[str, torch.Tensor]) -> dict[str, float]:
    """The step's device scalars as floats in one transfer: one device sync per optimizer step (each `float()` of a
    CUDA tensor is one, and the host cannot queue the next step's kernels while it waits)."""
    device = max((t.device for t in figures.values()), key=lambda d: d.type != "cpu")  # (a rank with no rows: a
    # CPU zero for its loss, beside the device's norms)
    values = torch.stack([t.detach().float().reshape(()).to(device) for t in figures.values()]).tolist()
    return dict(zip(figures, values, strict=True))
