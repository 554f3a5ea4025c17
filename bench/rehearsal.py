"""A paper-shaped rehearsal (issue 28): the real pipeline flow (`ance run`) on a synthetic collection of MS MARCO's
shape, with the tests' tiny model, at each corpus size given: data, BM25, zero-shot, the BM25 warm-up, two sync ANCE
rounds (encode, index, retrieve, mine, train), then the same rounds as one async run (the warm-up reused). Per stage:
wall time, peak RSS and disk written; the work folder at the end, after `ance gc` with the retention policy, against
the policy's bound.

    python bench/rehearsal.py --passages 100000 2000000 [--queries 500000] [--warmup-steps 300] [--round-steps 100]

The collection: passages of log-normal length (mean ≈ 60 words, median ≈ 54, 1 in 2,000 of 300-2,000 words: MS
MARCO's long tail), words drawn Zipf-like from a 30,000-word vocabulary whose 33 most frequent are BM25's English
stop words (as in English text: BM25 drops them and scores the posting lists of content words); `--queries` training
queries with one positive each (6 of its positive's words plus 2 random ones), 200 test queries, a dev split of
`--dev-queries` carved from the training queries. The rounds mine from an exact flat index (`--index ivf`: IVF-Flat,
for millions of passages on a CPU); evaluation is exact either way. The warm-up's BM25 negatives are mined for the
queries it trains on (`bm25_negatives.queries`: warm-up steps x batch size); the ANCE rounds mine all the training
queries.

How it measures: the `ance run` process is sampled every 0.2 s from outside (/proc: VmRSS, and VmHWM, the kernel's
own peak); a stage's window is its folder's build time (manifest `seconds`, ending at the manifest's write), and its
peak RSS the highest sample in the window, or the process's peak when that rose inside it. Stages nested in another's
window (the encode shards in encode, the async inferencer's stages in train-async) share its samples. Disk: each stage
folder's files, a hard-linked file counted once, for the folder that wrote it first. Only the flow's process is
sampled (not Prefect's ephemeral server).
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path

from msmarco_shape import synthetic_msmarco  # bench/msmarco_shape.py (this script runs as bench/rehearsal.py)

from ance_core.retention import RetentionConfig, collect

ROOT = Path(__file__).resolve().parents[1]
class Sampler(threading.Thread):
    """(time, VmRSS MB, VmHWM MB) of a process every `every` seconds until it ends."""

    def __init__(self, pid: int, every: float = 0.2, log: Path | None = None):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples, self.log = pid, every, [], log  # `log`: each sample appended as it comes

    def run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            except (OSError, ValueError):
                return
            rss, hwm = (int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")) if "VmRSS" in fields \
                else (0.0, 0.0)
            if not rss:
                return  # a zombie
            self.samples.append((time.time(), rss, hwm))
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write(json.dumps(self.samples[-1]) + "\n")
            time.sleep(self.every)


def read_samples(path: Path) -> list[tuple]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []


def sampled_seconds(samples: list[tuple], gap: float = 60.0) -> float:
    """The seconds the samples cover, attempt by attempt: a pause longer than `gap` between two samples is the time
    between a stopped attempt and its resumption (the Sampler samples a live run every fraction of a second)."""
    return sum(b[0] - a[0] for a, b in pairwise(samples) if b[0] - a[0] <= gap)


def run_flow(config: dict, root: Path, label: str) -> tuple[dict, list, float, float]:
    """`ance run` on a config, sampled; (its JSON result, the samples, start time, wall seconds).

    Resumed (`--resume`: samples of a stopped attempt beside it), the flow reuses the stage folders the stopped
    attempt finished (each stage is cached in the work folder) and the samples and wall time cover both attempts."""
    path = root / f"{label}.json"
    path.write_text(json.dumps(config))
    env = os.environ | {"PREFECT_HOME": str(root / "prefect"), "TQDM_DISABLE": "1",
                        "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # the run's embedded store, whose size the summary reports
    earlier = read_samples(root / f"{label}.samples")
    started = time.time()
    with open(root / f"{label}.log", "a" if earlier else "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ance_cli", "run", "--config", str(path), "--json"],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
        sampler = Sampler(proc.pid, log=root / f"{label}.samples")  # kept on disk: a run stopped early (`--partial`)
        sampler.start()
        out, _ = proc.communicate()
    sampler.join(5)
    if proc.returncode:
        raise SystemExit(f"{label}: ance run failed (exit {proc.returncode}); log: {root / f'{label}.log'}\n"
                         f"{(root / f'{label}.log').read_text()[-3000:]}")
    (root / f"{label}.out").write_text(out)
    wall = time.time() - started + sampled_seconds(earlier)
    return json.loads(out.strip().splitlines()[-1]), earlier + sampler.samples, \
        earlier[0][0] if earlier else started, wall


def stage_rows(work: Path, samples: list, since: float, owned: dict) -> list[dict]:
    """A row per stage folder built since `since`: its window, peak RSS in it, disk it wrote first."""
    rows = []
    for manifest in sorted(work.glob("*/*/manifest.json"), key=lambda p: p.stat().st_mtime):
        end = manifest.stat().st_mtime
        m = json.loads(manifest.read_text())
        if end < since or m.get("key") != manifest.parent.name:
            continue
        begin = end - m["seconds"]
        inside = [s for s in samples if begin <= s[0] <= end]
        before = [s for s in samples if s[0] < begin]
        peak = max((s[1] for s in inside), default=0.0)
        if inside and inside[-1][2] > (before[-1][2] if before else 0):  # the process's own peak rose in the window
            peak = max(peak, inside[-1][2])
        written = 0
        for path in manifest.parent.rglob("*"):
            if path.is_file() and (st := path.stat()).st_ino not in owned:
                owned[st.st_ino] = manifest.parent
                written += st.st_size
        # what the stage added: its peak over the RSS the process held when it began (the stages share one process,
        # whose heap keeps what earlier stages used: the peak alone carries their memory)
        rise = max(0.0, peak - before[-1][1]) if before and peak else 0.0
        rows.append({"stage": m["stage"], "seconds": m["seconds"], "peak_rss_mb": peak, "rise_mb": rise,
                     "disk_mb": written / 2**20, "begin": begin})
    return rows


def disk_mb(folder: Path) -> float:
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and (st := path.stat()).st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total / 2**20


def rehearse(passages: int, args, model: Path, tmp: Path, done: list) -> dict:
    """The runs at one corpus size; each run's rows are saved (`--json`, with the sizes `done`) as soon as it ends."""
    root = tmp / f"n{passages}"
    if args.resume and (root / "result.json").is_file():  # this size had ended
        return json.loads((root / "result.json").read_text())
    began = time.time()
    if args.resume and (root / "shape.json").is_file():  # a stopped rehearsal's collection and work folder
        shape = json.loads((root / "shape.json").read_text())
    else:
        root.mkdir()
        shape = synthetic_msmarco(root / "beir", passages, args.queries, args.dev_queries)
        (root / "shape.json").write_text(json.dumps(shape | {"generate_seconds": time.time() - began}))
    generated = shape.get("generate_seconds")
    train = {"batch_size": 32, "passage_max_length": 64, "learning_rate": 1e-3}
    # the warm-up's BM25 negatives for the queries it trains on (a seeded sample of steps x batch), not all of them
    warmup_queries = args.warmup_steps * train["batch_size"]
    config = {"data": {"dataset": str(root / "beir"), "dev_fraction": shape["dev_fraction"]},
              "model": {"name": str(model), "passage_max_length": 64},
              "bm25_negatives": {"queries": warmup_queries},
              "warmup": train | {"max_steps": args.warmup_steps}, "ance": train | {"max_steps": args.round_steps},
              "mining": {"top_k": 200}, "index": {"type": args.index} | (
                  {"ivf_storage": args.ivf_storage} if args.index == "ivf" else {}),
              "encode": {"batch_size": 256, "shard_size": 250_000},
              "eval": {"top_k": 100}, "rounds": 2, "refresh": "sync", "work_dir": str(root / "work")}
    rows, owned = [], {}
    for label in args.runs:  # the refresh mode
        if (root / f"{label}.out").is_file() and args.resume:  # this run had ended: its rows from its samples
            samples = read_samples(root / f"{label}.samples")
            since, wall = samples[0][0], sampled_seconds(samples)
        else:
            _, samples, since, wall = run_flow(config | {"refresh": label}, root, label)
        for row in stage_rows(root / "work", samples, since, owned):
            rows.append(row | {"run": label, "passages": passages})
        rows.append({"run": label, "passages": passages, "stage": "(whole run)", "seconds": wall,
                     "peak_rss_mb": max((s[2] for s in samples), default=0.0), "disk_mb": None, "begin": since})
        print(f"{passages} {label}: {wall:.0f} s", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps([*done, {"rows": rows, "summary": None}], indent=1))
    work = root / "work"
    before = disk_mb(work)
    plan = collect(work, RetentionConfig(keep_runs=args.keep_runs, keep_refreshes=args.keep_refreshes))  # ance gc
    encodes = [p for p in (work / "encode").iterdir() if p.name[0] != "."]
    checkpoints = [p for p in (work / "train").iterdir() if p.name[0] != "."] + \
        [p for p in (work / "train-async").glob("*") if p.name[0] != "."]
    # the bound: the kept refreshes' float16 shards (the encode folders still there) plus the kept checkpoints
    shards = sum(disk_mb(p) for p in encodes)
    bound = shards + sum(disk_mb(p) for p in checkpoints)
    summary = {"passages": passages, "generate_seconds": generated, "mean_words": shape["mean_words"],
               "work_mb_before_gc": before, "gc_removed": len(plan.remove), "work_mb": disk_mb(work),
               "encodings_kept": len(encodes), "encodings_mb": shards,
               "checkpoints_mb": bound - shards,
               # the MLflow store: its SQLite file and artifact folder (each evaluation's TREC run is most of it)
               "mlflow_mb": disk_mb(work / "mlartifacts") + (
                   (work / "mlflow.db").stat().st_size / 2**20 if (work / "mlflow.db").is_file() else 0.0),
               "other_mb": {d.name: disk_mb(d) for d in sorted(work.iterdir()) if d.is_dir() and d.name not in
                            ("encode", "encode-shard", "index", "train", "train-async", "mlartifacts")}}
    if not args.keep:
        shutil.rmtree(root)
    else:  # the collection stays with the work folder (a run can be resumed or repeated on it)
        (root / "result.json").write_text(json.dumps({"rows": rows, "summary": summary}))
    return {"rows": rows, "summary": summary}


