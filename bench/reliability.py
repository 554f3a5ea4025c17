"""Kill matrix and transient faults: does a run that is killed anywhere, then started again, end exactly like one that
was never interrupted?

The tiny pipeline (a random 2-layer BERT, ~200 SciFact documents, BM25 warm-up and 2 ANCE rounds of 4 steps, every
stage of the demo) runs once uninterrupted: the reference. Then, for each kill point, a fresh work folder: `ance run`
is SIGKILLed (its whole process group) at that point, and run again to completion. Kill points are `ANCE_FAULT` hang
points in every stage, including mid-training (before and after a checkpoint), mid-encoding (between shards) and
mid-index-write (the index file written, its doc ids not yet), plus kills at seeded random times. Per kill point:

  - identical: the final metrics of every model and the weights of every trained model are bit-identical to the
    reference's;
  - leftovers: `.partial-*` stage folders or half-written checkpoints left once the re-run is done;
  - rebuilt: stages that were complete when the run was killed and were built again by the re-run.

A scenario whose run was not killed (it ended before a random kill time, or never reached its hang point: a fault point
renamed or off the run's path) is named and left out of the count; a hang point never reached fails the script.

The asynchronous refresh is killed too (ASYNC_POINTS: between a snapshot's checkpoint and its publication, and after
it); its re-runs must complete without refresh errors or leftovers (bit-identity is not expected there).

Then one run with a transient failure injected into every task kind (`ANCE_FAULT=<task>,...`, each fails once):
how many recovered by Prefect's retry, and whether that run also ends bit-identical to the reference.

    python bench/reliability.py [--random-kills 4] [--seed 0] [--out DIR]
    python bench/reliability.py --smoke          # one kill point and the transient run, for the test suite
    python bench/reliability.py --async-only     # the asynchronous refresh's kills alone

Each run starts Prefect's ephemeral server of its own (`make demo`'s mode), unless `--prefect-api-url` names a server
for all of them (the test suite's).
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tiny.py: the tiny model and data

from tests.tiny import build_tiny_model, build_tiny_scifact, shared_scifact, tiny_pipeline_config  # noqa: E402

# Every stage of the pipeline, at its start or inside its work (tasks/common.py, ANCE_FAULT).
HANG_POINTS = [
    "bm25-run", "init-model", "encode-corpus@2", "build-index@1", "dense-run", "evaluate", "mine-negatives",
    "train@1", "train@3", "encode-corpus@3#2", "mine-negatives#2", "train@3#3", "negative-stats", "report",
]
# The asynchronous refresh (refresh: async, 2 rounds of 4 steps: the step-4 snapshot refreshes round 2): killed in
# the window between a snapshot step's checkpoint and its snapshot's publication, and after it. Its re-runs are not
# expected bit-identical to an uninterrupted async run (the step at which fresh negatives swap in depends on the
# inferencer's timing): each must complete, with no refresh error and nothing left half-written.
ASYNC_POINTS = ["snapshot@4", "train-async@6"]
TASK_KINDS = ["prepare-data", "bm25-run", "init-model", "encode-corpus", "build-index", "dense-run", "evaluate",
              "mine-negatives", "train", "negative-stats", "report"]


def command(folder: Path, config: dict) -> list[str]:
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return [sys.executable, "-m", "ance_cli", "run", "--config", str(path), "--json"]


PREFECT_SERVER: dict[str, str] = {}  # --prefect-api-url: {"PREFECT_API_URL": url}


def environment(folder: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ANCE_FAULT", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    return env | {"PREFECT_HOME": str(folder / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"} | (
        PREFECT_SERVER | extra)


def run(folder: Path, config: dict, **extra_env: str) -> tuple[dict, str, float]:
    started = time.perf_counter()
    proc = subprocess.run(command(folder, config), capture_output=True, text=True, env=environment(folder, **extra_env))
    if proc.returncode != 0:
        raise RuntimeError(f"ance run failed in {folder}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr, time.perf_counter() - started


def kill(folder: Path, config: dict, point: str | None, after_s: float | None) -> tuple[str, bool]:
    """Start a run and SIGKILL its process group at a hang point (or after `after_s` seconds); (what happened,
    whether it was killed there). A run that ends first, or never reaches its hang point (a fault point renamed or
    no longer on the run's path), was not killed: its re-run proves nothing."""
    signal_file = folder / "hung"
    extra = {"ANCE_FAULT": f"{point}:hang", "ANCE_FAULT_SIGNAL": str(signal_file)} if point else {}
    proc = subprocess.Popen(command(folder, config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=environment(folder, **extra), start_new_session=True)
    deadline = time.time() + (after_s if after_s is not None else 900)
    while proc.poll() is None and time.time() < deadline and not signal_file.exists():
        time.sleep(0.2)
    if proc.poll() is not None:
        return f"finished before the kill (exit {proc.returncode})", False
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if point and not signal_file.exists():
        return "never reached its hang point", False
    return ("killed at the hang point" if point else f"killed after {after_s:.1f} s"), True


def complete_stages(work: Path) -> dict[str, str]:
    """Every complete stage folder and the digest of its manifest (rewritten whenever the stage is built)."""
    return {str(m.parent): hashlib.sha256(m.read_bytes()).hexdigest()
            for m in work.glob("*/*/manifest.json") if not m.parent.name.startswith(".")}


def leftovers(work: Path) -> list[str]:
    return sorted(str(p) for p in [*work.glob("*/.partial-*"), *work.glob("train*/*/checkpoints/.tmp-*")])


def weights(work: Path) -> dict[str, str]:
    """Digest of the weights of every trained model (stage folders are named by content: comparable across runs)."""
    out = {}
    for folder in sorted(work.glob("train/*/")):
        if folder.name.startswith("."):
            continue
        h = hashlib.sha256()
        for name in ("model.safetensors", "head.safetensors"):
            h.update((folder / name).read_bytes())
        out[folder.name] = h.hexdigest()
    return out


def metrics(result: dict) -> list:
    return [{k: v for k, v in r.items()} for r in result["results"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random-kills", type=int, default=4, help="kills at seeded random times, besides the points")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="keep the work folders here (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="one kill point (mid-encoding) and the transient run, on "
                        "the warm-up alone (no ANCE round: every task kind still runs; the test suite)")
    parser.add_argument("--prefect-api-url", help="a Prefect server for every run (default: each its ephemeral one)")
    parser.add_argument("--async-only", action="store_true", help="only the asynchronous refresh's kills")
    args = parser.parse_args()
    if args.prefect_api_url:
        PREFECT_SERVER["PREFECT_API_URL"] = args.prefect_api_url
    scifact = shared_scifact()
    if scifact is None:
        sys.exit("SciFact not found: set ANCE_DATA_HOME or put it at ../shared/data/scifact")
    out = args.out or Path(tempfile.mkdtemp(prefix="ance-reliability-"))
    out.mkdir(parents=True, exist_ok=True)
    data = build_tiny_scifact(scifact, out / "data" / "scifact-tiny")
    model = build_tiny_model(out / "tiny-bert")

    def config_for(folder: Path) -> dict:  # the smoke: the warm-up alone (3 steps), where every task kind runs
        return tiny_pipeline_config(data, model, folder / "work", rounds=0 if args.smoke else 2,
                                    steps=3 if args.smoke else 4)

    if args.async_only:
        reference, ref_s, ref_weights, scenarios = None, 0.0, {}, []
    else:
        ref_dir = out / "reference"
        ref_dir.mkdir(exist_ok=True)
        reference, _, ref_s = run(ref_dir, config_for(ref_dir))
        ref_weights = weights(ref_dir / "work")
        print(f"reference run: {ref_s:.1f} s, {len(reference['stages'])} stages, {len(ref_weights)} trained models",
              flush=True)
        rng = random.Random(args.seed)
        points = ["encode-corpus@2"] if args.smoke else HANG_POINTS
        times = [] if args.smoke else sorted(rng.uniform(5.0, max(6.0, ref_s - 5.0)) for _ in range(args.random_kills))
        scenarios = [(p, None) for p in points] + [(None, t) for t in times]
    rows = []
    for k, (point, after_s) in enumerate(scenarios):
        folder = out / f"kill-{k:02d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        config = config_for(folder)
        what, killed = kill(folder, config, point, after_s)
        before = complete_stages(folder / "work")
        partial_before = len(leftovers(folder / "work"))
        result, _, seconds = run(folder, config)
        after = complete_stages(folder / "work")
        rebuilt = sorted(p for p, digest in before.items() if after.get(p) != digest)
        row = {"kill": point or f"random {after_s:.1f} s", "what": what, "killed": killed,
               "complete_before": len(before),
               "partial_before": partial_before, "rerun_s": round(seconds, 1),
               "identical_metrics": metrics(result) == metrics(reference),
               "identical_weights": weights(folder / "work") == ref_weights,
               "leftovers": leftovers(folder / "work"), "rebuilt": rebuilt}
        row["identical"] = row["identical_metrics"] and row["identical_weights"]
        rows.append(row)
        print(f"{row['kill']:<18} {what:<28} complete before {len(before):>2}, partial {partial_before}; re-run "
              f"{seconds:5.1f} s: identical {row['identical']}, leftovers {len(row['leftovers'])}, rebuilt "
              f"{len(rebuilt)}", flush=True)

    async_rows = []
    for k, point in enumerate([] if args.smoke else ASYNC_POINTS):
        folder = out / f"kill-async-{k:02d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        config = config_for(folder) | {"refresh": "async"}
        what, killed = kill(folder, config, point, None)
        result, _, seconds = run(folder, config)
        row = {"kill": f"async {point}", "what": what, "killed": killed, "rerun_s": round(seconds, 1),
               "refresh_errors": result["async_refresh"]["refresh_errors"], "leftovers": leftovers(folder / "work")}
        row["completed"] = killed and not row["refresh_errors"] and not row["leftovers"]
        async_rows.append(row)
        print(f"{row['kill']:<18} {what:<28} re-run {seconds:5.1f} s: completed {row['completed']}, refresh errors "
              f"{len(row['refresh_errors'])}, leftovers {len(row['leftovers'])}", flush=True)

    if args.async_only:
        print(json.dumps({"async": async_rows}))
        sys.exit(0 if all(r["completed"] for r in async_rows) else 1)
    folder = out / "transient"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    result, log, seconds = run(folder, config_for(folder), ANCE_FAULT=",".join(TASK_KINDS))
    injected = [kind for kind in TASK_KINDS if f"injected failure of task '{kind}'" in log]
    retried = log.count("Retry 1/2")
    transient = {"task_kinds": len(TASK_KINDS), "injected": len(injected), "recovered_by_retry": len(injected),
                 "retries": retried, "identical": metrics(result) == metrics(reference)
                 and weights(folder / "work") == ref_weights, "seconds": round(seconds, 1),
                 "not_injected": [k for k in TASK_KINDS if k not in injected]}
    print(f"transient faults: {len(injected)} of {len(TASK_KINDS)} task kinds failed once and recovered by retry "
          f"({retried} retries); the run completed in {seconds:.1f} s, identical to the reference: "
          f"{transient['identical']}")

    killed = [r for r in rows if r["killed"]]
    identical = sum(r["identical"] for r in killed)
    missed = [r["kill"] for r in rows if not r["killed"] and not r["kill"].startswith("random")]  # a stale point
    print(f"\nkill matrix: {identical}/{len(killed)} re-runs of killed runs bit-identical to the uninterrupted run, "
          f"{sum(len(r['leftovers']) for r in rows)} leftover partial folders, "
          f"{sum(len(r['rebuilt']) for r in rows)} complete stages rebuilt; not killed (left out): "
          f"{[r['kill'] for r in rows if not r['killed']] or 'none'}")
    print(json.dumps({"kills": len(killed), "identical": identical, "hang_points_missed": missed,
                      "leftovers": sum(len(r["leftovers"]) for r in rows),
                      "rebuilt": sum(len(r["rebuilt"]) for r in rows), "rows": rows, "transient": transient,
                      "async": async_rows, "reference_s": round(ref_s, 1)}))
    if identical != len(killed) or missed or not transient["identical"] or transient["not_injected"] or not all(
            r["completed"] for r in async_rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
