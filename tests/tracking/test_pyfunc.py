"""Every registered version is an MLflow model that encodes text (tracking/pyfunc.py): loaded with
`mlflow.pyfunc.load_model` and served by a real `mlflow models serve` process on 127.0.0.1, run with docs/serving.md's
commands. Its embeddings are the pipeline's own (ance_core.export.encoder.Encoder), compressed versions encode to their
compressed dimension, and bad requests get a 400 with a message."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from ance_core.compression.conae import Projector
from ance_core.export.encoder import Encoder
from ance_core.export.hybrid import HybridSearch, copy_package
from ance_core.modeling.model import model_files, write_compressed_checkpoint
from ance_core.pipeline.report import DEV_KEY
from tests.tiny import REPO, free_port, random_head_checkpoint, wait_answering

QUERIES = ["does vitamin D lower cancer risk", "a query far longer than the eight tokens a tiny query keeps " * 3]
PASSAGES = ["Vitamin D supplementation and cancer incidence: a randomized trial", "short", "x " * 100]
COMPRESSED_DIM = 8


def _register(tracker, name: str, label: str, checkpoint: Path, dev: float, retrieval: Path | None = None) -> None:
    from tracking.registry import register_models
    from tracking.uploads import log_checkpoint

    run = tracker.start_run(label)
    log_checkpoint(tracker, run, checkpoint, retrieval)
    metrics = {"ndcg_at_10": 0.25, DEV_KEY: dev}
    register_models(tracker, name, [(label, run, metrics)], "scifact", "test", candidate=label, dev_setting="0.2/42")
    tracker.end_run(run)


@pytest.fixture(scope="module")
def registry(tiny_model, tmp_path_factory):
    """Two versions of ance-scifact (the second the champion) and a compressed one, in an embedded store."""
    from tracking.client import Tracker

    tmp = tmp_path_factory.mktemp("serving")
    first = random_head_checkpoint(tiny_model, tmp / "first")
    champion = random_head_checkpoint(tiny_model, tmp / "champion", pooling="cls")
    compressed = tmp / "compressed"
    write_compressed_checkpoint(champion, Projector.truncation(Encoder(champion).dim, COMPRESSED_DIM), compressed)
    package = _retrieval_package(champion, tmp)
    searchable = tmp / "searchable"  # the champion as its version holds it: with its retrieval package
    shutil.copytree(champion, searchable)
    copy_package(package, searchable)
    tracker = Tracker(tmp / "work", "ance-train")
    _register(tracker, "ance-scifact", "warm-up", first, 0.1)
    _register(tracker, "ance-scifact", "ANCE round 1", champion, 0.2, package)
    _register(tracker, "ance-scifact-compressed", "conae-8", compressed, 0.1)
    return {"uri": tracker.uri, "work": tmp / "work", "champion": champion, "compressed": compressed,
            "searchable": searchable}


def _retrieval_package(checkpoint: Path, tmp: Path) -> Path:
    """A hybrid result's retrieval package (ance_core/export/hybrid.py) over a 30-passage corpus."""
    from ance_core.export.hybrid import write_package
    from ance_core.modeling.model import load_checkpoint
    from ance_core.retrieval.bm25 import BM25
    from ance_core.retrieval.config import BM25Config, EncodeConfig
    from ance_core.retrieval.encode import encode_documents
    from ance_core.retrieval.fusion import Fusion
    from tests.tiny import training_tables

    corpus = training_tables()[1]
    model, tokenizer, meta = load_checkpoint(checkpoint)
    emb, ids, _ = encode_documents(model, tokenizer, meta, corpus, EncodeConfig(precision="fp32"))
    (tmp / "encode").mkdir()
    np.save(tmp / "encode" / "emb_00000.npy", emb.astype(np.float16))
    (tmp / "encode" / "docids.txt").write_text("\n".join(ids) + "\n")
    (tmp / "bm25").mkdir()
    BM25.build([corpus], BM25Config(), spill=tmp / "bm25").save(tmp / "bm25")
    write_package(tmp / "package", tmp / "encode", tmp / "bm25", BM25Config(), Fusion("rrf"))
    return tmp / "package"


@pytest.fixture
def tracking_uri(registry, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry["uri"])
    return registry["uri"]


