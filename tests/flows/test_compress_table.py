"""The compression table and its MLflow record: the baseline row, IVF-PQ options checked before any training, the
registry fed only with delivered checkpoints, and runs ended when the logging is interrupted (the embedded store)."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from ance_core.artifacts import ArtifactRef
from ance_core.compression.conae import PROJECTOR_FILE
from ance_core.compression.config import CompressConfig
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.retrieval.ann import check_ann_options
from flows import compress as flow
from tracking.client import Tracker


def _row(method: str, dim: int, index: str, ndcg: float, size: int, folder: Path | None = None) -> dict:
    ref = ArtifactRef(str(folder), "x") if folder else None
    return {"method": method, "dim": dim, "index": index, "compress": ref, "checkpoint": ref or ArtifactRef("t", "t"),
            "ndcg_at_10": ndcg, "mrr_at_10": ndcg, "recall_at_100": ndcg, "index_bytes": size,
            "latency_batched_ms": 0.1, "latency_single_ms": 0.2}


def test_quality_and_size_are_against_the_teachers_flat_index_whatever_the_order():
    rows = [_row("teacher", 384, "hnsw", 0.5, 1200), _row("teacher", 384, "flat", 0.4, 1000),
            _row("pca", 128, "flat", 0.3, 333)]
    table = flow.compression_table(rows, 64).splitlines()
    assert "| +25.0% | 1,200 | 1.20× |" in table[2] and "| -25.0% | 333 | 0.33× |" in table[4]
    zero = flow.compression_table([_row("teacher", 384, "flat", 0.0, 1000), _row("pca", 128, "flat", 0.0, 333)], 64)
    assert "| n/a | 333 | 0.33× |" in zero  # a teacher that scores 0 is no ratio, not a ZeroDivisionError


def test_ivfpq_options_that_cannot_be_built_are_refused_before_any_training():
    with pytest.raises(ValidationError, match=r"pq_dims_per_code 8 does not divide dims \[100\]"):
        CompressConfig(dims=[100, 64], index_types=["flat", "ivfpq"], pq_dims_per_code=8)
    CompressConfig(dims=[100], index_types=["flat"], pq_dims_per_code=8)  # no IVF-PQ: nothing to divide
    ivfpq = CompressConfig(dims=[64], index_types=["ivfpq"], ivf_nlist=200)
    with pytest.raises(AnceError, match="ivf_nlist 200 is more inverted lists than the corpus has vectors \\(100\\)"):
        check_ann_options(ivfpq, [384, 64], 100)
    with pytest.raises(AnceError, match="does not divide the dimension 30"):
        check_ann_options(CompressConfig(dims=[64], index_types=["ivfpq"]), [30, 64], 1000)
    with pytest.raises(AnceError, match="at least 2 vectors"):
        check_ann_options(CompressConfig(dims=[64], index_types=["ivfpq"]), [384, 64], 1)
    check_ann_options(ivfpq, [384, 64], 200)


@pytest.fixture
def logged(tmp_path):
    folder = tmp_path / "conae-64"
    folder.mkdir()
    (folder / PROJECTOR_FILE).write_bytes(b"projector")
    result = {"checkpoint": "t", "files": str(tmp_path), "split": "test",
              "rows": [_row("teacher", 384, "flat", 0.5, 1000), _row("conae", 64, "flat", 0.4, 200, folder)]}
    for name in (flow.COMPRESSION_MD, flow.COMPRESSION_CSV):
        (tmp_path / name).write_text("table")
    return Tracker(tmp_path / "work", "compress"), result


def test_a_conae_checkpoint_that_did_not_arrive_is_not_registered(logged, monkeypatch):
    tracker, result = logged
    registered = []
    monkeypatch.setattr(flow, "log_checkpoint", lambda *a, **k: False)  # its files kept in the spool
    monkeypatch.setattr(flow, "register_models", lambda t, name, versions, *a, **k: registered.append(versions) or {})
    out = flow.log_compression(tracker, None, result, CompressConfig(), DataConfig(), {})
    assert registered == [[]]  # (registered before: a version that downloads as an empty folder)
    assert tracker.client.get_run(out["run_id"]).info.status == "FINISHED"


def test_an_interrupted_compression_record_ends_its_runs_killed(logged, monkeypatch):
    tracker, result = logged

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(flow, "log_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        flow.log_compression(tracker, None, result, CompressConfig(), DataConfig(), {})
    runs = tracker.client.search_runs([tracker.experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED", "KILLED"}
    assert {r.info.run_name for r in runs if r.info.status == "KILLED"} == {"compression", "conae-64 flat"}


def test_a_run_that_compresses_the_model_it_will_train_is_not_refused_up_front(tiny_model):
    """The check that refuses a maxp checkpoint before any work read the meta of whatever it was given: a pipeline run
    with compression, which checks its pretrained model (no ance_model.json yet), was refused before it started (found
    by a review of the change that added it)."""
    from ance_core.compression.config import CompressConfig
    from flows.compress import check_compression

    check_compression(str(tiny_model), CompressConfig(dims=[8]), 200)
