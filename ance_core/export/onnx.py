"""A checkpoint's encoder in ONNX, for serving on CPU with onnxruntime (issue 43): `ance export --format onnx`.

The export folder is the checkpoint's model files (so it stays a checkpoint: `Encoder`, `ance search --model`, the
MLflow model) plus

    onnx/model.onnx        the encoder with its pooling and head: (input_ids, attention_mask) -> (batch, dim) float32,
                           batch and sequence length dynamic (torch.onnx, opset 17)
    onnx/model_int8.onnx   with --int8: the same with its matrix products' weights quantised to int8 per output
                           channel (onnxruntime's dynamic quantisation: activations quantised per batch at run time;
                           the embedding tables stay fp32)
    onnx/serving.json      which of the two serves (`Encoder(..., backend="auto")`, the MLflow model)

A query is tokenized as the pipeline does (the checkpoint's prefixes and max lengths) and padded per batch;
embeddings match the PyTorch model's in fp32 to float rounding (the export checks it, and `ance export` prints the
largest difference). Compressed checkpoints (ConAE projectors) are not exported. From a sentence-transformers export
folder, its checkpoint files alone are taken (its module folders are not: the ONNX folder is no such model).
"""

import json
import logging
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ance_core.artifacts import atomic_folder
from ance_core.errors import AnceError
from ance_core.export.sentence_transformers import ST_FILES, check_target
from ance_core.modeling.model import checkpoint_tokenizer, load_checkpoint, model_files, read_meta

ONNX_DIR = "onnx"
FP32, INT8 = "model.onnx", "model_int8.onnx"
SERVING = "serving.json"
OPSET = 17
MAX_FP32_DIFFERENCE = 1e-3  # an fp32 export's largest difference from PyTorch, of the largest value (float rounding)
MIN_INT8_COSINE = 0.9  # an int8 export's lowest cosine with PyTorch's embedding (a dropped mask is far below)
CHECK = ["what is a dense retriever?", "hard negatives are mined from an approximate nearest-neighbour index of the "
         "corpus, refreshed as the model learns", "x"]


def _require_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise AnceError("the ONNX export and its serving need onnx and onnxruntime: pip install onnx onnxruntime "
                        "(the project's `onnx` extra)") from None
    return onnxruntime


