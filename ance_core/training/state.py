"""A training stage's resumable state, without pickle: the model (a checkpoint), the optimizer's moments and param
groups, the scheduler and loss scaler, and every rank's RNG state, written atomically as checkpoints/step-N.

Taking the state (`capture_state`: copies in CPU memory, on the training thread) is apart from writing it
(`write_state`), so a checkpoint can be written by another thread while training goes on (training/checkpointing.py).
"""

import copy
import itertools
import json
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from ance_core.errors import AnceError
from ance_core.modeling.model import BiEncoder, ModelMeta, load_checkpoint, save_checkpoint
from ance_core.training.ranks import Ranks, restore_rng

CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class TrainingState:
    """A training stage's resumable state at one step, in CPU memory and apart from the objects training goes on
    changing: what `write_state` writes."""

    step: int
    model: BiEncoder  # a CPU copy of the trained model
    tokenizer: PreTrainedTokenizerBase  # a copy (the training thread keeps tokenizing with its own)
    meta: ModelMeta
    moments: dict[str, torch.Tensor]  # "<param id>.<name>": the optimizer's per-parameter tensors (AdamW: exp_avg, ...)
    trainer_state: str  # JSON: step, epoch, optimizer param groups and scalars, scheduler, loss scaler
    rng: dict[str, torch.Tensor]  # every rank's RNG state (ranks.py `rng_states`)


def cpu_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose parameters and buffers are copies in CPU memory, made without a second copy on the
    accelerator (a plain deepcopy clones each tensor on its own device first); tied parameters stay tied."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        cpu = tensor.detach().to("cpu", copy=True)
        is_parameter = isinstance(tensor, torch.nn.Parameter)
        memo[id(tensor)] = torch.nn.Parameter(cpu, requires_grad=False) if is_parameter else cpu
    return copy.deepcopy(model, memo)


def capture_state(model: BiEncoder, tokenizer, meta: ModelMeta, optimizer, scheduler, scaler, step: int, epoch: int,
                  rng: dict[str, torch.Tensor]) -> TrainingState:
    """The state of the training at `step`, copied: the live objects may change as soon as this returns."""
    state = optimizer.state_dict()  # its tensors are the optimizer's own: copied below
    moments, scalars = {}, {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                moments[f"{pid}.{name}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars[f"{pid}.{name}"] = value
    trainer_state = {
        "step": step,
        "epoch": epoch,
        "optimizer_param_groups": state["param_groups"],
        "optimizer_scalars": scalars,
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    return TrainingState(step, cpu_copy(model), copy.deepcopy(tokenizer), meta, moments,
                         json.dumps(trainer_state, indent=1, default=float),
                         {k: v.detach().to("cpu", copy=True) for k, v in rng.items()})


def write_state(folder: Path, state: TrainingState) -> None:
    """Write a captured state into `folder`: the checkpoint's model files and the training state beside them."""
    save_checkpoint(state.model, state.tokenizer, state.meta, folder)
    save_file(state.moments, folder / "optimizer.safetensors")
    save_file(state.rng, folder / "rng.safetensors")
    (folder / "trainer_state.json").write_text(state.trainer_state)


def save_state(folder: Path, model: BiEncoder, tokenizer, meta: ModelMeta, optimizer, scheduler, scaler,
               step: int, epoch: int, rng: dict[str, torch.Tensor]) -> None:
    """Write the training's state at `step` into `folder`, now (the end of a stage)."""
    write_state(folder, capture_state(model, tokenizer, meta, optimizer, scheduler, scaler, step, epoch, rng))


def _optimizer_moments(folder: Path, device: torch.device) -> dict[int, dict]:
    """The per-parameter optimizer state saved in a folder (`save_state`)."""
    trainer_state = json.loads((folder / "trainer_state.json").read_text())
    entries: dict[int, dict] = defaultdict(dict)
    for key, value in load_file(folder / "optimizer.safetensors").items():
        pid, name = key.split(".", 1)
        entries[int(pid)][name] = value.to(device) if name != "step" else value
    for key, value in trainer_state["optimizer_scalars"].items():
        pid, name = key.split(".", 1)
        entries[int(pid)][name] = value
    return dict(entries)


def resume_optimizer(folder: Path, optimizer) -> None:
    """Start from the optimizer moments saved with a checkpoint (a previous stage's), keeping this stage's learning
    rate and weight decay."""
    if not (folder / "optimizer.safetensors").is_file():
        raise AnceError(f"{folder}: no optimizer state to continue from (schedule: continuous needs the previous "
                        "stage's training folder)")
    device = next(p for group in optimizer.param_groups for p in group["params"]).device
    moments = _optimizer_moments(folder, device)
    for entries in moments.values():  # a previous stage's weight average (`ema_decay`) is its own, not carried on
        entries.pop("ema", None)
    optimizer.load_state_dict({"state": moments, "param_groups": optimizer.state_dict()["param_groups"]})


def load_state(folder: Path, model: BiEncoder, optimizer, scheduler, scaler, ranks: Ranks) -> int:
    trained, _, _ = load_checkpoint(folder, next(model.parameters()).device)
    model.load_state_dict(trained.state_dict())
    trainer_state = json.loads((folder / "trainer_state.json").read_text())
    optimizer.load_state_dict({"state": _optimizer_moments(folder, next(model.parameters()).device),
                               "param_groups": trainer_state["optimizer_param_groups"]})
    scheduler.load_state_dict(trainer_state["scheduler"])
    if scaler is not None and trainer_state["scaler"]:
        scaler.load_state_dict(trainer_state["scaler"])
    restore_rng(load_file(folder / "rng.safetensors"), ranks)
    return int(trainer_state["step"])


def latest_checkpoint(out: Path) -> Path | None:
    found = sorted((out / CHECKPOINTS).glob("step-*")) if (out / CHECKPOINTS).is_dir() else []
    return found[-1] if found else None


def checkpoint_step(out: Path) -> int:
    """The step of the latest resumable checkpoint in `out` (0: none)."""
    latest = latest_checkpoint(out)
    return int(latest.name[5:]) if latest is not None else 0


def write_checkpoint(out: Path, state: TrainingState) -> Path:
    """Write checkpoints/step-N atomically (a temporary folder renamed into place), then drop older ones."""
    final = out / CHECKPOINTS / f"step-{state.step:06d}"
    tmp = out / CHECKPOINTS / f".tmp-step-{state.step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_state(tmp, state)
    os.replace(tmp, final)
    for old in (out / CHECKPOINTS).glob("step-*"):
        if old != final:
            shutil.rmtree(old)
    return final
