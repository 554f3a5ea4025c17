"""Training on 2 processes (torch.distributed, gloo on CPU): the objective of one process with the whole batch,
resumable after a rank is SIGKILLed, and run by the pipeline's training tasks with rank 0 logging."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ance_core.artifacts import write_text
from ance_core.errors import AnceError
from ance_core.negatives.refresh_state import read_refresh_state
from ance_core.training.config import TrainConfig
from ance_core.training.distributed import LogTail, launch
from ance_core.training.gradients import accumulate_gradients
from ance_core.training.loop import train
from ance_core.training.ranks import gather_rows, process_group, rank_rows, split_sizes
from tests.tiny import (
    REPO,
    kill_when_hung,
    random_head_checkpoint,
    run_pipeline_cli,
    tiny_pipeline_config,
    training_tables,
    write_beir,
)


@pytest.fixture(scope="module")
def no_dropout_checkpoint(tiny_model, tmp_path_factory) -> Path:
    """The tiny model without dropout: 2 ranks x b and 1 x 2b then compute the same function."""
    folder = tmp_path_factory.mktemp("nodrop")
    shutil.copytree(tiny_model, folder / "base")
    config = json.loads((folder / "base" / "config.json").read_text())
    (folder / "base" / "config.json").write_text(json.dumps(config | {"hidden_dropout_prob": 0.0}))
    return random_head_checkpoint(folder / "base", folder / "ckpt")


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory) -> Path:
    """training_tables() as a BEIR dataset folder (what a rank reads) and a negatives parquet."""
    from ance_core.data.dataset import load_dataset, save_tables

    negatives, corpus, queries, relevant = training_tables()
    folder = tmp_path_factory.mktemp("stage")
    beir = write_beir(folder / "beir", corpus.rename(columns={"doc_id": "_id"}).to_dict("records"),
                      queries.rename(columns={"query_id": "_id"}).to_dict("records"),
                      {"train": [(q, d, 1) for q, docs in relevant.items() for d in docs]})
    (folder / "data").mkdir()
    save_tables(load_dataset(beir), folder / "data")
    negatives.to_parquet(folder / "negatives.parquet")
    return folder


def _spec(checkpoint: Path, inputs: Path, cfg: TrainConfig) -> dict:
    return {"checkpoint": str(checkpoint), "negatives": str(inputs / "negatives.parquet"), "data": str(inputs / "data"),
            "split": "train", "cfg": cfg.model_dump(mode="json"), "schedule": None}


def _one_process(checkpoint: Path, cfg: TrainConfig, out: Path) -> dict:
    negatives, corpus, queries, relevant = training_tables()
    return train(checkpoint, negatives, corpus, queries, relevant, cfg, out)


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


CFG = dict(batch_size=4, learning_rate=1e-3, precision="fp32", passage_max_length=24, checkpoint_every=0, seed=7)


def test_the_rows_of_a_batch_go_round_the_ranks():
    assert split_sizes(10, 2) == [5, 5] and split_sizes(5, 2) == [3, 2] and split_sizes(3, 4) == [1, 1, 1, 0]
    from ance_core.training.ranks import Ranks

    assert [rank_rows(5, Ranks(r, 2)) for r in (0, 1)] == [slice(0, 3), slice(3, 5)]
    local = torch.ones(3, 2, requires_grad=True)
    assert gather_rows(local, [3], Ranks()) is local  # one process: nothing to gather


def _gradient_worker(rank: int, world: int, checkpoint: str, port: int, out: str) -> None:
    """One rank of the gradient check: its half of the batch through DDP, the loss of the whole batch."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with process_group("gloo", rank=rank, world_size=world):
        torch.set_num_threads(1)
        _gradient_rank(rank, world, checkpoint, out)