def test_a_registered_version_loads_as_a_pyfunc_model_that_encodes_queries_and_passages(registry, tracking_uri):
    import mlflow

    model = mlflow.pyfunc.load_model("models:/ance-scifact@champion")
    encoder = Encoder(registry["champion"])
    queries = model.predict(QUERIES, params={"kind": "query"})
    assert queries.dtype == np.float32 and queries.shape == (2, encoder.dim)
    np.testing.assert_allclose(queries, encoder.encode(QUERIES, kind="query"), atol=1e-5)
    passages = model.predict(PASSAGES)  # kind defaults to passage
    np.testing.assert_allclose(passages, encoder.encode(PASSAGES, kind="passage"), atol=1e-5)
    assert not np.allclose(model.predict(QUERIES[1:]), queries[1:], atol=1e-3)  # a passage is cut later than a query
    schema = model.metadata.get_output_schema().to_dict()[0]
    assert list(schema["tensor-spec"]["shape"]) == [-1, encoder.dim]
    assert model.metadata.get_params_schema().to_dict() == [
        {"name": "kind", "type": "string", "default": "passage", "shape": None},
        {"name": "k", "type": "long", "default": 10, "shape": None},
        {"name": "mode", "type": "string", "default": "hybrid", "shape": None}]


def test_a_hybrid_results_version_searches_as_the_run_did_and_another_says_it_cannot(registry, tracking_uri):
    import mlflow
    from mlflow.exceptions import MlflowException

    from ance_core.export.hybrid import HybridSearch

    model = mlflow.pyfunc.load_model("models:/ance-scifact@champion")
    searcher = HybridSearch(registry["searchable"])
    for mode in ("hybrid", "dense", "bm25"):
        hits = model.predict(QUERIES, params={"kind": "search", "k": 3, "mode": mode})
        assert list(hits.columns) == ["query", "rank", "doc_id", "score"]
        pd.testing.assert_frame_equal(hits, searcher.search(QUERIES, 3, mode), check_exact=False, atol=1e-5)
    assert len(model.predict(QUERIES, params={"kind": "search", "k": 3})) == 6  # both queries have 3 fused hits
    pd.testing.assert_frame_equal(model.predict(QUERIES, params={"kind": "search", "k": None}),  # (a TypeError)
                                  model.predict(QUERIES, params={"kind": "search"}))  # the default, 10
    from tracking.pyfunc import EmbeddingModel

    for k in ("3", 2.5, True):  # (the served model is given what its schema lets through; the class, anything)
        with pytest.raises(MlflowException, match=r"k .*: give the number of hits as a whole number"):
            EmbeddingModel(registry["searchable"]).predict(QUERIES, params={"kind": "search", "k": k})
    with pytest.raises(MlflowException, match="kind 'hits': use one of query, passage, or search"):
        model.predict(QUERIES, params={"kind": "hits"})
    for kind in ("query", "search"):  # (valid JSON: "\ud800" arrives as a lone surrogate; it was a TypeError)
        with pytest.raises(MlflowException, match=r"text 1 is not valid Unicode text: half of a surrogate pair "
                                                  r"\(\\ud800\) at character 3"):
            model.predict(["fine", "abc\ud800"], params={"kind": kind})
    plain = mlflow.pyfunc.load_model("models:/ance-scifact/1")
    with pytest.raises(MlflowException, match="this version has no retrieval package .*: only a version whose run's "
                       "result was a hybrid row can search") as refused:
        plain.predict(QUERIES, params={"kind": "search"})
    assert "/" not in str(refused.value).split("(")[0], refused.value  # (not MLflow's download folder: a client
    # cannot read it)


def test_a_served_version_searches_after_its_download_folder_is_emptied(registry, tmp_path, capfd):
    """`mlflow models serve` loads a version from a download folder in /tmp: the retrieval package loaded at the first
    search failed once a cleaner had emptied it. A search of many queries prints no progress bar into the server's
    log."""
    from tracking.pyfunc import EmbeddingModel

    downloaded = tmp_path / "model"
    shutil.copytree(registry["searchable"], downloaded)
    model = EmbeddingModel(downloaded)
    shutil.rmtree(downloaded / "retrieval")
    many = [f"{QUERIES[0]} {i}" for i in range(150)]
    capfd.readouterr()
    hits = model.predict(many, params={"kind": "search", "k": 2})
    pd.testing.assert_frame_equal(hits, HybridSearch(registry["searchable"]).search(many, 2), check_exact=False,
                                  atol=1e-5)
    assert "bm25" not in capfd.readouterr().err


