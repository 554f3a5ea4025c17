"""Does `encode.compile` pay on this machine? The pipeline's corpus encoding (`encode_documents`, the demo's encode
settings) of a collection's passages, eager and through torch.compile, in one process: after an untimed eager
warm-up (the process's first forwards set up oneDNN's kernels), eager, compiled (its first pass compiles), then eager
and compiled in turn. Prints each pass's seconds, the ratio compile included (the best eager pass over the first
compiled one: what one encoding of this corpus gains) and once compiled (the best eager pass over the best later
compiled one: what a large corpus gains), and the largest difference of the embeddings.
    python bench/encode_compile.py [--dataset scifact] [--passages N] [--model minilm] [--repeats 2]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ance_core.data.dataset import load_dataset
from ance_core.data.sources import resolve_dataset
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.devices import autocast_dtype
from ance_core.modeling.model import init_model, load_checkpoint
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--passages", type=int, help="the corpus's first N passages (default: all)")
    parser.add_argument("--model", default="minilm", help="'minilm', a Hugging Face id or a local model folder")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="eager and compiled passes after the first two")
    args = parser.parse_args()

    corpus = load_dataset(resolve_dataset(args.dataset)).corpus
    corpus = corpus if args.passages is None else corpus.head(args.passages)
    ckpt = Path(tempfile.mkdtemp(prefix="ance-bench-"))
    init_model(ModelConfig(name=args.model, passage_max_length=args.max_length), ckpt)
    model, tokenizer, meta = load_checkpoint(ckpt)
    configs = {False: EncodeConfig(), True: EncodeConfig(compile=True)}
    dtype = autocast_dtype(configs[False].precision, torch.device("cpu"))
    print(f"{len(corpus)} {args.dataset} passages at {args.max_length} tokens, model {args.model}, "
          f"{torch.get_num_threads()} threads, autocast {dtype}")
    encode_documents(model, tokenizer, meta, corpus.head(256), configs[False])  # warm-up, untimed
    times: dict[bool, list[float]] = {False: [], True: []}
    embeddings: dict[bool, np.ndarray] = {}
    for compiled in [False, True] + [False, True] * args.repeats:
        started = time.perf_counter()
        embeddings[compiled] = encode_documents(model, tokenizer, meta, corpus, configs[compiled])[0]
        times[compiled].append(time.perf_counter() - started)
        print(f"{'compiled' if compiled else 'eager':>8}: {times[compiled][-1]:.1f} s", flush=True)
    first = min(times[False]) / times[True][0]
    steady = min(times[False]) / min(times[True][1:]) if args.repeats else None
    diff = float(np.abs(embeddings[True] - embeddings[False]).max())
    print(f"eager / compiled, compile included: {first:.2f}x"
          + (f"; once compiled: {steady:.2f}x" if steady else "") + f"; largest embedding difference {diff:.2g}")
    print(json.dumps({"passages": len(corpus), "eager_s": times[False], "compiled_s": times[True],
                      "ratio_compile_included": round(first, 3), "ratio_compiled": steady and round(steady, 3),
                      "max_abs_diff": diff}))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
