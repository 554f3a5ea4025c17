"""Checkpoints by time, written in the background: the steps a seconds cadence picks (a fake clock, no sleeping), a
background write equal to a synchronous one even when training changes the model meanwhile, a failed write raised
on the training side, and 2 gloo ranks checkpointing at the steps rank 0 chose."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ance_core.modeling.model import load_checkpoint
from ance_core.training import checkpointing, loop
from ance_core.training.checkpointing import CheckpointCadence, CheckpointWriter
from ance_core.training.config import TrainConfig
from ance_core.training.optim import linear_schedule, make_optimizer
from ance_core.training.ranks import Ranks, process_group
from ance_core.training.state import TrainingState, capture_state, latest_checkpoint, save_state
from tests.tiny import random_head_checkpoint, training_tables

SECONDS_PER_STEP = 250  # of the fake clock
CFG = TrainConfig(max_steps=12, batch_size=3, learning_rate=1e-3, precision="fp32", warmup_ratio=0.25,
                  checkpoint_every=0, checkpoint_seconds=600)
STATE_FILES = ("model.safetensors", "head.safetensors", "config.json", "optimizer.safetensors", "rng.safetensors",
               "trainer_state.json")


@pytest.fixture(scope="module")
def start(tiny_model, tmp_path_factory) -> Path:
    return random_head_checkpoint(tiny_model, tmp_path_factory.mktemp("start") / "ckpt")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors") | load_file(folder / "head.safetensors")


def _step_clock(patch=setattr):
    """A fake wall clock for a training: SECONDS_PER_STEP per optimizer step taken (a step is taken before its
    checkpoint is decided on; its log line may come after the next step, training/loop.py). `patch`: how the count
    is hooked into TrainStep (monkeypatch.setattr in a test's own process)."""
    from ance_core.training.step import TrainStep

    taken, step = [0], TrainStep.__call__

    def counting(self, *args, **kwargs):
        taken[0] += 1
        return step(self, *args, **kwargs)

    patch(TrainStep, "__call__", counting)

    def clock() -> float:
        return SECONDS_PER_STEP * taken[0]

    clock.reset = lambda: taken.__setitem__(0, 0)
    return clock


def _record_writes(monkeypatch) -> list[int]:
    """The steps whose checkpoints the training hands to its background writer."""
    written: list[int] = []
    write = CheckpointWriter.write

    def recording(self, state):
        written.append(state.step)
        write(self, state)

    monkeypatch.setattr(CheckpointWriter, "write", recording)
    return written


def test_the_cadence_counts_seconds_since_the_last_checkpoint_and_steps():
    now = [0.0]
    seconds = CheckpointCadence(0, 600, Ranks(), clock=lambda: now[0])
    due = []
    for step in range(1, 13):
        now[0] = 250.0 * step
        if seconds.due(step):
            seconds.taken()
            due.append(step)
    assert due == [3, 6, 9, 12]  # 750 s since the start, then since each checkpoint

    now[0] = 0.0
    both = CheckpointCadence(4, 600, Ranks(), clock=lambda: now[0])
    due = []
    for step in range(1, 13):
        now[0] = 250.0 * step
        if both.due(step):
            both.taken()  # a checkpoint by steps restarts the seconds too
            due.append(step)
    assert due == [3, 4, 7, 8, 11, 12]
    assert [s for s in range(1, 13) if CheckpointCadence(5, 0, Ranks()).due(s)] == [5, 10]
    assert not any(CheckpointCadence(0, 0, Ranks()).due(s) for s in range(1, 100))


def test_a_seconds_cadence_checkpoints_at_the_expected_steps_and_resumes_exactly(start, tmp_path, monkeypatch):
    """600 s at 250 s a step: checkpoints after steps 3, 6 and 9 (the last step's is the result itself); a run stopped
    after step 10 resumes from the step-9 checkpoint, written in the background, to the uninterrupted run's weights."""
    tables = training_tables()
    straight = tmp_path / "straight"
    written = _record_writes(monkeypatch)
    clock = _step_clock(monkeypatch.setattr)
    monkeypatch.setattr(checkpointing, "monotonic", clock)
    loop.train(start, *tables, CFG, straight)
    assert written == [3, 6, 9]

    def crash(record: dict) -> None:
        if record["step"] == 10:
            raise RuntimeError("simulated crash")

    resumed = tmp_path / "resumed"
    written.clear()
    clock.reset()
    with pytest.raises(RuntimeError, match="simulated crash"):
        loop.train(start, *tables, CFG, resumed, callbacks=[crash])
    assert written == [3, 6, 9] and latest_checkpoint(resumed).name == "step-000009"
    assert not list((resumed / "checkpoints").glob(".tmp-*"))  # written whole before train raised
    assert loop.train(start, *tables, CFG, resumed)["resumed_from_step"] == 9
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_steps_and_seconds_together_checkpoint_at_whichever_comes_first(start, tmp_path, monkeypatch):
    written = _record_writes(monkeypatch)
    monkeypatch.setattr(checkpointing, "monotonic", _step_clock(monkeypatch.setattr))
    loop.train(start, *training_tables(), CFG.model_copy(update={"checkpoint_every": 4}), tmp_path)
    assert written == [3, 4, 7, 8, 11]


def test_a_background_write_equals_a_synchronous_one_though_training_goes_on(start, tmp_path):
    """The state is copied when it is captured: the model and optimizer changed right after (as the next steps
    would) leave the checkpoint written in the background byte-equal to one written synchronously before."""
    model, tokenizer, meta = load_checkpoint(start)
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.01)
    scheduler = linear_schedule(optimizer, 1, 10)
    for _ in range(2):  # Adam moments to save
        sum(p.square().sum() for p in model.parameters()).backward()
        optimizer.step()
        scheduler.step()
    live = dict(model=model, tokenizer=tokenizer, meta=meta, optimizer=optimizer, scheduler=scheduler, scaler=None,
                step=2, epoch=0, rng={"torch_cpu": torch.get_rng_state()})
    (tmp_path / "sync").mkdir()
    save_state(tmp_path / "sync", **live)
    captured = capture_state(**live)
    with torch.no_grad():  # training goes on before the writer runs
        for p in model.parameters():
            p.add_(1.0)
        for entries in optimizer.state.values():
            entries["exp_avg"].add_(1.0)
    with CheckpointWriter(tmp_path / "bg") as writer:
        writer.write(captured)
    folder = latest_checkpoint(tmp_path / "bg")
    assert folder is not None and folder.name == "step-000002"
    for name in STATE_FILES:
        assert (folder / name).read_bytes() == (tmp_path / "sync" / name).read_bytes(), name


