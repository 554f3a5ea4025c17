"""Overhead of live MLflow logging on training speed.

The demo's warm-up training (all-MiniLM-L6-v2, SciFact BM25 negatives, 16 queries x (1 positive + 1 negative) per
step at 128 tokens) for --steps optimizer steps, three ways, each --repeats times in the order A B C C B A ... (to
cancel drift), with the mlflow server up throughout:
  A. no tracking;
  B. live logging (LiveMetrics: every step queued, sent in batches every 5 s from a background thread) to the
     embedded SQLite store;
  C. the same to a lean `mlflow server` on 127.0.0.1 (SQLite, one worker), over HTTP.
Prints seconds per step of each and the ratios B/A and C/A (goal: ~1.00), the share of the run the sending thread
was busy, and the time `close()` waited for the last batch. Fresh output folders for every run; the shared BM25
negatives are mined once, and a 5-step training run warms up the process, before timing.
    python bench/mlflow_logging.py [--steps 40] [--repeats 3] [--config FILE]
        (FILE: a pipeline config, e.g. the tiny one)
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pandas as pd

from ance_core.data.dataset import read_tables
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import load_config
from ance_core.training.loop import train
from tasks.bm25 import bm25_run
from tasks.data import prepare_data
from tasks.mine import mine_negatives
from tasks.model import init_checkpoint
from tracking.client import Tracker
from tracking.live import PARENT_KEYS, STEP_KEYS, LiveMetrics


def start_server(store: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
         "--artifacts-destination", str(store / "mlartifacts")],
        env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(1)
    raise RuntimeError("mlflow server did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3, help="times each mode runs (order A B C C B A A B C ...)")
    parser.add_argument("--config", type=Path, help="a pipeline config instead of the demo's (data, model, warmup)")
    args = parser.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the store measured here, not one the shell names
    c = load_config(args.config) if args.config else PipelineConfig()
    root = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    wd = str(root / "work")
    data = prepare_data.fn(c.data, wd)
    checkpoint = init_checkpoint.fn(c.model, wd)
    candidates = bm25_run.fn(data, c.bm25, c.data.train_split, c.bm25_negatives.depth, wd)
    negatives = mine_negatives.fn({"bm25": candidates}, data, c.data.train_split, c.bm25_negatives, 0, wd)
    tables = read_tables(data.path)
    pairs = pd.read_parquet(f"{negatives.path}/negatives.parquet")
    cfg = c.warmup.model_copy(update={"max_steps": args.steps, "checkpoint_every": 0, "checkpoint_seconds": 0})
    server, url = start_server(root / "mlflow-server")
    trackers = {"embedded SQLite": Tracker(root / "embedded", "bench"), "mlflow server": Tracker(root, "bench", url)}
    seconds: dict[str, list[float]] = {"no tracking": [], **{k: [] for k in trackers}}
    waits: dict[str, list[float]] = {k: [] for k in trackers}
    busy: dict[str, list[float]] = {k: [] for k in trackers}
    order = ["no tracking", "embedded SQLite", "mlflow server"]
    relevant = tables.relevant(c.data.train_split)
    train(checkpoint.path, pairs, tables.corpus, tables.queries, relevant,  # warm-up
          cfg.model_copy(update={"max_steps": 5}), root / "warm-up")
    try:
        sequence = [m for r in range(args.repeats) for m in (order if r % 2 == 0 else order[::-1])]
        for k, mode in enumerate(sequence):
            callbacks, live = [], None
            if mode in trackers:
                tracker = trackers[mode]
                parent = tracker.start_run(f"parent {k}")
                child = tracker.start_run(f"train {k}", parent_id=parent)
                live = LiveMetrics(tracker, {child: STEP_KEYS, parent: PARENT_KEYS}, 0)
                callbacks = [live]
            started = time.perf_counter()
            train(checkpoint.path, pairs, tables.corpus, tables.queries, relevant, cfg,
                  root / f"train-{k}", callbacks=callbacks)
            seconds[mode].append((time.perf_counter() - started) / args.steps)
            if live is not None:
                closing = time.perf_counter()
                live.close()
                waits[mode].append(time.perf_counter() - closing)
                busy[mode].append(live.busy_s / (seconds[mode][-1] * args.steps))
                assert trackers[mode].undelivered == {}, trackers[mode].undelivered
            print(f"{mode}: {seconds[mode][-1]:.3f} s/step", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
    base = sum(seconds["no tracking"]) / len(seconds["no tracking"])
    print(f"\n{args.steps} steps per run, each mode {args.repeats} times (A B C C B A ...); mean seconds per step:")
    for mode, values in seconds.items():
        mean = sum(values) / len(values)
        extra = (f", sending thread busy {100 * max(busy[mode]):.2f}% of the run at most, close() waited "
                 f"{max(waits[mode]):.3f} s at most") if mode in waits else ""
        print(f"  {mode:16s} {mean:.3f} s/step (runs: {', '.join(f'{v:.3f}' for v in values)}) "
              f"ratio {mean / base:.3f}{extra}")


if __name__ == "__main__":
    main()
