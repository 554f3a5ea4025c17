"""Batched encoding: length-sorted dynamic padding, inference mode, autocast; corpus streamed to .npy shards.

Output folder of `encode_corpus` (and of the encode stage, which encodes each shard in its own task, `encode_shard`,
and puts them together with `assemble_shards`):
  emb_00000.npy ...   `encode.dtype` (float16 by default), one file per `shard_size` documents: their rows (one per
                      document, or per MaxP window); readers compute in float32 (`iter_shards`)
  docids.txt          one doc id per line, same order as the concatenated shards
  windows.txt         maxp checkpoints only: the window number of each row (a document has one row per window)

A document is its first `passage_max_length` tokens (FirstP), or with a `maxp` checkpoint its windows of that many
tokens, at most `max_passages` (`passage_windows`; ANCE §5 MaxP).
"""

import functools
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ance_core.artifacts import DOCIDS, EMBEDDINGS, WINDOWS, id_lines, link_or_copy, shard_paths
from ance_core.data.dataset import passage_texts
from ance_core.errors import AnceError
from ance_core.faults import fault_point
from ance_core.modeling.devices import autocast_dtype, out_of_memory_advice, pick_device
from ance_core.modeling.model import BiEncoder, ModelMeta, load_checkpoint
from ance_core.modeling.tokenizing import pad_ids, padded_width, passage_windows, token_id_chunks, token_ids
from ance_core.retrieval.attention import attention_backends
from ance_core.retrieval.config import EncodeConfig


def encode_texts(
    model: BiEncoder,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    max_length: int,
    batch_size: int,
    dtype: torch.dtype | None,
    progress: tqdm | None = None,
    batch_tokens: int | None = None,
    pad_multiple: int | None = None,
    compiled: bool = False,
) -> np.ndarray:
    """(len(texts), h) float32, in input order. Texts are sorted by token length so each batch pads little.
    `batch_tokens`: batches of at most that many padded tokens, tokenized ahead by a producer thread
    (`_encode_pipelined`). `pad_multiple`: each batch padded to a multiple of that many tokens (fewer distinct
    shapes). `compiled`: the forward under torch.compile (`compiled_forward`). Attention runs without SDPA's cuDNN
    backend (`attention_backends`)."""
    if batch_tokens is not None:
        return _encode_pipelined(model, tokenizer, texts, max_length, batch_tokens, dtype, progress, pad_multiple,
                                 compiled)
    # tokenized a chunk at a time (modeling/tokenizing.py): a fast tokenizer's per-text encodings (offsets, words,
    # ...) of a whole shard take several times the memory of the token ids kept
    features = list(token_ids(tokenizer, texts, max_length))
    order = np.argsort([-len(ids) for ids in features], kind="stable")
    batches = ((idx, pad_ids(tokenizer, [features[i] for i in idx], pad_multiple))
               for idx in (order[start:start + batch_size] for start in range(0, len(texts), batch_size)))
    return _encode_batches(model, batches, len(texts), progress, dtype,
                           f"encoding batches of {batch_size} texts of up to {max_length} tokens",
                           "lower encode.batch_size (or the model's max length)", compiled)


def _forward(model: BiEncoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids, attention_mask)


@functools.cache
def _compiled() -> Callable:
    return torch.compile(_forward, dynamic=True)


def compiled_forward(model: BiEncoder) -> Callable:
    """The model's forward under torch.compile (inductor, dynamic shapes: length-sorted batches are nearly all new
    shapes, and a symbolic graph serves them; a batch of one text compiles once more). One compiled function for the
    process, the model its argument: every model of the same architecture runs one graph (its weights are the graph's
    inputs, so a model trained on afterwards, as a stage's dev checks encode with, is encoded with its new weights),
    and nothing is kept on the model (a deep copy of it, a freed one, are what they were)."""
    return functools.partial(_compiled(), model)


