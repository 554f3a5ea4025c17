"""The encoding producer's padding (issue 42): `tokenizer.pad` against `pad_ids` (modeling/tokenizing.py, numpy) over
the batches `encode.batch_tokens` cuts from passages of the rehearsal's MS MARCO shape, in one run.

    python bench/pad.py [--passages 30000] [--batch-tokens 131072]
"""

import argparse
import tempfile
import time
from pathlib import Path

from msmarco_shape import synthetic_msmarco  # bench/msmarco_shape.py (this script runs as bench/pad.py)
from transformers import AutoTokenizer

from ance_core.data.dataset import load_dataset, passage_texts
from ance_core.modeling.model import resolve_model_name
from ance_core.modeling.tokenizing import pad_ids, token_id_chunks
from ance_core.retrieval.encode import token_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=30_000)
    parser.add_argument("--batch-tokens", type=int, default=131_072)
    parser.add_argument("--model", default="minilm")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-pad-"))
    synthetic_msmarco(root / "data", args.passages, 10, 0)
    texts = passage_texts(load_dataset(root / "data").corpus)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_name(args.model))
    started = time.perf_counter()
    batches = [[ids[i] for i in rows] for ids in token_id_chunks(tokenizer, texts, 256)
               for rows in token_batches([len(x) for x in ids], args.batch_tokens)]
    tokenize = time.perf_counter() - started
    seconds = {}
    for name, pad in {"tokenizer.pad": lambda rows: tokenizer.pad({"input_ids": rows}, return_tensors="pt"),
                      "pad_ids": lambda rows: pad_ids(tokenizer, rows)}.items():
        started = time.perf_counter()
        for rows in batches:
            pad(rows)
        seconds[name] = time.perf_counter() - started
    print(f"{len(texts)} passages, {len(batches)} batches of <= {args.batch_tokens} padded tokens; tokenizing "
          f"{tokenize:.2f} s")
    for name, s in seconds.items():
        print(f"{name:>14}: {s:.3f} s")
    print(f"pad_ids is {seconds['tokenizer.pad'] / seconds['pad_ids']:.1f}x faster")


if __name__ == "__main__":
    main()