def _gradient_rank(rank: int, world: int, checkpoint: str, out: str) -> None:
    from ance_core.modeling.model import load_checkpoint
    from ance_core.training.gradients import PairEncoder
    from ance_core.training.loss import nll_loss
    from ance_core.training.ranks import current_ranks

    model, tokenizer, _ = load_checkpoint(checkpoint)
    model.eval()  # no dropout: the same function on every rank
    ranks = current_ranks()
    encoder = torch.nn.parallel.DistributedDataParallel(PairEncoder(model))
    queries, passages = _gradient_batch()
    group = len(passages) // len(queries)
    mine = rank_rows(len(queries), ranks)
    tok = lambda texts: dict(tokenizer(texts, padding=True, truncation=True, max_length=24, return_tensors="pt"))  # noqa: E731
    q, p = encoder({k: v for k, v in tok(queries[mine]).items() if k != "token_type_ids"},
                   {k: v for k, v in tok(passages[mine.start * group: mine.stop * group]).items()
                    if k != "token_type_ids"})
    sizes = split_sizes(len(queries), world)
    q, p = gather_rows(q, sizes, ranks), gather_rows(p, [n * group for n in sizes], ranks)
    loss = nll_loss(q, p, group, in_batch=True)
    (loss * world).backward()
    if rank == 0:
        torch.save({"loss": loss.detach(), **{n: t.grad for n, t in model.named_parameters()}}, out)


def _gradient_batch() -> tuple[list[str], list[str]]:
    negatives, corpus, queries, _ = training_tables()
    text = dict(zip(corpus["doc_id"], corpus["text"], strict=True))
    rows = negatives.head(6)
    qtext = dict(zip(queries["query_id"], queries["text"], strict=True))
    pairs = zip(rows["positive_id"], rows["negative_ids"], strict=True)
    return [qtext[q] for q in rows["query_id"]], [text[d] for pos, negs in pairs for d in [pos, *negs]]


