"""Dev evaluation inside a training stage (`dev_check`, training/config.py `DevCheckConfig`): the dev queries scored on
a fixed candidate set every few steps, the best step kept, the stage ended early once its dev score stopped rising.

`DevCheck` scores the model being trained: it encodes the candidate passages (each dev query's BM25 and starting-model
top `depth` and its relevant documents: `candidate_pairs`) and the dev queries as the evaluation does (the checkpoint's
prefixes and lengths, FirstP or MaxP), ranks each query's candidates by inner product and computes nDCG@10 as the
evaluation does (trec_eval through ir_measures; a hit whose id is the query's dropped when the evaluation drops it).

`BestStep` is the loop's side: which step is best so far and whether the stage should stop. The best step's state is
kept in `<out>/best/` (model and training state, written after the resumable checkpoint of that step, so a resumed
stage never holds a best from a step it has not reached yet); the score of every check is in the step's train_log
record (`dev_check_ndcg_at_10`), so a resumed stage rebuilds its history from the log it keeps.
"""

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ance_core.errors import AnceError
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_documents, encode_queries
from ance_core.retrieval.evaluate import evaluate_run, without_identical_ids
from ance_core.training.config import DevCheckConfig

DEV_METRIC = "dev_check_ndcg_at_10"
BEST = "best"
BEST_JSON = "dev_best.json"


def candidate_pairs(runs: list[pd.DataFrame], qrels: pd.DataFrame, depth: int) -> pd.DataFrame:
    """(query_id, doc_id) of each dev query's candidates: the top `depth` of each run (ranked by `rank`, else by
    score) and its relevant documents, once each, sorted."""
    parts = []
    for run in runs:
        order = "rank" if "rank" in run else "score"
        run = run.sort_values(["query_id", order], ascending=[True, order == "rank"], kind="stable")
        parts.append(run.groupby("query_id", sort=False).head(depth)[["query_id", "doc_id"]])
    relevant = qrels.loc[qrels["relevance"] > 0, ["query_id", "doc_id"]]
    pairs = pd.concat([*parts, relevant]).astype(str).drop_duplicates()
    return pairs[pairs["query_id"].isin(set(qrels["query_id"]))].sort_values(["query_id", "doc_id"]).reset_index(
        drop=True)


class DevCheck:
    """nDCG@10 of a model on the dev queries, over their candidate set (module docstring)."""

    def __init__(self, pairs: pd.DataFrame, queries: pd.DataFrame, qrels: pd.DataFrame, passages: pd.DataFrame,
                 encode: EncodeConfig, ignore_identical_ids: bool = True, passage_max_length: int | None = None):
        """`pairs`: (query_id, doc_id) candidates; `queries`: the dev queries (query_id, text); `qrels`: their
        judgements; `passages`: the candidates' corpus rows (doc_id, title, text); `passage_max_length`: the passage
        tokens encoded (FirstP; default the checkpoint's)."""
        self.passage_max_length = passage_max_length
        missing = set(pairs["doc_id"]) - set(passages["doc_id"].astype(str))
        if missing:
            raise AnceError(f"dev check: {len(missing)} candidate documents are not in the corpus (e.g. "
                            f"{sorted(missing)[:3]})")
        self.pairs, self.qrels, self.encode = pairs, qrels, encode
        self.ignore_identical_ids = ignore_identical_ids
        self.queries = queries[queries["query_id"].isin(set(pairs["query_id"]))].reset_index(drop=True)
        self.passages = passages.assign(doc_id=passages["doc_id"].astype(str)).drop_duplicates("doc_id")
        self.passages = self.passages[self.passages["doc_id"].isin(set(pairs["doc_id"]))].reset_index(drop=True)

    @property
    def size(self) -> dict[str, int]:
        return {"dev_check_queries": len(self.queries), "dev_check_passages": len(self.passages),
                "dev_check_pairs": len(self.pairs)}

    def score(self, model, tokenizer, meta) -> float:
        """The dev nDCG@10 of `model` (left in eval mode: the caller puts it back to training)."""
        if self.passage_max_length is not None and meta.document_mode == "firstp":
            meta = dataclasses.replace(meta, passage_max_length=self.passage_max_length)
        with torch.inference_mode():
            docs, ids, _ = encode_documents(model, tokenizer, meta, self.passages, self.encode)
            q = encode_queries(model, tokenizer, self.queries["text"].tolist(), meta, self.encode)
        # a document's score: its best row (MaxP windows; FirstP has one)
        rows = pd.DataFrame({"doc_id": ids, "row": np.arange(len(ids))})
        q_row = pd.Series(np.arange(len(self.queries)), index=self.queries["query_id"].astype(str))
        pairs = self.pairs.merge(rows, on="doc_id")
        scores = np.einsum("ij,ij->i", q[q_row.loc[pairs["query_id"]].to_numpy()], docs[pairs["row"].to_numpy()])
        run = pairs.assign(score=scores).groupby(["query_id", "doc_id"], as_index=False)["score"].max()
        run = run.sort_values(["query_id", "score"], ascending=[True, False], kind="stable")
        run["rank"] = run.groupby("query_id").cumcount() + 1
        if self.ignore_identical_ids:
            run = without_identical_ids(run)
        return evaluate_run(run, self.qrels)[0]["ndcg_at_10"]


