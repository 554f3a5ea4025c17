"""Query-side-only training (issue 40, RESULTS.md): the pretrained model's document encodings stay fixed and only the
query encoder trains, its negatives retrieved at every step by the current query encoder from that fixed index (as
ADORE does: Zhan et al., SIGIR 2021). The lever for collections of a dozen training queries, where training the
whole model moves a strong pretrained one away from what it knew. Not in the pipeline: this measures it first.

Settings fixed before any figure was read: the `demo` recipe's (lr 4e-5, batches of 16 pairs, 3 epochs: the
warm-up's 1 and the round's 2, one SimANS negative per pair from the top 100 at a 0.5, b 0, in-batch negatives with
labelled positives masked, AdamW with weight decay 0.01, 10% warm-up, clipping at 2.0, no hidden-state dropout).
Dev chooses between the pretrained model and the trained query encoder, as the pipeline's `best` rule; the test
split's figures go to `--out` and are printed only with `--show-test`.

    python bench/recipes.py --datasets ../collections/med --recipe demo --dev-fraction 0.3 --work w  # its stages
    python bench/query_side.py --work w/med/work --seed 42 --out med-42.json

`--work` is a run's work folder (`work_dir`) holding one data stage and one pretrained model (`ance run` on a
collection builds both).
"""

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ance_core.data.dataset import read_tables
from ance_core.data.splits import with_training_grades
from ance_core.modeling.model import load_checkpoint
from ance_core.negatives.samplers import simans_probabilities
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_documents, encode_queries
from ance_core.retrieval.evaluate import evaluate_run
from ance_core.training.optim import linear_schedule, make_optimizer


def only_folder(root: Path) -> Path:
    folders = [p for p in root.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise SystemExit(f"{root}: expected one stage folder, found {len(folders)} (a work folder of one collection)")
    return folders[0]


def search(q: np.ndarray, d: np.ndarray, ids: list[str], qids: list[str], depth: int = 1000) -> pd.DataFrame:
    scores = q @ d.T
    k = min(depth, d.shape[0])
    top = np.argsort(-scores, axis=1)[:, :k]
    rows = [(qid, ids[j], float(scores[i, j])) for i, qid in enumerate(qids) for j in top[i]]
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])


def ndcg(model, tok, meta, queries: pd.DataFrame, qrels: pd.DataFrame, docs: np.ndarray, ids: list[str]) -> float:
    model.eval()
    with torch.no_grad():
        q = encode_queries(model, tok, queries["text"].tolist(), meta, EncodeConfig())
    metrics, _ = evaluate_run(search(q, docs, ids, queries["query_id"].astype(str).tolist()), qrels)
    return metrics["ndcg_at_10"]


def simans_negatives(scores: np.ndarray, chunk: list[tuple[str, str]], doc_row: dict[str, int],
                     relevant: dict[str, set[str]], rng: np.random.Generator) -> list[int]:
    """One negative per (query, positive) pair: SimANS over the query's top 100 of the fixed index (its current
    encoding's scores), its labelled positives left out."""
    negatives = []
    for i, (q, d) in enumerate(chunk):
        row = scores[i].copy()
        row[[doc_row[x] for x in relevant.get(q, ()) if x in doc_row]] = -np.inf
        top = np.argsort(-row)[:100]
        top = top[np.isfinite(row[top])]
        negatives.append(int(rng.choice(top, p=simans_probabilities(row[top], scores[i, doc_row[d]], 0.5, 0.0))))
    return negatives


def in_batch_mask(chunk: list[tuple[str, str]], columns: list[int], doc_row: dict[str, int],
                  relevant: dict[str, set[str]]) -> torch.Tensor:
    """(B, 2B) True where a column is a labelled positive of the row's query other than its own (never a negative)."""
    mask = torch.zeros(len(chunk), len(columns), dtype=torch.bool)
    for i, (q, _) in enumerate(chunk):
        rel = {doc_row[x] for x in relevant.get(q, ()) if x in doc_row}
        for j, c in enumerate(columns):
            mask[i, j] = j != 2 * i and c in rel
    return mask


