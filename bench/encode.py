"""Passages/s of the pipeline encoder (length-sorted dynamic padding) vs a plain padded transformers loop.

Same model, max length, batch size, threads and bf16 autocast; one run; prints the ratio.
    python bench/encode.py [--passages 1024] [--batch-size 64] [--max-length 256]
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from ance_core.config import ModelConfig
from ance_core.data import load_dataset, passage_texts, resolve_dataset
from ance_core.encode import encode_texts
from ance_core.model import init_model, load_checkpoint, pool, resolve_model_name


def plain_loop(texts: list[str], model_path: str, max_length: int, batch_size: int) -> np.ndarray:
    """What a first version would write: corpus order, each batch padded to its longest passage."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).eval()
    out = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            out.append(pool(hidden, batch["attention_mask"], "mean").float().numpy())
    return np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--passages", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args()

    corpus = load_dataset(resolve_dataset(args.dataset)).corpus.head(args.passages)
    texts = passage_texts(corpus)
    ckpt = Path(tempfile.mkdtemp(prefix="ance-bench-"))
    init_model(ModelConfig(name=args.model, passage_max_length=args.max_length), ckpt)
    model, tokenizer, meta = load_checkpoint(ckpt)
    print(f"{len(texts)} passages, max length {args.max_length}, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads, bf16 autocast, model {resolve_model_name(args.model)}")

    start = time.perf_counter()
    encode_texts(model, tokenizer, texts, args.max_length, args.batch_size, torch.bfloat16)
    pipeline_rate = len(texts) / (time.perf_counter() - start)

    start = time.perf_counter()
    plain_loop(texts, resolve_model_name(args.model), args.max_length, args.batch_size)
    plain_rate = len(texts) / (time.perf_counter() - start)

    print(f"pipeline encoder: {pipeline_rate:7.1f} passages/s")
    print(f"plain loop:       {plain_rate:7.1f} passages/s")
    print(f"ratio (pipeline / plain): {pipeline_rate / plain_rate:.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
