"""Tiny offline inputs, shared by the test fixtures (tests/conftest.py) and the bench scripts' smoke runs: a random
2-layer BERT with a WordPiece vocabulary trained here, and a ~200-document SciFact subset in BEIR layout."""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def shared_scifact() -> Path | None:
    for root in (os.environ.get("ANCE_DATA_HOME"), REPO.parent / "shared" / "data"):
        if root and (Path(root) / "scifact" / "corpus.jsonl").is_file():
            return Path(root) / "scifact"
    return None


def write_beir(folder: Path, corpus: list[dict], queries: list[dict], qrels: dict[str, list[tuple]]) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in rows)]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def build_tiny_scifact(scifact: Path, folder: Path) -> Path:
    """~200 SciFact documents: the positives of 40 train and 30 test queries, filled up with random others."""
    rng = random.Random(0)
    corpus = [json.loads(x) for x in (scifact / "corpus.jsonl").read_text().splitlines() if x.strip()]
    queries = {q["_id"]: q for q in map(json.loads, (scifact / "queries.jsonl").read_text().splitlines())}
    qrels = {}
    for split, n in (("train", 40), ("test", 30)):
        rows = [ln.split("\t") for ln in (scifact / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]]
        chosen = sorted({r[0] for r in rows})[:n]
        qrels[split] = [(q, d, s) for q, d, s in rows if q in chosen]
    needed = {d for rows in qrels.values() for _, d, _ in rows}
    others = [d for d in corpus if d["_id"] not in needed]
    docs = [d for d in corpus if d["_id"] in needed] + rng.sample(others, 200 - len(needed))
    used_queries = [queries[q] for q in sorted({q for rows in qrels.values() for q, _, _ in rows})]
    return write_beir(folder, docs, used_queries, qrels)


def build_tiny_model(folder: Path) -> Path:
    """A 2-layer, 32-dim random BERT with a WordPiece vocabulary trained here (on SciFact text when present, so
    real passages do not collapse to [UNK])."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    text_file = folder / "train.txt"
    words = ("cell protein gene cancer patients study risk effect mice treatment increase expression "
             "blood disease clinical results human response level activity associated reduced").split()
    rng = random.Random(0)
    lines = [" ".join(rng.choices(words, k=12)) for _ in range(400)]
    if (scifact := shared_scifact()) is not None:
        docs = (scifact / "corpus.jsonl").read_text().splitlines()[:3000]
        lines += [json.loads(d)["title"] + " " + json.loads(d)["text"] for d in docs]
        lines += [json.loads(q)["text"] for q in (scifact / "queries.jsonl").read_text().splitlines()]
    text_file.write_text("\n".join(lines))
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train([str(text_file)], vocab_size=4000, min_frequency=2, show_progress=False)
    text_file.unlink()
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece._tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    assert tokenizer.vocab_size > 100
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_cross_encoder(tiny_model: Path, folder: Path) -> Path:
    """A cross-encoder of the tiny model's shape: a BERT sequence classifier with one output (random weights), with
    the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    config = BertConfig.from_pretrained(tiny_model, num_labels=1)
    torch.manual_seed(3)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(folder)
    return folder


