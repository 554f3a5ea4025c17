"""One optimizer step of a training stage, as a function of the step's micro-batches (issue 42: the loop in loop.py is
setup plus a short loop over this, nanoGPT's shape; a step with fixed inputs is what CUDA-graph capture needs).

`TrainStep(...)(micro_batches)` encodes each micro-batch (this rank's slice of it under DDP), takes the NLL of ANCE
eq. 5 over the whole batch (plus a teacher's KL where the rows carry one), accumulates the gradients (or caches the
in-batch negatives' gradients: GradCache), clips them, steps the optimizer and the schedule and, with `ema_decay`,
the weight average. It returns the step's figures as device tensors, not read: the loop reads them in one transfer
after the step is queued (`read_once`).
"""

from contextlib import nullcontext

import torch

from ance_core.training.config import TrainConfig
from ance_core.training.gradients import accumulate_gradients, cached_gradients, group_grad_norms, layer_groups
from ance_core.training.loss import distill_loss, nll_loss
from ance_core.training.ranks import Ranks, gather_rows, split_sizes


class WeightAverage:
    """An exponential moving average of the trainable weights (`ema_decay`), kept in the optimizer's per-parameter
    state (key "ema": saved, resumed and carried with the moments). A fresh stage starts it from its first step's
    weights (dropping a previous stage's, which a continued optimizer state carries)."""

    KEY = "ema"

    def __init__(self, model: torch.nn.Module, optimizer, decay: float, fresh: bool):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.decay = optimizer, decay
        if fresh:
            for p in self.params:
                self.optimizer.state.get(p, {}).pop(self.KEY, None)

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step `step` (1-based) of the stage: the decay is min(decay, (1 + step) / (10 + step)), so
        the first steps' weights do not dominate a short stage's average (TensorFlow's ExponentialMovingAverage with
        num_updates)."""
        decay = min(self.decay, (1 + step) / (10 + step))
        for p in self.params:
            state = self.optimizer.state[p]  # (set by the optimizer's first step: the moments come first)
            if self.KEY not in state:
                state[self.KEY] = p.detach().float().clone()
            else:
                state[self.KEY].lerp_(p.detach().float(), 1 - decay)

    @torch.no_grad()
    def apply(self) -> None:
        for p in self.params:
            if self.KEY in self.optimizer.state.get(p, {}):
                p.copy_(self.optimizer.state[p][self.KEY].to(p.dtype))


# shapes a compiled encoder may see before torch falls back to eager for new ones (its default is 8): query widths x
# passage widths x the batch sizes of an epoch's last step, at pad_multiple
RECOMPILE_LIMIT = 64


def compiled(encoder: torch.nn.Module, device: torch.device, grad_accumulation: int) -> torch.nn.Module:
    """The encoder under torch.compile (`compile`): its forward and backward as inductor kernels, and on CUDA each
    shape's step a captured CUDA graph (mode reduce-overhead: one launch for the step's kernels, the fix for a step
    that launches faster than the GPU computes). Not with grad_accumulation > 1: a graph's replay would overwrite the
    gradients the micro-batch before it left in the graph's memory, so those steps compile without CUDA graphs.
    Static shapes: the batches are padded to `pad_multiple`."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    mode = "reduce-overhead" if device.type == "cuda" and grad_accumulation == 1 else None
    return torch.compile(encoder, mode=mode, dynamic=False)


class TrainStep:
    """The stage's optimizer step. `encoder`: the PairEncoder (DDP-wrapped with several ranks) of `model`; `group`:
    passages per query (1 positive + the mined negatives); `dtype`: the autocast dtype (None: fp32); `scaler`: fp16's
    loss scaler on CUDA; `averaged`: the EMA of the weights, or None; `left_padded`: the tokenizer pads on the left
    (GradCache trims padding columns only on the right)."""

    def __init__(self, model: torch.nn.Module, encoder: torch.nn.Module, optimizer, scheduler, cfg: TrainConfig,
                 group: int, device: torch.device, dtype: torch.dtype | None, scaler: torch.amp.GradScaler | None,
                 ranks: Ranks, averaged: WeightAverage | None, left_padded: bool):
        self.model, self.encoder, self.optimizer, self.scheduler, self.cfg = model, encoder, optimizer, scheduler, cfg
        self.group, self.device, self.dtype, self.scaler, self.ranks = group, device, dtype, scaler, ranks
        self.averaged, self.left_padded = averaged, left_padded
        self.thirds = layer_groups(model)
        if cfg.compile:
            self.encoder = compiled(encoder, device, cfg.grad_accumulation)

    def embed(self, queries: dict, passages: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (b, h) query and (b*G, h) passage embeddings, float32."""
        on_device = lambda inputs: {k: v.to(self.device, non_blocking=True) for k, v in inputs.items()}  # noqa: E731
        with torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None else nullcontext():
            q, p = self.encoder(on_device(queries), on_device(passages))
        return q.float(), p.float()

    def batch_loss(self, batch: dict, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The loss of a global micro-batch of batch["rows"] pairs from this rank's embeddings of its slice."""
        cfg, group = self.cfg, self.group
        mask = batch["mask"].to(self.device, non_blocking=True) if "mask" in batch else None  # (B, B*G)
        sizes = split_sizes(batch["rows"], self.ranks.world)
        q = gather_rows(q, sizes, self.ranks)  # (B, h)
        p = gather_rows(p, [n * group for n in sizes], self.ranks)  # (B*G, h)
        loss = nll_loss(q, p, group, cfg.in_batch_negatives, mask, cfg.hardest_in_batch)
        if "teacher" in batch and cfg.distill_weight:  # the negatives carry a teacher's scores of each group
            loss = loss + cfg.distill_weight * distill_loss(q, p, group, batch["teacher"].to(self.device))
        return loss

    def micro_batch_loss(self, batch: dict) -> torch.Tensor:
        """The loss of a global micro-batch; this rank encodes its slice (StepBatches) at once."""
        return self.batch_loss(batch, *self.embed(batch["queries"], batch["passages"]))

    def __call__(self, micro_batches: list[dict], step: int) -> tuple[dict[str, torch.Tensor], float]:
        """Optimizer step `step` (0-based) on these micro-batches: ({"loss", "grad_norm" (pre-clip), the norm of each
        third of the layers} as device tensors, the learning rate the step used)."""
        cfg, scaler, optimizer = self.cfg, self.scaler, self.optimizer
        if cfg.compile and self.device.type == "cuda" and cfg.grad_accumulation == 1:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs' previous outputs may be overwritten
        optimizer.zero_grad(set_to_none=True)
        if cfg.grad_cache_chunk is None:
            loss = accumulate_gradients(self.encoder, micro_batches, self.micro_batch_loss, self.ranks.world, scaler)
        else:
            loss = cached_gradients(self.encoder, micro_batches, self.embed, self.batch_loss, cfg.grad_cache_chunk,
                                    self.group, self.left_padded, self.ranks.world, scaler)
        if scaler is not None:
            scaler.unscale_(optimizer)
        layer_norms = group_grad_norms(self.thirds)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)  # pre-clip
        lr = self.scheduler.get_last_lr()[0]
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        self.scheduler.step()
        if self.averaged is not None:
            self.averaged.update(step + 1)
        return {"loss": loss, "grad_norm": grad_norm, **layer_norms}, lr