def test_two_ranks_compute_the_loss_and_gradients_of_the_whole_batch(no_dropout_checkpoint, tmp_path):
    """DDP over 2 gloo processes with 3 queries each = one process with the 6 (loss and every gradient, 1e-5)."""
    import socket

    from ance_core.modeling.model import load_checkpoint
    from ance_core.training.loss import nll_loss

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_gradient_worker, args=(2, str(no_dropout_checkpoint), port, str(tmp_path / "g.pt")),
                                nprocs=2)
    two = torch.load(tmp_path / "g.pt")

    model, tokenizer, _ = load_checkpoint(no_dropout_checkpoint)
    model.eval()
    queries, passages = _gradient_batch()
    tok = lambda texts: {k: v for k, v in tokenizer(texts, padding=True, truncation=True, max_length=24,  # noqa: E731
                                                     return_tensors="pt").items() if k != "token_type_ids"}
    loss = nll_loss(model(**tok(queries)), model(**tok(passages)), len(passages) // len(queries), in_batch=True)
    loss.backward()
    assert float(two["loss"]) == pytest.approx(loss.item(), abs=1e-5)
    compared = 0
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        torch.testing.assert_close(two[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)
        compared += 1
    assert compared > 10 and float(sum(g.abs().sum() for n, g in two.items() if n != "loss")) > 0


@pytest.mark.parametrize("ranks_cfg", [{}, {"grad_cache_chunk": 1}], ids=["at-once", "grad-cache"])
def test_ten_steps_on_two_ranks_reach_the_weights_of_one_process_with_the_whole_batch(
        no_dropout_checkpoint, stage_inputs, tmp_path, ranks_cfg):
    """The training task's path (torchrun, 2 gloo ranks, batch 4 = 2 x 2) against one process with batch 4: same
    step-1 loss and gradient norm (1e-5, or 1e-6 relative), weights after 10 AdamW steps within 1e-4; also with each
    rank's half encoded a query at a time (grad_cache_chunk: the all-reduce in the last chunk's backward)."""
    one = _one_process(no_dropout_checkpoint, TrainConfig(**CFG, max_steps=10), tmp_path / "one")
    records = []
    two = launch(_spec(no_dropout_checkpoint, stage_inputs,
                       TrainConfig(**CFG | ranks_cfg, max_steps=10, world_size=2)),
                 tmp_path / "two", 2, callbacks=[records.append])
    assert two["steps"] == one["steps"] == 10
    assert [r["step"] for r in records] == list(range(1, 11))  # rank 0 logged each step once
    log_one, log_two = _log(tmp_path / "one"), _log(tmp_path / "two")
    assert log_two == records
    for key in ("loss", "grad_norm", "grad_norm_bottom", "grad_norm_top"):
        assert log_two[0][key] == pytest.approx(log_one[0][key], rel=1e-6, abs=1e-5), key  # (float32 sums)
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    start = load_file(no_dropout_checkpoint / "model.safetensors")
    moved = max(float((a[k] - start[k]).abs().max()) for k in a)
    assert moved > 1e-3  # the weights did change
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=0, msg=key)
    assert not (tmp_path / "two" / "distributed.json").exists()


def _rank_pid(spec: Path, rank: int) -> int | None:
    """The pid of a rank of the torchrun started on `spec` (its environment says RANK)."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if str(spec).encode() not in cmdline or b"torch.distributed.run" in cmdline:
                continue
            if f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (OSError, ValueError):
            continue
    return None


def test_a_sigkilled_rank_resumes_to_the_weights_of_an_uninterrupted_run(tiny_model, stage_inputs, tmp_path,
                                                                           monkeypatch):
    """Rank 1 is SIGKILLed at step 7 (it hangs there by a drill; the test kills it); the re-run resumes both ranks
    from step 5's checkpoint and ends bit-identical to an uninterrupted 2-rank run (dropout on: each rank's RNG is
    in the checkpoint)."""
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "ckpt")
    cfg = TrainConfig(**CFG | {"checkpoint_every": 5}, max_steps=12, world_size=2, attention_dropout=0.1)
    launch(_spec(checkpoint, stage_inputs, cfg), tmp_path / "whole", 2)

    signal_file = tmp_path / "hung"
    monkeypatch.setenv("ANCE_FAULT", "train-rank1@7:hang")
    monkeypatch.setenv("ANCE_FAULT_SIGNAL", str(signal_file))
    monkeypatch.setenv("ANCE_FAULT_HOOK", "tasks.common")  # what the training task passes its ranks
    out = tmp_path / "killed"
    killed = []

    def kill_rank_1():
        deadline = time.monotonic() + 300
        while not signal_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if (pid := _rank_pid(out / "distributed.json", 1)) is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    with pytest.raises(AnceError, match="re-run resumes"):
        launch(_spec(checkpoint, stage_inputs, cfg), out, 2)
    killer.join()
    assert killed and [p.name for p in (out / "checkpoints").iterdir()] == ["step-000005"]
    monkeypatch.delenv("ANCE_FAULT")
    records = []
    summary = launch(_spec(checkpoint, stage_inputs, cfg), out, 2, callbacks=[records.append], resumed_step=5)
    assert summary["resumed_from_step"] == 5 and [r["step"] for r in records] == list(range(6, 13))
    for name in ("model.safetensors", "head.safetensors", "optimizer.safetensors", "rng.safetensors"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    rng = load_file(out / "rng.safetensors")
    assert {"torch_cpu", "torch_cpu_rank1"} <= set(rng) and not torch.equal(rng["torch_cpu"], rng["torch_cpu_rank1"])
    losses = lambda folder: [r["loss"] for r in _log(folder)]  # noqa: E731
    assert losses(out) == losses(tmp_path / "whole")


def test_the_launcher_tails_the_log_from_where_it_stopped(tmp_path):
    """Each poll reads what was appended since the last (not the whole log), a half-written line waits for the next
    poll, and a log rewritten on a resume (cut back to its checkpoint, a new file) is read again from its start."""
    log = tmp_path / "train_log.jsonl"
    tail = LogTail(log, seen=1)
    assert tail.records() == []  # not there yet
    log.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert [r["step"] for r in tail.records()] == [2]  # step 1 was seen before; the third line is half written
    offset = tail.offset
    with open(log, "a") as f:
        f.write('ep": 3}\n')
    assert [r["step"] for r in tail.records()] == [3] and tail.offset > offset
    assert tail.records() == []
    resumed = "".join(json.dumps({"step": k, "loss": 0.5}) + "\n" for k in range(1, 6))  # a new file, longer
    write_text(log, resumed)
    assert [r["step"] for r in tail.records()] == [4, 5]


def test_world_size_is_checked():
    negatives, corpus, queries, relevant = training_tables()
    with pytest.raises(AnceError, match="world_size 2 but this process group has 1"):
        train("unused", negatives, corpus, queries, relevant, TrainConfig(world_size=2), Path("unused"))


def test_the_pipeline_trains_on_two_ranks_and_logs_each_step_once(tiny_scifact, tiny_model, tmp_path):
    """The tiny pipeline with warmup and rounds on 2 processes each: MLflow has one loss per optimizer step."""
    from mlflow.tracking import MlflowClient

    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=4)
    for stage in ("warmup", "ance"):
        config[stage] |= {"world_size": 2, "checkpoint_every": 3}
    config["compression"] = None
    result, _ = run_pipeline_cli(config, tmp_path)
    client = MlflowClient(result["mlflow_uri"])
    steps = [m.step for m in client.get_metric_history(result["mlflow_run_id"], "loss")]
    assert steps == list(range(1, 9))
    trained = [p for p in (tmp_path / "work" / "train").iterdir() if not p.name.startswith(".")]
    assert len(trained) == 2
    for folder in trained:
        assert not (folder / "checkpoints").exists() and not (folder / "distributed.json").exists()
        assert len(_log(folder)) == 4


def test_the_async_refresh_trains_on_two_ranks(tiny_scifact, tiny_model, tmp_path):
    """refresh: async with the rounds on 2 ranks: rank 0 saves the step-6 snapshot, the task's inferencer mines from
    it, and max_staleness 1 makes the ranks wait for those negatives and swap them in together at step 6."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=2, steps=6)
    config["ance"] |= {"world_size": 2}
    config |= {"refresh": "async", "max_staleness": 1, "compression": None}
    result, _ = run_pipeline_cli(config, tmp_path)
    refresh = result["async_refresh"]
    assert not refresh["refresh_errors"]
    assert [(s["checkpoint_step"], s["swapped_at_step"]) for s in refresh["swaps"]] == [(6, 6)]
    assert [w["step"] for w in refresh["waits"]] == [6]
    assert refresh["rounds"] == [{"round": k, "mean_staleness": 2.5, "max_staleness": 5} for k in (1, 2)]
    assert [r["model"] for r in result["results"]][-3:-1] == ["ANCE round 1", "ANCE round 2"]  # (+ the hybrid)
    trainer = Path(next(s["path"] for s in result["stages"] if s["for"] == "ANCE (async)" and s["stage"] == "train"))
    assert [r["step"] for r in _log(trainer)] == list(range(1, 13))  # rank 0's log: each optimizer step once
    assert not (trainer / "snapshots").exists() and not (trainer / "async_ready.json").exists()


