"""A training stage's plan: its steps and epochs from its pairs, its place in a continuous learning-rate schedule,
its seed, refreshed negatives aligned to its pairs, and the precisions it may train in."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ance_core.errors import AnceError
from ance_core.negatives.mining import REDRAWN
from ance_core.negatives.teacher import TEACHER_COLUMNS
from ance_core.training.config import TrainConfig


def check_precision(precision: str, device: torch.device, where: str = "precision") -> None:
    """fp16 training needs a loss scaler, which exists for CUDA only: on a CPU (or MPS) it is refused, not run
    unscaled (gradients underflow to zero)."""
    if precision == "fp16" and device.type != "cuda":
        raise AnceError(f"{where}: fp16 training needs a CUDA GPU (its loss scaler); this process trains on "
                        f"{device.type}. Use bf16 (or auto, bf16 here)")


def steps_per_epoch(pairs: int, cfg: TrainConfig) -> int:
    """Optimizer steps in one pass over `pairs` (query, positive) rows: whole groups of `cfg.grad_accumulation`
    batches (a last incomplete group is left out of the epoch), at least one. A last batch of fewer rows than
    processes (`world_size`) is left out too: some rank would have none of it (StepBatches skips it), and a step of
    nothing would still move the schedule (and trip fp16's loss scaler)."""
    batches = math.ceil(pairs / cfg.batch_size)
    if 0 < pairs % cfg.batch_size < cfg.world_size:
        batches -= 1
    return max(1, batches // cfg.grad_accumulation)


def check_processes(pairs: int, cfg: TrainConfig) -> None:
    """Fewer (query, positive) pairs than training processes: some process would have no row of any step, and the
    stage would log steps that train nothing; refused before the processes start."""
    if pairs < cfg.world_size:
        raise AnceError(f"{pairs} training pair(s) for world_size {cfg.world_size}: every training process needs a "
                        f"pair of each step; set world_size to at most {pairs}")


def planned_steps(pairs: int, cfg: TrainConfig) -> int:
    """Optimizer steps a training stage of `cfg` takes on `pairs` (query, positive) rows."""
    return cfg.max_steps or steps_per_epoch(pairs, cfg) * cfg.epochs


def planned_epochs(pairs: int, cfg: TrainConfig) -> int:
    """Epochs (whole or begun) a training stage of `cfg` takes on `pairs` rows."""
    return -(-planned_steps(pairs, cfg) // steps_per_epoch(pairs, cfg))


@dataclass(frozen=True)
class Schedule:
    """A training stage's place in one learning-rate schedule shared by several stages (`schedule: continuous`).

    Its steps are offset+1 .. offset+steps of a schedule of `total` steps that warms up linearly over the first
    `warmup` and then decays linearly to zero at `total`; with `resume_optimizer`, the optimizer's moments start from
    the state saved with the starting checkpoint (the previous stage's), so the stages train as one run."""

    offset: int
    total: int
    warmup: int
    resume_optimizer: bool


def continuous_schedules(steps: Sequence[int], warmup_ratio: float, resume_first: bool = False) -> list[Schedule]:
    """One Schedule per stage of `steps` optimizer steps each, all parts of one schedule over their sum."""
    total, offsets = sum(steps), np.cumsum([0, *steps[:-1]]).tolist()
    return [Schedule(int(offset), total, int(warmup_ratio * total), resume_first or k > 0)
            for k, offset in enumerate(offsets)]


def aligned_negatives(pairs: pd.DataFrame, table: pd.DataFrame, group: int) -> pd.DataFrame:
    """`pairs` with the negatives (and MaxP windows) of `table`, a refreshed table of the same (query, positive) rows:
    aligned on them, so the data order is untouched."""
    key = ["query_id", "positive_id"]
    columns = [c for c in ("negative_ids", "negative_windows", "positive_window", *REDRAWN, *TEACHER_COLUMNS)
               if c in table]
    merged = pairs[key].merge(table[[*key, *columns]], on=key, how="left", validate="one_to_one")
    if merged["negative_ids"].isna().any() or len(table) != len(pairs):
        raise ValueError("refreshed negatives do not cover the same (query, positive) pairs as the first set")
    if {len(n) for n in merged["negative_ids"]} != {group - 1}:
        raise ValueError(f"refreshed negatives must have {group - 1} negatives per pair, like the first set")
    stale = [c for c in (*REDRAWN, *TEACHER_COLUMNS) if c in pairs and c not in table]  # the new table's replace them
    return pairs.drop(columns=stale).assign(**{column: merged[column].to_numpy() for column in columns})


def stage_seed(seed: int, round_: int) -> int:
    """The seed of a training stage: `seed` for the warm-up (round 0), another for each ANCE round, so stages that
    share a config's seed do not replay one batch order and one dropout (each round's first epoch would otherwise see
    the warm-up's batches and in-batch negatives)."""
    if round_ == 0:
        return seed
    return int(np.random.SeedSequence([seed, round_]).generate_state(1)[0] % 2**31)