def test_a_version_with_a_damaged_package_still_encodes_and_says_why_it_cannot_search(registry, tmp_path):
    from mlflow.exceptions import MlflowException

    from tracking.pyfunc import EmbeddingModel

    shutil.copytree(registry["searchable"], damaged := tmp_path / "model")
    (damaged / "retrieval" / "package.json").write_text("{")
    model = EmbeddingModel(damaged)
    assert model.predict(QUERIES, params={"kind": "query"}).shape[0] == 2
    with pytest.raises(MlflowException, match=r"^this version/retrieval: a damaged retrieval package \(JSONDecode"):
        model.predict(QUERIES, params={"kind": "search"})


def test_mlflows_scoring_app_hands_the_request_to_the_model_as_sent(registry, tracking_uri):
    """MLflow's scoring app (what `mlflow models serve` runs), in this process. With a string column as the input
    schema, MLflow turned a request's values into strings first: a null was encoded as the text "None", a list as its
    first item, a (query_id, text) frame as its ids, each answered 200."""
    import mlflow
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model("models:/ance-scifact@champion")
    assert model.metadata.get_input_schema() is None
    client = TestClient(scoring_server.init(model))
    encoder = Encoder(registry["champion"])

    def post(body: dict):
        return client.post("/invocations", json=body)

    for inputs, says in ((["a", None], "text 1 is missing (null)"), ([["a", "b"]], "text 0 is a list"),
                         ([None], "text 0 is missing (null)")):
        answer = post({"inputs": inputs, "params": {"kind": "query"}})
        assert answer.status_code == 400 and says in answer.text, (inputs, answer.status_code, answer.text)
    frame = {"dataframe_split": {"columns": ["query_id", "text"], "data": [["q1", QUERIES[0]]]}}
    answer = post(frame | {"params": {"kind": "query"}})
    assert answer.status_code == 400 and "the input has 2 columns (query_id, text)" in answer.text, answer.text
    answer = post({"inputs": ["cancer", " "], "params": {"kind": "search", "k": 2}})
    assert answer.status_code == 400 and "text 1 is empty" in answer.text, answer.text
    for inputs in (QUERIES[0], [QUERIES[0]]):  # one string, or a list of one
        answer = post({"inputs": inputs, "params": {"kind": "query"}})
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.array(answer.json()["predictions"], dtype=np.float32),
                                   encoder.encode(QUERIES[:1], kind="query"), atol=1e-5)
    one_column = {"dataframe_split": {"columns": ["text"], "data": [[QUERIES[0]]]}, "params": {"kind": "query"}}
    assert post(one_column).status_code == 200