def test_the_async_trainer_on_two_ranks_killed_after_its_snapshot_resumes(tiny_scifact, tiny_model, tmp_path):
    """Rank 0 hangs at step 8 (after the step-6 snapshot and swap), the whole run is SIGKILLed; the re-run resumes
    both ranks from step 8 with the negatives that were in use, and records every step's staleness once."""
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=2, steps=6)
    config["ance"] |= {"world_size": 2}
    config |= {"refresh": "async", "max_staleness": 1, "compression": None}
    kill_when_hung(tmp_path, config, "train-rank0@8")

    result, _ = run_pipeline_cli(config, tmp_path)
    refresh = result["async_refresh"]
    trainer = Path(next(s["path"] for s in result["stages"] if s["for"] == "ANCE (async)" and s["stage"] == "train"))
    assert json.loads((trainer / "manifest.json").read_text())["summary"]["resumed_from_step"] == 8
    steps = [step for step, _ in read_refresh_state(trainer)["staleness"]]
    assert steps == list(range(12))
    assert [(s["checkpoint_step"], s["swapped_at_step"]) for s in refresh["swaps"]] == [(6, 6)]
    assert refresh["rounds"][1] == {"round": 2, "mean_staleness": 2.5, "max_staleness": 5}
    assert not refresh["refresh_errors"] and [r["step"] for r in _log(trainer)] == list(range(1, 13))


