"""`ance export --format onnx [--int8]`: the exported encoder gives the checkpoint's query and passage embeddings on
onnxruntime (fp32: to float rounding; int8: close), the folder is still a checkpoint and an MLflow model that serves
the ONNX encoder, and bad input is one clear line."""

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from ance_cli.main import app
from ance_core.errors import AnceError
from ance_core.export.encoder import Encoder
from ance_core.export.onnx import FP32, INT8, ONNX_DIR, export_onnx, served_file
from tests.tiny import random_head_checkpoint

TEXTS = ["does vitamin D lower cancer risk", "x", "  Mice, blood disease!  ",
         *(" ".join(["cell protein gene expression in patients"] * k) for k in (1, 3, 9))]


def _invoke(args):
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx")
    checkpoint = random_head_checkpoint(tiny_model, folder / "checkpoint")
    code, output = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(folder / "onnx-int8"),
                            "--format", "onnx", "--int8"])
    assert code == 0, output
    return checkpoint, folder, output


@pytest.mark.parametrize("kind", ["query", "passage"])
def test_the_onnx_encoder_gives_the_checkpoints_embeddings(exported, kind):
    checkpoint, folder, _ = exported
    result = export_onnx(checkpoint, folder / f"onnx-{kind}")
    assert result["serve"] == f"{ONNX_DIR}/{FP32}" and result["max_relative_difference"] < 1e-4
    torch_emb = Encoder(checkpoint).encode(TEXTS, kind)
    onnx = Encoder(folder / f"onnx-{kind}")  # backend auto: the export folder's ONNX model
    assert onnx.onnx is not None and onnx.dim == torch_emb.shape[1]
    got = onnx.encode(TEXTS, kind)
    assert got.dtype == np.float32 and got.shape == torch_emb.shape
    np.testing.assert_allclose(got, torch_emb, rtol=1e-4, atol=1e-4 * np.abs(torch_emb).max())
    # the export folder is still a checkpoint: PyTorch on request gives the same
    np.testing.assert_allclose(Encoder(folder / f"onnx-{kind}", backend="torch").encode(TEXTS, kind), torch_emb,
                               rtol=1e-6, atol=1e-6)


def test_int8_serves_close_to_fp32_and_the_mlflow_model_serves_it(exported):
    import mlflow

    checkpoint, folder, output = exported
    out = folder / "onnx-int8"
    assert served_file(out) == out / ONNX_DIR / INT8 and (out / ONNX_DIR / FP32).is_file()
    assert "onnx/model_int8.onnx" in output and "mlflow models serve -m" in output
    torch_emb = Encoder(checkpoint).encode(TEXTS, "query")
    int8 = Encoder(out).encode(TEXTS, "query")
    assert not np.allclose(int8, torch_emb, atol=1e-6)  # quantised: not the fp32 model
    assert _cosines(int8, torch_emb).min() > 0.9
    model = mlflow.pyfunc.load_model(str(out))  # the MLmodel files the export wrote
    served = np.asarray(model.predict(TEXTS, params={"kind": "query"}))
    np.testing.assert_allclose(served, int8, rtol=1e-6, atol=1e-6)
    requirements = (out / "requirements.txt").read_text()
    assert "onnxruntime" in requirements


def test_bad_input_is_one_clear_line(exported, tmp_path):
    checkpoint, folder, _ = exported
    code, output = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "x"), "--int8"])
    assert code == 2 and "--int8 quantises an ONNX export: add --format onnx" in output
    code, output = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(folder / "onnx-int8"),
                            "--format", "onnx"])
    assert code == 2 and "exists and is not empty" in output
    code, output = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "y"),
                            "--format", "tflite"])
    assert code == 2 and "unknown export format 'tflite'" in output and "onnx" in output
    with pytest.raises(Exception, match="not an ONNX export"):
        Encoder(checkpoint, backend="onnx")
    damaged = tmp_path / "damaged"  # an export without its tokenizer.json: built anyway, every word [UNK]
    shutil.copytree(folder / "onnx-int8", damaged)
    (damaged / "tokenizer.json").unlink()
    with pytest.raises(AnceError, match=r"damaged checkpoint \(its tokenizer knows \d+ tokens, its model \d+"):
        Encoder(damaged, backend="onnx")
    (damaged / "config.json").unlink()
    with pytest.raises(AnceError, match="a damaged ONNX export"):
        Encoder(damaged, backend="onnx")


