"""A training stage's resumable state, without pickle: the model (a checkpoint), the optimizer's moments and param
groups, the scheduler and loss scaler, and every rank's RNG state, written atomically as checkpoints/step-N."""

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ance_core.errors import AnceError
from ance_core.modeling.model import BiEncoder, ModelMeta, load_checkpoint, save_checkpoint
from ance_core.training.ranks import Ranks, restore_rng

CHECKPOINTS = "checkpoints"


def save_state(folder: Path, model: BiEncoder, tokenizer, meta: ModelMeta, optimizer, scheduler, scaler,
                step: int, epoch: int, rng: dict[str, torch.Tensor]) -> None:
    save_checkpoint(model, tokenizer, meta, folder)
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            (tensors if torch.is_tensor(value) else scalars)[f"{pid}.{name}"] = value
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, folder / "optimizer.safetensors")
    save_file(rng, folder / "rng.safetensors")
    trainer_state = {
        "step": step,
        "epoch": epoch,
        "optimizer_param_groups": state["param_groups"],
        "optimizer_scalars": scalars,
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    (folder / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1, default=float))


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
    optimizer.load_state_dict({"state": _optimizer_moments(folder, device),
                               "param_groups": optimizer.state_dict()["param_groups"]})


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


def write_checkpoint(out: Path, step: int, **state) -> None:
    """Write checkpoints/step-N atomically, then drop older ones."""
    final = out / CHECKPOINTS / f"step-{step:06d}"
    tmp = out / CHECKPOINTS / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_state(tmp, step=step, **state)
    os.replace(tmp, final)
    for old in (out / CHECKPOINTS).glob("step-*"):
        if old != final:
            shutil.rmtree(old)