def _count_all_reduces(rank: int, world: int, init_file: str, counts) -> None:
    """A rank of a 2-process gloo group: one optimizer step of 3 micro-batches through `accumulate_gradients` on a
    DDP-wrapped model whose communication hook counts the gradient all-reduces."""
    with process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world):
        counts[rank] = _all_reduces_of_a_step(rank, world)


def _all_reduces_of_a_step(rank: int, world: int) -> tuple:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    calls = []

    def hook(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, hook)
    batches = [torch.full((2, 4), float(rank + m)) for m in range(3)]
    loss = accumulate_gradients(model, batches, lambda x: model(x).sum(), world)
    return len(calls), float(loss), model.module.weight.grad.clone()


def test_gradient_accumulation_all_reduces_once_per_optimizer_step(tmp_path):
    """3 micro-batches on 2 ranks: the gradient is all-reduced once (the forward of the first two inside no_sync:
    DDP decides at forward time), and it is the average of what the ranks accumulated."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        counts = manager.dict()
        mp.spawn(_count_all_reduces, args=(2, str(tmp_path / "init"), counts), nprocs=2, join=True)
        counts = dict(counts)
    assert [counts[r][0] for r in (0, 1)] == [1, 1]
    # rank r's micro-batch m is all (r + m): d(sum of Linear)/dW over 2 rows, /3 micro-batches, x world 2, averaged
    expected = torch.full((1, 4), sum(2 * (r + m) for r in (0, 1) for m in range(3)) / 3 * 2 / 2)
    for r in (0, 1):
        torch.testing.assert_close(counts[r][2], expected)


def test_a_resumed_launch_reports_the_resumed_runs_steps_not_the_killed_attempts(tmp_path, monkeypatch):
    """The killed attempt logged steps 1-8 and checkpointed at 5. The launcher's first poll ran before rank 0 cut the
    log back: it sent the old steps 6-8 to the callbacks (MLflow, Prefect), then skipped the resumed run's own 6-8 as
    seen. Now the launcher cuts the log first: the callbacks get steps 6-9 of the resumed run only."""
    import ance_core.training.distributed as distributed

    out = tmp_path / "stage"
    out.mkdir()
    log = out / "train_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": "old"}) + "\n" for s in range(1, 9)))

    class Ranks:  # torchrun's side, faked: rank 0 cuts the log back at its second poll, then trains steps 6-9
        def __init__(self, *args, **kwargs):
            self.polls, self.returncode = 0, None

        def poll(self):
            self.polls += 1
            if self.polls == 2:
                kept = [ln for ln in log.read_text().splitlines() if json.loads(ln)["step"] <= 5]
                log.write_text("".join(ln + "\n" for ln in kept)
                               + "".join(json.dumps({"step": s, "loss": "new"}) + "\n" for s in range(6, 10)))
                (out / distributed.RESULT).write_text(json.dumps({"resumed_from_step": 5}))
                self.returncode = 0
            return self.returncode

    monkeypatch.setattr(distributed.subprocess, "Popen", Ranks)
    records = []
    launch({}, out, 2, callbacks=[records.append], resumed_step=5, poll_seconds=0)
    assert [(r["step"], r["loss"]) for r in records] == [(s, "new") for s in range(6, 10)]


def test_more_processes_than_gpus_is_refused_before_any_rank_starts(tmp_path, monkeypatch):
    """Each rank takes GPU LOCAL_RANK: on a machine of 2 GPUs, world_size 4 failed in ranks 2 and 3 with CUDA's
    "invalid device ordinal", after torchrun started them all."""
    import ance_core.training.distributed as distributed

    started = []
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(distributed.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(AnceError, match=r"world_size 4 but this machine has 2 GPU\(s\).*at most 2.*"
                       "CUDA_VISIBLE_DEVICES"):
        launch({}, tmp_path / "stage", 4)
    assert not started and not (tmp_path / "stage").exists()


def test_each_rank_gets_its_share_of_the_cores_unless_the_user_set_threads(monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 for several processes per node: gloo ranks trained on one thread each."""
    from ance_core.training.distributed import rank_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert rank_threads(2) == {"OMP_NUM_THREADS": "8"} and rank_threads(32) == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(2) == {}


