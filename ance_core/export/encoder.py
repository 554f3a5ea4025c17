"""A trained checkpoint as a text encoder, for use outside the pipeline:

    encoder = Encoder("work/train/<key>")                    # or a registered version's downloaded folder
    q = encoder.encode(["what causes fever?"], kind="query")   # (1, dim) float32
    d = encoder.encode(passages, kind="passage")              # score = q @ d.T (dot product, as the pipeline)

A query is cut to the checkpoint's `query_max_length` tokens, a passage to its `passage_max_length` (FirstP: the
pipeline encodes a corpus document as its title and text joined by a space, `ance_core.data.dataset.passage_texts`). A
compressed checkpoint projects queries and passages to its compressed dimension (their two projections differ). A
MaxP checkpoint scores a document by the best of its windows: encode the windows as passages and take the maximum.

The MLflow model of a registered version (tracking/pyfunc.py) encodes through this class; so does that of an ONNX
export folder (`ance export --format onnx`), on onnxruntime.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ance_core.errors import AnceError
from ance_core.modeling.config import Precision
from ance_core.modeling.devices import autocast_dtype, pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.retrieval.encode import encode_texts

KINDS = ("query", "passage")


BACKENDS = ("auto", "torch", "onnx")


class Encoder:
    def __init__(self, checkpoint: str | Path, device: str = "auto", precision: Precision = "fp32",
                 batch_size: int = 64, backend: str = "auto"):
        """`precision` fp32 (the default) gives the embeddings the pipeline's evaluation would compute in fp32;
        `auto` is bf16 on a CPU with bf16 in hardware (about 1.7x faster; fp32 on one without) and on GPUs that have
        it, else fp16. `backend` auto: the ONNX model an export folder serves (`ance export --format onnx`:
        onnxruntime on the CPU), else PyTorch; torch or onnx to choose."""
        from ance_core.export.onnx import OnnxEncoder, served_file

        if backend not in BACKENDS:
            raise AnceError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
        self.checkpoint = Path(checkpoint)
        self.batch_size = batch_size
        self.onnx = None
        if backend == "onnx" or (backend == "auto" and served_file(checkpoint) is not None):
            self.onnx = OnnxEncoder(checkpoint, batch_size=batch_size)
            self.meta = self.onnx.meta
            return
        self.model, self.tokenizer, self.meta = load_checkpoint(checkpoint, pick_device(device))
        self.device = next(self.model.parameters()).device
        self.dtype = autocast_dtype(precision, self.device)

    @property
    def dim(self) -> int:
        """The embedding size: the compressed dimension for a compressed checkpoint."""
        if self.onnx is not None:
            return self.onnx.dim
        return self.model.dim if self.model.projector is None else self.model.projector.dim

    def encode(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
        """(len(texts), dim) float32 embeddings of `texts` as queries or as passages, in input order."""
        if kind not in KINDS:
            raise AnceError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
        texts = check_texts(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        query = kind == "query"
        max_length = self.meta.query_max_length if query else self.meta.passage_max_length
        texts = self.meta.queries(texts) if query else self.meta.passages(texts)  # the checkpoint's prefixes
        if self.onnx is not None:
            return self.onnx.encode_texts(texts, max_length)
        emb = encode_texts(self.model, self.tokenizer, texts, max_length, self.batch_size, self.dtype)
        projector = self.model.projector
        if projector is None:
            return emb
        return projector.queries(emb) if query else projector.docs(emb)


def check_texts(texts: Sequence) -> list[str]:
    """The texts of a request as a list; one that is no string is an AnceError naming it (a JSON null arrives as None
    or NaN: "missing")."""
    texts = list(texts)
    bad = next((k for k, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        value = texts[bad]
        missing = value is None or (isinstance(value, float) and value != value)
        raise AnceError(f"text {bad} is missing (null)" if missing
                        else f"text {bad} is a {type(value).__name__}, not a string")
    for k, text in enumerate(texts):  # (JSON's "\ud800" is a valid request; the tokenizer's error was a TypeError)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            half = f"\\u{ord(text[e.start]):04x}"
            raise AnceError(f"text {k} is not valid Unicode text: half of a surrogate pair ({half}) at character "
                            f"{e.start}") from None
    return texts
