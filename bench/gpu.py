"""Training and corpus encoding on the device torch picks (issue 28's GPU figures; on a machine without CUDA, the same
stages on its CPU): MiniLM on passages of the rehearsal's MS MARCO shape (bench/rehearsal.py's synthetic collection).

- encoding: passages/s of `encode_texts` (length-sorted dynamic padding) at --encode-length tokens, tokenization timed
  apart (it runs on the host before the batches go to the device);
- training: optimizer steps/s of the training loop (`ance_core.training.loop.train`, the pipeline's) for each
  --loader-workers value, --batch-size queries x (1 positive + 1 mined-shaped negative) per step at --train-length
  passage tokens, in-batch negatives; on CUDA the GPU-busy % (nvidia-smi's utilization.gpu: the share of each 100 ms
  in which a kernel ran) over the steps after the first --skip, and the peak memory torch allocated.

    python bench/gpu.py [--model minilm] [--random-init] [--shape bert-base] [--passages 100000] [--steps 300]
                        [--batch-size 64] [--loader-workers 0 2] [--json FILE]

--random-init builds the model from --model's config and tokenizer with random weights (a machine that has neither
the hub nor the packaged weights): the same shapes, so the same speed. --shape bert-base does so with BERT-base's
shape (12 layers, 768 wide, 12 heads, 3072 in the feed-forward; 110M parameters) and --model's tokenizer.

Encoding's model FLOP utilisation (`mfu`): the forward's FLOPs from the real token counts (padding not counted:
2 x the non-embedding parameters per token, plus attention's 4 x layers x width x t^2 per passage of t tokens) over
the seconds, as a share of --peak-tflops (790: the bf16 dense peak measured on the H100/H200 lent here).
"""

import argparse
import json
import subprocess
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from msmarco_shape import synthetic_msmarco  # bench/msmarco_shape.py (this script runs as bench/gpu.py)

from ance_core.data.dataset import load_dataset, passage_texts
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.devices import autocast_dtype, pick_device
from ance_core.modeling.model import init_model, load_checkpoint, resolve_model_name
from ance_core.modeling.tokenizing import token_ids
from ance_core.retrieval.attention import attention_backends
from ance_core.retrieval.encode import compiled_forward, encode_texts, padded_chunks
from ance_core.training.config import TrainConfig
from ance_core.training.loop import train


class GpuSampler(threading.Thread):
    """(time, utilization.gpu %) from `nvidia-smi -lms` until stopped."""

    def __init__(self, every_ms: int = 100):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      f"-lms={every_ms}"], stdout=subprocess.PIPE, text=True)

    def run(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.time(), float(line)))
            except ValueError:
                continue

    def stop(self) -> None:
        self.proc.terminate()
        self.join(5)

    def busy(self, start: float, stop: float) -> tuple[float, int]:
        window = [u for t, u in self.samples if start <= t <= stop]
        return (float(np.mean(window)) if window else float("nan")), len(window)


