"""The training loop: NLL over 1 positive + n mined negatives (ANCE eq. 5), resumable to the exact step.

Output folder (a checkpoint once finished):
  config.json, model.safetensors, head.safetensors, ance_model.json, tokenizer files   the trained model
  optimizer.safetensors, trainer_state.json, rng.safetensors                          the training state
  train_log.jsonl        one line per step: loss, lr, pre-clip gradient norm overall and per third of the layers
                         (grad_norm_bottom/middle/top, ANCE ICLR Fig. 4), examples/s
  checkpoints/step-NNNNNN/   the latest intermediate checkpoint (model + training state); removed at the end. Taken
                         every `checkpoint_seconds` and/or `checkpoint_every` steps and at the async refresh's
                         snapshot steps, written by a background thread (training/checkpointing.py)

`train` started again on the same folder resumes from its latest checkpoint: same weights, optimizer and
scheduler state, RNG state and data position, so the result equals an uninterrupted run (CPU, same seed).
No pickle: tensors in safetensors, everything else in JSON.
"""

import json
import math
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ance_core.artifacts import TRAIN_LOG, write_text
from ance_core.data.corpus import CorpusRows, FrameCorpus
from ance_core.errors import AnceError, warn
from ance_core.faults import drills_armed, fault_point
from ance_core.modeling.devices import autocast_dtype, out_of_memory_advice, pick_device
from ance_core.modeling.model import load_checkpoint, save_checkpoint
from ance_core.negatives.mining import epoch_negatives, negative_draws
from ance_core.system_metrics import SystemSampler
from ance_core.training.batches import PairTokens, PassageSource, StepFeed, StepPlan
from ance_core.training.checkpointing import CheckpointCadence, CheckpointWriter
from ance_core.training.config import TrainConfig
from ance_core.training.devcheck import BEST, DEV_METRIC, BestStep, StageDev
from ance_core.training.gradients import (
    PairEncoder,
    read_once,
)
from ance_core.training.optim import linear_schedule, make_optimizer
from ance_core.training.plan import (
    Schedule,
    aligned_negatives,
    check_precision,
    check_processes,
    planned_steps,
    stage_seed,
    steps_per_epoch,
)
from ance_core.training.ranks import current_ranks, rng_states
from ance_core.training.state import (
    CHECKPOINTS,
    capture_state,
    latest_checkpoint,
    load_state,
    resume_optimizer,
    save_state,
)
from ance_core.training.step import TrainStep, WeightAverage
from ance_core.training.tokens import pad_settings

StepCallback = Callable[[dict], None]
NegativesUpdate = Callable[[int], pd.DataFrame | None]
SnapshotHook = Callable[[int, Callable[[Path], None]], None]


# ---------------------------------------------------------------- the loop



def cut_log(path: Path, step: int, write: bool = True) -> list[dict]:
    """A training log's records of the steps up to `step` (the checkpoint a stage resumes from; 0: none); `write`:
    the log cut back to them, written as a new file, so that a reader tailing the old one sees the change
    (distributed.LogTail). A line cut off by the kill the stage resumes from (half a record) is dropped: it failed
    every retry."""
    kept = [(ln, r) for ln in path.read_text().splitlines()
            if (r := _record(ln)) is not None and r["step"] <= step] if step else []
    if write:
        write_text(path, "".join(ln + "\n" for ln, _ in kept))
    return [r for _, r in kept]