def run_pipeline_cli(config: dict, folder: Path, timeout: int = 600) -> tuple[dict, str]:
    """`ance run --config <config> --json` in a subprocess with its own PREFECT_HOME under `folder`; it must succeed.
    Returns the JSON result (its last line) and the whole standard output."""
    (folder / "c.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(folder / "c.json"), "--json"],
                          capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"PREFECT_HOME": str(folder / "prefect")})
    assert proc.returncode == 0, failure_report(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def failure_report(proc: subprocess.CompletedProcess) -> str:
    """A failed command's output for an assertion: every line that says what went wrong (an error, a traceback's last
    line, a C++ abort; in a long output the root cause is often far above its tail), then the tails."""
    cause = re.compile(r"error|exception|terminate|abort|fatal|killed|signal|traceback", re.I)
    lines = [line for line in (proc.stdout + "\n" + proc.stderr).splitlines() if cause.search(line)]
    return ("lines naming an error:\n" + "\n".join(line[:400] for line in lines[:40]) + "\n--- stdout tail:\n"
            + proc.stdout[-3000:] + "\n--- stderr tail:\n" + proc.stderr[-3000:])


def tiny_pipeline_config(data: Path, model: Path, work: Path, rounds: int = 2, steps: int = 3) -> dict:
    """The tiny pipeline: every stage of the demo in seconds (checkpoints every 2 steps, 4 shards of 64 passages)."""
    train = {"max_steps": steps, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3,
             "checkpoint_every": 2}
    return {"data": {"dataset": str(data)}, "model": {"name": str(model), "passage_max_length": 48},
            "warmup": train, "ance": train, "mining": {"top_k": 50}, "encode": {"batch_size": 32, "shard_size": 64},
            "rounds": rounds, "work_dir": str(work)}


TINY_COMPRESSION = {"dims": [16, 8], "index_types": ["flat", "hnsw", "ivfpq"], "epochs": 5}  # the tiny BERT's h: 32
RUN_RECORDS = ("mlflow.db", "mlartifacts", "mlflow-models", "mlflow-pending", "latest.json", "champion", "plots",
               ".locks", "runs", ".live")


@dataclass
class TinyPipeline:
    """One run of the tiny pipeline (2 rounds and the compression of its final model) on Prefect's ephemeral server,
    as `make demo` runs: the tests that read a finished run's stages share it (tests/conftest.py `tiny_pipeline`)."""

    root: Path
    config: dict
    first: dict  # the run's JSON result
    env: dict

    @property
    def work(self) -> Path:
        return Path(self.config["work_dir"])

    def run(self) -> dict:
        """`ance run` again with the same config and Prefect home."""
        proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(self.root / "tiny.json"),
                               "--json"], capture_output=True, text=True, env=self.env, timeout=600)
        assert proc.returncode == 0, failure_report(proc)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    @classmethod
    def start(cls, data: Path, model: Path, root: Path) -> "TinyPipeline":
        config = tiny_pipeline_config(data, model, root / "work") | {"compression": TINY_COMPRESSION}
        (root / "tiny.json").write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ANCE_FAULT")}  # ephemeral
        env |= {"PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        pipeline = cls(root, config, {}, env)
        pipeline.first = pipeline.run()
        return pipeline

    def copy_stages(self, work: Path) -> None:
        """The run's stage folders into another work folder (not its MLflow store nor its run records): a run there
        finds every stage built, under the same keys."""
        shutil.copytree(self.work, work, ignore=lambda folder, names: [n for n in names if n in RUN_RECORDS]
                        if Path(folder) == self.work else [])


def build_graded_dataset(scifact: Path, folder: Path, train_queries: int = 60, test_queries: int = 20,
                         weak: int = 12, documents: int = 400) -> Path:
    """A small graded, many-positives collection in the shape of the one that made training hurt (NFCorpus-like):
    each query's SciFact positives are grade 2, and `weak` more documents per query are grade 1, chosen at random:
    "indirect" links that share nothing with the query, 90% or more of the relevant pairs."""
    rng = random.Random(1)
    corpus = {d["_id"]: d for d in map(json.loads, (scifact / "corpus.jsonl").read_text().splitlines())}
    queries = {q["_id"]: q for q in map(json.loads, (scifact / "queries.jsonl").read_text().splitlines())}
    rows = [ln.split("\t") for ln in (scifact / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    by_query: dict[str, list[str]] = {}
    for q, d, _ in rows:
        by_query.setdefault(q, []).append(d)
    chosen = sorted(by_query)[: train_queries + test_queries]
    needed = sorted({d for q in chosen for d in by_query[q]})
    others = sorted(set(corpus) - set(needed))
    docs = needed + rng.sample(others, documents - len(needed))
    qrels: dict[str, list[tuple]] = {"train": [], "test": []}
    for k, q in enumerate(chosen):
        split = "train" if k < train_queries else "test"
        positives = set(by_query[q])
        qrels[split] += [(q, d, 2) for d in sorted(positives)]
        qrels[split] += [(q, d, 1) for d in rng.sample([d for d in docs if d not in positives], weak)]
    return write_beir(folder, [corpus[d] for d in docs], [queries[q] for q in chosen], qrels)


WORDS = "cell protein gene cancer patients study risk effect mice treatment blood disease".split()


def training_tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, set[str]]]:
    """What `ance_core.training.loop.train` takes after its checkpoint: negatives, corpus, queries and relevant
    documents. 10 queries with 2 negatives each over 30 passages of 8 words."""
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(30)], "title": "",
                           "text": [" ".join(WORDS[(i + j) % 12] for j in range(8)) for i in range(30)]})
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(10)], "text": [WORDS[i] for i in range(10)]})
    relevant = {f"q{i}": {f"d{i}"} for i in range(10)}
    negatives = pd.DataFrame({"query_id": [f"q{i}" for i in range(10)], "positive_id": [f"d{i}" for i in range(10)],
                              "negative_ids": [[f"d{i + 10}", f"d{i + 20}"] for i in range(10)],
                              "negative_ranks": [[1, 2]] * 10, "negative_scores": [[0.0, 0.0]] * 10})
    return negatives, corpus, queries, relevant


