"""Training tasks: one synchronous round (`train_round`), the dev checks' candidate sets, and the learning-rate plan
of a run's stages (`SchedulePlan`); the asynchronous trainer is in tasks/train_async.py."""

import dataclasses
import logging
from pathlib import Path

import pandas as pd
from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from ance_core.artifacts import (
    CANDIDATES,
    NEGATIVES,
    RUN,
    ArtifactRef,
    digest_of,
    read_manifest,
    run_stage,
)
from ance_core.data.corpus import ParquetCorpus, read_corpus_rows
from ance_core.data.dataset import read_tables
from ance_core.errors import AnceError
from ance_core.negatives.mining import read_training_pairs
from ance_core.retrieval.config import EncodeConfig
from ance_core.training.config import DevCheckConfig, TrainConfig
from ance_core.training.devcheck import DEV_METRIC, DevCheck, StageDev, candidate_pairs
from ance_core.training.distributed import FAULT_HOOK, launch
from ance_core.training.loop import train
from ance_core.training.plan import Schedule, check_processes, continuous_schedules, planned_steps
from ance_core.training.state import checkpoint_step
from tasks.common import inject_fault, progress_artifact, stage_task
from tracking.live import live_callbacks


def fault_callback(name: str):
    return lambda record: inject_fault(name, step=record["step"])


ACCUMULATION_RULE = "mean of the step's micro-batches"  # in the key of a stage with grad_accumulation > 1


def progress_callback(every: int = 10):
    """Training progress in the task's Prefect log (the UI shows it; tqdm's bar only reaches the terminal); outside a
    task run (`train_round.fn`, the benchmarks) in the standard logger `ance`."""
    try:
        logger = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger("ance")

    def log(record: dict) -> None:
        if DEV_METRIC in record:
            logger.info(f"step {record['step']}: dev nDCG@10 {record[DEV_METRIC]:.4f} (candidate set)")
        if record["step"] % every == 0:
            logger.info(f"step {record['step']}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, "
                        f"grad norm {record['grad_norm']:.2f}, {record['examples_per_s']:.1f} examples/s")

    return log


@dataclasses.dataclass(frozen=True)
class DevInputs:
    """A training stage's dev checks (training/devcheck.py): its candidate set (a `dev-candidates` stage), the dev
    split, the checks' config, the starting model's dev nDCG@10, and how passages are encoded and judged."""

    candidates: ArtifactRef
    split: str
    cfg: DevCheckConfig
    start_score: float | None
    encode: EncodeConfig
    ignore_identical_ids: bool = True

    def key(self) -> dict:
        return {"split": self.split, "check": self.cfg, "start_score": self.start_score, "encode": self.encode,
                "ignore_identical_ids": self.ignore_identical_ids}

    def content(self) -> str:
        """The candidate set's own digest, for the training stage's key: the same pairs from rankings of other depths
        (`bm25.top_k`, the BM25 dev run's evaluation depth) train the same stage (issue 41). A folder from before
        the digest was kept: its key."""
        return read_manifest(self.candidates.path).get("summary", {}).get("content", self.candidates.digest)

    def stage_dev(self, data: ArtifactRef, tables) -> StageDev:
        pairs = pd.read_parquet(Path(self.candidates.path, CANDIDATES))
        passages = read_corpus_rows(data.path, sorted(set(pairs["doc_id"])))
        check = DevCheck(pairs, tables.split_queries(self.split), tables.split_qrels(self.split), passages,
                         self.encode, self.ignore_identical_ids, self.cfg.passage_max_length)
        return StageDev(check, self.cfg, self.start_score)


@stage_task("dev-candidates")
def dev_candidates(runs: list[ArtifactRef], data: ArtifactRef, split: str, depth: int, work_dir: str) -> ArtifactRef:
    """The candidate set of a training stage's dev checks: each query of the dev `split`, the top `depth` of each run
    (BM25's, the starting model's) and its relevant documents."""

    def build(out):
        qrels = read_tables(data.path, corpus_columns=[]).split_qrels(split)
        ranked = [pd.read_parquet(Path(run.path, RUN), columns=["query_id", "doc_id", "rank"]) for run in runs]
        pairs = candidate_pairs(ranked, qrels, depth)
        pairs.to_parquet(out / CANDIDATES, index=False)
        content = digest_of(sorted(zip(pairs["query_id"], pairs["doc_id"], strict=True)))
        return {"queries": int(pairs["query_id"].nunique()), "passages": int(pairs["doc_id"].nunique()),
                "pairs": len(pairs), "content": content}

    inputs = {"runs": [run.digest for run in runs], "data": data.digest}
    return run_stage(work_dir, "dev-candidates", {"split": split, "depth": depth}, inputs, build)


