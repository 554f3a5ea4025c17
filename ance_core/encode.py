"""Batched encoding: length-sorted dynamic padding, inference mode, autocast; corpus streamed to .npy shards.

Output folder of `encode_corpus`:
  emb_00000.npy ...   float32 (n_shard, h), rows in corpus order
  docids.txt          one doc id per line, same order as the concatenated shards
"""

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ance_core.config import EncodeConfig
from ance_core.data import passage_texts
from ance_core.model import BiEncoder, autocast_dtype, load_checkpoint, pick_device


def encode_texts(
    model: BiEncoder,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    max_length: int,
    batch_size: int,
    dtype: torch.dtype | None,
    progress: tqdm | None = None,
) -> np.ndarray:
    """(len(texts), h) float32, in input order. Texts are sorted by token length so each batch pads little."""
    device = next(model.parameters()).device
    features = tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True)["input_ids"]
    order = np.argsort([-len(ids) for ids in features], kind="stable")
    out = np.empty((len(texts), model.dim), dtype=np.float32)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    model.eval()
    with torch.inference_mode(), autocast:
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [features[i] for i in idx]}, return_tensors="pt")
            emb = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (b, h)
            out[idx] = emb.float().cpu().numpy()
            if progress is not None:
                progress.update(len(idx))
    return out


def encode_corpus(checkpoint: str | Path, corpus: pd.DataFrame, cfg: EncodeConfig, out: Path) -> dict:
    """Encode every passage with the checkpoint into shards of `cfg.shard_size` rows."""
    device = pick_device()
    model, tokenizer, meta = load_checkpoint(checkpoint, device)
    dtype = autocast_dtype(cfg.precision, device)
    texts = passage_texts(corpus)
    ids = corpus["doc_id"].astype(str).tolist()
    with tqdm(total=len(texts), desc="encode corpus", unit="psg", dynamic_ncols=True) as bar:
        for shard, start in enumerate(range(0, len(texts), cfg.shard_size)):
            emb = encode_texts(
                model, tokenizer, texts[start : start + cfg.shard_size], meta.passage_max_length,
                cfg.batch_size, dtype, bar,
            )
            if model.projector is not None:
                emb = model.projector.docs(emb)
            np.save(out / f"emb_{shard:05d}.npy", emb)
    (out / "docids.txt").write_text("\n".join(ids) + "\n", encoding="utf-8")
    return {"passages": len(ids), "dim": emb.shape[1], "shards": shard + 1, "device": str(device)}


def encode_queries(
    model: BiEncoder, tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int, cfg: EncodeConfig
) -> np.ndarray:
    """(len(texts), dim) float32; projected when the checkpoint is a compressed one."""
    device = next(model.parameters()).device
    emb = encode_texts(model, tokenizer, texts, max_length, cfg.batch_size, autocast_dtype(cfg.precision, device))
    return emb if model.projector is None else model.projector.queries(emb)


def iter_shards(folder: str | Path) -> Iterator[np.ndarray]:
    for path in sorted(Path(folder).glob("emb_*.npy")):
        yield np.load(path)


def read_docids(folder: str | Path) -> list[str]:
    return (Path(folder) / "docids.txt").read_text(encoding="utf-8").splitlines()