def without_dropout(checkpoint: Path, out: Path) -> Path:
    """A copy of a checkpoint with its dropout off, so that a training step depends on its data only."""
    shutil.copytree(checkpoint, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"hidden_dropout_prob": 0.0,
                                                          "attention_probs_dropout_prob": 0.0}))
    return out


def random_head_checkpoint(tiny_model: Path, out: Path, **model) -> Path:
    """A checkpoint of the tiny model with a random head (a fresh one is the identity: a transposed weight would go
    unseen), 8-token queries and 24-token passages."""
    import torch

    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model, load_checkpoint, save_checkpoint

    init_model(ModelConfig(name=str(tiny_model), query_max_length=8, passage_max_length=24, **model), out)
    encoder, tokenizer, meta = load_checkpoint(out)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in (*encoder.proj.parameters(), *encoder.norm.parameters()):
            p.copy_(torch.randn_like(p))
    save_checkpoint(encoder, tokenizer, meta, out)
    return out


def command(root: Path, config: dict, name: str = "config.json") -> list[str]:
    path = root / name
    path.write_text(json.dumps(config))
    return [sys.executable, "-m", "ance_cli", "run", "--config", str(path), "--json"]


def env_for(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ANCE_FAULT"}
    return env | {"PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"} | extra


def run(root: Path, config: dict, **extra_env: str) -> tuple[dict, str]:
    proc = subprocess.run(command(root, config), capture_output=True, text=True, env=env_for(root, **extra_env),
                          timeout=900)
    assert proc.returncode == 0, failure_report(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


def kill_when_hung(root: Path, config: dict, fault: str) -> None:
    """Start `ance run` with `fault` set to hang, wait until it hangs, SIGKILL its whole process group."""
    signal_file = root / "hung"
    proc = subprocess.Popen(command(root, config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env_for(root, ANCE_FAULT=f"{fault}:hang", ANCE_FAULT_SIGNAL=str(signal_file)),
                            start_new_session=True)
    deadline = time.time() + 600
    while not signal_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert signal_file.exists(), f"the run never reached {fault} (exit {proc.poll()})"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_answering(url: str, proc: subprocess.Popen, what: str, timeout: float, log: Path | None = None) -> None:
    """Poll `url` until it answers 200 (a busy machine starts a server slowly), failing when `proc` exits or after
    `timeout` s, with the tail of `log` when there is one."""
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            tail = log.read_text()[-3000:] if log else ""
            assert proc.poll() is None, f"{what} exited: {tail}"
            raise AssertionError(f"{what} did not answer within {timeout:g} s: {tail}")
        time.sleep(1)
