"""Overhead of Prefect orchestration on the demo pipeline, and the time of a fully cached re-run.

One run each, on fresh work folders, same machine, same config:
  1. `ance run` (the Prefect flow, ephemeral server, content-keyed caching) - the whole command's wall time;
  2. the same stage functions called in plain Python in the same order (`task.fn`: no Prefect at all), in a process
     of its own, so that both sides pay the interpreter's start and the imports;
  3. `ance run` again on the work folder of 1: every stage cached.
The config has no dev split and no hybrid row (`data.dev_split: null`, `hybrid: false`), by default and over
`--config`: the plain side runs the stages of such a run only (the flow's best-so-far starts, fusion and retrieval
package need a dev split). The flow's MLflow logging (embedded store) has no plain counterpart: it is counted
outside the stages, with Prefect's own work.
Prints the ratio 1/2 (goal <= 1.05) and the time of 3 (goal <= 30 s), and splits the difference between 1 and 2
into the stages' own compute (build seconds from each stage's manifest.json) and everything else (interpreter and
Prefect start-up, task bookkeeping, cache keys, result persistence).
    python bench/orchestration.py [--rounds 2] [--config FILE] [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ance_core.artifacts import read_manifest
from ance_core.data.config import DataConfig
from ance_core.negatives.samplers import train_config_for
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import load_config
from tasks.analysis import DEPTH, negatives_analysis
from tasks.bm25 import bm25_run
from tasks.data import prepare_data
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate
from tasks.index import build_index
from tasks.mine import mine_negatives
from tasks.model import init_checkpoint
from tasks.report import report
from tasks.retrieve import dense_run
from tasks.train import SchedulePlan, train_round


def plain_pipeline(c: PipelineConfig) -> list[tuple[str, float]]:
    """The synchronous pipeline of flows/ance_pipeline.py (flows/book.py) as plain function calls: the same stages,
    evaluations on the evaluation and dev splits, negatives analyses and learning-rate schedules."""
    wd, tr, ev, dev = c.work_dir, c.data.train_split, c.data.eval_split, c.data.dev_split
    evaluations, dev_evaluations, models, started_from = [], {}, {}, {}

    def evaluate_split(label, checkpoint, index, split):
        run = dense_run.fn(checkpoint, index, data, split, c.eval.top_k, c.encode, c.index, wd)
        return evaluate.fn(run, data, split, wd)

    def evaluate_model(label, checkpoint, index=None, negatives=None):
        if index is None:
            index = build_index.fn(encode_corpus.fn(checkpoint, data, c.encode, wd), wd)
        models[label] = {"checkpoint": checkpoint, "index": index}
        evaluations.append((label, evaluate_split(label, checkpoint, index, ev)))
        if has_dev:
            dev_evaluations[label] = evaluate_split(label, checkpoint, index, dev)
        if negatives is not None:
            own = dense_run.fn(checkpoint, index, data, tr, max(c.mining.depth, DEPTH), c.encode, c.index, wd)
            negatives_analysis.fn(negatives, own, data, tr, wd, models[started_from[label]])

    data = prepare_data.fn(c.data, wd)
    has_dev = dev in read_manifest(data.path)["summary"]["splits"]
    for split in [ev, dev] if has_dev else [ev]:
        run = bm25_run.fn(data, c.bm25, split, c.bm25.top_k, wd)
        (evaluations.append(("BM25", evaluate.fn(run, data, split, wd))) if split == ev else
         dev_evaluations.update({"BM25": evaluate.fn(run, data, split, wd)}))
    round_cfg = train_config_for(c.mining, c.ance)
    warm_cfg = train_config_for(c.bm25_negatives, c.warmup)
    schedules = SchedulePlan(c.schedule, [warm_cfg, *[round_cfg] * c.rounds])
    checkpoint = init_checkpoint.fn(c.model, wd)
    evaluate_model("zero-shot", checkpoint)
    candidates = bm25_run.fn(data, c.bm25, tr, c.bm25_negatives.depth, wd)
    negatives = mine_negatives.fn({"bm25": candidates}, data, tr, c.bm25_negatives, 0, wd, train=warm_cfg)
    checkpoint = train_round.fn(checkpoint, negatives, data, tr, warm_cfg, wd, schedules.next(negatives))
    label, started_from["warmup"] = "warmup", "zero-shot"
    for k in range(1, c.rounds + 1):
        index = build_index.fn(encode_corpus.fn(checkpoint, data, c.encode, wd), wd)
        run = dense_run.fn(checkpoint, index, data, tr, c.mining.depth, c.encode, c.index, wd)
        round_negatives = mine_negatives.fn({"dense": run}, data, tr, c.mining, k, wd, train=round_cfg)
        evaluate_model(label, checkpoint, index, negatives)
        negatives, started_from[f"ANCE round {k}"] = round_negatives, label
        label = f"ANCE round {k}"
        checkpoint = train_round.fn(checkpoint, negatives, data, tr, round_cfg, wd, schedules.next(negatives), k)
    evaluate_model(label, checkpoint, negatives=negatives)
    report.fn(evaluations, [], ev, c.data.dataset, wd, dev_evaluations, dev if has_dev else None,
              [m for m in models], started_from)
    return evaluations


def stage_seconds(work_dir: Path) -> dict[str, float]:
    """Build seconds per stage type, summed over the stage folders of a work dir (from their manifests)."""
    totals: dict[str, float] = {}
    for manifest in sorted(work_dir.glob("*/*/manifest.json")):
        stage = manifest.parent.parent.name
        totals[stage] = totals.get(stage, 0.0) + json.loads(manifest.read_text())["seconds"]
    return totals


def breakdown(prefect_s: float, plain_s: float, prefect_work: Path, plain_work: Path) -> dict:
    a, b = stage_seconds(prefect_work), stage_seconds(plain_work)
    print("stage compute (s)      Prefect    plain")
    for stage in sorted(set(a) | set(b)):
        print(f"  {stage:<18} {a.get(stage, 0):9.1f} {b.get(stage, 0):8.1f}")
    prefect_stages, plain_stages = sum(a.values()), sum(b.values())
    print(f"  {'all stages':<18} {prefect_stages:9.1f} {plain_stages:8.1f}")
    print(f"outside the stages: Prefect {prefect_s - prefect_stages:.1f} s, plain {plain_s - plain_stages:.1f} s")
    return {"prefect_stage_s": round(prefect_stages, 1), "plain_stage_s": round(plain_stages, 1),
            "prefect_outside_s": round(prefect_s - prefect_stages, 1),
            "plain_outside_s": round(plain_s - plain_stages, 1),
            "stages_only_in_flow": sorted(set(a) - set(b)), "stages_only_plain": sorted(set(b) - set(a))}


def timed_cli(config: PipelineConfig, folder: Path, env: dict) -> tuple[float, dict]:
    path = folder / "config.json"
    path.write_text(config.model_dump_json())
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(path), "--json"], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-4000:])
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def comparable(c: PipelineConfig, rounds: int | None) -> PipelineConfig:
    """The config both sides run: no dev split, no hybrid row (what `plain_pipeline` implements), `rounds` if given."""
    data = DataConfig.model_validate(c.data.model_dump() | {"dev_fraction": 0.0, "dev_split": None})
    return c.model_copy(update={"data": data, "hybrid": False}
                        | ({"rounds": rounds} if rounds is not None else {}))


def timed_plain(config: PipelineConfig, folder: Path, env: dict) -> float:
    """`plain_pipeline` in a process of its own (this script with --plain), timed as `timed_cli` times the flow."""
    path = folder / "plain-config.json"
    path.write_text(config.model_dump_json())
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--plain", str(path)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(proc.stdout[-2000:] + proc.stderr[-4000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="ANCE rounds (default: the --config's, else 2)")
    parser.add_argument("--config", type=Path, help="a pipeline config instead of the demo's")
    parser.add_argument("--out", type=Path, help="keep the work folders here (default: a temporary folder)")
    parser.add_argument("--plain", type=Path, help=argparse.SUPPRESS)  # (the plain side's own process)
    args = parser.parse_args()
    if args.plain:
        plain_pipeline(load_config(args.plain))
        return
    base = comparable(load_config(args.config) if args.config else PipelineConfig(),
                      args.rounds if args.rounds is not None or args.config else 2)
    out = args.out or Path(tempfile.mkdtemp(prefix="ance-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PREFECT_HOME": str(out / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the run's embedded store, as `make demo` has it

    prefect_cfg = base.model_copy(update={"work_dir": str(out / "work-prefect")})
    prefect_s, first = timed_cli(prefect_cfg, out, env)
    print(f"Prefect flow (ance run, whole command): {prefect_s:.1f} s", flush=True)

    plain_cfg = base.model_copy(update={"work_dir": str(out / "work-plain")})
    plain_s = timed_plain(plain_cfg, out, env)
    print(f"plain Python (same stage functions):    {plain_s:.1f} s", flush=True)

    cached_s, again = timed_cli(prefect_cfg, out, env)
    reused = sum(s["cached"] for s in again["stages"])
    print(f"cached re-run (ance run, whole command): {cached_s:.1f} s, {reused}/{len(again['stages'])} stages cached")
    print(f"overhead ratio Prefect / plain: {prefect_s / plain_s:.3f}")
    parts = breakdown(prefect_s, plain_s, Path(prefect_cfg.work_dir), Path(plain_cfg.work_dir))
    print(json.dumps({"prefect_s": round(prefect_s, 1), "plain_s": round(plain_s, 1),
                      "ratio": round(prefect_s / plain_s, 3), "cached_rerun_s": round(cached_s, 1),
                      "cached_stages": reused, "stages": len(again["stages"])} | parts))


if __name__ == "__main__":
    main()