def test_a_failed_write_raises_on_the_training_side(start, tmp_path, monkeypatch):
    def disk_full(out, state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointing, "write_checkpoint", disk_full)
    cfg = CFG.model_copy(update={"max_steps": 3, "checkpoint_every": 1, "checkpoint_seconds": 0})
    with pytest.raises(OSError, match="No space left") as raised:
        loop.train(start, *training_tables(), cfg, tmp_path)
    assert any("step-1 checkpoint" in note for note in raised.value.__notes__)
    assert not (tmp_path / "model.safetensors").exists()  # the training stopped there, unfinished

    writer = CheckpointWriter(tmp_path / "other")  # leaving the writer's block raises it too
    with pytest.raises(OSError, match="No space left"):
        with writer:
            writer.write(TrainingState(5, None, None, None, {}, "{}", {}))


def _rank(rank: int, world: int, checkpoint: str, init_file: str, out: str, records: str) -> None:
    """A rank of a 2-process gloo group training with a seconds cadence: rank 0 reads a fake clock (250 s a step),
    rank 1 one that never moves (were it to decide for itself, it would never checkpoint). Each rank records its
    decision at every step."""
    with process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world):
        torch.set_num_threads(1)
        checkpointing.monotonic = _step_clock() if rank == 0 else (lambda: 0.0)
        decisions, written = [], []
        due, write = CheckpointCadence.due, CheckpointWriter.write

        def recording_due(self, step):
            decisions.append([step, answer := due(self, step)])
            return answer

        def recording_write(self, state):
            written.append(state.step)
            write(self, state)

        CheckpointCadence.due, CheckpointWriter.write = recording_due, recording_write
        cfg = CFG.model_copy(update={"batch_size": 4, "world_size": world})
        loop.train(checkpoint, *training_tables(), cfg, Path(out))
        Path(records, f"rank{rank}.json").write_text(json.dumps({"decisions": decisions, "written": written}))


def test_two_ranks_checkpoint_at_the_steps_rank_0_chose(start, tmp_path):
    torch.multiprocessing.spawn(_rank, args=(2, str(start), str(tmp_path / "init"), str(tmp_path / "out"),
                                             str(tmp_path)), nprocs=2)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["decisions"] == rank1["decisions"]
    assert [step for step, due in rank0["decisions"] if due] == [3, 6, 9] == rank0["written"]
    assert rank1["written"] == []  # rank 0 writes them
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / "checkpoints").exists()
