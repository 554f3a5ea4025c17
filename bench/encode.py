"""Passages/s of the pipeline encoder (length-sorted dynamic padding) vs a plain padded transformers loop.

Same model, max length, batch size, threads and bf16 autocast, one run, both warmed up first; prints the ratio
and the padding each approach computes (tokens run through the model / real tokens), per max length.
    python bench/encode.py [--passages 1024] [--batch-size 64] [--max-lengths 256 512]
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from ance_core.data.dataset import load_dataset, passage_texts
from ance_core.data.sources import resolve_dataset
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint, pool, resolve_model_name
from ance_core.retrieval.encode import encode_texts


def plain_loop(model, tokenizer, texts: list[str], max_length: int, batch_size: int) -> np.ndarray:
    """What a first version would write: corpus order, each batch padded to its longest passage."""
    out = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            out.append(pool(hidden, batch["attention_mask"], "mean").float().numpy())
    return np.concatenate(out)


def padded_ratio(lengths: np.ndarray, order: np.ndarray, batch_size: int) -> float:
    padded = sum(lengths[order[i : i + batch_size]].max() * len(order[i : i + batch_size])
                 for i in range(0, len(order), batch_size))
    return padded / lengths.sum()


def rate(fn, *args) -> float:
    """Passages per second of one call fn(*args) that returns one vector per passage."""
    start = time.perf_counter()
    n = len(fn(*args))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--passages", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-lengths", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args()

    texts = passage_texts(load_dataset(resolve_dataset(args.dataset)).corpus.head(args.passages))
    source = resolve_model_name(args.model)
    plain_model, plain_tok = AutoModel.from_pretrained(source).eval(), AutoTokenizer.from_pretrained(source)
    bs = args.batch_size
    print(f"{len(texts)} {args.dataset} passages, batch {bs}, {torch.get_num_threads()} threads, bf16 autocast, "
          f"model {args.model}")
    print("max_len  pipeline psg/s  plain psg/s  ratio  padded/real tokens (pipeline, plain)")
    for max_length in args.max_lengths:
        ckpt = Path(tempfile.mkdtemp(prefix="ance-bench-"))
        init_model(ModelConfig(name=args.model, passage_max_length=max_length), ckpt)
        model, tokenizer, _ = load_checkpoint(ckpt)
        encode_texts(model, tokenizer, texts[:bs], max_length, bs, torch.bfloat16)  # warm-up
        plain_loop(plain_model, plain_tok, texts[:bs], max_length, bs)
        plain_rate = rate(plain_loop, plain_model, plain_tok, texts, max_length, bs)
        pipeline_rate = rate(encode_texts, model, tokenizer, texts, max_length, bs, torch.bfloat16)
        lengths = np.array([len(x) for x in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]])
        pad_sorted = padded_ratio(lengths, np.argsort(-lengths, kind="stable"), bs)
        pad_plain = padded_ratio(lengths, np.arange(len(lengths)), bs)
        print(f"{max_length:7d}  {pipeline_rate:14.1f}  {plain_rate:11.1f}  {pipeline_rate / plain_rate:5.2f}x"
              f"  {pad_sorted:.3f}, {pad_plain:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    main()