def export_onnx(checkpoint: str | Path, out: str | Path, int8: bool = False, force: bool = False,
                finish: Callable[[Path], None] | None = None) -> dict[str, Any]:
    """Write `checkpoint` as an ONNX export folder `out`, atomically (`finish(folder)` adds what else it holds, e.g.
    the MLflow model files, before it is put in place); returns what was written and the largest difference between
    the served model's embeddings and PyTorch's on a few texts."""
    _require_onnxruntime()
    checkpoint, out = Path(checkpoint), Path(out)
    check_target(out, force, checkpoint)
    model, tokenizer, meta = load_checkpoint(checkpoint, "cpu")
    if model.projector is not None:
        raise AnceError(f"{checkpoint}: a compressed checkpoint (ConAE projector); export its teacher")
    model.eval()
    with atomic_folder(out) as tmp:
        for src in model_files(checkpoint):
            if src.name not in ST_FILES:
                shutil.copy2(src, tmp / src.name)
        folder = tmp / ONNX_DIR
        folder.mkdir()
        sample = tokenizer(CHECK[:2], padding=True, return_tensors="pt")
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer's warnings (a Python value read from a tensor "might not generalize"): the export is
            # checked against PyTorch's embeddings below, on other inputs, and refused when they differ
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export")  # (on
            # purpose: dynamo=False below)
            torch.onnx.export(model, (sample["input_ids"], sample["attention_mask"]), str(folder / FP32),
                              input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                            "attention_mask": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
        served = FP32
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # per output channel, the matrix products only (the embedding tables stay fp32): the best of four ways on
            # SciFact's dev split, -0.0035 nDCG@10 on its test queries (BENCHMARKS.md)
            before = logging.root.manager.disable
            logging.disable(max(before, logging.WARNING))  # (its advice to pre-process the model, on the root logger)
            try:
                quantize_dynamic(str(folder / FP32), str(folder / INT8), weight_type=QuantType.QInt8,
                                 per_channel=True, op_types_to_quantize=["MatMul"])
            finally:
                logging.disable(before)
            served = INT8
        (folder / SERVING).write_text(json.dumps({"serve": served, "opset": OPSET}) + "\n")
        texts = meta.queries(CHECK)
        with torch.no_grad():
            batch = tokenizer(texts, padding=True, truncation=True, max_length=meta.query_max_length,
                              return_tensors="pt")
            expected = model(batch["input_ids"], batch["attention_mask"]).numpy()
        got = OnnxEncoder(tmp).encode_texts(texts, meta.query_max_length)
        difference = float(np.abs(got - expected).max() / np.abs(expected).max())
        cosine = float(((got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)).min())
        if (cosine < MIN_INT8_COSINE) if int8 else (difference > MAX_FP32_DIFFERENCE):  # nothing is put in place
            raise AnceError(f"{checkpoint}: the ONNX export's embeddings are not PyTorch's (largest difference "
                            f"{difference:.1e} of the largest value, lowest cosine {cosine:.4f}; allowed: "
                            + (f"cosine ≥ {MIN_INT8_COSINE} for int8" if int8 else f"{MAX_FP32_DIFFERENCE:.0e} for "
                               "fp32") + f"): an exporter problem with this model (torch {torch.__version__}); "
                            "serve the checkpoint with PyTorch")
        if finish is not None:
            finish(tmp)
    return {"out": str(out), "format": "onnx", "serve": f"{ONNX_DIR}/{served}", "dim": int(expected.shape[1]),
            "max_relative_difference": difference, "query_max_length": meta.query_max_length,
            "passage_max_length": meta.passage_max_length}


def served_file(folder: str | Path) -> Path | None:
    """The ONNX file an export folder serves, None for a plain checkpoint."""
    serving = Path(folder) / ONNX_DIR / SERVING
    if not serving.is_file():
        return None
    return Path(folder) / ONNX_DIR / json.loads(serving.read_text())["serve"]


class OnnxEncoder:
    """An export folder's ONNX model on onnxruntime's CPU provider: texts (prefixes already applied) to embeddings.
    `threads`: onnxruntime's intra-op threads (0: its default, every core)."""

    def __init__(self, folder: str | Path, file: str | Path | None = None, threads: int = 0, batch_size: int = 64):
        ort = _require_onnxruntime()
        from transformers import AutoConfig

        folder = Path(folder)
        path = Path(file) if file is not None else served_file(folder)
        if path is None or not path.is_file():
            raise AnceError(f"{folder}: not an ONNX export (no {ONNX_DIR}/{SERVING}): ance export --format onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        try:
            self.tokenizer = checkpoint_tokenizer(folder, AutoConfig.from_pretrained(folder).vocab_size)
        except (OSError, ValueError) as e:  # its config.json or tokenizer files missing or not what they should be
            raise AnceError(f"{folder}: a damaged ONNX export ({type(e).__name__}: {' '.join(str(e).split())[:300]}); "
                            "export it again") from None
        self.meta = read_meta(folder)
        self.batch_size = batch_size
        self.dim = int(self.session.get_outputs()[0].shape[1])  # (the export fixes it: only the batch is dynamic)

    def encode_texts(self, texts: Sequence[str], max_length: int) -> np.ndarray:
        """(len(texts), dim) float32, in input order; batches of texts of similar length, each padded to its
        longest."""
        texts = list(texts)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        parts: list[np.ndarray] = [np.empty(0)] * len(texts)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=max_length,
                                   return_tensors="np", return_token_type_ids=False)
            (emb,) = self.session.run(None, {"input_ids": batch["input_ids"].astype(np.int64),
                                             "attention_mask": batch["attention_mask"].astype(np.int64)})
            for row, vector in zip(rows, emb, strict=True):
                parts[row] = vector
        return np.stack(parts).astype(np.float32) if texts else np.empty((0, self.dim), dtype=np.float32)