def _record(line: str) -> dict | None:
    """A training log line's record, or None for one cut off (half written when the process was killed)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "step" in record else None


def train(
    init_checkpoint: str | Path,
    negatives: pd.DataFrame,
    corpus: CorpusRows | pd.DataFrame,
    queries: pd.DataFrame,
    relevant: dict[str, set[str]],
    cfg: TrainConfig,
    out: Path,
    callbacks: Sequence[StepCallback] = (),
    negatives_update: NegativesUpdate | None = None,
    snapshot_steps: Collection[int] = (),
    on_snapshot: SnapshotHook | None = None,
    schedule: Schedule | None = None,
    round_: int = 0,
    dev: StageDev | None = None,
) -> dict:
    """Train from `init_checkpoint` on mined (query, positive, negatives) rows; write the result into `out`.
    `relevant`: every labelled-relevant document per query, masked out where it would be another query's in-batch
    negative.

    Only what the rows name is held, as token ids: their queries (from `queries`) and their positives and negatives,
    read from `corpus` by row (data/corpus.py: `ParquetCorpus` decodes only the row groups of a data folder's
    corpus.parquet that hold them; a DataFrame is read in place), tokenized once (training/tokens.py); the documents of
    newer negatives are read when `negatives_update` swaps them in. A DataLoader of `cfg.loader_workers` workers pads
    each step's micro-batches from those ids (training/batches.py): the tensors, in the order, that tokenizing each
    micro-batch's texts gives.

    `round_` (0: the warm-up) seeds the stage's batch order and dropout (`stage_seed`). A table of several draws
    (negatives/mining.py `sample_negatives(draws=...)`) trains epoch e on draw e mod draws: each epoch other
    negatives from the mined pool, the same (query, positive) rows in `epoch_order`.

    `schedule` places the stage in a learning-rate schedule shared with other stages (default: its own, warm-up over
    `cfg.warmup_ratio` of its steps, then linear decay to zero).

    `callbacks` get each step's log record; one that raises stops the training there (the latest checkpoint in `out`
    stays, and `train` on the same folder resumes from it). In one process a step with nothing due at it (no dev
    check, checkpoint or snapshot; not the last) is read, logged and called back once the next step is queued, so
    that the device does not wait for the host between steps; a non-finite loss still stops the stage before any
    later checkpoint.

    Asynchronous refresh (ANCE Fig. 2): before each step `negatives_update(step)` may return a newer negatives
    table for the same (query, positive) rows, which replaces the one in use without changing the data order.
    After each step in `snapshot_steps`, a resumable checkpoint is written and `on_snapshot(step, save)` is called;
    `save(folder)` writes the current model there (for the inferencer to encode the corpus with).

    `dev` (training/devcheck.py): the dev split scored on its candidate set `dev.cfg.per_epoch` times an epoch and at
    the last step (each score in its step's record, `dev_check_ndcg_at_10`); the stage ends early after
    `dev.cfg.patience` checks in a row below its best, and its result is the best check's state (the starting model's,
    step 0, when no check beat it) unless `dev.cfg.keep_best` is off. A new best also takes a resumable checkpoint.

    Other resumable checkpoints follow `cfg.checkpoint_seconds` / `cfg.checkpoint_every` (training/checkpointing.py);
    they are written in the background, and each is on disk before `train` returns or raises, before a snapshot
    step's `on_snapshot`, and, with a drill armed (ance_core/faults.py), before its step's callbacks.

    In a process group of `cfg.world_size` ranks (started by training/distributed.py `launch`), each rank encodes its
    slice of every batch and the loss spans the whole batch (training/ranks.py); rank 0 logs, checkpoints and
    calls `callbacks`.
    """
    if negatives.empty:
        raise ValueError("no training pairs: the negatives table is empty")
    check_processes(len(negatives), cfg)
    ranks = current_ranks()
    if ranks.world != cfg.world_size:
        raise AnceError(f"world_size {cfg.world_size} but this process group has {ranks.world} process(es): "
                        "train on several processes with ance_core.training.distributed.launch (the task does)")
    device = pick_device()
    if device.type == "cuda" and ranks.world > 1:
        device = torch.device("cuda", torch.cuda.current_device())
    check_precision(cfg.precision, device)
    dtype = autocast_dtype(cfg.precision, device)
    seed = stage_seed(cfg.seed, round_)
    torch.manual_seed(seed + ranks.rank)
    model, tokenizer, meta = load_checkpoint(init_checkpoint, device, attention_dropout=cfg.attention_dropout,
                                           hidden_dropout=cfg.hidden_dropout)
    query_length = cfg.query_max_length or meta.query_max_length
    passage_length = cfg.passage_max_length or meta.passage_max_length
    if model.projector is not None:
        raise AnceError(f"{init_checkpoint}: a compressed checkpoint (it has a projector); train its teacher and "
                        "compress again")
    pairs = negatives.reset_index(drop=True)
    group = 1 + len(pairs["negative_ids"].iloc[0])
    if group == 1 and not cfg.in_batch_negatives:
        raise ValueError("the training pairs have no mined negatives (sampler in-batch or nce) and "
                         "in_batch_negatives is off: there would be nothing to contrast with")

    source = PassageSource(corpus if isinstance(corpus, CorpusRows) else FrameCorpus(corpus), tokenizer, meta,
                           passage_length)
    draws, in_use = negative_draws(pairs), 0  # the draw whose tokens are held
    # the texts the rows name (draw 0's negatives), tokenized
    tokens = PairTokens.build(epoch_negatives(pairs, 0), source, queries, relevant, query_length)

    per_epoch = steps_per_epoch(len(pairs), cfg)
    total = planned_steps(len(pairs), cfg)
    optimizer = make_optimizer(model, cfg.optimizer, cfg.learning_rate, cfg.weight_decay)
    if schedule is None:
        scheduler = linear_schedule(optimizer, int(cfg.warmup_ratio * total), total)
    else:
        if schedule.offset + total > schedule.total:
            raise ValueError(f"a stage of {total} steps at offset {schedule.offset} overruns its schedule of "
                             f"{schedule.total} steps")
        if schedule.resume_optimizer:
            resume_optimizer(Path(init_checkpoint), optimizer)
        scheduler = linear_schedule(optimizer, schedule.warmup, schedule.total, offset=schedule.offset)
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 and device.type == "cuda" else None

    out.mkdir(parents=True, exist_ok=True)
    step = 0
    if (resume := latest_checkpoint(out)) is not None:
        step = load_state(resume, model, optimizer, scheduler, scaler, ranks)
    log_path = out / TRAIN_LOG
    kept = cut_log(log_path, step, write=ranks.main)
    encoder = PairEncoder(model)
    if ranks.world > 1:
        encoder = torch.nn.parallel.DistributedDataParallel(
            encoder, device_ids=[device.index] if device.type == "cuda" else None)

    averaged = WeightAverage(model, optimizer, cfg.ema_decay, fresh=step == 0) if cfg.ema_decay else None
    padding = pad_settings(tokenizer)
    train_step = TrainStep(model, encoder, optimizer, scheduler, cfg, group, device, dtype, scaler, ranks, averaged,
                           left_padded=padding[1])
    state = dict(model=model, tokenizer=tokenizer, meta=meta, optimizer=optimizer, scheduler=scheduler,
                 scaler=scaler, epoch=step // per_epoch)
    best = _dev_start(dev, out, step, kept, state, ranks)
    model.train()
    bar = tqdm(total=total, initial=step, desc="train", unit="step", dynamic_ncols=True, disable=not ranks.main)
    per_rank = -(-cfg.batch_size // ranks.world)
    oom = out_of_memory_advice(
        f"training a batch of {cfg.batch_size} queries ({per_rank} per rank) with {group} passages each at "
        f"{passage_length} tokens", f"lower batch_size and raise grad_accumulation to keep the batch of "
        f"{cfg.batch_size * cfg.grad_accumulation}, set grad_cache_chunk (the whole batch's in-batch negatives with "
        f"one chunk's memory), lower passage_max_length, or train in bf16")
    if cfg.grad_cache_chunk is not None and cfg.grad_cache_chunk >= per_rank and ranks.main:
        warn(f"grad_cache_chunk {cfg.grad_cache_chunk} holds the whole batch of {per_rank} queries per process: each "
             "step encodes it twice for nothing; set a smaller chunk or unset it")
    plan = StepPlan(cfg.batch_size, cfg.grad_accumulation, per_epoch, seed, cfg.in_batch_negatives,
                    cfg.padding_multiple)
    feed = StepFeed(plan, ranks, padding, total, cfg.loader_workers, device.type == "cuda", seed)
    feed.reset(tokens)
    cadence = CheckpointCadence(cfg.checkpoint_every, cfg.checkpoint_seconds, ranks)
    sampler = SystemSampler(out) if ranks.main else nullcontext()  # CPU, memory, GPU use while the stage trains

    def stage(step: int) -> str:
        """The stage a step trains, for errors: with snapshots (one asynchronous trainer over all rounds, ANCE Fig. 2)
        a round ends at each snapshot step."""
        if round_ == 0:
            return "the warm-up"
        if not snapshot_steps:
            return f"ANCE round {round_}"
        return f"ANCE round {round_ + sum(s < step for s in snapshot_steps)} (the asynchronous trainer)"

    # one process: a step with nothing due at it (no dev check, checkpoint, snapshot, drill; not the last) has its
    # figures read once the next step is queued, so the device never waits on the host's bookkeeping between steps
    defer, pending = ranks.world == 1, None

    def read(step: int, epoch: int, figures: dict, lr: float, rows: int, started: float,
             ended: float | None = None) -> dict:
        """The step's record; its time runs from its start to `ended` (a deferred step's: the next step's start)."""
        norms = read_once(figures)  # one device transfer
        loss_value = norms.pop("loss")
        if not math.isfinite(loss_value):  # every step after it would train on NaN: stop before it is kept
            raise AnceError(f"{stage(step)}: the loss is {loss_value} at step {step} (learning_rate "
                            f"{cfg.learning_rate:g}, precision {cfg.precision}); training stopped and nothing was "
                            "published: lower the learning rate (or max_grad_norm), or train in fp32")
        if scaler is None and not math.isfinite(norms["grad_norm"]):  # (fp16's scaler skips such a step itself)
            raise AnceError(f"{stage(step)}: the gradient norm is {norms['grad_norm']} at step {step} (loss "
                            f"{loss_value:.4g}, learning_rate {cfg.learning_rate:g}, precision {cfg.precision}); "
                            "training stopped and nothing was published: lower the learning rate, or train in fp32")
        seconds = (time.perf_counter() if ended is None else ended) - started
        state["epoch"] = epoch
        return {"step": step, "epoch": epoch, "loss": loss_value, "lr": lr, **norms, "examples_per_s": rows / seconds,
                "timestamp": int(time.time() * 1000)}  # (its points' time in MLflow, when logged after the stage)

    def log_step(record: dict) -> None:
        if ranks.main:
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.update(1)
            dev_score = {"dev": f"{record[DEV_METRIC]:.4f}"} if DEV_METRIC in record else {}
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}", **dev_score)

    def patience_spent() -> bool:  # (also when resumed at the check that spent it: the stage had ended there)
        return best is not None and dev.cfg.patience is not None and best.since_best() >= dev.cfg.patience

    with open(log_path, "a") if ranks.main else nullcontext() as log, oom, feed, CheckpointWriter(out) as writer, \
            sampler:
        while step < total and not patience_spent():
            epoch = step // per_epoch
            swapped = negatives_update is not None and (table := negatives_update(step)) is not None
            if swapped:
                pairs = aligned_negatives(pairs, table, group)
                draws = negative_draws(pairs)
            if swapped or epoch % draws != in_use:  # newer negatives, or the epoch's own draw
                in_use = epoch % draws
                # the new documents read and tokenized now, those no longer named dropped
                feed.reset(tokens := tokens.swapped(epoch_negatives(pairs, in_use), source))
            started = time.perf_counter()
            micro_batches = feed.next(step)  # the step's rows in epoch_order, padded by the loader
            figures, lr = train_step(micro_batches, step)
            step += 1
            rows = sum(b["rows"] for b in micro_batches)
            if pending is not None:  # the previous step's, now that this one is queued
                log_step(record := read(*pending, ended=started))
                pending = None
                for callback in callbacks:
                    callback(record)
            checked = best is not None and (step % dev.cfg.every(per_epoch) == 0 or step == total)
            snapshot = step in snapshot_steps and step < total
            due = step < total and cadence.due(step)  # (on every rank: a collective with the seconds cadence)
            if defer and step < total and not (checked or snapshot or due or drills_armed()):
                pending = (step, epoch, figures, lr, rows, started)
                continue
            record = read(step, epoch, figures, lr, rows, started)
            improved = False
            if checked:
                record[DEV_METRIC] = dev.check.score(model, tokenizer, meta)
                model.train()
                improved = best.checked(step, record[DEV_METRIC])
            if ranks.world == 1:
                log_step(record)
            keep = improved and step < total  # a new best: resumable from it before it is kept as the best
            if snapshot or due or keep:
                rng = rng_states(ranks)  # every rank's: a collective
                cadence.taken()
                if ranks.main:
                    writer.write(capture_state(step=step, rng=rng, **state))  # copied here, written in the background
            if ranks.main and (snapshot or keep or drills_armed()):
                writer.wait()  # on disk before on_snapshot publishes the step, or a drill below stops the process
            if keep:
                best.save(out, lambda folder, step=step, rng=rng: save_state(folder, step=step, rng=rng, **state))
            if ranks.world > 1:  # the launcher's callbacks (a drill) run on the log's records: after the checkpoint
                log_step(record)
                fault_point(f"train-rank{ranks.rank}", step)  # a drill stops one rank here (tests)
            if not ranks.main:
                continue
            if snapshot and on_snapshot is not None:
                fault_point("snapshot", step)  # a drill: the step's checkpoint is on disk, its snapshot not published
                on_snapshot(step, lambda folder: save_checkpoint(model, tokenizer, meta, folder))
            for callback in callbacks:
                callback(record)
    if patience_spent() and ranks.main:
        print(f"dev check: {dev.cfg.patience} checks without beating step {best.step}'s dev nDCG@10 "
              f"{best.score:.4f}; the stage ends at step {step} of {total}")
    bar.close()
    rng = rng_states(ranks)
    if ranks.world > 1:
        dist.barrier()  # every rank done before rank 0 writes the result
    if averaged is not None:
        averaged.apply()  # the stage's model: the average of its weights over its steps
    if not ranks.main:
        return {"steps": step}
    save_state(out, step=step, rng=rng, **state)
    if best is not None and dev.cfg.keep_best and best.step != step:
        print(f"dev check: the stage's model is step {best.step}'s (dev nDCG@10 {best.score:.4f}"
              + (", the starting model" if best.step == 0 else "") + f"), not step {step}'s")
        best.restore(out)  # (a copy: killed before the checkpoints go, the stage resumes with its best intact)
    shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    shutil.rmtree(out / BEST, ignore_errors=True)
    losses = [json.loads(ln)["loss"] for ln in log_path.read_text().splitlines()]
    summary = {"steps": step, "pairs": len(pairs), "group_size": group, "first_loss": losses[0],
               "last_loss": losses[-1], "resumed_from_step": int(resume.name[5:]) if resume else 0}
    if best is not None:
        summary |= best.summary() | {"planned_steps": total} | dev.check.size
    return summary


def _dev_start(dev: StageDev | None, out: Path, step: int, records: list[dict], state: dict, ranks) -> BestStep | None:
    """The stage's best step so far (training/devcheck.py), None without dev checks. A fresh stage keeps its starting
    state as the best (step 0: its score is the starting model's evaluation, or a check now)."""
    if dev is None:
        return None
    if ranks.world > 1:
        raise AnceError("dev_check scores the model in one training process; with world_size > 1 set "
                        "dev_check.per_epoch: 0")
    if step == 0:  # a fresh stage (or one whose checkpoints had gone): a best left by an earlier attempt is not its
        BestStep.clear(out)
    start_score = dev.start_score
    if start_score is None and step == 0:
        start_score = dev.check.score(state["model"], state["tokenizer"], state["meta"])
    best = BestStep.resume(out, records, start_score if start_score is not None else float("-inf"))
    if step == 0:
        rng = rng_states(ranks)
        best.save(out, lambda folder: save_state(folder, step=0, rng=rng, **state))
    elif best.resumed_past(step):  # stopped while saving this step's new best: it is the state just resumed from
        rng = rng_states(ranks)
        best.save(out, lambda folder: save_state(folder, step=step, rng=rng, **state))
    return best