def test_searches_at_once_share_one_searcher(registry, monkeypatch):
    """MLflow's scoring server predicts in threads: six first search requests at once built six searchers (the
    corpus's embeddings and the BM25 index loaded six times). The searcher is built once, with the model."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import ance_core.export.hybrid as hybrid
    from tracking.pyfunc import EmbeddingModel

    built, real = [], hybrid.HybridSearch

    def counted(*args, **kwargs):
        built.append(threading.get_ident())
        time.sleep(0.2)  # (a load that takes a while: the other requests arrive during it)
        return real(*args, **kwargs)

    monkeypatch.setattr(hybrid, "HybridSearch", counted)
    model = EmbeddingModel(registry["searchable"])
    assert len(built) == 1  # (with the model)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: model.predict(QUERIES[:1], params={"kind": "search", "k": 2}), range(6)))
    assert len(built) == 1 and all(a.equals(answers[0]) for a in answers)  # (no search builds one)


def test_a_compressed_version_encodes_to_its_compressed_dimension(registry, tracking_uri):
    import mlflow

    model = mlflow.pyfunc.load_model("models:/ance-scifact-compressed/1")
    encoder = Encoder(registry["compressed"])
    for kind, texts in (("query", QUERIES), ("passage", PASSAGES)):
        out = model.predict(texts, params={"kind": kind})
        assert out.shape == (len(texts), COMPRESSED_DIM)
        np.testing.assert_allclose(out, encoder.encode(texts, kind=kind), atol=1e-5)
    from mlflow.exceptions import MlflowException

    # why it cannot search: not "only a hybrid result's version can", which a hybrid result compressed is too
    with pytest.raises(MlflowException, match=r"no retrieval package \(retrieval/\): a compressed model \(ConAE or "
                       "PCA\) is served without one; kind query or passage encodes"):
        model.predict(QUERIES, params={"kind": "search"})


def test_the_logged_model_files_do_not_mix_with_the_checkpoint(registry, tmp_path, monkeypatch):
    """The downloaded version is a checkpoint with its MLflow description beside it; the checkpoint's files (what a
    compressed copy or an export copies) stay the same."""
    from tracking.registry import download_registered_model

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder, _ = download_registered_model("models:/ance-scifact@champion", tmp_path, registry["work"])
    assert (Path(folder) / "MLmodel").is_file() and (Path(folder) / "requirements.txt").is_file()
    assert [p.name for p in model_files(folder)] == [p.name for p in model_files(registry["champion"])]
    requirements = (Path(folder) / "requirements.txt").read_text()
    assert re.search(r"^torch==\S+$", requirements, re.M) and re.search(r"^mlflow==\S+$", requirements, re.M)
    assert "+" not in requirements  # (torch==2.13.0+cpu is on no package index: the environment could not be built)
    assert {"pyarrow", "tqdm", "faiss-cpu"} <= {line.split("==")[0] for line in requirements.splitlines()}


def _readme_commands() -> tuple[str, str, str]:
    """The manual's three commands from a registered model to a served endpoint."""
    text = (REPO / "docs" / "serving.md").read_text()
    section = text.split("## As an MLflow model, served", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.strip().splitlines()]
    assert len(lines) == 3, lines
    return lines[0], lines[1], lines[2]


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_the_pipelines_embeddings(registry):
    export, serve, curl = _readme_commands()
    # the environment comes first: `mlflow models serve` starts `uvicorn` from the PATH
    assert export == ". .venv/bin/activate; export MLFLOW_TRACKING_URI=sqlite:///$PWD/work/mlflow.db"
    port = free_port()
    serve_args = shlex.split(serve.removesuffix("&").strip())
    assert serve_args[:3] == ["mlflow", "models", "serve"] and "--env-manager" in serve_args
    serve_args[serve_args.index("-p") + 1] = str(port)
    curl_args = shlex.split(curl)
    request = curl_args[curl_args.index("-d") + 1]
    url = f"http://127.0.0.1:{port}/invocations"
    assert curl_args[curl_args.index("-s") + 1] == "127.0.0.1:5001/invocations"
    venv = Path(sys.executable).parent  # what `. .venv/bin/activate` puts first
    env = os.environ | {"MLFLOW_TRACKING_URI": registry["uri"], "MLFLOW_DISABLE_TELEMETRY": "true",
                        "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv.parent)}
    serve_args[0] = shutil.which("mlflow", path=env["PATH"])
    log = registry["work"].parent / f"serve-{port}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(serve_args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # a busy 2-core machine: importing torch and loading the model take a while
        wait_answering(f"http://127.0.0.1:{port}/ping", server, "mlflow models serve", 600, log)
        headers = {"Content-Type": "application/json"}
        encoder = Encoder(registry["champion"])
        answer = httpx.post(url, content=request, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        texts = json.loads(request)["inputs"]
        np.testing.assert_allclose(np.array(answer.json()["predictions"], dtype=np.float32),
                                   encoder.encode(texts, kind="query"), atol=1e-5)
        answer = httpx.post(url, json={"inputs": PASSAGES}, timeout=120)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.array(answer.json()["predictions"], dtype=np.float32),
                                   encoder.encode(PASSAGES, kind="passage"), atol=1e-5)
        for bad, says in ((b'{"inputs": ["unclosed', "Invalid input"),
                          ({"inputs": QUERIES, "params": {"kind": "document"}}, "kind 'document': use one of query"),
                          ({"texts": QUERIES}, "inputs"),
                          ({"inputs": ["a", None]}, "text 1 is missing (null)")):
            answer = (httpx.post(url, content=bad, headers=headers, timeout=120) if isinstance(bad, bytes)
                      else httpx.post(url, json=bad, timeout=120))
            assert 400 <= answer.status_code < 500 and says in answer.text, (bad, answer.status_code, answer.text)
        assert httpx.post(url, json={"inputs": PASSAGES[:1]}, timeout=120).status_code == 200  # still serving
        # the champion carries a retrieval package: it searches, one record per hit
        answer = httpx.post(url, json={"inputs": QUERIES[:1], "params": {"kind": "search", "k": 2}}, timeout=120)
        assert answer.status_code == 200, answer.text
        expected = HybridSearch(registry["searchable"]).search(QUERIES[:1], 2)
        assert [r["doc_id"] for r in answer.json()["predictions"]] == expected["doc_id"].tolist()
    finally:
        _stop(server)


def _stop(server: subprocess.Popen) -> None:
    """The server and its workers (their own process group)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