class BatchResults:
    """Embeddings written into `out` (rows, dim) as batches finish. On a GPU one batch behind: a batch's copy to
    pinned host memory is queued after its forward and read once the next batch's forward is queued, so the GPU
    does not wait on the host between batches (a `.cpu()` per batch did: encoding ran at a quarter of the forward's
    speed on an H100, BENCHMARKS.md). On the CPU each batch is written at once."""

    def __init__(self, out: np.ndarray, device: torch.device, progress: tqdm | None):
        self.out, self.cuda, self.progress = out, device.type == "cuda", progress
        self.pending: tuple[np.ndarray, torch.Tensor, torch.cuda.Event] | None = None

    def put(self, rows: np.ndarray, emb: torch.Tensor) -> None:
        if not self.cuda:
            self._write(rows, emb.float().numpy())
            return
        host = torch.empty(emb.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(emb.float(), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self.flush()  # the previous batch's (queued before this batch's forward)
        self.pending = (rows, host, copied)

    def flush(self) -> None:
        if self.pending is not None:
            rows, host, copied = self.pending
            self.pending = None
            copied.synchronize()
            self._write(rows, host.numpy())

    def _write(self, rows: np.ndarray, emb: np.ndarray) -> None:
        self.out[rows] = emb
        if self.progress is not None:
            self.progress.update(len(rows))


def token_batches(lengths: list[int], batch_tokens: int, pad_multiple: int | None = None) -> list[np.ndarray]:
    """Positions of texts of these token `lengths` in batches, longest first: each batch as many texts as fit in
    `batch_tokens` padded tokens (its count x its longest text, rounded up to `pad_multiple`), one text at least."""
    order = np.argsort([-n for n in lengths], kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = padded_width(max(lengths[order[start]], 1), pad_multiple)
        size = max(1, batch_tokens // longest)
        batches.append(order[start:start + size])
        start += size
    return batches


# The pipelined encoding's first chunk of texts: small, so that the model starts at once. With the first chunk a
# whole CHUNK (8,192 texts), tokenizing, sorting, padding and pinning it held the GPU back ~0.36 s of a 3.06 s
# BERT-base-shaped encoding of 30k passages on an H200, most of the gap to its forwards alone (2.58 s: BENCHMARKS.md).
FIRST_CHUNK = 512


def padded_chunks(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, batch_tokens: int,
                  pin: bool, pad_multiple: int | None = None, first: int | None = None
                  ) -> Iterator[list[tuple[np.ndarray, dict]]]:
    """The pipelined encoding's producer work: per chunk of texts tokenized at once (the `first` texts, FIRST_CHUNK
    by default, then `tokenizing.CHUNK` at a time), its batches of at most `batch_tokens` padded tokens as (positions
    in `texts`, padded tensors, in pinned memory when `pin`)."""
    first = FIRST_CHUNK if first is None else first
    offset = 0
    for ids in chain(token_id_chunks(tokenizer, texts[:first], max_length),
                     token_id_chunks(tokenizer, texts[first:], max_length)):
        batches = []
        for rows in token_batches([len(x) for x in ids], batch_tokens, pad_multiple):
            padded = pad_ids(tokenizer, [ids[i] for i in rows], pad_multiple)
            batches.append((rows + offset, {k: v.pin_memory() for k, v in padded.items()} if pin else padded))
        offset += len(ids)
        yield batches


def _encode_pipelined(model: BiEncoder, tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int,
                      batch_tokens: int, dtype: torch.dtype | None, progress: tqdm | None,
                      pad_multiple: int | None = None, compiled: bool = False) -> np.ndarray:
    """`encode_texts` with `batch_tokens`: a producer thread tokenizes a chunk of texts at a time (the tokenizer's
    Rust core releases the GIL), sorts it by length, cuts it into batches of at most `batch_tokens` padded tokens and
    pads them (pinned for a GPU), two chunks ahead of the model, which encodes them as they come. (DataLoader worker
    processes instead of the thread were slower on an H200: bench/encode_pace.py in BENCHMARKS.md.)"""
    pin = next(model.parameters()).device.type == "cuda"
    ready: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def hand(item) -> bool:  # to the encoding thread; False once it has stopped (an error, an interrupt)
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batches in padded_chunks(tokenizer, texts, max_length, batch_tokens, pin, pad_multiple):
                if not hand(batches):
                    return  # the rest is not tokenized for nothing
            hand(None)
        except BaseException as e:  # handed to the encoding thread, which raises it
            hand(e)

    def received() -> Iterator[tuple[np.ndarray, dict]]:
        while (chunk := ready.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield from chunk

    producer = threading.Thread(target=produce, name="tokenizer", daemon=True)
    producer.start()
    try:
        return _encode_batches(model, received(), len(texts), progress, dtype,
                               f"encoding batches of up to {batch_tokens} padded tokens (texts of up to "
                               f"{max_length} tokens)", "lower encode.batch_tokens (or the model's max length)")
    finally:
        stop.set()
        producer.join()


def _encode_batches(model: BiEncoder, batches: Iterator[tuple[np.ndarray, dict]], n: int, progress: tqdm | None,
                    dtype: torch.dtype | None, doing: str, advice: str, compiled: bool = False) -> np.ndarray:
    """(n, h) float32: each batch's rows (positions among the n texts, padded tensors) from the model, in the order
    the batches come; out of memory, an error saying what it was `doing` and the `advice`."""
    device = next(model.parameters()).device
    forward = compiled_forward(model) if compiled else model
    out = np.empty((n, model.dim), dtype=np.float32)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    model.eval()
    results = BatchResults(out, device, progress)
    with torch.inference_mode(), autocast, attention_backends(), out_of_memory_advice(doing, advice):
        for rows, batch in batches:
            results.put(rows, forward(batch["input_ids"].to(device, non_blocking=True),
                                      batch["attention_mask"].to(device, non_blocking=True)))  # (b, h)
        results.flush()
    return out


def document_passages(tokenizer: PreTrainedTokenizerBase, corpus: pd.DataFrame, meta: ModelMeta
                      ) -> tuple[list[str], list[str], list[int]]:
    """What a checkpoint encodes of a corpus: (texts, doc id of each, window number of each). FirstP: one text per
    document (truncated by the tokenizer); MaxP: its windows. Each after the checkpoint's passage prefix."""
    texts = passage_texts(corpus)
    ids = corpus["doc_id"].astype(str).tolist()
    if meta.document_mode != "maxp":
        return meta.passages(texts), ids, [0] * len(ids)
    out: tuple[list[str], list[str], list[int]] = ([], [], [])
    for doc_id, text in zip(ids, texts, strict=True):
        for k, window in enumerate(passage_windows(tokenizer, text, meta.passage_max_length, meta.max_passages)):
            out[0].append(window), out[1].append(doc_id), out[2].append(k)
    return meta.passages(out[0]), out[1], out[2]


def encode_documents(model: BiEncoder, tokenizer: PreTrainedTokenizerBase, meta: ModelMeta, corpus: pd.DataFrame,
                     cfg: EncodeConfig, progress: tqdm | None = None) -> tuple[np.ndarray, list[str], list[int]]:
    """(embeddings, doc id of each row, window number of each row) of a corpus slice: FirstP one row per document,
    MaxP one per window; projected when the checkpoint is a compressed one."""
    texts, ids, windows = document_passages(tokenizer, corpus, meta)
    device = next(model.parameters()).device
    emb = encode_texts(model, tokenizer, texts, meta.passage_max_length, cfg.batch_size,
                       autocast_dtype(cfg.precision, device), progress, cfg.batch_tokens, compiled=cfg.compile)
    if model.projector is not None:
        emb = model.projector.docs(emb)
    return emb, ids, windows


def shard_ranges(documents: int, shard_size: int) -> list[tuple[int, int]]:
    """The corpus's shards: consecutive ranges of `shard_size` documents (one .npy file each)."""
    return [(start, min(start + shard_size, documents)) for start in range(0, documents, shard_size)] or [(0, 0)]


def encode_corpus(checkpoint: str | Path, corpus: pd.DataFrame, cfg: EncodeConfig, out: Path) -> dict:
    """Encode every passage (FirstP) or window (MaxP) with the checkpoint, shard by shard, in this process (the
    stage task runs `encode_shard` per shard as its own task instead; the folder is the same)."""
    model, tokenizer, meta = load_checkpoint(checkpoint, pick_device())
    ids: list[str] = []
    windows: list[int] = []
    ranges = shard_ranges(len(corpus), cfg.shard_size)
    with tqdm(total=len(corpus), desc="encode corpus", unit="doc", dynamic_ncols=True) as bar:
        for shard, (start, stop) in enumerate(ranges):
            emb, shard_ids, shard_windows = encode_documents(model, tokenizer, meta, corpus.iloc[start:stop], cfg)
            bar.update(stop - start)
            np.save(out / EMBEDDINGS.format(shard), stored(emb, cfg, shard_ids))
            ids += shard_ids
            windows += shard_windows
            fault_point("encode-corpus", shard + 1)
    return write_doc_order(out, ids, windows, meta.document_mode == "maxp") | {
        "documents": len(corpus), "dim": model.dim if model.projector is None else model.projector.dim,
        "shards": len(ranges), "device": str(next(model.parameters()).device)}


SHARD_EMBEDDINGS = "emb.npy"  # an encode-shard folder: emb.npy, docids.txt (windows.txt), the rows of its documents
_loaded: dict[tuple[str, int], tuple[BiEncoder, PreTrainedTokenizerBase, ModelMeta]] = {}
_loading = threading.Lock()  # the async trainer's inferencer threads encode at the same time


def stored(emb: np.ndarray, cfg: EncodeConfig, ids: list[str]) -> np.ndarray:
    """The rows as the shards keep them (`encode.dtype`). float16 holds up to 65504: a model whose embeddings exceed it
    (unnormalised, large norms) is refused with the first document that does, rather than indexed as inf."""
    if not np.isfinite(emb).all():  # the model's own output: no storage setting helps
        row = int(np.flatnonzero(~np.isfinite(emb).all(axis=1))[0])
        raise AnceError(f"document '{ids[row]}': the model encodes it to NaN or inf (a diverged checkpoint, or "
                        "fp16 autocast overflowing: try encode.precision bf16 or fp32)")
    out = emb.astype(cfg.dtype)
    if cfg.dtype == "float16" and not np.isfinite(out).all():
        row = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise AnceError(f"document '{ids[row]}': its embedding has values beyond float16's range (max |x| "
                        f"{float(np.abs(emb[row]).max()):.4g} > 65504); set encode.dtype: float32")
    return out


def encode_shard(checkpoint: str | Path, corpus: pd.DataFrame, cfg: EncodeConfig, out: Path,
                 label: str = "encode shard") -> dict:
    """One shard of a corpus (a slice of documents) into an encode-shard folder. The checkpoint stays loaded in this
    process for the next shard (a worker encodes many); `release_checkpoint` frees it."""
    model, tokenizer, meta = _checkpoint_in_memory(checkpoint)
    total = None if meta.document_mode == "maxp" else len(corpus)  # MaxP: windows, counted as they are encoded
    with tqdm(total=total, desc=label, unit="psg", dynamic_ncols=True) as bar:
        emb, ids, windows = encode_documents(model, tokenizer, meta, corpus, cfg, progress=bar)
    np.save(out / SHARD_EMBEDDINGS, stored(emb, cfg, ids))
    return write_doc_order(out, ids, windows, meta.document_mode == "maxp") | {
        "documents": len(corpus), "dim": emb.shape[1], "device": str(next(model.parameters()).device),
        "pid": os.getpid(), "host": socket.gethostname()}


def _checkpoint_in_memory(checkpoint: str | Path) -> tuple[BiEncoder, PreTrainedTokenizerBase, ModelMeta]:
    path = Path(checkpoint).resolve()
    key = (str(path), (path / "model.safetensors").stat().st_mtime_ns)
    with _loading:
        if key not in _loaded:
            _loaded.clear()  # one model at a time (a thread still encoding with the last one keeps its reference)
            _loaded[key] = load_checkpoint(path, pick_device())
        return _loaded[key]


def release_checkpoint() -> None:
    with _loading:
        _loaded.clear()


def assemble_shards(shards: list[str | Path], out: Path) -> dict:
    """The encode folder of a corpus from its encode-shard folders, in corpus order: shard k's embeddings become
    emb_<k>.npy (a hard link where the file system allows, else a copy), the doc ids (and windows) concatenated."""
    ids: list[str] = []
    windows: list[int] = []
    for k, shard in enumerate(map(Path, shards)):
        link_or_copy(shard / SHARD_EMBEDDINGS, out / EMBEDDINGS.format(k))
        ids += read_docids(shard)
        if (shard / WINDOWS).is_file():
            windows += [int(x) for x in (shard / WINDOWS).read_text().split()]
    return write_doc_order(out, ids, windows, bool(windows)) | {"shards": len(shards)}


def write_doc_order(out: Path, ids: list[str], windows: list[int], maxp: bool) -> dict:
    """docids.txt (and windows.txt for MaxP) of an encode folder whose shards hold these rows in this order."""
    (out / DOCIDS).write_text("\n".join(ids) + "\n", encoding="utf-8")
    if maxp:
        (out / WINDOWS).write_text("\n".join(map(str, windows)) + "\n")
    return {"passages": len(ids), "document_mode": "maxp" if maxp else "firstp"}


def encode_queries(
    model: BiEncoder, tokenizer: PreTrainedTokenizerBase, texts: list[str], meta: ModelMeta, cfg: EncodeConfig
) -> np.ndarray:
    """(len(texts), dim) float32 of the queries as the checkpoint `meta` encodes them (its prefix, its length);
    projected when the checkpoint is a compressed one."""
    device = next(model.parameters()).device
    emb = encode_texts(model, tokenizer, meta.queries(texts), meta.query_max_length, cfg.batch_size,
                       autocast_dtype(cfg.precision, device), batch_tokens=cfg.batch_tokens)
    emb = emb if model.projector is None else model.projector.queries(emb)
    if not (finite := np.isfinite(emb).all(axis=1)).all():  # (faiss drops such a query from the run without a word)
        bad = np.flatnonzero(~finite)
        raise AnceError(f"{len(bad)} of {len(texts)} queries are encoded to NaN or inf, the first "
                        f"'{texts[bad[0]][:60]}' (a diverged checkpoint, or fp16 autocast overflowing: try "
                        "encode.precision bf16 or fp32)")
    return emb


def iter_shards(folder: str | Path) -> Iterator[np.ndarray]:
    """Each shard's rows in order, as float32 (whatever `encode.dtype` stored)."""
    for path in shard_paths(folder):
        yield np.load(path).astype(np.float32, copy=False)


def read_docids(folder: str | Path) -> list[str]:
    return id_lines(Path(folder) / DOCIDS)


def map_shards(folder: str | Path) -> Iterator[np.ndarray]:
    """An encode folder's shards in order as read-only memory maps (rows, h) in the dtype they were saved in: a
    caller holds what it slices out, not the corpus (compression's PCA reads them a chunk of rows at a time)."""
    for path in shard_paths(folder):
        yield np.load(path, mmap_mode="r")