def test_an_export_that_fails_while_made_servable_leaves_nothing(exported, tmp_path):
    """The MLflow model files are written inside the export's atomic folder: a failure there (a review simulated it)
    left an ONNX folder without its MLmodel, not servable, that a re-run refused as not empty."""
    checkpoint, _, _ = exported

    def failing(folder):
        (folder / "MLmodel").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        export_onnx(checkpoint, tmp_path / "out", finish=failing)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_an_export_whose_embeddings_are_not_pytorchs_is_refused_and_leaves_nothing(exported, tmp_path, monkeypatch):
    """The check against PyTorch was only printed: an exporter that dropped the attention mask (simulated: the
    served model ignores it) would have been put in place and served."""
    from ance_core.errors import AnceError
    from ance_core.export import onnx

    checkpoint, _, _ = exported
    real = onnx.OnnxEncoder.encode_texts

    def maskless(self, texts, max_length):
        return real(self, [t + " and more words than it had" for t in texts], max_length)

    monkeypatch.setattr(onnx.OnnxEncoder, "encode_texts", maskless)
    with pytest.raises(AnceError, match="the ONNX export's embeddings are not PyTorch's"):
        export_onnx(checkpoint, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_retrieval_package_searches_with_an_onnx_export(exported, tmp_path):
    """HybridSearch read the encoder's PyTorch model (`encoder.model.projector`), which an ONNX export's encoder does
    not load: searching a package put into an export folder failed with an AttributeError."""
    from ance_core.export.hybrid import RETRIEVAL, HybridSearch, copy_package, write_package
    from ance_core.retrieval.bm25 import BM25
    from ance_core.retrieval.config import BM25Config
    from ance_core.retrieval.fusion import Fusion
    from tests.tiny import training_tables

    checkpoint, folder, _ = exported
    corpus = training_tables()[1]
    encode = tmp_path / "encode"
    encode.mkdir()
    np.save(encode / "emb_00000.npy", Encoder(checkpoint).encode(corpus["text"].tolist()).astype(np.float16))
    (encode / "docids.txt").write_text("\n".join(corpus["doc_id"]) + "\n")
    (tmp_path / "bm25").mkdir()
    BM25.build([corpus], BM25Config(), spill=tmp_path / "bm25").save(tmp_path / "bm25")
    write_package(tmp_path / "package", encode, tmp_path / "bm25", BM25Config(), Fusion("rrf"))
    export = export_onnx(checkpoint, tmp_path / "onnx")["out"]
    copy_package(tmp_path / "package", tmp_path / "onnx")
    copy_package(tmp_path / "package", tmp_path / "torch-copy")
    for path in checkpoint.iterdir():
        if path.is_file():
            (tmp_path / "torch-copy" / path.name).write_bytes(path.read_bytes())
    assert (tmp_path / "onnx" / RETRIEVAL).is_dir()
    by_onnx = HybridSearch(export).search(["cancer gene"], k=5)
    by_torch = HybridSearch(tmp_path / "torch-copy").search(["cancer gene"], k=5)
    assert by_onnx["doc_id"].tolist() == by_torch["doc_id"].tolist() and len(by_onnx) == 5


def test_an_onnx_export_of_a_sentence_transformers_export_is_no_broken_sentence_transformers_folder(exported,
                                                                                                  tmp_path):
    """A sentence-transformers export folder is also a checkpoint; its ONNX export copied its modules.json, settings
    and card but not the module folders they name, so SentenceTransformer(folder) failed on it (Pooling's missing
    embedding_dimension) while the card still described those modules."""
    from ance_core.export.sentence_transformers import ST_FILES, export_checkpoint

    checkpoint = exported[0]
    export_checkpoint(checkpoint, tmp_path / "st")
    export_onnx(tmp_path / "st", tmp_path / "onnx")
    assert not ST_FILES & {p.name for p in (tmp_path / "onnx").iterdir()}
    np.testing.assert_allclose(Encoder(tmp_path / "onnx").encode(TEXTS, "query"),
                               Encoder(checkpoint, backend="torch").encode(TEXTS, "query"), atol=1e-4, rtol=0)


def test_an_export_prints_nothing_of_the_tracer_nor_the_quantizer(exported, tmp_path, caplog):
    """A probe: `ance export --format onnx --int8` printed 7 lines of the tracer's warnings ("the exported graph will
    produce incorrect results", which the export's own check against PyTorch's embeddings answers) and the quantizer's
    advice on the root logger."""
    import logging
    import warnings

    import torch

    checkpoint, _, _ = exported
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        export_onnx(checkpoint, tmp_path / "again", int8=True)
    assert not [w for w in seen if issubclass(w.category, torch.jit.TracerWarning) or "ONNX export" in str(w.message)
                ], [str(w.message) for w in seen]
    assert not [r for r in caplog.records if r.name == "root"], [r.getMessage() for r in caplog.records]
    assert logging.root.manager.disable == logging.NOTSET  # (the quantizer's quiet ends with it, as it was)
