"""`ance export --format sentence-transformers`: the folder sentence-transformers loads gives the checkpoint's query and
passage encodings, is what sentence-transformers itself saves, evaluates as the checkpoint, and carries a model card;
bad input is one clear line."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ance_cli.main import app
from ance_core.export.sentence_transformers import _training, export_checkpoint
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint, model_files
from ance_core.retrieval.config import EncodeConfig, EvalConfig
from ance_core.retrieval.encode import encode_texts
from tests.tiny import random_head_checkpoint

ST_FILES = ["modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "1_Pooling/config.json",
            "2_Dense/config.json", "3_LayerNorm/config.json"]
TEXTS = ["does vitamin D lower cancer risk", "x", "  Mice, blood disease!  ",
         *(" ".join(["cell protein gene expression in patients"] * k) for k in (1, 3, 9))]


def _invoke(args):
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


@pytest.fixture(scope="module", params=["mean", "cls"])
def exported(request, tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"export-{request.param}")
    checkpoint = random_head_checkpoint(tiny_model, folder / "checkpoint", pooling=request.param)
    export_checkpoint(checkpoint, folder / "st")
    return checkpoint, folder / "st"


def test_sentence_transformers_gives_the_query_and_passage_encodings(exported):
    from sentence_transformers import SentenceTransformer

    checkpoint, folder = exported
    model, tokenizer, meta = load_checkpoint(checkpoint)
    queries = encode_texts(model, tokenizer, TEXTS, meta.query_max_length, 4, None)  # fp32
    passages = encode_texts(model, tokenizer, TEXTS, meta.passage_max_length, 4, None)
    assert np.abs(queries - passages).max() > 1e-3  # the long texts: the two lengths matter
    st = SentenceTransformer(str(folder), device="cpu")
    assert st.similarity_fn_name == "dot" and st.max_seq_length == meta.passage_max_length
    np.testing.assert_allclose(st.encode_query(TEXTS), queries, atol=1e-5, rtol=0)
    np.testing.assert_allclose(st.encode_document(TEXTS), passages, atol=1e-5, rtol=0)
    np.testing.assert_allclose(st.encode(TEXTS), passages, atol=1e-5, rtol=0)
    scores = st.similarity(st.encode_query(TEXTS[:2]), st.encode_document(TEXTS))
    np.testing.assert_allclose(scores.numpy(), queries[:2] @ passages.T, rtol=1e-4, atol=1e-4)


def test_the_folder_is_what_sentence_transformers_saves(exported, tmp_path):
    from sentence_transformers import SentenceTransformer

    checkpoint, folder = exported
    SentenceTransformer(str(folder), device="cpu").save(str(tmp_path))
    for name in ST_FILES:
        ours, theirs = (json.loads((f / name).read_text()) for f in (folder, tmp_path))
        if name == "sentence_bert_config.json":  # ours also keeps these two, which 6.2 reads but saves elsewhere
            assert ours.pop("max_seq_length") == 24 and ours.pop("model_kwargs") == {"add_pooling_layer": False}
        if name == "config_sentence_transformers.json":
            ours.pop("__version__"), theirs.pop("__version__")
        assert ours == theirs, name
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 24
    # the encoder's weights are the checkpoint's, byte for byte; the head is also kept for the ance commands
    for name in ("model.safetensors", "head.safetensors", "ance_model.json"):
        assert (folder / name).read_bytes() == (checkpoint / name).read_bytes()


def test_model_card_names_the_model_and_its_settings(exported):
    checkpoint, folder = exported
    card = (folder / "README.md").read_text()
    meta = json.loads((checkpoint / "ance_model.json").read_text())
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert json.dumps(meta, indent=2) in card  # the exact config
    assert f"{meta['pooling']} pooling" in card and "dot product" in card and "encode_query" in card
    assert "not recorded" in card and "No evaluation is recorded" in card  # nothing more is known of this one


def test_the_export_evaluates_as_the_checkpoint(tiny_model, tiny_scifact, tmp_path):
    """What `ance evaluate` runs (flows/evaluate.py: encode -> index -> retrieve -> evaluate, at the default
    encoding settings), once on the checkpoint and once on its export."""
    from ance_core.data.dataset import load_dataset
    from ance_core.modeling.model import checkpoint_digest, read_meta
    from ance_core.retrieval.encode import encode_corpus
    from ance_core.retrieval.evaluate import evaluate_run
    from ance_core.retrieval.index import build_index
    from ance_core.retrieval.search import dense_retrieve

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    export_checkpoint(checkpoint, tmp_path / "st")
    data = load_dataset(tiny_scifact)
    metrics = {}
    for name in ("checkpoint", "st"):
        model, emb, idx = tmp_path / name, tmp_path / f"{name}-emb", tmp_path / f"{name}-idx"
        emb.mkdir(), idx.mkdir()
        read_meta(model)  # what `ance evaluate` checks first
        encode_corpus(model, data.corpus, EncodeConfig(), emb)
        build_index(emb, idx)
        run = dense_retrieve(model, idx, data.split_queries("test"), EvalConfig().top_k)
        metrics[name] = evaluate_run(run, data.split_qrels("test"))[0]
    assert metrics["st"] == pytest.approx(metrics["checkpoint"], abs=1e-6) and metrics["st"]["recall_at_100"] > 0
    # the same content digest: a pipeline's cached stages of the checkpoint serve its export
    assert checkpoint_digest(tmp_path / "st") == checkpoint_digest(checkpoint)


def test_model_card_of_a_training_stage_has_its_stages_data_and_metrics(tiny_model, tmp_path):
    """A checkpoint found in a work folder: the card follows its stage manifests and the run's report."""
    from ance_core.artifacts import run_stage

    work = tmp_path / "work"
    model = run_stage(work, "model", {"name": "tiny", "pooling": "mean"}, {},
                      lambda out: init_model(ModelConfig(name=str(tiny_model)), out))
    data = run_stage(work, "data", {"format": "auto"}, {"content": "c"},
                     lambda out: {"documents": 200, "queries": 70, "splits": ["test", "train"]})
    mine = run_stage(work, "mine", {"mining": "sampler='ance'", "round": 1, "split": "train"},
                     {"run": "r", "data": data.digest}, lambda out: {"pairs": 33, "sampler": "ance"})

    def train(out):
        for src in model_files(model.path):
            shutil.copy2(src, out / src.name)
        return {"steps": 4, "pairs": 33}

    def report(out):
        (out / "results.json").write_text(json.dumps({"dataset": "scifact", "split": "test", "dev_split": "dev",
                                                      "results": rows}))

    trained = run_stage(work, "train", {"train": "learning_rate=0.001", "split": "train"},
                        {"checkpoint": model.digest, "negatives": mine.digest, "data": data.digest}, train)
    retrieved = run_stage(work, "retrieve", {"split": "test"}, {"checkpoint": trained.digest}, lambda out: None)
    evaluated = run_stage(work, "evaluate", {"split": "test"}, {"run": retrieved.digest}, lambda out: None)
    rows = [{"model": "BM25", "ndcg_at_10": 0.5, "mrr_at_10": 0.4, "recall_at_100": 0.9, "recall_at_1000": 1.0},
            {"model": "ANCE round 1", "ndcg_at_10": 0.25, "mrr_at_10": 0.2, "recall_at_100": 0.8,
             "recall_at_1000": 1.0, "dev_ndcg_at_10": 0.3}]
    run_stage(work, "reports", {"split": "test"}, {"ANCE round 1": evaluated.digest}, report)
    export_checkpoint(trained.path, tmp_path / "st")
    card = (tmp_path / "st" / "README.md").read_text()
    assert "# ANCE dense retriever: ANCE round 1 (scifact)" in card
    assert "Training data (the data stage" in card and "200 documents, 70 queries" in card
    assert f"1. `model` `{model.digest}`" in card and f"2. `train` `{trained.digest}`: 4 optimizer steps" in card
    assert "negatives mined by `ance` (round 1)" in card and '"train": "learning_rate=0.001"' in card
    assert "| nDCG@10 | `test` | 0.2500 |" in card and "| **ANCE round 1** (this model) | 0.3000 |" in card