def train(model, tok, meta, data, docs: np.ndarray, ids: list[str], epochs: int, lr: float, seed: int,
          dev: Callable[[], float]) -> tuple[int, int, list[dict]]:
    """The query encoder trained in place against the fixed `docs`: (pairs, steps, each epoch's loss and dev score)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    doc_row = {d: i for i, d in enumerate(ids)}
    docs_t = torch.from_numpy(docs).float()
    positives, relevant = data.positives("train"), data.relevant("train")
    text = dict(zip(data.queries["query_id"].astype(str), data.queries["text"], strict=True))
    pairs = [(q, d) for q in sorted(positives) for d in sorted(positives[q]) if d in doc_row]
    if not pairs:
        raise SystemExit("no (query, positive) pair of the train split to train on")
    batch = 16
    total = (len(pairs) + batch - 1) // batch * epochs
    optimizer = make_optimizer(model, "adamw", lr, 0.01)
    scheduler = linear_schedule(optimizer, int(0.1 * total), total)
    history, step = [], 0
    for epoch in range(epochs):
        model.train()
        order = rng.permutation(len(pairs))
        for start in range(0, len(pairs), batch):
            chunk = [pairs[i] for i in order[start:start + batch]]
            enc = tok(meta.queries([text[q] for q, _ in chunk]), max_length=meta.query_max_length, truncation=True,
                      padding=True, return_tensors="pt")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                qv = model(enc["input_ids"], enc["attention_mask"]).float()  # (B, h)
            negatives = simans_negatives((qv.detach() @ docs_t.T).numpy(), chunk, doc_row, relevant, rng)
            columns = [x for pair in zip([doc_row[d] for _, d in chunk], negatives, strict=True) for x in pair]
            logits = (qv @ docs_t[columns].T).masked_fill(in_batch_mask(chunk, columns, doc_row, relevant),
                                                         float("-inf"))  # (B, 2B): each query's positive, negative
            loss = F.cross_entropy(logits, torch.arange(len(chunk)) * 2)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            optimizer.step()
            scheduler.step()
            step += 1
        history.append({"epoch": epoch + 1, "step": step, "loss": loss.item(), "dev": dev()})
        print(f"epoch {epoch + 1}: step {step}/{total} loss {loss.item():.4f} dev nDCG@10 {history[-1]['dev']:.4f}",
              flush=True)
    return len(pairs), total, history


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a run's work folder (one data stage, one model)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True, help="the figures, as JSON")
    ap.add_argument("--show-test", action="store_true", help="print the test split's figures")
    args = ap.parse_args()
    t0 = time.time()
    data = with_training_grades(read_tables(only_folder(args.work / "data")), "train", "auto")
    model, tok, meta = load_checkpoint(only_folder(args.work / "model"), hidden_dropout=0.0)
    if meta.document_mode != "firstp" or model.projector is not None:  # (one row per document, no projection)
        raise SystemExit("a FirstP model without compression only (model.document_mode firstp)")
    model.eval()
    with torch.no_grad():
        docs, ids, _ = encode_documents(model, tok, meta, data.corpus, EncodeConfig())
    score = {split: partial(ndcg, model, tok, meta, data.split_queries(split), data.split_qrels(split), docs, ids)
             for split in ("dev", "test")}
    zero_shot = {split: run() for split, run in score.items()}
    print(f"zero-shot dev nDCG@10 {zero_shot['dev']:.4f}", flush=True)
    pairs, steps, history = train(model, tok, meta, data, docs, ids, args.epochs, args.lr, args.seed, score["dev"])
    trained = {split: run() for split, run in score.items()}
    chosen = "query-side" if trained["dev"] > zero_shot["dev"] else "zero-shot"
    result = {"seed": args.seed, "pairs": pairs, "steps": steps, "dev_queries": len(data.split_queries("dev")),
              "zero_shot": zero_shot, "query_side": trained, "chosen_on_dev": chosen,
              "delivered_test": (trained if chosen == "query-side" else zero_shot)["test"], "history": history,
              "seconds": round(time.time() - t0, 1)}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"dev: zero-shot {zero_shot['dev']:.4f} query-side {trained['dev']:.4f} -> {chosen}; {result['seconds']} s")
    if args.show_test:
        print(f"test: zero-shot {zero_shot['test']:.4f} query-side {trained['test']:.4f} "
              f"delivered {result['delivered_test']:.4f}")


if __name__ == "__main__":
    main()
