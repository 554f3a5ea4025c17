"""What sets the pace of corpus encoding on a GPU: the same passages encoded by several variants of the pipeline,
each in a fresh process (so no variant finds another's kernels, plans or shapes warm), each encoded twice in a row
(`cold`: the first pass over these batch shapes; `warm`: the same batches again), then the forwards alone over the
same batches already on the device. Issue 42 measured corpus encoding at a third of the forward's utilisation; the
variants tell which of its suspects holds:

- `thread`: encode.batch_tokens as shipped (a producer thread tokenizes and pads ahead of the model; SDPA without
  its cuDNN backend, retrieval/attention.py's SDPA_BACKENDS);
- `batched`: no producer (the shard tokenized first, batches of --batch-size texts);
- `pad32`: batches padded to a multiple of 32 tokens (a few batch shapes recur instead of one new shape per batch);
- `cudnn`: SDPA's cuDNN backend allowed (torch's default; encoding ran so until this script found that it builds a
  plan for each new shape);
- `mask2d`: BERT given its (B, T) attention mask, as before `prepared_mask` (modeling/model.py), whose padding check
  in transformers reads a GPU value at every forward;
- `fullchunk`: the producer's first chunk a whole tokenizing.CHUNK (8,192 texts), as before encode.FIRST_CHUNK (the
  model waited for it);
- `bf16w`: the weights cast to bf16 and no autocast (the forward ceiling rose from 37.7% to 50.3% of the peak so);
  the variant also reports how far its embeddings are from the autocast model's (cosine, top-10 agreement);
- combinations, joined by `+` (e.g. `thread+cudnn`).

(A producer in DataLoader worker processes instead of the thread was measured with this script at commit 954cf25,
slower on an H200, and dropped.)

cold ≫ warm says new shapes cost (plans, autotuning); warm ≫ forward-alone says the hand-off between producer and
model costs. --profile adds torch.profiler's top host-side ops of the cold pass of the first variant.

    python bench/encode_pace.py --model minilm [--shape bert-base] [--passages 30000] [--variants thread batched ...]
                                [--json FILE]

MFU as bench/gpu.py computes it: the forward's FLOPs from the real token counts over --peak-tflops (790, bf16).
On a CPU the same script runs (small --passages); the figures then say little about a GPU.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from gpu import forward_flops, model_source, utilisation  # bench/gpu.py (this script runs as bench/encode_pace.py)
from msmarco_shape import synthetic_msmarco

from ance_core.data.dataset import load_dataset, passage_texts
from ance_core.modeling import tokenizing
from ance_core.modeling.devices import autocast_dtype, pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.modeling.tokenizing import token_ids
from ance_core.retrieval import attention as attention_module
from ance_core.retrieval import encode as encode_module
from ance_core.retrieval.encode import encode_texts, padded_chunks

KNOBS = {"thread", "batched", "pad32", "cudnn", "mask2d", "fullchunk", "bf16w"}


def one_variant(args) -> dict:
    """This process's variant: cold and warm passes, then the forwards alone."""
    knobs = set(args.one.split("+"))
    if knobs - KNOBS:
        raise SystemExit(f"unknown variant part(s) {sorted(knobs - KNOBS)}: choose from {sorted(KNOBS)}")
    device = pick_device()
    if "cudnn" in knobs:
        attention_module.SDPA_BACKENDS = None  # torch's own choice of SDPA backends
    texts = passage_texts(load_dataset(Path(args.root) / "data").corpus)[: args.passages]
    model, tokenizer, _ = load_checkpoint(Path(args.root) / "model", device)
    dtype = autocast_dtype("auto", device)
    if "mask2d" in knobs:
        model.prepared_masks = False
    if "fullchunk" in knobs:
        encode_module.FIRST_CHUNK = tokenizing.CHUNK
    agreement = None
    if "bf16w" in knobs:
        agreement = bf16_agreement(model, tokenizer, texts[:2000], args.length, args.batch_tokens, dtype)
        model, dtype = model.to(torch.bfloat16), None
    pad = 32 if "pad32" in knobs else None
    batched = "batched" in knobs

    def encode(part: list[str]) -> None:
        if batched:
            encode_texts(model, tokenizer, part, args.length, args.batch_size, dtype, pad_multiple=pad)
        else:
            encode_texts(model, tokenizer, part, args.length, 0, dtype, batch_tokens=args.batch_tokens,
                         pad_multiple=pad)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    encode(texts[:64])  # the first kernels, the allocator, the CUDA context: not this variant's cost
    flops = forward_flops(model, [len(ids) for ids in token_ids(tokenizer, texts, args.length)])
    report = {"variant": args.one, "passages": len(texts), "device": torch.cuda.get_device_name()
              if device.type == "cuda" else "cpu", "sdpa_backends": "torch's" if attention_module.SDPA_BACKENDS is None
              else [b.name for b in attention_module.SDPA_BACKENDS], "pad_multiple": pad, "bf16_agreement": agreement}
    profiler = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        profiler = profile(activities=activities)
    for name in ("cold", "warm"):
        sync()
        started = time.perf_counter()
        with profiler if (profiler is not None and name == "cold") else nullcontext():
            encode(texts)
            sync()
        seconds = time.perf_counter() - started
        report[name] = {"seconds": round(seconds, 3), "passages_per_s": round(len(texts) / seconds, 1),
                        **utilisation(flops, seconds, args.peak_tflops)}
    if profiler is not None:
        report["profile_cpu"] = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                                              max_name_column_width=60)
        if device.type == "cuda":
            report["profile_cuda"] = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                                                   max_name_column_width=60)
    if not batched:  # the producer's work alone and the forwards alone, over the same batches
        started = time.perf_counter()
        batches = [b for chunk in padded_chunks(tokenizer, texts, args.length, args.batch_tokens,
                                                device.type == "cuda", pad) for _, b in chunk]
        report["producer_alone_seconds"] = round(time.perf_counter() - started, 3)
        report["batches"] = len(batches)
        report["distinct_shapes"] = len({tuple(b["input_ids"].shape) for b in batches})
        batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
        autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
        sync()
        started = time.perf_counter()
        with torch.inference_mode(), autocast, attention_module.attention_backends():
            for b in batches:
                model(b["input_ids"], b["attention_mask"])
        sync()
        seconds = time.perf_counter() - started
        report["forward_alone"] = {"seconds": round(seconds, 3), **utilisation(flops, seconds, args.peak_tflops)}
    return report


