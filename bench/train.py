"""Training speed: optimizer steps per second of the training loop (ance_core.training.loop) with the model's attention
dropout and without it (`attention_dropout: 0`), or with `--kind hidden` its hidden-state dropout and without it
(`hidden_dropout: 0`; the attention dropout at the config's), at 128 and 256 passage tokens.

The demo's warm-up setting (all-MiniLM-L6-v2, SciFact BM25 negatives, 16 queries x (1 positive + 1 negative) per
step, in-batch negatives, bf16 autocast), --steps steps per run, in the order A B B A (A: dropout as the model has it,
B: none) per passage length after an untimed 2-step warm-up; prints seconds per step and the ratio A / B.
    python bench/train.py [--kind attention|hidden] [--steps 12] [--lengths 128 256] [--config FILE]
(FILE: a pipeline config: data, model)
"""

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from ance_core.artifacts import NEGATIVES
from ance_core.data.dataset import read_tables
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import load_config
from ance_core.training.loop import train
from tasks.bm25 import bm25_run
from tasks.data import prepare_data
from tasks.mine import mine_negatives
from tasks.model import init_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--kind", choices=["attention", "hidden"], default="attention", help="which dropout")
    parser.add_argument("--config", type=Path, help="a pipeline config instead of the demo's (data, model, warmup)")
    args = parser.parse_args()
    c = load_config(args.config) if args.config else PipelineConfig()
    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    wd, split = str(root / "work"), c.data.train_split
    data = prepare_data.fn(c.data, wd)
    checkpoint = init_checkpoint.fn(c.model, wd)
    candidates = bm25_run.fn(data, c.bm25, split, c.bm25_negatives.depth, wd)
    mined = mine_negatives.fn({"bm25": candidates}, data, split, c.bm25_negatives, 0, wd)
    pairs = pd.read_parquet(Path(mined.path, NEGATIVES))
    tables = read_tables(data.path)
    relevant = tables.relevant(split)

    def seconds_per_step(length: int, dropout: float | None, steps: int, k: int) -> float:
        cfg = c.warmup.model_copy(update={"max_steps": steps, "checkpoint_every": 0, "checkpoint_seconds": 0,
                                          "passage_max_length": length, f"{args.kind}_dropout": dropout})
        started = time.perf_counter()
        train(checkpoint.path, pairs, tables.corpus, tables.queries, relevant, cfg, root / f"run-{k}")
        return (time.perf_counter() - started) / steps

    seconds_per_step(args.lengths[0], None, 2, 0)  # warm-up: imports, allocator, thread pools
    print(f"{args.steps} steps per run, order A B B A per length; seconds per step (including the model's load)")
    for length in args.lengths:
        runs = {"model's": [], "none": []}
        for k, mode in enumerate(["model's", "none", "none", "model's"]):
            runs[mode].append(seconds_per_step(length, None if mode == "model's" else 0.0, args.steps,
                                               100 * length + k))
        a, b = (sum(v) / len(v) for v in runs.values())
        print(f"  {length} tokens: {args.kind} dropout as the model has it {a:.3f} s/step, none {b:.3f} s/step, "
              f"ratio {a / b:.2f}x", flush=True)


if __name__ == "__main__":
    main()
