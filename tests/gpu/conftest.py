"""The GPU suite (`make test-gpu`): the CUDA paths of encoding, the faiss index, bf16/fp16 training and its resume,
and the async inferencer's device. Every test here is marked `gpu` and is skipped where CUDA is absent (CI), unless
ANCE_GPU_TESTS_ON_CPU=1: then the tests run on the CPU in place of the GPU (to exercise their logic on a machine
without one), and the checks that only CUDA can run (fp16 loss scaling, faiss on the GPU) skip with their own reason.
"""

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model
from tests.tiny import training_tables

ON_CPU_ENV = "ANCE_GPU_TESTS_ON_CPU"
NO_CUDA = ("no CUDA device: the GPU suite runs on a GPU machine (make test-gpu); "
           f"{ON_CPU_ENV}=1 runs its logic on the CPU")
HERE = Path(__file__).resolve().parent

# cuBLAS is deterministic for a fixed workspace configuration (read when its first handle is made, after this file
# is imported); the training tests also ask torch for deterministic kernels (tests/gpu/test_train.py)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def cpu_stand_in() -> bool:
    return not torch.cuda.is_available() and os.environ.get(ON_CPU_ENV, "") not in ("", "0")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = None if torch.cuda.is_available() or cpu_stand_in() else pytest.mark.skipif(True, reason=NO_CUDA)
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            if skip is not None:  # first, so that its reason is the one reported
                item.add_marker(skip, append=False)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The CUDA device the tests run on (the current one, as `pick_device` picks it), or the CPU standing in for it
    under ANCE_GPU_TESTS_ON_CPU=1."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    assert cpu_stand_in(), "collection skips the GPU suite without CUDA"
    return torch.device("cpu")


@pytest.fixture
def faiss_gpu(device) -> int:
    """The faiss GPU the index goes to (the current CUDA device); skips where faiss cannot use the GPU, even when torch
    sees CUDA (faiss-cpu installed)."""
    import faiss

    if device.type != "cuda":
        pytest.skip(f"faiss on the GPU needs CUDA ({ON_CPU_ENV} runs the CPU-side checks only)")
    if not hasattr(faiss, "StandardGpuResources"):
        pytest.skip("faiss has no GPU support (faiss-cpu is installed; the GPU image installs faiss-gpu)")
    if faiss.get_num_gpus() == 0:
        pytest.skip("faiss sees no GPU (faiss.get_num_gpus() == 0) although torch sees CUDA")
    return device.index


@pytest.fixture(scope="module")
def start(tiny_model, tmp_path_factory) -> Path:
    """The tiny BERT's starting checkpoint."""
    out = tmp_path_factory.mktemp("start")
    init_model(ModelConfig(name=str(tiny_model)), out)
    return out


@pytest.fixture(scope="module")
def tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, set[str]]]:
    """`train`'s negatives, corpus, queries and relevant documents: 10 queries with 2 negatives each, 30 passages
    (tests/core/training/test_loop.py's)."""
    return training_tables()