def test_the_inferencer_takes_a_gpu_no_rank_trains_on_or_says_it_shares_one():
    from ance_core.training.ranks import inferencer_gpu

    assert inferencer_gpu(0, 1) == (None, None) and inferencer_gpu(1, 1) == (None, None)
    assert inferencer_gpu(2, 1) == (1, None) and inferencer_gpu(4, 2) == (2, None)
    gpu, warning = inferencer_gpu(2, 2)
    assert gpu == 1 and "shares GPU 1 with a training rank (ance.world_size 2 on 2 GPUs)" in warning


def test_cuda_rng_states_are_restored_in_device_order_past_ten_gpus(monkeypatch):
    """Sorted as text, cuda_10 came before cuda_2: on 11+ GPUs a resumed rank drew another device's dropout."""
    from ance_core.training import ranks as ranks_module

    restored = []
    monkeypatch.setattr(ranks_module.torch, "set_rng_state", lambda state: None)
    monkeypatch.setattr(ranks_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ranks_module.torch.cuda, "set_rng_state_all", lambda states: restored.extend(states))
    saved = {"torch_cpu": torch.zeros(1)} | {f"cuda_{i}": torch.tensor([i]) for i in range(12)}
    ranks_module.restore_rng(saved, ranks_module.Ranks(0, 1))
    assert [int(t) for t in restored] == list(range(12))


RANK_WITH_A_CYCLE = """
import sys, torch
from ance_core.training.ranks import process_group

def held_by_a_cycle():  # a DDP module one step used, left in a reference cycle (as the training loop's closures
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))  # leave theirs): only the cyclic
    model(torch.randn(8, 64)).sum().backward()  # collector frees it
    cycle = {"model": model}
    cycle["self"] = cycle

with process_group("gloo", init_method="file://" + sys.argv[2], rank=int(sys.argv[1]), world_size=2):
    held_by_a_cycle()
"""  # then the interpreter exits as a torchrun rank does


