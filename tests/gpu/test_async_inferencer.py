"""The asynchronous inferencer's device (`refresh: async`, tasks/train_async.py). With two GPUs or more its thread takes
the last one (`AsyncNegatives.publish` makes it the thread's current CUDA device; `pick_device()`'s "cuda" and the
faiss index follow the current device) while the trainer keeps GPU 0, the paper's 1:1 allocation. With one GPU, or
the CPU standing in for it, the inferencer shares the trainer's device.

The trainer is the real `train` with the real `AsyncNegatives` (snapshot at step 2 of 4, `max_staleness` 1, so it
waits for the refresh and swaps its negatives in); only the inferencer's Prefect tasks are replaced by the core
functions they call (load the snapshot, encode the corpus, build and search the index), run in the inferencer thread
where `refresh_negatives` runs: Prefect runs a synchronous task's body in the calling thread."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import tasks.train_async
from ance_core.artifacts import NEGATIVES, ArtifactRef
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import load_checkpoint
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.encode import encode_corpus, encode_texts
from ance_core.retrieval.index import SearchIndex, build_index
from ance_core.training.config import TrainConfig
from tasks.train_async import AsyncNegatives

GPUS = torch.cuda.device_count()


def _current_cuda_device() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _train_with_async_refresh(start: Path, tables, folder: Path, monkeypatch) -> tuple[dict, set]:
    """Train 4 steps with one background refresh from the step-2 snapshot; returns what the inferencer thread saw
    and the trainer's current CUDA device at each step."""
    negatives, corpus, queries, relevant = tables
    seen: dict = {}

    def refresh_negatives(snapshot: ArtifactRef, round_: int, **_) -> dict[str, ArtifactRef]:
        seen["thread_device"] = _current_cuda_device()
        model, tokenizer, meta = load_checkpoint(snapshot.path, pick_device())
        seen["model_device"] = next(model.parameters()).device
        encoded, index_dir, mined = folder / "encode", folder / "index", folder / "mine"
        for f in (encoded, index_dir, mined):
            f.mkdir()
        seen["encode"] = encode_corpus(snapshot.path, corpus, EncodeConfig(batch_size=16, precision="fp32"), encoded)
        build_index(encoded, index_dir)
        index = SearchIndex(index_dir, IndexConfig())
        if index.on_gpu:
            import faiss

            on = index.index if hasattr(index.index, "getDevice") else faiss.downcast_index(index.index)
            seen["faiss_device"] = on.getDevice()
        query_vectors = encode_texts(model, tokenizer, queries["text"].tolist(), meta.query_max_length, 16, None)
        _, ids = index.search(query_vectors, 5)
        assert np.isin(ids, corpus["doc_id"]).all()
        negatives.to_parquet(mined / NEGATIVES)  # the same rows: only the swap matters here
        return {"mine": ArtifactRef(str(mined), f"mined-round-{round_}")}

    monkeypatch.setattr(tasks.train_async, "refresh_negatives", refresh_negatives)
    monkeypatch.setattr(tasks.train_async, "get_run_logger", lambda: logging.getLogger("ance"))
    out, work = folder / "trainer", folder / "work"
    out.mkdir()
    inferencer = AsyncNegatives(out, ArtifactRef(str(folder / "first"), "first"), {}, "trainer", str(work),
                                max_staleness=1, steps_per_round=2)
    trainer_devices = set()
    cfg = TrainConfig(max_steps=4, batch_size=3, learning_rate=1e-3, checkpoint_every=0, precision="fp32")
    tasks.train_async.train(start, negatives, corpus, queries, relevant, cfg, out,
                      callbacks=[lambda record: trainer_devices.add(_current_cuda_device())],
                      negatives_update=inferencer.update, snapshot_steps={2}, on_snapshot=inferencer.on_snapshot)
    report = inferencer.finish(rounds=2)
    assert report["refresh_errors"] == []
    assert [s["checkpoint_step"] for s in report["swaps"]] == [2]  # the refreshed negatives were swapped in
    return seen, trainer_devices


@pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA devices or more (found {GPUS}): the async inferencer takes the "
                    "last GPU, the trainer keeps GPU 0")
def test_async_inferencer_runs_on_the_last_gpu(device, start, tables, tmp_path, monkeypatch):
    last = GPUS - 1
    seen, trainer_devices = _train_with_async_refresh(start, tables, tmp_path, monkeypatch)
    assert trainer_devices == {device.index} and device.index != last
    assert seen["thread_device"] == last
    assert seen["model_device"] == torch.device("cuda", last)
    assert torch.device(seen["encode"]["device"]) == torch.device("cuda", last)
    assert seen.get("faiss_device", last) == last  # when faiss has GPU support
    assert torch.cuda.current_device() == device.index  # the inferencer's device did not leak into this thread


@pytest.mark.skipif(GPUS >= 2, reason="two GPUs or more: test_async_inferencer_runs_on_the_last_gpu covers them")
def test_async_inferencer_shares_the_only_device(device, start, tables, tmp_path, monkeypatch):
    seen, trainer_devices = _train_with_async_refresh(start, tables, tmp_path, monkeypatch)
    assert seen["model_device"] == device
    assert torch.device(seen["encode"]["device"]).type == device.type  # "cuda:0" on CUDA
    assert trainer_devices == {device.index} and seen["thread_device"] == device.index
    assert seen.get("faiss_device", device.index) == device.index