def test_bad_input_is_one_clear_line(tiny_model, tmp_path):
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    cases = [
        (["--checkpoint", str(tmp_path)], "not an ANCE checkpoint"),
        (["--checkpoint", str(tmp_path / "missing")], "no such folder"),
        (["--checkpoint", str(checkpoint), "--format", "tflite"], "unknown export format 'tflite'"),
        (["--checkpoint", str(checkpoint), "--out", str(checkpoint), "--force"], "would replace the checkpoint"),
        (["--checkpoint", "models:/ance-scifact"], "not a registered model URI"),
        (["--checkpoint", "models:/ance-scifact@champion", "--work-dir", str(tmp_path / "w")], "no MLflow store"),
    ]
    for args, message in cases:
        code, out = _invoke(["export", "--out", str(tmp_path / "out"), *args])
        assert code == 2 and message in out and "Traceback" not in out, (args, out)
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")])
    assert code == 2 and "exists and is not empty; not an earlier export either: choose a new or empty --out" in out
    # (it said "pass --force to replace it", which --force then refused: a review)
    code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"), "--force"])
    assert code == 2 and "not an earlier export" in out and (tmp_path / "out" / "keep.txt").is_file()  # (a review:
    # `--out ~/project --force` would have replaced the project)
    (tmp_path / "out" / "keep.txt").unlink()
    for _ in range(2):  # a new export, then --force over it
        code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"), "--force"])
        assert code == 0 and (tmp_path / "out" / "modules.json").is_file(), out
    (tmp_path / "out" / "mine.txt").write_text("x")  # an export's folder with a file of one's own: still an export
    code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"), "--force"])
    assert code == 0 and not (tmp_path / "out" / "mine.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".partial")]
    # a place no folder can be made in (a traceback, exit 1, before): one line, for either format
    (tmp_path / "afile").write_text("x")
    for out, message in ((tmp_path / "afile" / "sub", "afile is a file, not a folder"),
                         (Path("/proc/ance-export"), "a folder cannot be made in /proc")):
        for fmt in ("sentence-transformers", "onnx"):
            code, printed = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--format", fmt])
            assert code == 2 and message in printed and "Traceback" not in printed, (out, fmt, printed)


def test_a_damaged_checkpoint_is_one_line_and_force_never_replaces_a_trained_one(tiny_model, tmp_path):
    """Found by a probe: a damaged checkpoint printed a traceback (JSONDecodeError, TypeError, FileNotFoundError,
    SafetensorError) from export and search; `--force` replaced a trained checkpoint given as --out. Found by a review:
    one without its tokenizer.json loaded, with a tokenizer of its special tokens only."""
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    damages = {"not json": lambda c: (c / "ance_model.json").write_text("{not json"),
               "no fields": lambda c: (c / "ance_model.json").write_text("{}"),
               "no head": lambda c: (c / "head.safetensors").unlink(),
               "cut short": lambda c: (c / "model.safetensors").write_bytes(b"\0" * 100),
               "no tokenizer.json": lambda c: (c / "tokenizer.json").unlink()}  # (built anyway: every word [UNK])
    for name, damage in damages.items():
        bad = tmp_path / name.replace(" ", "-")
        shutil.copytree(checkpoint, bad)
        damage(bad)
        for args in (["export", "--checkpoint", str(bad), "--out", str(tmp_path / "o")],
                     ["export", "--checkpoint", str(bad), "--out", str(tmp_path / "o"), "--format", "onnx"],
                     ["search", "protein", "--model", str(bad)]):  # (its meta readable: no index of it, said first)
            code, out = _invoke(args)
            indexed_first = args[0] == "search" and name in ("cut short", "no tokenizer.json")
            damaged = "damaged checkpoint" in out or indexed_first
            assert code == 2 and damaged and "Traceback" not in out, (name, args, out)
        assert not (tmp_path / "o").exists()
    trained = tmp_path / "trained"
    shutil.copytree(checkpoint, trained)
    (trained / "trainer_state.json").write_text("{}")
    code, out = _invoke(["export", "--checkpoint", str(checkpoint), "--out", str(trained), "--force"])
    assert code == 2 and "a pipeline stage or a trained checkpoint (trainer_state.json), not an export" in out, out
    assert (trained / "trainer_state.json").is_file()


def test_maxp_and_compressed_checkpoints_are_refused(tiny_model, tmp_path):
    from ance_core.compression.conae import PROJECTOR_FILE

    maxp = tmp_path / "maxp"
    init_model(ModelConfig(name=str(tiny_model), document_mode="maxp"), maxp)
    code, out = _invoke(["export", "--checkpoint", str(maxp), "--out", str(tmp_path / "a")])
    assert code == 2 and "MaxP checkpoint" in out
    compressed = random_head_checkpoint(tiny_model, tmp_path / "compressed")
    (compressed / PROJECTOR_FILE).write_bytes(b"")
    code, out = _invoke(["export", "--checkpoint", str(compressed), "--out", str(tmp_path / "b")])
    assert code == 2 and "export its teacher instead" in out
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_registered_version_is_exported_with_what_the_registry_knows(tiny_model, tmp_path):
    from ance_core.pipeline.config import PipelineConfig
    from tracking.client import Tracker, flatten
    from tracking.registry import register_models
    from tracking.uploads import log_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    tracker = Tracker(tmp_path / "work", "ance-train")
    parent = tracker.start_run("pipeline")
    child = tracker.start_run("ANCE round 1", parent_id=parent)
    tracker.log_params(parent, flatten(PipelineConfig(rounds=2)))
    (tmp_path / "results.md").write_text("## scifact test\n\n| model | nDCG@10 |\n|---|---|\n"
                                         "| ANCE round 1 | 0.2500 |\n\nStage time: ...\n")
    tracker.log_artifact(parent, tmp_path / "results.md", "report")
    log_checkpoint(tracker, child, checkpoint)
    metrics = {"ndcg_at_10": 0.25, "mrr_at_10": 0.2, "recall_at_100": 0.8, "recall_at_1000": 1.0}
    register_models(tracker, "ance-scifact", [("ANCE round 1", child, metrics)], "scifact", "test")
    code, out = _invoke(["export", "--checkpoint", "models:/ance-scifact/1", "--out", str(tmp_path / "st"),
                         "--work-dir", str(tmp_path / "work")])
    assert code == 0, out
    assert (tmp_path / "st" / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    card = (tmp_path / "st" / "README.md").read_text()
    assert "models:/ance-scifact/1 (version 1" in card and "# ANCE dense retriever: ANCE round 1 (scifact)" in card
    assert "| nDCG@10 | `test` | 0.2500 |" in card and '"rounds": "2"' in card and "2 ANCE round(s)" in card
    assert "| ANCE round 1 | 0.2500 |" in card and "Stage time" not in card
    code, out = _invoke(["export", "--checkpoint", "models:/ance-scifact/7", "--out", str(tmp_path / "x"),
                         "--work-dir", str(tmp_path / "work")])
    assert code == 2 and "models:/ance-scifact/7: not found" in out


def test_the_manuals_commands_export_and_load_a_sentence_transformers_model(tiny_model, tmp_path, monkeypatch):
    """docs/serving.md "As a sentence-transformers model": its `ance export` line and its Python, run as written (the
    checkpoint and output folders put in the places they name)."""
    from tests.tiny import REPO

    section = (REPO / "docs" / "serving.md").read_text().split("## As a sentence-transformers model", 1)[1]
    command = section.split("```bash\n", 1)[1].split("```", 1)[0].split("  #", 1)[0].strip()
    python = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    random_head_checkpoint(tiny_model, tmp_path / "work" / "train" / "0123abcd")
    args = command.replace("<digest>", "0123abcd").split()
    assert args[0] == "ance" and "--out" in args
    code, out = _invoke(args[1:])
    assert code == 0, out
    printed = []
    monkeypatch.setattr("builtins.print", printed.append)
    exec(compile(python, "docs/serving.md", "exec"), {})
    assert tuple(printed[0].shape) == (1, 1)  # the query's dot product with the passage


def test_prefixes_are_kept_by_the_checkpoint_the_export_and_the_ance_encoder(tiny_model, tmp_path):
    """model.query_prefix / passage_prefix (E5's 'query: ' / 'passage: '): written to the checkpoint (a checkpoint
    without them has no such keys: its digest is the one it had), exported as the sentence-transformers prompts that
    encode_query / encode_document put first, and put first by the encoder the MLflow model serves with."""
    from sentence_transformers import SentenceTransformer

    from ance_core.export.encoder import Encoder

    plain = random_head_checkpoint(tiny_model, tmp_path / "plain")
    assert "query_prefix" not in json.loads((plain / "ance_model.json").read_text())
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "prefixed", query_prefix="query: ",
                                        passage_prefix="passage: ")
    model, tokenizer, meta = load_checkpoint(checkpoint)
    assert (meta.query_prefix, meta.passage_prefix) == ("query: ", "passage: ")
    queries = encode_texts(model, tokenizer, ["query: " + t for t in TEXTS], meta.query_max_length, 4, None)
    passages = encode_texts(model, tokenizer, ["passage: " + t for t in TEXTS], meta.passage_max_length, 4, None)
    unprefixed = encode_texts(model, tokenizer, TEXTS, meta.query_max_length, 4, None)
    assert np.abs(queries - unprefixed).max() > 1e-3
    export_checkpoint(checkpoint, tmp_path / "st")
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    np.testing.assert_allclose(st.encode_query(TEXTS), queries, atol=1e-5, rtol=0)
    np.testing.assert_allclose(st.encode_document(TEXTS), passages, atol=1e-5, rtol=0)
    np.testing.assert_allclose(st.encode(TEXTS), passages, atol=1e-5, rtol=0)  # (the card's and docs' plain `encode`:
    # it encoded without the passage prefix)
    assert "`'query: '` (the `query` prompt" in (tmp_path / "st" / "README.md").read_text()
    encoder = Encoder(checkpoint)
    np.testing.assert_allclose(encoder.encode(TEXTS, "query"), queries, atol=1e-5, rtol=0)
    np.testing.assert_allclose(encoder.encode(TEXTS, "passage"), passages, atol=1e-5, rtol=0)


@pytest.mark.parametrize("label,said", [("warmup", "this model is its `warmup`;"),
                                        ("zero-shot", "this model is its `zero-shot` (the model it started from, "
                                                      "not one it trained);")])
def test_a_registered_versions_card_says_which_of_its_runs_models_it_is(label, said):
    """A version of the warm-up was carded as trained by the run's whole recipe (its ANCE rounds too)."""
    card = _training({"params": {"rounds": "1", "mining.sampler": "simans"}, "label": label})
    assert ("The pipeline run it comes from: a warm-up on BM25 negatives, then 1 ANCE round(s) with negatives mined "
            f"by `simans`; {said} the run's exact parameters are below.") in card