@dataclass(frozen=True)
class StageDev:
    """What a training stage needs for its dev checks."""

    check: DevCheck
    cfg: DevCheckConfig
    start_score: float | None = None  # the starting model's dev nDCG@10 (its evaluation); None: a check at step 0


@dataclass
class BestStep:
    """The best check of a stage so far, and the checks since it (module docstring)."""

    step: int
    score: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, score) of every check, in order

    @classmethod
    def resume(cls, out: Path, records: list[dict], start_score: float) -> "BestStep":
        """From the stage folder and its kept train_log records (a fresh stage: none, the start is step 0)."""
        history = [(r["step"], r[DEV_METRIC]) for r in records if DEV_METRIC in r]
        partial, old = out / f".{BEST}-partial", out / f".{BEST}-old"
        if not (out / BEST).exists():  # stopped between save's two renames: the newer best if it was whole
            if (partial / BEST_JSON).is_file():
                os.replace(partial, out / BEST)
            elif old.exists():
                os.replace(old, out / BEST)
        for left in (partial, old):  # what a stop mid-save left beside the best (a later save renames onto them)
            shutil.rmtree(left, ignore_errors=True)
        saved = out / BEST / BEST_JSON
        if saved.is_file():
            best = json.loads(saved.read_text())
            return cls(best["step"], best["score"], history)
        return cls(0, start_score, history)

    def checked(self, step: int, score: float) -> bool:
        """Record a check; True when it is the new best (a tie keeps the earlier step: fewer updates, same score)."""
        self.history.append((step, score))
        if score > self.score:
            self.step, self.score = step, score
            return True
        return False

    def resumed_past(self, step: int) -> bool:
        """Resumed at `step`, whose logged check beat the saved best: a stop while that best was being saved (its
        checkpoint is written first). The check becomes the best; the caller saves it from the resumed state."""
        score = next((s for k, s in reversed(self.history) if k == step), None)
        if score is None or not score > self.score:
            return False
        self.step, self.score = step, score
        return True

    def since_best(self) -> int:
        return sum(1 for step, _ in self.history if step > self.step)

    def save(self, out: Path, write_state) -> None:
        """`write_state(folder)` writes the training state of this step; it replaces `<out>/best` whole."""
        partial = out / f".{BEST}-partial"
        shutil.rmtree(partial, ignore_errors=True)
        write_state(partial)
        (partial / BEST_JSON).write_text(json.dumps({"step": self.step, "score": self.score}))
        old = out / f".{BEST}-old"
        shutil.rmtree(old, ignore_errors=True)  # (a stop after the last save's renames left it: renaming onto it fails)
        if (out / BEST).exists():
            os.replace(out / BEST, old)
        os.replace(partial, out / BEST)
        shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def clear(out: Path) -> None:
        for name in (BEST, f".{BEST}-partial", f".{BEST}-old"):
            shutil.rmtree(out / name, ignore_errors=True)

    def restore(self, out: Path) -> None:
        """Make the stage's result (its files in `out`) the best step's state: copies of `<out>/best`'s files, which
        stay until the caller drops them."""
        for path in (out / BEST).iterdir():  # the checkpoint's files and its training state (`write_state`'s)
            if path.is_file() and path.name != BEST_JSON:
                shutil.copyfile(path, out / f".{path.name}.restoring")
                os.replace(out / f".{path.name}.restoring", out / path.name)

    def summary(self) -> dict:
        return {"best_step": self.step, "best_dev_ndcg_at_10": round(self.score, 6), "dev_checks": len(self.history)}
