from pathlib import Path

import pandas as pd

from ance_core.artifacts import RUN, ArtifactRef, run_stage
from ance_core.data.dataset import read_tables
from ance_core.retrieval.config import EvalConfig
from ance_core.retrieval.evaluate import identical_ids_rule, write_evaluation
from tasks.common import stage_task


@stage_task("evaluate")
def evaluate(run: ArtifactRef, data: ArtifactRef, split: str, work_dir: str, cfg: EvalConfig = EvalConfig()
             ) -> ArtifactRef:
    """nDCG@10, MRR@10, R@100, R@1000 of a run on a split (hits whose document is the query dropped first, unless
    `cfg.ignore_identical_ids` is off); per-query values and the TREC file are kept. A BM25 run is scored on its
    matches: the rows of score 0 that fill a query's run to its depth match no query term (BEIR's BM25 returns no
    such rows; scored, they were arbitrary documents that could be relevant, in R@1000 most)."""

    def build(out):
        qrels = read_tables(data.path, corpus_columns=[]).split_qrels(split)  # no passage is read
        ranked = pd.read_parquet(Path(run.path, RUN))
        if Path(run.path).parent.name == "bm25":  # (the bm25 stage's folder)
            ranked = ranked[ranked["score"] > 0]
        return write_evaluation(ranked, qrels, out, tag=run.digest, ignore_identical_ids=cfg.ignore_identical_ids,
                                relevant_grade=cfg.relevant_grade)

    return run_stage(work_dir, "evaluate", evaluate_key(split, cfg), {"run": run.digest, "data": data.digest}, build)


def evaluation_for(cfg: EvalConfig, data: ArtifactRef) -> EvalConfig:
    """The evaluation config as it applies to the data stage's collection (`identical_ids_rule`: identical ids kept
    where its qrels judge a query's own id relevant); its qrels alone are read."""
    return identical_ids_rule(cfg, read_tables(data.path, corpus_columns=[]).qrels)


def evaluate_key(split: str, cfg: EvalConfig) -> dict:
    """The evaluate stage's config: identical ids dropped (the default) is a new key; kept, the key from before; a
    relevant grade other than 1 a key of its own."""
    return ({"split": split} | ({"ignore_identical_ids": True} if cfg.ignore_identical_ids else {})
            | ({"relevant_grade": cfg.relevant_grade} if cfg.relevant_grade != 1 else {}))