@stage_task("train")
def train_round(checkpoint: ArtifactRef, negatives: ArtifactRef, data: ArtifactRef, split: str, cfg: TrainConfig,
                work_dir: str, schedule: Schedule | None = None, round_: int = 0, dev: DevInputs | None = None
                ) -> ArtifactRef:
    """Train from a checkpoint on mined negatives (within a shared learning-rate `schedule`, if given) as ANCE round
    `round_` (0: the warm-up; it seeds the batch order and dropout), with `dev` checks if given; a retried or re-run
    task resumes from its last checkpoint."""

    def build(out):
        total = planned_steps(read_manifest(negatives.path)["summary"]["pairs"], cfg)
        what = "the warm-up" if round_ == 0 else f"ANCE round {round_}"
        bar = progress_artifact(total, f"training {what}: {total} steps")
        callbacks = [progress_callback(), lambda record: bar(record["step"]), *live_callbacks(),
                     fault_callback("train")]
        if cfg.world_size > 1 and dev is not None:
            raise AnceError("dev_check scores the model in one training process; with world_size > 1 set "
                            "dev_check.per_epoch: 0")
        if cfg.world_size > 1:
            check_processes(read_manifest(negatives.path)["summary"]["pairs"], cfg)  # before the processes start
            spec = {"checkpoint": checkpoint.path, "negatives": str(Path(negatives.path, NEGATIVES)),
                    "data": data.path, "split": split, "cfg": cfg.model_dump(mode="json"),
                    "schedule": dataclasses.asdict(schedule) if schedule is not None else None, "round": round_}
            summary = launch(spec, out, cfg.world_size, callbacks, resumed_step=checkpoint_step(out),
                             env={FAULT_HOOK: "tasks.common"})
        else:
            tables = read_tables(data.path, corpus_columns=[])  # the passages are read by row, as needed
            pairs = read_training_pairs(Path(negatives.path, NEGATIVES))
            summary = train(checkpoint.path, pairs, ParquetCorpus.of_folder(data.path), tables.split_queries(split),
                            tables.relevant(split), cfg, out, callbacks=callbacks, schedule=schedule, round_=round_,
                            dev=dev.stage_dev(data, tables) if dev is not None else None)
        bar.finish()  # (dev checks may stop it before its last step)
        return summary

    inputs = {"checkpoint": checkpoint.digest, "negatives": negatives.digest, "data": data.digest}
    if dev is not None:
        inputs["dev_candidates"] = dev.content()
    return run_stage(work_dir, "train", train_config(cfg, split, schedule, round_, dev), inputs, build, resumable=True)


def train_config(cfg: TrainConfig, split: str, schedule: Schedule | None = None, round_: int = 0,
                 dev: DevInputs | None = None) -> dict:
    """The train stage's config, in its key (tests/tasks/test_train_keys.py pins what each part does to it)."""
    config = {"train": cfg, "split": split} | ({"schedule": schedule} if schedule is not None else {})
    if cfg.grad_accumulation > 1:  # a step of fewer micro-batches is their mean since issue 41 (over GA before)
        config["accumulation"] = ACCUMULATION_RULE
    if round_:  # (the warm-up's key is the one it had before rounds were seeded apart)
        config["round"] = round_
    if dev is not None:  # (a stage without dev checks keeps the key it had before them)
        config["dev"] = dev.key()
    return config


class SchedulePlan:
    """The learning-rate schedule of each training stage of a run, in order: None (each stage its own) or, for
    `schedule: continuous`, its part of one schedule over all of them (ance_core.training.loop.Schedule). `pairs`:
    each stage's (query, positive) pairs, known before it is mined (tasks/mine.py `stage_pairs`: a stage that mines
    a sample of the queries trains on other pairs, in another number); without them every stage is planned from the
    first stage's negatives (one row per training pair, whatever the sampler)."""

    def __init__(self, mode: str, stages: list[TrainConfig], resume_first: bool = False,
                 pairs: list[int] | None = None):
        if pairs is not None and len(pairs) != len(stages):
            raise ValueError(f"{len(pairs)} pair counts for {len(stages)} training stages")
        self.mode, self.stages, self.resume_first, self.pairs = mode, stages, resume_first, pairs
        self.planned: list[Schedule] | None = None

    def next(self, negatives: ArtifactRef, restart: bool = False) -> Schedule | None:
        """The next stage's schedule. `restart`: the stage does not continue the previous one (it starts from an
        earlier model, the best on dev): it and the stages after it become one schedule of their own, warmed up
        again, with a fresh optimizer."""
        if self.mode != "continuous" or not self.stages:
            return None
        if self.planned is None or restart:
            first = len(self.stages) - len(self.planned) if self.planned is not None else 0
            left = self.stages[first:]
            known = self.pairs[first:] if self.pairs else None
            pairs = known or [read_manifest(negatives.path)["summary"]["pairs"]] * len(left)
            steps = [planned_steps(n, cfg) for n, cfg in zip(pairs, left, strict=True)]
            self.planned = continuous_schedules(steps, left[0].warmup_ratio, self.resume_first and not restart)
        return self.planned.pop(0)