def bf16_agreement(model, tokenizer, texts: list[str], length: int, batch_tokens: int, dtype) -> dict:
    """How far embeddings of bf16 weights are from the autocast model's: per-passage cosine and the overlap of each
    passage's 10 nearest passages (among these texts) under the two, both on embeddings centred on the reference's
    mean."""
    import copy

    reference = encode_texts(model, tokenizer, texts, length, 0, dtype, batch_tokens=batch_tokens)
    bf16 = encode_texts(copy.deepcopy(model).to(torch.bfloat16), tokenizer, texts, length, 0, None,
                        batch_tokens=batch_tokens)
    a, b = torch.from_numpy(reference).double(), torch.from_numpy(bf16).double()
    centre = a.mean(0)  # random weights embed every passage near one direction: compare what differs between them
    a, b = a - centre, b - centre
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1)
    top = [(x @ x.T).fill_diagonal_(float("-inf")).topk(10, dim=1).indices for x in (a, b)]
    overlap = [len(set(p.tolist()) & set(q.tolist())) / 10 for p, q in zip(*top, strict=True)]
    return {"passages": len(texts), "cosine_min": round(float(cosine.min()), 5),
            "cosine_mean": round(float(cosine.mean()), 5), "top10_overlap_mean": round(sum(overlap) / len(overlap), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="the tokenizer (and config) of the random-weight model")
    parser.add_argument("--shape", choices=["bert-base"], help="random weights of BERT-base's shape")
    parser.add_argument("--passages", type=int, default=30_000)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch-tokens", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=256, help="the `batched` variant's texts per batch")
    parser.add_argument("--variants", nargs="+", default=["thread+cudnn", "batched+cudnn", "thread+pad32+cudnn",
                                                           "thread", "batched"])
    parser.add_argument("--profile", action="store_true", help="profile the first variant's cold pass")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per variant")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's variant
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_variant(args)))
        return
    root = Path(tempfile.mkdtemp(prefix="encode-pace-"))
    synthetic_msmarco(root / "data", args.passages, 10, 0)
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model

    init_model(ModelConfig(name=model_source(args.model, True, root, args.shape)), root / "model")
    reports = []
    for i, variant in enumerate(args.variants):
        command = [sys.executable, __file__, "--one", variant, "--root", str(root), "--passages", str(args.passages),
                   "--length", str(args.length), "--batch-tokens", str(args.batch_tokens), "--batch-size",
                   str(args.batch_size), "--peak-tflops", str(args.peak_tflops)]
        if args.profile and i == 0:
            command.append("--profile")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            report = json.loads(lines[-1]) if lines else {"variant": variant, "error": done.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            report = {"variant": variant, "error": f"over {args.timeout} s"}
        reports.append(report)
        for table in ("profile_cpu", "profile_cuda"):
            if table in report:
                print(report[table])
        brief = {k: v for k, v in report.items() if not k.startswith("profile")}
        print(json.dumps(brief), flush=True)
    print(f"\n{'variant':<22}{'cold s':>9}{'warm s':>9}{'fwd s':>8}{'prod s':>8}{'cold MFU':>10}{'warm MFU':>10}"
          f"{'fwd MFU':>9}{'shapes':>8}")
    for r in reports:
        if "error" in r:
            print(f"{r['variant']:<22} error: {r['error'][-300:]}")
            continue
        fwd = r.get("forward_alone", {})
        print(f"{r['variant']:<22}{r['cold']['seconds']:>9.2f}{r['warm']['seconds']:>9.2f}"
              f"{fwd.get('seconds', float('nan')):>8.2f}{r.get('producer_alone_seconds', float('nan')):>8.2f}"
              f"{r['cold']['mfu']:>10.1%}{r['warm']['mfu']:>10.1%}{fwd.get('mfu', float('nan')):>9.1%}"
              f"{r.get('distinct_shapes', '-'):>8}")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
