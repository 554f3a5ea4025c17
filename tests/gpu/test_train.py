"""bf16 and fp16 training on CUDA, interrupted after a step and resumed from its latest checkpoint (as
tests/core/training/test_loop.py does on the CPU: a callback raises, then `train` runs again on the same folder); the
fp16 checkpoints keep the GradScaler's state.

Tolerance: on the CPU (ANCE_GPU_TESTS_ON_CPU=1) the resumed run's weights and losses equal the uninterrupted run's
exactly. On CUDA some kernels are not bit-reproducible even with deterministic algorithms asked for (attention's
backward pass, nll_loss), so there the weights may differ from the uninterrupted run's by at most 1% of how far
training moved them (||w_resumed - w_straight|| <= 0.01 ||w_straight - w_start||, over all weights), and each step's
loss by at most 1% (relative). A resume that loses the optimizer moments or the RNG state (dropout) is 10 to 20 times
further off (measured on the CPU in bf16: weights 23% or 10% of the training, losses 4% or 19%); a lost loss scale
shows in the fp16 run's final GradScaler state, compared exactly."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ance_core.training.config import TrainConfig
from ance_core.training.loop import train

CFG = TrainConfig(max_steps=6, batch_size=3, learning_rate=1e-3, checkpoint_every=2, warmup_ratio=0.25)
STOP_AFTER = 5  # the latest checkpoint is step 4's
RESUME_TOLERANCE = 1e-2  # CUDA only; exact on the CPU


class SimulatedCrash(RuntimeError):
    pass


@pytest.fixture
def deterministic(device):
    """On CUDA: deterministic kernels where torch has them (warn only where it has none, as for nll_loss)."""
    if device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors") | load_file(folder / "head.safetensors")


def _norm(tensors) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors)))


def _losses(folder) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's "no deterministic implementation" warnings
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_resumes_after_an_interruption(precision, device, start, tables, tmp_path,
                                                                 deterministic):
    if precision == "fp16" and device.type != "cuda":
        pytest.skip("fp16 training scales its loss with torch.amp.GradScaler, which runs on CUDA only")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name(device)} has no bf16 support")
    cfg = CFG.model_copy(update={"precision": precision})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    straight = tmp_path / "straight"
    assert train(start, *tables, cfg, straight)["steps"] == CFG.max_steps
    if device.type == "cuda":
        assert torch.cuda.max_memory_allocated(device) > 0  # pick_device() trained on the GPU

    def crash(record: dict) -> None:
        if record["step"] == STOP_AFTER:
            raise SimulatedCrash(f"simulated crash after step {STOP_AFTER}")

    resumed = tmp_path / "resumed"
    with pytest.raises(SimulatedCrash):
        train(start, *tables, cfg, resumed, callbacks=[crash])
    saved = json.loads((resumed / "checkpoints" / "step-000004" / "trainer_state.json").read_text())
    assert saved["step"] == 4
    if precision == "fp16":  # the loss scale and its growth tracker, restored on resuming
        assert {"scale", "_growth_tracker"} <= saved["scaler"].keys() and 0 < saved["scaler"]["scale"] <= 2.0 ** 16
    else:
        assert saved["scaler"] is None  # bf16 needs no loss scaling
    assert train(start, *tables, cfg, resumed)["resumed_from_step"] == 4

    state = {f.name: json.loads((f / "trainer_state.json").read_text()) for f in (straight, resumed)}
    assert state["resumed"]["scaler"] == state["straight"]["scaler"]
    a, b, initial = _weights(straight), _weights(resumed), _weights(start)
    moved = _norm(a[k] - initial[k] for k in a)
    assert moved > 0  # some steps were taken (fp16: not all skipped for overflowing gradients)
    if device.type == "cpu":
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert _losses(resumed) == _losses(straight)
    else:
        deviation = _norm(a[k] - b[k] for k in a)
        assert deviation <= RESUME_TOLERANCE * moved, f"resumed weights off by {deviation / moved:.2e} of the training"
        assert _losses(resumed) == pytest.approx(_losses(straight), rel=RESUME_TOLERANCE)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_compiled_step_trains_as_the_eager_step_under_cuda_graphs(device, start, tables, tmp_path):
    """`compile` on CUDA is torch.compile in mode reduce-overhead (CUDA graphs recorded per padded shape): the steps
    train as the eager ones, through batches of more than one padded shape (queries cut at 40 tokens and passages at
    72, padded to multiples of 8) and over two runs in one process. fp32 without dropout, so a step depends on its
    data only; on CUDA within 1% of how far training moved the weights (the kernels differ: inductor's fused ones
    against eager's), losses within 1%."""
    from tests.tiny import without_dropout

    plain = without_dropout(start, tmp_path / "no-dropout")
    base = dict(max_steps=6, batch_size=3, precision="fp32", checkpoint_every=0, learning_rate=1e-3,
                query_max_length=40, passage_max_length=72, pad_multiple=8)
    for name, extra in {"eager": {}, "compiled": {"compile": True}, "again": {"compile": True}}.items():
        train(plain, *tables, TrainConfig(**base | extra), tmp_path / name)
    eager, initial = _weights(tmp_path / "eager"), _weights(plain)
    moved = _norm(eager[k] - initial[k] for k in eager)
    assert moved > 0
    for name in ("compiled", "again"):
        other = _weights(tmp_path / name)
        deviation = _norm(other[k] - eager[k] for k in eager)
        assert deviation <= RESUME_TOLERANCE * moved, f"{name}: weights off by {deviation / moved:.2e} of the training"
        assert _losses(tmp_path / name) == pytest.approx(_losses(tmp_path / "eager"), rel=RESUME_TOLERANCE)
