"""Hybrid retrieval's stages (ance_core/retrieval/fusion.py): the fusion chosen on the dev split (`fusion`), and a
split's dense and BM25 runs fused by it (`fuse`), which the evaluate stage then scores like any run."""

import json
from pathlib import Path

import pandas as pd

from ance_core.artifacts import RUN, ArtifactRef, run_stage, write_json
from ance_core.data.dataset import read_tables
from ance_core.retrieval.config import EvalConfig
from ance_core.retrieval.fusion import Fusion, choose_fusion, fuse
from ance_core.retrieval.search import write_run
from tasks.common import stage_task

FUSION = "fusion.json"


def read_fusion(ref: ArtifactRef) -> Fusion:
    return Fusion.of(json.loads(Path(ref.path, FUSION).read_text())["chosen"])


@stage_task("fusion")
def fusion_choice(dense: ArtifactRef | None, bm25: ArtifactRef | None, data: ArtifactRef, split: str | None,
                  work_dir: str, cfg: EvalConfig = EvalConfig(), given: dict | None = None) -> ArtifactRef:
    """The fusion of a dense model's ranking with BM25's, chosen on their runs of the dev `split` (fusion.json: the
    chosen one and every candidate's dev nDCG@10); without a dev split (`split` None), reciprocal-rank fusion, or the
    fusion `given` (one a run chose: `ance evaluate --hybrid`)."""

    def build(out):
        if split is None:
            chosen = Fusion.of(given) if given else Fusion("rrf")
            record = {"chosen": chosen.as_dict(), "candidates": [], "split": None}
        else:
            qrels = read_tables(data.path, corpus_columns=[]).split_qrels(split)
            runs = [pd.read_parquet(Path(ref.path, RUN)) for ref in (dense, bm25)]
            chosen, scored = choose_fusion(*runs, qrels, cfg.ignore_identical_ids, cfg.top_k)
            record = {"chosen": chosen.as_dict(), "candidates": scored, "split": split}
        write_json(out / FUSION, record)
        return {"chosen": Fusion.of(record["chosen"]).label()}

    inputs = {"dense": dense.digest if dense else None, "bm25": bm25.digest if bm25 else None, "data": data.digest}
    config = {"split": split, "top_k": cfg.top_k, "ignore_identical_ids": cfg.ignore_identical_ids}
    config |= {"given": Fusion.of(given).as_dict()} if given and split is None else {}  # (unset: the keys it had)
    return run_stage(work_dir, "fusion", config, inputs, build)


@stage_task("fuse")
def fused_run(dense: ArtifactRef, bm25: ArtifactRef, fusion: ArtifactRef, work_dir: str, top_k: int = 1000,
              ignore_identical_ids: bool = True) -> ArtifactRef:
    """A split's dense and BM25 runs fused by a `fusion` stage's choice, `top_k` hits per query (run.parquet);
    `ignore_identical_ids` (`eval.ignore_identical_ids`): a query's own id left out of both runs first, as the fusion
    was chosen."""

    def build(out):
        runs = [pd.read_parquet(Path(ref.path, RUN), columns=["query_id", "doc_id", "score"]) for ref in (dense, bm25)]
        run = fuse(*runs, read_fusion(fusion), top_k, ignore_identical_ids)
        write_run(run, out / RUN)
        return {"queries": int(run["query_id"].nunique()), "depth": top_k}

    inputs = {"dense": dense.digest, "bm25": bm25.digest, "fusion": fusion.digest}
    config = {"top_k": top_k} | ({} if ignore_identical_ids else {"ignore_identical_ids": False})
    return run_stage(work_dir, "fuse", config, inputs, build)