def partial(root: Path) -> None:
    """The rows of a rehearsal stopped before it ended (`--partial <tmp>/n<passages>`): the stage folders built so far
    with the samples written beside them, printed as the full report prints them."""
    rows, owned = [], {}
    for label in ("sync", "async"):
        if not (root / f"{label}.samples").is_file():
            continue
        samples = read_samples(root / f"{label}.samples")
        for row in stage_rows(root / "work", samples, samples[0][0], owned):
            rows.append(row | {"run": label, "passages": int(root.name[1:])})
    _print_rows([{"rows": rows}])


def train_alone(root: Path, steps: int) -> None:
    """`--train-alone <tmp>/n<passages>`: the first ANCE round's training (the sync run's round 1: its checkpoint,
    mined table and data folder from the work folder) again, `steps` steps into a scratch folder, in a fresh process
    that ran no other stage: its peak RSS (VmHWM) and its rise over the process after its imports. In the flow the
    stage shares one process with every stage before it, whose heap it inherits (the rows' peaks carry that)."""
    work = root / "work"
    for manifest in sorted((work / "train").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime):
        m = json.loads(manifest.read_text())
        # the round starts from the best model so far on dev: the warm-up (a train folder) or the pretrained model
        starts = [work / stage / m["inputs"]["checkpoint"] for stage in ("train", "model")]
        start = next((folder for folder in starts if folder.is_dir()), starts[0])
        folders = {"checkpoint": start, "negatives": work / "mine" / m["inputs"]["negatives"],
                   "data": work / "data" / m["inputs"]["data"]}
        if m["config"].get("round") == 1 and all(f.is_dir() for f in folders.values()):
            break
    else:
        raise SystemExit(f"{root}: no round-1 training whose checkpoint, negatives and data folders are all kept")
    spec = {k: str(v) for k, v in folders.items()} | {
        "train": json.loads((root / "sync.json").read_text())["ance"] | {"max_steps": steps}}
    with tempfile.TemporaryDirectory(dir=root) as out:
        proc = subprocess.run([sys.executable, __file__, "--train-stage", json.dumps(spec | {"out": out})],
                              capture_output=True, text=True, env=os.environ | {"TQDM_DISABLE": "1"}, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"the training failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{root.name[1:]} passages: round-1 training alone, {r['pairs']} pairs, {steps} steps: "
          f"{r['seconds']:.0f} s, peak RSS {r['peak_mb']:.0f} MB, after imports {r['imports_mb']:.0f} MB, "
          f"rise {r['peak_mb'] - r['imports_mb']:.0f} MB")


