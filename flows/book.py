"""The bookkeeping of a pipeline run, so that the flow body stays a straight line of stages.

`ModelBook` records every model the run produces, as it goes: its checkpoint and corpus encoding, its evaluations on
the evaluation split and the dev split, the negatives it trained on, the model it started from, and the stage runs
made for it (`StageLog`). It runs a model's evaluation chain; it decides nothing (the report task selects the run's
result on the dev split).
"""

from ance_core.artifacts import ArtifactRef, read_manifest, stage_warnings
from ance_core.config import PipelineConfig
from ance_core.samplers import get_sampler
from tasks.analysis import DEPTH, analyse_negatives, read_stats
from tasks.bm25 import bm25_run
from tasks.common import StageLog, run_task
from tasks.evaluate import evaluate
from tasks.refresh import evaluate_stages
from tasks.report import report


class ModelBook:
    def __init__(self, config: PipelineConfig, data: ArtifactRef, log: StageLog):
        self.c, self.data, self.log = config, data, log
        summary = read_manifest(data.path)["summary"]
        self.eval_split = config.data.eval_split
        self.dev_split = config.data.dev_split if config.data.dev_split in summary.get("splits", []) else None
        # names the dev queries and labels a dev score was measured on (the champion compares only like with like)
        self.dev_setting = (f"{self.dev_split} {summary['split_digests'][self.dev_split]}" if self.dev_split
                            else None)
        self.evaluations: list[tuple[str, ArtifactRef]] = []  # (label, evaluation on eval_split), in run order
        self.dev: dict[str, ArtifactRef] = {}  # label -> evaluation on the dev split
        self.models: dict[str, dict[str, ArtifactRef]] = {}  # label -> checkpoint, encode, index
        self.trained_on: dict[str, ArtifactRef] = {}  # label -> the mined negatives it trained on
        self.started_from: dict[str, str] = {}  # label -> the label of the model it trained from
        self.stats: dict[str, ArtifactRef] = {}  # label -> its negatives analysis

    def bm25(self) -> None:
        """The BM25 baseline on the evaluation split (and the dev split)."""
        c, wd = self.c, self.c.work_dir
        for split in dict.fromkeys(filter(None, (self.eval_split, self.dev_split))):
            run = self.log.run("BM25", "bm25" if split == self.eval_split else "bm25-dev", bm25_run, self.data, c.bm25,
                               split, c.bm25.top_k, wd)
            ref = self.log.run("BM25", "evaluate" if split == self.eval_split else "evaluate-dev", evaluate, run,
                               self.data, split, wd)
            self._record_evaluation("BM25", split, ref)

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
        c, wd = self.c, self.c.work_dir
        built = built or {}
        refs = evaluate_stages(checkpoint, self.data, self.eval_split, c.eval.top_k, c.encode, c.index, wd,
                               built.get("index"), self.dev_split)
        self.log.record(label, refs)
        self.models[label] = {"checkpoint": checkpoint, "encode": built.get("encode") or refs["encode"],
                              "index": built.get("index") or refs["index"]}
        self._record_evaluation(label, self.eval_split, refs["evaluate"])
        if "evaluate-dev" in refs:
            self._record_evaluation(label, self.dev_split, refs["evaluate-dev"])
        if label in self.trained_on:
            depth = c.mining.depth if c.mining.spec.needs_model else DEPTH  # dense: the next mining's ranking, cached
            start = self.models.get(self.started_from[label])
            self.stats[label] = analyse_negatives(self.trained_on[label], checkpoint, self.models[label]["index"],
                                                  self.data, c.data.train_split, c.encode, c.index, wd, depth, start)

    def _record_evaluation(self, label: str, split: str, ref: ArtifactRef) -> None:
        if split == self.eval_split:
            self.evaluations.append((label, ref))
        if split == self.dev_split:
            self.dev[label] = ref

    def report(self, dataset: str) -> ArtifactRef:
        """The results table, with the run's result chosen on the dev split among the trained models and the one the
        training started from."""
        candidates = [label for label in self.models if label != "BM25"]
        return run_task(report, self.evaluations, self.log.timings, self.eval_split, dataset, self.c.work_dir,
                        self.dev, self.dev_split, candidates, self.started_from)

    def negatives(self) -> dict[str, dict]:
        """The negatives statistics per trained model (analysis and mining fallback counts)."""
        return {label: read_stats(ref) for label, ref in self.stats.items()}

    def stage_warnings(self) -> list[str]:
        """What the stages of this run warned about (each once), from their manifests: reused stages included."""
        folders = [t.ref.path for t in self.log.timings] + [ref.path for ref in self.stats.values()]
        return list(dict.fromkeys(w for folder in folders for w in stage_warnings(folder)))
