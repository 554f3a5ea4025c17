"""Data-parallel training over 2 GPUs (DistributedDataParallel, nccl, one GPU per rank;
ance_core/training/distributed.py): 10 steps with the global batch split over the GPUs reach one GPU's weights, within
the tolerance of tests/gpu/test_train.py (1% of how far training moved them: CUDA kernels are not bit-reproducible);
rank 0 alone writes the result. The CPU version (gloo, exact to 1e-4) is tests/core/training/test_distributed.py."""

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from ance_core.training.config import TrainConfig
from ance_core.training.distributed import launch
from tests.core.training.test_distributed import CFG, _log, _one_process, _spec, no_dropout_checkpoint, stage_inputs  # noqa: F401

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                                reason="DDP with nccl needs 2 CUDA GPUs")


def test_ddp_training_with_nccl_matches_one_gpu(no_dropout_checkpoint, stage_inputs, tmp_path):  # noqa: F811
    one = _one_process(no_dropout_checkpoint, TrainConfig(**CFG, max_steps=10), tmp_path / "one")
    two = launch(_spec(no_dropout_checkpoint, stage_inputs, TrainConfig(**CFG, max_steps=10, world_size=2)),
                 tmp_path / "two", 2)
    assert one["steps"] == two["steps"] == 10
    assert _log(tmp_path / "two")[0]["loss"] == pytest.approx(_log(tmp_path / "one")[0]["loss"], rel=1e-3)
    start = load_file(no_dropout_checkpoint / "model.safetensors")
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    moved = sum(float((a[k].float() - start[k].float()).norm() ** 2) for k in a) ** 0.5
    apart = sum(float((a[k].float() - b[k].float()).norm() ** 2) for k in a) ** 0.5
    assert moved > 0 and apart <= 0.01 * moved, (apart, moved)