def _train_stage(spec: dict) -> None:
    """The child of `train_alone`: the train task's body (tasks/train.py `train_round`) on the spec's folders."""
    from ance_core.artifacts import NEGATIVES
    from ance_core.data.corpus import ParquetCorpus
    from ance_core.data.dataset import read_tables
    from ance_core.negatives.mining import read_training_pairs
    from ance_core.training.config import TrainConfig
    from ance_core.training.loop import train

    def status(field: str) -> float:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
        return int(line.split()[1]) / 1024

    imports, started = status("VmRSS"), time.time()
    tables = read_tables(spec["data"], corpus_columns=[])
    pairs = read_training_pairs(Path(spec["negatives"], NEGATIVES))
    train(spec["checkpoint"], pairs, ParquetCorpus.of_folder(spec["data"]), tables.split_queries("train"),
          tables.relevant("train"), TrainConfig(**spec["train"]), Path(spec["out"]), round_=1)
    print(json.dumps({"pairs": len(pairs), "seconds": time.time() - started, "imports_mb": imports,
                      "peak_mb": status("VmHWM")}))


def _print_rows(results: list[dict]) -> None:
    print(f"{'passages':>9} {'run':6} {'stage':16} {'built':>5} {'seconds':>8} {'peak RSS MB':>12} {'rise MB':>8} "
          f"{'disk MB':>9}")
    for result in results:
        for (passages, run, stage), r in aggregate(result["rows"]).items():
            disk = "" if r["disk_mb"] is None else f"{r['disk_mb']:9.1f}"
            peak = f"{r['peak_rss_mb']:12.0f}" if r["peak_rss_mb"] else f"{'-':>12}"  # shorter than one sample
            print(f"{passages:9d} {run:6} {stage:16} {r['count']:5d} {r['seconds']:8.1f} {peak} "
                  f"{r.get('rise_mb', 0.0):8.0f} {disk}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, nargs="+", default=[100_000, 2_000_000])
    parser.add_argument("--queries", type=int, default=500_000)
    parser.add_argument("--dev-queries", type=int, default=2_000)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--round-steps", type=int, default=100)
    parser.add_argument("--index", choices=["flat", "ivf"], default="flat",
                        help="the rounds' mining index (evaluation stays exact): ivf (nlist 4 sqrt(N), nprobe 32) "
                        "where flat search of every training query is hours on a CPU (500k x 2M)")
    parser.add_argument("--ivf-storage", choices=["auto", "flat", "sq8", "fp16"], default="auto",
                        help="--index ivf: how its lists store the vectors (index.ivf_storage; auto: the pipeline's "
                        "rule, flat at the tiny model's 32 dimensions)")
    parser.add_argument("--keep-runs", type=int, default=2)
    parser.add_argument("--keep-refreshes", type=int, default=2)
    parser.add_argument("--model", help="a model folder; default: the tests' tiny BERT, built here")
    parser.add_argument("--tmp", help="where the collections and work folders go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folders")
    parser.add_argument("--runs", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    parser.add_argument("--json", help="write every row and summary here")
    parser.add_argument("--resume", help="go on with a stopped rehearsal's folder (the one --keep printed): "
                        "each size's collection is reused, a run that ended is read back, a stopped one resumes "
                        "from its cached stage folders")
    parser.add_argument("--partial", help="print the rows of a stopped rehearsal's <tmp>/n<passages> folder (--keep)")
    parser.add_argument("--train-alone", help="run a kept <tmp>/n<passages> folder's first round of training again "
                        "in a fresh process (--train-steps steps) and print its peak RSS")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--train-stage", help=argparse.SUPPRESS)  # train-alone's child process
    args = parser.parse_args()
    if args.ivf_storage != "auto" and args.index != "ivf":
        parser.error(f"--ivf-storage {args.ivf_storage}: the lists of an IVF index (--index ivf)")
    if args.partial:
        return partial(Path(args.partial))
    if args.train_stage:
        return _train_stage(json.loads(args.train_stage))
    if args.train_alone:
        return train_alone(Path(args.train_alone), args.train_steps)
    sys.path.insert(0, str(ROOT))
    from tests.tiny import build_tiny_model

    results = []
    # (--keep: a folder of its own, left in place; printed, for --partial)
    if args.resume:
        args.keep = True
    with contextlib.nullcontext(args.resume or tempfile.mkdtemp(dir=args.tmp)) if args.keep else \
            tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        if args.keep:
            print(f"work folders under {tmp}", flush=True)
        model = Path(args.model) if args.model else tmp / "tiny-model" if (tmp / "tiny-model").is_dir() \
            else build_tiny_model(tmp / "tiny-model")
        for passages in args.passages:
            results.append(rehearse(passages, args, model, tmp, results))
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    index = f"{args.index} ({args.ivf_storage} lists)" if args.index == "ivf" else args.index
    print(f"\n{args.queries} training queries (one positive each), top-200 from a {index} index, tiny model "
          f"(32-d), warm-up "
          f"{args.warmup_steps} steps, rounds {args.round_steps} steps, {os.cpu_count()} cores")
    _print_rows(results)
    for result in results:
        s = result["summary"]
        print(f"{s['passages']} passages (mean {s['mean_words']:.1f} words): work folder "
              f"{s['work_mb_before_gc']:.0f} MB "
              f"after the runs; `ance gc --keep-runs {args.keep_runs} --keep-refreshes {args.keep_refreshes}` removed "
              f"{s['gc_removed']} stage folders: {s['work_mb']:.0f} MB = "
              f"{s['encodings_kept']} kept encodings {s['encodings_mb']:.0f} MB + checkpoints "
              f"{s['checkpoints_mb']:.0f} MB + " + ", ".join(f"{k} {v:.0f}" for k, v in s["other_mb"].items()
                                                               if v >= 0.5) +
              (f"; MLflow store {s['mlflow_mb']:.0f} MB" if "mlflow_mb" in s else ""))
    if len(results) > 1:
        small, large = (aggregate(r["rows"]) for r in (results[0], results[-1]))
        n0, n1 = results[0]["summary"]["passages"], results[-1]["summary"]["passages"]
        print(f"\npeak RSS per stage, {n1} ÷ {n0} passages:")
        for (_, run, stage), r in large.items():
            if (before := small.get((n0, run, stage))) and before["peak_rss_mb"] and r["peak_rss_mb"]:
                print(f"  {run:6} {stage:16} {r['peak_rss_mb']:8.0f} / {before['peak_rss_mb']:6.0f} MB = "
                      f"{r['peak_rss_mb'] / before['peak_rss_mb']:.2f}x")


def aggregate(rows: list[dict]) -> dict[tuple, dict]:
    """The stage folders of a (size, run, stage) together, in the order they first ran: how many were built, their
    seconds and disk summed, the highest peak RSS and rise."""
    out: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: (r["run"] == "async", r["begin"])):
        a = out.setdefault((r["passages"], r["run"], r["stage"]),
                           {"count": 0, "seconds": 0.0, "peak_rss_mb": 0.0, "rise_mb": 0.0, "disk_mb": None})
        a["count"] += 1
        a["seconds"] += r["seconds"]
        a["peak_rss_mb"] = max(a["peak_rss_mb"], r["peak_rss_mb"])
        a["rise_mb"] = max(a["rise_mb"], r.get("rise_mb") or 0.0)
        if r["disk_mb"] is not None:
            a["disk_mb"] = (a["disk_mb"] or 0.0) + r["disk_mb"]
    return out

if __name__ == "__main__":
    main()
