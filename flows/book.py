"""The bookkeeping of a flow run (`ance-train`, `compare-negatives`), so that a flow's body is a straight line of
stages.

`RunBook` opens the run's MLflow record (and links it from the Prefect flow run), and records every model the run
produces as it goes: its checkpoint, corpus encoding and index, its evaluations on the evaluation split and the dev
split, the negatives it trained on and the model it started from, its negatives analysis, and every stage run under
the label it ran for (`StageLog`: the report's wall-time table). It runs a model's evaluation chain, the hybrid row
and the report, then logs and prints the run's end. It decides two things on the dev split: which model a stage
starts from (`start_of`: the best so far) and which dense model the hybrid row fuses; the report task selects the
run's result.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ance_core.artifacts import ArtifactRef, read_manifest, run_stage, stage_warnings
from ance_core.data.checks import check_trainable, warn_shared_queries
from ance_core.data.corpus import ParquetCorpus
from ance_core.data.dataset import read_tables
from ance_core.data.sources import resolve_dataset
from ance_core.errors import warn
from ance_core.export.hybrid import package_bytes, write_package
from ance_core.modeling.checks import longer_than_passages
from ance_core.modeling.model import read_meta
from ance_core.negatives.analysis import read_stats
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.samplers import get_sampler
from ance_core.pipeline.config import negatives_needed
from ance_core.pipeline.report import (
    DEV_KEY,
    StageTiming,
    pooled_best,
    pooled_dev,
    read_metrics,
    read_report,
    select_model,
)
from ance_core.retrieval.evaluate import identical_ids_rule, warn_shallow
from ance_core.training.config import TrainConfig
from flows.publish import artifact_key, flow_tags, link_mlflow_run, publish_tables
from flows.start import warn_other_dev_split
from tasks.analysis import analyse_negatives
from tasks.bm25 import bm25_index, bm25_run
from tasks.common import StageLog, run_task, stages_for
from tasks.data import prepare_data
from tasks.evaluate import evaluate
from tasks.fusion import fused_run, fusion_choice, read_fusion
from tasks.refresh import evaluate_stages, refresh_negatives
from tasks.report import report
from tasks.train import DevInputs, Schedule, dev_candidates, train_round
from tracking.closing import closing_lines
from tracking.registry import dev_setting
from tracking.run import PipelineTracking


@dataclass(frozen=True)
class Trial:
    """A pipeline run as a trial of a recipe search: the search's MLflow experiment and run, the trial's name."""

    experiment: str
    parent_run: str | None
    name: str


MAX_PACKAGE_BYTES = 512 * 2**20  # a hybrid result's retrieval package logged with its version, up to this size
LONG_SAMPLE = 500  # documents tokenized whole to tell how many a FirstP model reads only the start of
LONG_SHARE = 0.1  # the share of them that is said


class RunBook:
    def __init__(self, config, experiment: str, dev: bool = True, next_mining: MiningConfig | None = None,
                 trial: "Trial | None" = None, folds: list[dict[str, ArtifactRef]] | None = None):
        """`dev`: evaluate every model on the dev split too and let the report choose the run's result on it (a
        comparison does neither). `next_mining`: the rounds' mining, whose dense ranking the negatives analysis
        shares (cached) instead of ranking the training queries once more. `trial`: the run is a trial of a recipe
        search (`ance tune`): its MLflow run is nested under the search's, and nothing is registered or linked.
        `folds`: under `selection: cv`, the other dev folds' runs' dev evaluations (kind -> evaluation), pooled with
        this run's to choose its result and the dense model of its hybrid row."""
        self.c, self.wd, self.split = config, config.work_dir, config.data.train_split
        self.log = StageLog()
        self.trial = trial
        self.folds = folds
        self.loose: list[str] = []  # warnings said outside any stage's build (a flow collects them into it)
        self.experiment = experiment
        if trial is not None:
            self.tracking = PipelineTracking(config, flow_tags(), experiment=trial.experiment, trial=True,
                                             trial_of=trial.parent_run, name=trial.name)
        else:
            self.tracking = PipelineTracking(config, flow_tags(), experiment=experiment)
            link_mlflow_run(self.tracking, key=self.artifact_key("mlflow-run"))
        self.with_dev, self.next_mining = dev, next_mining
        self.eval_split = config.data.eval_split
        self.eval = config.eval  # (as it applies to the collection once its qrels are read: prepare_data)
        self.dev_split: str | None = None
        self.dev_setting: str | None = None  # the dev queries and labels a dev score is measured on (the champion
        # compares only like with like)
        self.data: ArtifactRef | None = None
        self.evaluations: list[tuple[str, ArtifactRef]] = []  # (label, evaluation on eval_split), in run order
        self.dev: dict[str, ArtifactRef] = {}  # label -> evaluation on the dev split
        self.models: dict[str, dict[str, ArtifactRef]] = {}  # label -> checkpoint, encode, index
        self.trained_on: dict[str, ArtifactRef] = {}  # label -> the mined negatives it trained on
        self.started_from: dict[str, str] = {}  # label -> the label of the model it trained from
        self.stats: dict[str, ArtifactRef] = {}  # label -> its negatives analysis
        self.dev_runs: dict[str, ArtifactRef] = {}  # label (BM25 too) -> its ranking of the dev split
        self.eval_runs: dict[str, ArtifactRef] = {}  # label (BM25 too) -> its ranking of the evaluation split

    def ended_on_failure(self):
        """A block whose failure ends the run's MLflow runs FAILED (the nested ones opened so far, then the run's),
        not left RUNNING."""
        tracking = self.tracking
        return tracking.tracker.ended_on_failure(lambda: [*tracking.children.values(), tracking.parent])

    def prepare_data(self) -> ArtifactRef:
        self.data = self.log.run("data", "prepare", prepare_data, self.c.data, self.wd)
        cfg = self.c.data  # a run that would find nothing to train on stops here, before any other work
        folder = resolve_dataset(cfg.dataset, cfg.data_home, download=False)
        tables = read_tables(self.data.path, corpus_columns=["doc_id"])
        check_trainable(tables, folder, cfg.train_split, negatives_needed(self.c), cfg.format)
        warn_shared_queries(tables, cfg.eval_split, cfg.train_split, cfg.dev_split)
        summary = read_manifest(self.data.path)["summary"]
        self.eval = identical_ids_rule(self.c.eval, tables.qrels)  # (the collection's qrels decide identical ids)
        warn_shallow({"eval.top_k": self.eval.top_k, "bm25.top_k": self.c.bm25.top_k})
        if self.with_dev and self.c.data.dev_split in summary.get("splits", []):
            self.dev_split = self.c.data.dev_split
            self.dev_setting = dev_setting(self.dev_split, summary["split_digests"][self.dev_split], self.eval)
            if self.c.start_checkpoint:
                warn_other_dev_split(self.wd, self.c.start_checkpoint, self.dev_setting)
        splits = {"training": self.split, "dev": self.dev_split, "evaluation": self.eval_split}
        self.tracking.set_dataset(self.data.digest, self.data.path, summary,
                                  {context: split for context, split in splits.items() if split})
        return self.data

    def say_long_documents(self, checkpoint: ArtifactRef, sample: int = LONG_SAMPLE) -> None:
        """One line when a FirstP model reads only the start of many of the corpus's documents (a seeded sample of
        them tokenized whole), naming what reads more of them: said, since the run goes on either way."""
        meta = read_meta(checkpoint.path)
        if self.trial is not None or meta.document_mode != "firstp":
            return  # (a search's trials and a cv run's folds: said by the run itself)
        corpus, rng = ParquetCorpus.of_folder(self.data.path), np.random.default_rng(0)
        groups = pq.ParquetFile(corpus.path).metadata  # (rows of 5 row groups at most: not MS MARCO's whole text read)
        starts = np.cumsum([0] + [groups.row_group(g).num_rows for g in range(groups.num_row_groups)])
        chosen = np.sort(rng.choice(groups.num_row_groups, min(5, groups.num_row_groups), replace=False))
        pool = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in chosen])
        rows = np.sort(rng.choice(pool, min(sample, len(pool)), replace=False))
        texts = [text for _, part in corpus.passages(rows) for text in part]
        if texts and (long := longer_than_passages(checkpoint.path, texts)) >= LONG_SHARE * len(texts):
            tokens = meta.passage_max_length
            print(f"corpus: {long} of {len(texts)} documents sampled ({100 * long / len(texts):.0f}%) are longer than "
                  f"the model's {tokens} passage tokens: FirstP (model.document_mode) encodes the first {tokens} of "
                  "each; maxp encodes up to model.max_passages windows of each (the full-maxp recipe)")

    def bm25(self) -> None:
        """The BM25 baseline on the evaluation split (and the dev split)."""
        for split in dict.fromkeys(filter(None, (self.eval_split, self.dev_split))):
            run = self.log.run("BM25", "bm25" if split == self.eval_split else "bm25-dev", bm25_run, self.data,
                               self.c.bm25, split, self.c.bm25.top_k, self.wd)
            ref = self.log.run("BM25", "evaluate" if split == self.eval_split else "evaluate-dev", evaluate, run,
                               self.data, split, self.wd, self.eval)
            self._record_evaluation("BM25", split, ref)
            (self.dev_runs if split == self.dev_split else self.eval_runs)["BM25"] = run

    def mine(self, label: str, model: str | None, checkpoint: ArtifactRef | None, mining: MiningConfig, round_: int,
             scorer: str | None = None, train: TrainConfig | None = None) -> dict[str, ArtifactRef]:
        """The negatives `label` trains on, mined with `model`'s `checkpoint` (none in the warm-up; `scorer`: the
        model that scores BM25 candidates there). The corpus encoding and index belong to `model` (they also serve
        its evaluation), retrieval and mining to `label`; a stage already recorded for its label is not recorded
        twice. `train`: the config of the stage that trains on them (a draw of negatives per epoch)."""
        with stages_for(f"negatives for {label}"):
            refs = refresh_negatives(checkpoint, self.data, self.split, self.c.encode, self.c.index, mining, round_,
                                     self.wd, self.c.bm25, scorer=self.models[scorer] if scorer else None,
                                     execution=self.c.execution, train=train)
        seen = {(t.label, t.ref.path) for t in self.log.timings}
        for name, ref in refs.items():
            for_label = model if name in ("encode", "index") else label
            if (for_label, ref.path) not in seen:
                self.log.timings.append(StageTiming(for_label, "retrieve-train" if name == "retrieve" else name, ref))
        return refs

    def start_of(self, stage: str, last: str, quiet: bool = False) -> str:
        """The model `stage` trains from: the best dense model so far on the dev split (`select_model`: on a tie the
        later one), `last` (the previous stage's) unless an earlier model scores higher, and `last` without dev
        scores."""
        scored = [{"model": label, DEV_KEY: read_metrics(self.dev[label])["ndcg_at_10"]}
                  for label, model in self.models.items() if label != "BM25" and label in self.dev
                  and "fusion" not in model]
        best = select_model(scored, [r["model"] for r in scored]) or last
        if best != last and not quiet:
            dev = {r["model"]: r[DEV_KEY] for r in scored}
            print(f"{stage} starts from {best} (dev nDCG@10 {dev[best]:.4f}), the best model so far on the dev split: "
                  f"{last} scored {dev[last]:.4f}")
        return best

    def train(self, label: str, started_from: str, checkpoint: ArtifactRef, negatives: ArtifactRef,
              cfg: TrainConfig, sampler: str, schedule: Schedule | None = None, round_: int = 0) -> ArtifactRef:
        """Train `label` (ANCE round `round_`; 0: the warm-up) from `started_from`'s checkpoint on `negatives` (mined
        with `sampler`), its steps streamed to MLflow while it trains."""
        dev = self.dev_inputs(label, started_from)
        with self.tracking.live(label, self.log.timings):
            trained = self.log.run(label, "train", train_round, checkpoint, negatives, self.data, self.split, cfg,
                                   self.wd, schedule, round_, dev)
        self.trained(label, started_from, negatives, sampler)
        return trained

    def dev_inputs(self, label: str, started_from: str) -> DevInputs | None:
        """The dev checks of the stage training `label` from `started_from` (`dev_check`; None when off, or without a
        dev split or the starting model's dev ranking): their candidate set from BM25's and the starting model's
        rankings of the dev split."""
        check = getattr(self.c, "dev_check", None)
        if check is None or not check.active:
            return None
        if self.dev_split is None:
            warn(f"dev_check is on, but the run has no dev split ({self.c.data.dev_split} is neither a split of the "
                 f"dataset nor carved from it): {label} trains without dev checks")
            return None
        if started_from not in self.dev_runs or "BM25" not in self.dev_runs:
            return None
        runs = [self.dev_runs["BM25"], self.dev_runs[started_from]]
        candidates = self.log.run(label, "dev-candidates", dev_candidates, runs, self.data, self.dev_split,
                                  check.depth, self.wd)
        start_score = check.start_score(read_metrics(self.dev[started_from])["ndcg_at_10"])
        return DevInputs(candidates, self.dev_split, check, start_score, self.c.encode,
                         self.eval.ignore_identical_ids)

    def trained(self, label: str, started_from: str, negatives: ArtifactRef | None, sampler: str) -> None:
        """Record that `label` was trained from the model `started_from` on `negatives` (mined with `sampler`)."""
        self.started_from[label] = started_from
        if negatives is not None and get_sampler(sampler).mines:
            self.trained_on[label] = negatives

    def evaluate(self, label: str, checkpoint: ArtifactRef, built: dict[str, ArtifactRef] | None = None) -> None:
        """Evaluate a checkpoint on the evaluation and dev splits; `built` holds the corpus encoding and index its
        mining already made. A model trained on mined negatives also gets the negatives analysis (its own ranking of
        the training queries, shared with the next round's mining, and the starting model's scores of its
        negatives)."""
        c, built = self.c, built or {}
        exact = built.get("index") if c.index.type == "flat" else None  # an approximate mining index is not reused
        with stages_for(label):
            refs = evaluate_stages(checkpoint, self.data, self.eval_split, self.eval, c.encode, c.index, self.wd,
                                   exact, self.dev_split, c.execution)
        self.log.record(label, refs)
        self.models[label] = {"checkpoint": checkpoint, "encode": built.get("encode") or refs["encode"],
                              "index": exact or refs["index"]}
        self._record_evaluation(label, self.eval_split, refs["evaluate"])
        self.eval_runs[label] = refs["retrieve"]
        if "evaluate-dev" in refs:
            self._record_evaluation(label, self.dev_split, refs["evaluate-dev"])
            self.dev_runs[label] = refs["retrieve-dev"]
        if label in self.trained_on:
            # the ranking the next round's mining made with this model, when it ranked every training query (it
            # ranks at least the analysis's depth: the samplers that rank with the model rank 100 deep or more)
            mined = self.next_mining
            shared = built.get("retrieve") if mined is not None and mined.queries is None else None
            with stages_for(f"negatives of {label}"):
                self.stats[label] = analyse_negatives(self.trained_on[label], checkpoint,
                                                      self.models[label]["index"], self.data, self.split, c.encode,
                                                      c.index, self.wd, self.models.get(self.started_from[label]),
                                                      shared)

    def hybrid(self, last: str) -> str | None:
        """The hybrid row (`hybrid`): the best dense model on the dev split (`last` without one) fused with BM25, the
        fusion chosen on the dev split (RRF without one), evaluated on both splits like a model; a candidate for the
        run's result. Its label, or None when the config has it off or BM25 ranked no evaluation split."""
        if not getattr(self.c, "hybrid", False) or "BM25" not in self.eval_runs:
            return None
        dense = self.best_pooled() or self.start_of("hybrid", last, quiet=True)
        label = f"{dense} + BM25"
        dev = self.dev_split if dense in self.dev_runs and "BM25" in self.dev_runs else None
        choice = self.log.run(label, "fusion", fusion_choice, self.dev_runs.get(dense) if dev else None,
                              self.dev_runs.get("BM25") if dev else None, self.data, dev, self.wd, self.eval)
        splits = [(self.eval_split, self.eval_runs, "")] + ([(dev, self.dev_runs, "-dev")] if dev else [])
        for split, runs, suffix in splits:
            fused = self.log.run(label, f"fuse{suffix}", fused_run, runs[dense], runs["BM25"], choice, self.wd,
                                 self.eval.top_k, self.eval.ignore_identical_ids)
            ref = self.log.run(label, f"evaluate{suffix}", evaluate, fused, self.data, split, self.wd, self.eval)
            self._record_evaluation(label, split, ref)
        self.models[label] = self.models[dense] | {"fusion": choice}
        print(f"hybrid: {dense} fused with BM25 by {read_fusion(choice).label()}"
              + (f" (chosen on the {dev} split)" if dev else " (no dev split to choose on)"))
        return label

    def best_pooled(self) -> str | None:
        """Under `selection: cv`, the dense model with the best dev nDCG@10 pooled over the dev folds (None
        otherwise)."""
        if not self.folds:
            return None
        dense = {label: self.dev[label] for label, model in self.models.items()
                 if label != "BM25" and label in self.dev and "fusion" not in model}
        return pooled_best(pooled_dev(dense, self.folds), list(dense))

    def _record_evaluation(self, label: str, split: str, ref: ArtifactRef) -> None:
        if split == self.eval_split:
            self.evaluations.append((label, ref))
        if split == self.dev_split:
            self.dev[label] = ref

    def report(self) -> tuple[ArtifactRef, dict]:
        """The results table (its stage and its content, the stages' warnings first). With `dev`, the run's result is
        chosen on the dev split among the trained models and the one the training started from."""
        dataset = self.c.data.dataset
        if self.with_dev:
            candidates = [label for label in self.models if label != "BM25"]
            ref = run_task(report, self.evaluations, self.log.timings, self.eval_split, dataset, self.wd, self.dev,
                           self.dev_split, candidates, self.started_from, getattr(self.c, "selection", "best"),
                           self.folds)
        else:
            ref = run_task(report, self.evaluations, self.log.timings, self.eval_split, dataset, self.wd)
        result = read_report(ref)
        result["warnings"] = self.stage_warnings() + result["warnings"]
        return ref, result

    def negatives(self) -> dict[str, dict]:
        """The negatives statistics per trained model (analysis and mining fallback counts)."""
        return {label: read_stats(ref) for label, ref in self.stats.items()}

    def stage_warnings(self) -> list[str]:
        """What the stages of this run warned about (each once), from their manifests: reused stages included."""
        folders = [t.ref.path for t in self.log.timings] + [ref.path for ref in self.stats.values()]
        return list(dict.fromkeys(w for folder in folders for w in stage_warnings(folder)))

    def track(self, result: dict, plots_dir: Path, selected: tuple[str, ArtifactRef] | None = None,
              async_refresh: dict | None = None, extra_plots: Iterable[Path] = (), retrieval: Path | None = None,
              end: bool = True) -> dict:
        """Log the rest of the run to MLflow (tracking.run.PipelineTracking.finish); never fails the run. The run's
        warnings are the stages' and the report's, and those said outside any stage's build (`loose`)."""
        result["warnings"] = list(dict.fromkeys(result["warnings"] + self.loose))
        return self.tracking.finish_safely(result, self.log.timings, self.evaluations, self.data.path, self.stats,
                                           async_refresh, extra_plots=extra_plots, plots_dir=plots_dir,
                                           selected=selected, dev=self.dev, dev_setting=self.dev_setting,
                                           retrieval=retrieval, end=end)

    def retrieval_package(self, label: str) -> Path | None:
        """The retrieval package of a hybrid row's dense model (its corpus encoding, the BM25 index, the fusion:
        ance_core/export/hybrid.py), a stage of its own; None (with a warning) above `MAX_PACKAGE_BYTES`."""
        model = self.models[label]
        if read_manifest(model["encode"].path)["summary"].get("document_mode") == "maxp":
            warn(f"the run's result {label} is served without a retrieval package: a MaxP model's encoding has a row "
                 "per window, which the package's search does not rank; its MLflow model encodes text only")
            return None
        index = bm25_index(self.data, self.c.bm25, self.wd)
        size = package_bytes(model["encode"].path, index)
        if size > MAX_PACKAGE_BYTES:
            warn(f"the run's result {label} is served without its retrieval package: the corpus's embeddings and BM25 "
                 f"index take {size / 2**20:.0f} MB (more than {MAX_PACKAGE_BYTES / 2**20:.0f} MB to log with every "
                 "version); its MLflow model encodes text only")
            return None
        fusion = read_fusion(model["fusion"])
        depth = self.eval.top_k
        shallower = {"bm25_depth": self.c.bm25.top_k} if self.c.bm25.top_k < depth else {}  # (served that deep)
        ref = run_stage(self.wd, "serving", {"bm25": self.c.bm25.scoring(), "fusion": fusion.as_dict(), "depth": depth}
                        | shallower,
                        {"encode": model["encode"].digest, "data": self.data.digest},
                        lambda out: write_package(out, model["encode"].path, index, self.c.bm25, fusion, depth))
        return Path(ref.path)

    def conclude(self, tracked: dict, result: dict, selected: str | None = None) -> None:
        """Print the run's closing lines (warnings, result, MLflow) and put them, with the results table, on the flow
        run's MLflow link."""
        closing = closing_lines(tracked, selected, result["warnings"], on_dev=result.get("selected") is not None,
                                best=result.get("best_on_dev"), selection=result.get("selection"))
        # a trial's lines (a search's trial, a cv run's other fold) named as its, not to be read as the run's own
        print("\n".join(closing if self.trial is None else (f"[{self.trial.name}] {line}" for line in closing)))
        if self.trial is None:
            link_mlflow_run(self.tracking, result["markdown"], closing, key=self.artifact_key("mlflow-run"))
            publish_tables(result["results"], self.log.timings, self.started_from, self.artifact_key)

    def artifact_key(self, kind: str) -> str:
        """A Prefect artifact key of this flow and collection (`ance-train-scifact-results`): the Artifacts page keeps
        each one's history apart from other flows' and collections'."""
        return artifact_key(self.experiment, self.c.data.collection, kind)