def test_a_ddp_module_left_in_a_reference_cycle_is_freed_before_its_group(tmp_path):
    """A rank's DDP module freed after its process group is destroyed can abort the rank as the interpreter exits
    ("terminate called without an active exception", SIGABRT): CI lost the asynchronous two-rank run to it twice, and
    a two-rank script here to it in 13 of 30 runs. `process_group` collects it before the group is destroyed (without
    that collection this test failed in 4 of 5 tries, with it in none of 5)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for k in range(6):
        ranks = [subprocess.Popen([sys.executable, "-c", RANK_WITH_A_CYCLE, str(rank), str(tmp_path / f"init-{k}")],
                                  env=env, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
        ended = [(rank.wait(timeout=300), rank.stderr.read()) for rank in ranks]
        assert all(code == 0 for code, _ in ended), f"group {k}: " + "; ".join(
            f"rank {r} exit {code}: {err[-500:]}" for r, (code, err) in enumerate(ended))


def test_a_failing_exit_after_the_summary_keeps_the_training(tmp_path):
    """Found by a review: rank 0 removes the checkpoints once the model is saved, before the ranks exit; a crash at
    their exit (a non-zero torchrun status) failed the stage, and its retry trained again from step 0. With rank 0's
    summary written, the training is kept, with a warning; without one (or half of one), it failed."""
    from ance_core.errors import AnceError, AnceWarning
    from ance_core.training.distributed import RESULT, finished_summary

    with pytest.raises(AnceError, match=r"distributed training on 2 processes failed \(torchrun exit status 1"):
        finished_summary(tmp_path, 1, 2)
    (tmp_path / RESULT).write_text('{"steps": 4')  # (cut off)
    with pytest.raises(AnceError, match="failed"):
        finished_summary(tmp_path, 0, 2)
    (tmp_path / RESULT).write_text(json.dumps({"steps": 4}))
    assert finished_summary(tmp_path, 0, 2) == {"steps": 4}
    with pytest.warns(AnceWarning, match=r"ended with torchrun exit status -6 after rank 0 saved the trained model .* "
                                         r"is kept"):
        assert finished_summary(tmp_path, -6, 2) == {"steps": 4}


def test_a_drill_at_a_checkpoint_step_finds_that_checkpoint_on_disk(tiny_model, stage_inputs, tmp_path, monkeypatch):
    """Found by a review: under DDP rank 0 logged a step's record before writing its checkpoint, and the launcher's
    callbacks (the task's `train@N` drill) run on the records it tails, so the drill could stop the ranks with step
    N's checkpoint not yet written (here each write takes 3 s) and the retry resumed from an earlier one."""
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "ckpt")
    cfg = TrainConfig(**CFG | {"checkpoint_every": 3}, max_steps=12, world_size=2)  # (stopped while writing step 9's)
    monkeypatch.setenv("ANCE_FAULT", "train@6")  # armed: the ranks wait for a checkpoint before its step goes on
    monkeypatch.setenv("ANCE_FAULT_HOOK", "tests.core.training.slow_checkpoints")

    def drill(record):
        if record["step"] == 6:
            raise RuntimeError("drill at step 6")

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="drill at step 6"):
        launch(_spec(checkpoint, stage_inputs, cfg), out, 2, callbacks=[drill])
    assert "step-000006" in [p.name for p in (out / "checkpoints").iterdir()]
    assert [r["step"] for r in _log(out)][:6] == list(range(1, 7))


def test_a_launch_stopped_after_its_ranks_finished_is_not_trained_again(tiny_model, stage_inputs, tmp_path):
    """Found by a review: rank 0 writes its summary once the model is saved and its checkpoints removed; a launcher
    stopped after that while it ran the last records' callbacks left the summary, and the retry's launch removed it
    and trained again from step 0. Now it delivers the records and returns the summary; the model stays as saved."""
    from ance_core.training.distributed import RESULT

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "ckpt")
    cfg = TrainConfig(**CFG, max_steps=4, world_size=2)
    out = tmp_path / "out"

    def stopped_at_the_end(record):
        deadline = time.monotonic() + 120
        while record["step"] == 4 and not (out / RESULT).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if record["step"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch(_spec(checkpoint, stage_inputs, cfg), out, 2, callbacks=[stopped_at_the_end])
    assert (out / RESULT).exists() and not (out / "checkpoints").exists()
    saved = (out / "model.safetensors").stat()
    records = []
    summary = launch(_spec(checkpoint, stage_inputs, cfg), out, 2, callbacks=[records.append])
    assert summary["steps"] == 4 and [r["step"] for r in records] == [1, 2, 3, 4]
    assert (out / "model.safetensors").stat().st_mtime_ns == saved.st_mtime_ns
    assert not (out / RESULT).exists() and not (out / "distributed.json").exists()