SHAPES = {"bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                        "intermediate_size": 3072}}


def model_source(name: str, random_init: bool, root: Path, shape: str | None = None) -> str:
    source = resolve_model_name(name)
    if not random_init and shape is None:
        return source
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(source)
    config.update(SHAPES.get(shape, {}))
    model = AutoModel.from_config(config)
    out = root / "random-init"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return str(out)


def forward_flops(model: torch.nn.Module, lengths: list[int]) -> float:
    """The encoder's forward FLOPs over passages of these token counts (no padding)."""
    config = model.encoder.config
    embedding = sum(p.numel() for n, p in model.encoder.named_parameters() if "embeddings" in n)
    dense = sum(p.numel() for p in model.parameters()) - embedding
    t = np.asarray(lengths, dtype=np.float64)
    return float(2 * dense * t.sum() + 4 * config.num_hidden_layers * config.hidden_size * (t ** 2).sum())


def utilisation(flops: float, seconds: float, peak_tflops: float) -> dict:
    return {"tflops": round(flops / seconds / 1e12, 1), "mfu": round(flops / seconds / (peak_tflops * 1e12), 3)}


def bench_encode(checkpoint: Path, texts: list[str], length: int, batch_size: int, precision: str,
                 peak_tflops: float) -> dict:
    device = pick_device()
    model, tokenizer, _ = load_checkpoint(checkpoint, device)
    dtype = autocast_dtype(precision, device)
    encode_texts(model, tokenizer, texts[:2 * batch_size], length, batch_size, dtype)  # warm-up: kernels, allocator
    started = time.perf_counter()
    lengths = [len(ids) for ids in token_ids(tokenizer, texts, length)]  # as encode_texts tokenizes
    tokenize = time.perf_counter() - started
    flops = forward_flops(model, lengths)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    encode_texts(model, tokenizer, texts, length, batch_size, dtype)
    sync()
    seconds = time.perf_counter() - started
    return {"passages": len(texts), "max_length": length, "batch_size": batch_size, "seconds": round(seconds, 2),
            "passages_per_s": round(len(texts) / seconds, 1), "tokenize_seconds": round(tokenize, 2),
            "passages_per_s_without_tokenizing": round(len(texts) / max(seconds - tokenize, 1e-9), 1),
            "mean_tokens": round(float(np.mean(lengths)), 1), **utilisation(flops, seconds, peak_tflops)}


def bench_encode_pipelined(checkpoint: Path, texts: list[str], length: int, batch_tokens: int, precision: str,
                           peak_tflops: float, compiled: bool = False) -> dict:
    """The same passages encoded with `batch_tokens` (encode.batch_tokens): tokenizing overlaps the model's work.
    `compiled`: through torch.compile (encode.compile); the warm-up compiles, and its seconds are reported."""
    device = pick_device()
    model, tokenizer, _ = load_checkpoint(checkpoint, device)
    dtype = autocast_dtype(precision, device)
    flops = forward_flops(model, [len(ids) for ids in token_ids(tokenizer, texts, length)])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    encode_texts(model, tokenizer, texts[:1000], length, 0, dtype, batch_tokens=batch_tokens,
                 compiled=compiled)  # warm-up
    sync()
    warm_up = time.perf_counter() - started
    started = time.perf_counter()
    encode_texts(model, tokenizer, texts, length, 0, dtype, batch_tokens=batch_tokens, compiled=compiled)
    sync()
    seconds = time.perf_counter() - started
    # the two halves apart, to tell which sets the pace: the producer's work alone (tokenize, cut, pad, pin) and the
    # model's forwards alone over the same batches already on the device
    started = time.perf_counter()
    batches = [batch for chunk in padded_chunks(tokenizer, texts, length, batch_tokens, pin=device.type == "cuda")
               for _, batch in chunk]
    producer = time.perf_counter() - started
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    sync()
    started = time.perf_counter()
    # under the SDPA backends encoding runs with (without them, cuDNN's backend plans every new shape: the forwards
    # alone measured 7.4 s against the pipelined encode's 2.6 s on an H200)
    forward_of = compiled_forward(model) if compiled else model
    with torch.inference_mode(), autocast, attention_backends():
        for b in batches:
            forward_of(b["input_ids"], b["attention_mask"])
    sync()
    forward = time.perf_counter() - started
    return {"passages": len(texts), "max_length": length, "batch_tokens": batch_tokens, "compiled": compiled,
            "warm_up_seconds": round(warm_up, 2), "seconds": round(seconds, 2),
            "passages_per_s": round(len(texts) / seconds, 1), **utilisation(flops, seconds, peak_tflops),
            "batches": len(batches), "producer_alone_seconds": round(producer, 2),
            "forward_alone_seconds": round(forward, 2),
            "forward_alone": utilisation(flops, forward, peak_tflops)}


def training_pairs(corpus: pd.DataFrame, qrels: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """`n` (query, positive) rows with one random passage as the negative: the shape of a mined table."""
    rng = np.random.default_rng(seed)
    rows = qrels.iloc[:n]
    negatives = corpus["doc_id"].to_numpy()[rng.integers(0, len(corpus), len(rows))]
    return pd.DataFrame({"query_id": rows["query_id"].to_numpy(), "positive_id": rows["doc_id"].to_numpy(),
                         "negative_ids": [[d] for d in negatives], "negative_ranks": [[1]] * len(rows),
                         "negative_scores": [[0.0]] * len(rows)})


def bench_train(checkpoint: Path, data, pairs: pd.DataFrame, args, workers: int, out: Path,
                compile: bool = False) -> dict:
    relevant = {q: {d} for q, d in zip(pairs["query_id"], pairs["positive_id"], strict=True)}
    cfg = TrainConfig(max_steps=args.steps, batch_size=args.batch_size, passage_max_length=args.train_length,
                      precision=args.precision, checkpoint_every=0, checkpoint_seconds=0, loader_workers=workers,
                      compile=compile)
    stamps: list[float] = []
    sampler = GpuSampler() if torch.cuda.is_available() else None
    if sampler:
        sampler.start()
        torch.cuda.reset_peak_memory_stats()
    started = time.time()
    try:
        train(checkpoint, pairs, data.corpus, data.queries, relevant, cfg, out,
              callbacks=[lambda record: stamps.append(time.time())])
    finally:
        if sampler:
            sampler.stop()
    skip = min(args.skip, len(stamps) - 2)
    steady = stamps[-1] - stamps[skip]
    result = {"loader_workers": workers, "compile": compile, "steps": len(stamps), "batch_size": args.batch_size,
              "passage_tokens": args.train_length, "seconds_total": round(time.time() - started, 2),
              "seconds_to_first_step": round(stamps[0] - started, 2),
              "steps_per_s": round((len(stamps) - 1 - skip) / steady, 3)}
    if sampler:
        busy, n = sampler.busy(stamps[skip], stamps[-1])
        result |= {"gpu_busy_pct": round(busy, 1), "gpu_samples": n,
                   "peak_allocated_mb": round(torch.cuda.max_memory_allocated() / 2 ** 20)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape, --model's tokenizer")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--encode-passages", type=int, help="passages encoded (default: all)")
    parser.add_argument("--encode-length", type=int, default=256)
    parser.add_argument("--encode-batch-size", type=int, default=256)
    parser.add_argument("--encode-batch-tokens", type=int, help="also encode with encode.batch_tokens this many "
                        "(batches by padded tokens, tokenized ahead by a producer thread)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", type=int, default=20, help="first steps left out of steps/s and GPU-busy %%")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-length", type=int, default=128)
    parser.add_argument("--loader-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--compile", action="store_true", help="train once more with train.compile (torch.compile; "
                        "CUDA graphs on a GPU), with the last --loader-workers; its first steps compile (--skip them)")
    parser.add_argument("--encode-compile", action="store_true", help="with --encode-batch-tokens: encode once more "
                        "through torch.compile (encode.compile; its warm-up compiles)")
    parser.add_argument("--only-compiled", action="store_true", help="with --compile: skip the eager runs")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    device = pick_device()
    report: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "threads": torch.get_num_threads()}
    shape = synthetic_msmarco(root / "data", args.passages, args.steps * args.batch_size, 0)
    data = load_dataset(root / "data")
    checkpoint = root / "start"
    init_model(ModelConfig(name=model_source(args.model, args.random_init, root, args.shape)), checkpoint)
    report["collection"] = shape
    report["model"] = {"shape": args.shape or args.model, "random_init": args.random_init or bool(args.shape),
                       "parameters": sum(p.numel() for p in load_checkpoint(checkpoint, torch.device("cpu"))[0]
                                         .parameters())}
    texts = passage_texts(data.corpus)[: args.encode_passages or None]
    report["encode"] = bench_encode(checkpoint, texts, args.encode_length, args.encode_batch_size, args.precision,
                                    args.peak_tflops)
    print(json.dumps(report["encode"]), flush=True)
    if args.encode_batch_tokens:  # batches by tokens, tokenized ahead by a producer thread (encode.batch_tokens)
        report["encode_pipelined"] = bench_encode_pipelined(checkpoint, texts, args.encode_length,
                                                            args.encode_batch_tokens, args.precision,
                                                            args.peak_tflops)
        print(json.dumps(report["encode_pipelined"]), flush=True)
        if args.encode_compile:  # and through torch.compile (encode.compile)
            report["encode_pipelined_compiled"] = bench_encode_pipelined(
                checkpoint, texts, args.encode_length, args.encode_batch_tokens, args.precision, args.peak_tflops,
                compiled=True)
            print(json.dumps(report["encode_pipelined_compiled"]), flush=True)
    qrels = data.split_qrels("train")
    pairs = training_pairs(data.corpus, qrels, args.steps * args.batch_size)
    report["train"] = []
    for workers in [] if args.only_compiled and args.compile else args.loader_workers:
        report["train"].append(bench_train(checkpoint, data, pairs, args, workers, root / f"train-{workers}"))
        print(json.dumps(report["train"][-1]), flush=True)
    if args.compile:
        workers = args.loader_workers[-1]
        report["train"].append(bench_train(checkpoint, data, pairs, args, workers, root / "train-compiled", True))
        print(json.dumps(report["train"][-1]), flush=True)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
