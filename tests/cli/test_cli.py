"""CLI behaviour on user errors: one clear line, exit status 2, no traceback, nothing written."""

import json
import os
import re
import socket

import pytest
from typer.testing import CliRunner

from ance_cli.main import app
from ance_core.errors import AnceError, AnceWarning
from tests.tiny import random_head_checkpoint, write_beir

runner = CliRunner()


def _invoke(args, input: str | None = None):
    result = runner.invoke(app, args, input=input)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def test_not_a_checkpoint(tmp_path):
    code, out = _invoke(["evaluate", "--checkpoint", str(tmp_path), "--dataset", str(tmp_path)])
    assert code == 2 and "not an ANCE checkpoint" in out and "Traceback" not in out
    code, out = _invoke(["search", "cells", "--model", str(tmp_path / "typo")])  # a path that is not there: said so
    assert code == 2 and "typo: no such checkpoint folder (the path does not exist)" in out, out
    code, out = _invoke(["evaluate", "--run", str(tmp_path / "run.trec"), "--hybrid"])  # (a run is scored as it is)
    assert code == 2 and "--hybrid: for --checkpoint only" in out, out
    # a registered model's URI is looked up in the work folder's store (it was taken for a folder that is not there)
    code, out = _invoke(["evaluate", "--checkpoint", "models:/ance-none@champion", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "models:/ance-none@champion: not found (" in out and "mlflow.db does not exist" in out, out


def test_search_refuses_an_empty_query_and_a_top_k_below_one(tmp_path):
    """Once an empty query printed ten arbitrary hits and --top-k 0 an AssertionError's traceback."""
    code, out = _invoke(["search", "  ", "--model", str(tmp_path)])
    assert code == 2 and "the query is empty" in out and "Traceback" not in out, out
    for k in ("0", "-3"):
        code, out = _invoke(["search", "cells", "--model", str(tmp_path), "--top-k", k])
        assert code == 2 and "--top-k" in out and "Traceback" not in out, out


def test_compress_refuses_a_folder_that_is_not_a_checkpoint_and_a_bad_config(tmp_path):
    code, out = _invoke(["compress", "--checkpoint", str(tmp_path), "--dataset", str(tmp_path)])
    assert code == 2 and "not an ANCE checkpoint" in out and "Traceback" not in out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("methods: [conae]\nonly_kl: true\nno_kl: true\n")
    code, out = _invoke(["compress", "--config", str(cfg), "--dataset", str(tmp_path)])
    assert code == 2 and "only_kl and no_kl" in out and str(cfg) in out and "Traceback" not in out
    code, out = _invoke(["compress", "--name", "a/b", "--dataset", str(tmp_path)])  # (the registry's name for it)
    assert code == 2 and "--name 'a/b'" in out and "letters, digits" in out and "invalid config" not in out, out
    code, out = _invoke(["run", "--set", "data.name=a/b"])  # in a config, the field's path and the rule
    assert code == 2 and "data.name: a collection's name is letters" in out and "Value error" not in out, out


def test_compress_refuses_what_it_would_refuse_late_before_the_corpus_is_encoded(tiny_model, tiny_scifact, tmp_path):
    """Dims none of which is below the model's, an IVF-PQ with more lists than documents, no model to compress: each
    was found after the data stage and the corpus encoding (or, for dims, never: a table of the teacher alone)."""
    from tests.tiny import random_head_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")  # (32 dimensions)
    work = tmp_path / "w"
    cases = [("dims: [64, 512]\n", "compression.dims [64, 512]: none is below the model's dimension 32"),
             ("dims: [16]\nmethods: [truncate]\nindex_types: [ivfpq]\nivf_nlist: 100000\n",
              "compression.ivf_nlist 100000 is more inverted lists than the corpus has vectors")]
    for text, message in cases:
        (tmp_path / "c.yaml").write_text(text)
        code, out = _invoke(["compress", "--checkpoint", str(checkpoint), "--dataset", str(tiny_scifact),
                             "--config", str(tmp_path / "c.yaml"), "--work-dir", str(work)])
        assert code == 2 and message in out and "Traceback" not in out, out
        assert not (work / "encode").exists()
    code, out = _invoke(["compress", "--dataset", str(tiny_scifact), "--work-dir", str(tmp_path / "empty")])
    assert code == 2 and "no trained model yet; train one first (ance run" in out and "Traceback" not in out, out
    assert not (tmp_path / "empty").exists()  # (looking for a champion created the folder and an empty registry)


def test_a_folder_name_mlflow_refuses_as_a_model_name_is_refused_where_models_are_registered(tiny_model, tiny_scifact,
                                                                                              tmp_path):
    """A dataset folder named with ':' (MLflow refuses it in a registered model's name) failed the registration at
    the end of a run, and every MLflow call after it; refused before any work by the commands that register models
    (naming how to name the collection), taken by those that do not."""
    import os
    import subprocess
    import sys

    from tests.tiny import failure_report, random_head_checkpoint, tiny_pipeline_config

    folder = tmp_path / "scifact:2024"
    folder.symlink_to(tiny_scifact)
    work = tmp_path / "work"
    (tmp_path / "c.json").write_text(json.dumps(tiny_pipeline_config(folder, tiny_model, work)))
    env = os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2, failure_report(proc)
    assert "the dataset folder's name 'scifact:2024' cannot name the collection's registered model (MLflow refuses " \
           "':'); set data.name" in proc.stdout + proc.stderr, failure_report(proc)
    assert not (work / "train").exists() and not (work / "init").exists()
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    code, out = _invoke(["compress", "--checkpoint", str(checkpoint), "--dataset", str(folder), "--work-dir",
                         str(work)])
    assert code == 2 and "registered model (MLflow refuses ':'); set --name" in out and "--name None" not in out, out
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "bm25", "--dataset", str(folder), "--work-dir",
                           str(work), "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, failure_report(proc)  # (it registers nothing: the name is no matter)
    assert 0 <= json.loads(proc.stdout.strip().splitlines()[-1])["ndcg_at_10"] <= 1


def test_a_pipeline_refuses_its_compression_options_before_anything_trains(tiny_model, tiny_scifact, tmp_path):
    """Found by a review: `ance run` with a compression section checked it only in its last stage, after every
    stage had trained (`ance compress` checks before its corpus encoding)."""
    import os
    import subprocess
    import sys

    from tests.tiny import failure_report, tiny_pipeline_config

    work = tmp_path / "work"
    config = tiny_pipeline_config(tiny_scifact, tiny_model, work) | {
        "compression": {"dims": [16], "methods": ["truncate"], "index_types": ["ivfpq"], "ivf_nlist": 100000}}
    (tmp_path / "c.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, failure_report(proc)
    assert "compression.ivf_nlist 100000 is more inverted lists than the corpus has vectors" in out, out
    assert not (work / "train").exists() and not (work / "init").exists()  # refused before any model was made


def test_bad_config_names_the_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("warmup:\n  learning_rate: -1\n")
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and "warmup.learning_rate" in out and "Traceback" not in out


def test_bad_data_names_file_and_line_before_any_work(tmp_path):
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"train": [("q1", "d1", 1)], "test": [("q1", "d1", 1)]})
    (ds / "corpus.jsonl").write_text('{"_id": "d1", "text": \n{"_id": "d2", "text": \n')  # (nothing readable: a
    cfg = tmp_path / "c.yaml"                                                                 # bad row alone is left
    work = tmp_path / "work"                                                                  # out with a warning)
    cfg.write_text(json.dumps({"data": {"dataset": str(ds)}, "work_dir": str(work)}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and "corpus.jsonl:1: malformed JSON" in out and "Traceback" not in out
    # nothing half-written (the stage locks are empty files that stay, by design: ance_core/artifacts.py)
    assert not any(p.is_file() and ".locks" not in p.parts for p in work.rglob("*"))


def test_a_work_dir_that_cannot_be_created_is_one_line_before_any_work(tmp_path):
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    (tmp_path / "a-file").write_text("")
    work = tmp_path / "a-file" / "work"  # under a file: no one can create it (root included)
    for args in (["bm25", "--dataset", str(ds), "--work-dir", str(work)],
                 ["run", "--set", f"data.dataset={ds}", "--set", f"work_dir={work}"]):
        code, out = _invoke(args)
        assert code == 2 and f"error: work_dir {work}: cannot be created or written (Not a directory)" in out, out
        assert "ance run, tune, compare: --set work_dir=...; the other commands: --work-dir" in out, out
        assert "Traceback" not in out and len(set(out.strip().splitlines())) == 1, out  # (stderr read twice)
    assert not (tmp_path / "ds" / ".ance").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "ds"]
    code, out = _invoke(["bm25", "--dataset", str(ds), "--work-dir", str(tmp_path / "a-file")])  # the file itself
    assert code == 2 and f"work_dir {tmp_path / 'a-file'}: a file, not a folder" in out, out  # ("File exists")


def test_a_tracking_uri_mlflow_reads_as_a_folder_is_one_line_before_any_work(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI without "://" (a typo) was said after the temporary server's start, three times (the flow's
    error, its failed state, the command's line), as MLflow's paragraph on migrating its file store."""
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    work = tmp_path / "work"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http//127.0.0.1:5000")
    code, out = _invoke(["run", "--set", f"data.dataset={ds}", "--set", f"work_dir={work}"])
    assert code == 2 and "error: MLFLOW_TRACKING_URI 'http//127.0.0.1:5000' is a folder to MLflow" in out, out
    assert "MLFLOW_ALLOW_FILE_STORE=true" in out and "migrate" not in out, out
    assert "Traceback" not in out and len(set(out.strip().splitlines())) == 1, out
    assert not work.exists()
    for args in (["recipes"], ["bm25", "--dataset", str(ds), "--work-dir", str(work)]):  # commands that track
        code, out = _invoke(args)  # nothing are not refused for it (bm25 evaluates, and records no MLflow run)
        assert "MLFLOW_TRACKING_URI" not in out and code == 0, out


def test_an_empty_work_dir_is_refused_not_taken_for_the_current_folder(tmp_path, monkeypatch):
    """`--set work_dir=$UNSET`: the stages (and a run record) were written into the current folder."""
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for args, message in ((["bm25", "--dataset", str(ds), "--work-dir", " "], "error: work_dir is empty: the stages "
                           "would be written into the current folder; set work_dir to a folder"),
                          (["run", "--set", f"data.dataset={ds}", "--set", "work_dir="], "work_dir: empty: the "
                           "stages would be written into the current folder")):
        code, out = _invoke(args)
        assert code == 2 and message in out and "Traceback" not in out, out
    assert not any((tmp_path / "here").iterdir())


def test_a_one_document_corpus_is_refused_before_any_stage(tmp_path):
    queries = [{"_id": "q1", "text": "y"}, {"_id": "q2", "text": "z"}]
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], queries,
                    {"train": [("q1", "d1", 1)], "test": [("q2", "d1", 1)]})
    code, out = _invoke(["run", "--set", f"data.dataset={ds}", "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "1 'train' queries have fewer than 1 documents that are not relevant to them" in out, out
    assert "(q1; 'q1': 0 of the corpus's 1)" in out and "Traceback" not in out
    assert sorted(p.name for p in (tmp_path / "w").iterdir() if not p.name.startswith(".")) == ["data"]  # only it


def test_missing_split_is_refused_before_any_work(tmp_path):
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"train": [("q1", "d1", 1)]})
    code, out = _invoke(["bm25", "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and f"{ds}: split 'test' has no qrels (available splits: train); a split's qrels are read " \
        f"from {ds / 'qrels' / 'test.tsv'}" in out.replace("\n", " ")
    assert not (tmp_path / "w").exists()  # refused before the data stage read the collection (it was built first)
    code, out = _invoke(["run", "--set", f"data.dataset={ds}", "--set", "data.eval_split=nosuch",
                         "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "split 'nosuch' has no qrels (available splits: train)" in out and "Traceback" not in out
    assert not (tmp_path / "w").exists(), out
    # a folder that is no dataset is still told so by the data stage (not "split 'test' has no qrels")
    code, out = _invoke(["bm25", "--dataset", str(tmp_path), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "neither a BEIR folder (corpus.jsonl) nor MS MARCO" in out, out
    # MS MARCO's layout: its own file name, its own splits
    ms = tmp_path / "ms"
    ms.mkdir()
    (ms / "collection.tsv").write_text("d1\tx\nd2\ty\n")
    (ms / "queries.train.tsv").write_text("q1\ty\n")
    (ms / "qrels.train.tsv").write_text("q1\t0\td1\t1\n")
    code, out = _invoke(["bm25", "--dataset", str(ms), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "split 'test' has no qrels (available splits: train)" in out, out
    assert str(ms / "qrels.test.tsv") in out.replace("\n", "") and not (tmp_path / "w").exists()
    # the dev split (carved by the data stage when the dataset has none) is checked after that stage
    code, out = _invoke(["bm25", "--dataset", str(ms), "--split", "dev", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "split 'dev' has no qrels" in out and str(ms / "qrels.dev.tsv") in out.replace("\n", "")
    # (and why none was carved: its one training query is too few for a dev split; the warning saying so was hidden)
    assert "none is carved from its 'train' queries (data.dev_fraction 0.2 of those with a positive" in out, out


def test_unknown_recipe_is_refused(tmp_path):
    code, out = _invoke(["demo", "--recipe", "fastest", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "unknown recipe 'fastest'; choose one of demo, full" in out and "Traceback" not in out


@pytest.mark.parametrize("recipe", [[], ["--recipe", "demo"]])
def test_search_settings_without_recipe_auto_are_refused(tmp_path, recipe):
    """They were ignored: the run trained the defaults or the fixed recipe, with no search and no word of it."""
    work = tmp_path / "w"
    code, out = _invoke(["run", *recipe, "--budget-minutes", "5", "--tune-set", "eta=2", "--set", f"work_dir={work}"])
    assert code == 2 and "--budget-minutes and --tune-set: search settings, for --recipe auto only" in out, out
    assert "Traceback" not in out and not work.exists()
    code, out = _invoke(["run", *recipe, "--budget-minutes", "0", "--set", f"work_dir={work}"])  # (0 was taken: falsy)
    assert code == 2 and "--budget-minutes: search settings, for --recipe auto only" in out and not work.exists(), out


def test_options_that_would_be_ignored_are_refused_or_taken(tmp_path, monkeypatch):
    """Found by a review: `search --query-id` without --trec was ignored; `demo --compress --set compression.dims=...`
    was refused ('compression' is a value, not a section), though demo takes --set."""
    code, out = _invoke(["search", "cancer", "--model", str(tmp_path), "--query-id", "q7"])
    assert code == 2 and "--query-id q7: the query's id in the run file, for --trec only" in out, out
    import ance_cli.train_commands

    ran = []
    monkeypatch.setattr(ance_cli.train_commands, "run_pipeline", lambda config, as_json: ran.append(config))
    code, out = _invoke(["demo", "--compress", "--set", "compression.dims=[64]", "--work-dir", str(tmp_path / "w")])
    assert code == 0, out
    assert ran[0].compression.dims == [64] and ran[0].compression.index_types == ["flat", "hnsw", "ivfpq"]


@pytest.mark.parametrize("args, message", [
    (["demo", "--rounds", "2", "--set", "rounds=1"], "--rounds and --set rounds=1 both set rounds: give it once"),
    (["demo", "--work-dir", "{w}", "--set", "work_dir={w}2"], "--work-dir and --set work_dir={w}2 both set work_dir"),
    (["tune", "--seed", "7", "--tune-set", "seeds=[8]", "--set", "work_dir={w}"],
     "--seed and --tune-set seeds=[8] both set seeds: give it once"),
    (["tune", "--budget-minutes", "5", "--tune-set", " budget_minutes=9", "--set", "work_dir={w}"],
     "--budget-minutes and --tune-set  budget_minutes=9 both set budget_minutes"),
    (["tune", "--recipe", "full", "--tune-set", "recipe=demo", "--set", "work_dir={w}"],
     "--recipe and --tune-set recipe=demo both set recipe"),
    (["run", "--recipe", "auto", "--budget-minutes", "5", "--tune-set", "budget_minutes=9", "--set", "work_dir={w}"],
     "--budget-minutes and --tune-set budget_minutes=9 both set budget_minutes"),
])
def test_an_option_and_a_set_of_the_same_setting_are_refused(tmp_path, monkeypatch, args, message):
    """Found by a review: `demo --rounds 2 --set rounds=1` trained one round (the --set won, silently), as did a
    search's --seed beside --tune-set seeds=...; which one the user meant is not known, so neither is taken."""
    import ance_cli.train_commands

    monkeypatch.setattr(ance_cli.train_commands, "run_pipeline", lambda config, as_json: pytest.fail("ran"))
    work = str(tmp_path / "w")
    code, out = _invoke([a.replace("{w}", work) for a in args])
    assert code == 2 and message.replace("{w}", work) in out.replace("\n", ""), out
    assert "Traceback" not in out and not (tmp_path / "w").exists()


def test_bad_data_leaves_no_work_folder_and_a_run_scored_on_a_missing_split_names_its_file(tmp_path):
    """A dataset error left a new work folder holding its lock and an empty data/ folder; `evaluate --run` on a split
    the dataset lacks wrote the data stage, then said so in a line without the qrels file's path."""
    empty = write_beir(tmp_path / "empty", [], [{"_id": "q1", "text": "one"}], {"test": [("q1", "d0", 1)]})
    work = tmp_path / "w"
    code, out = _invoke(["bm25", "--dataset", str(empty), "--split", "test", "--work-dir", str(work)])
    assert code == 2 and "empty corpus" in out and "Traceback" not in out, out
    assert not work.exists()
    good = write_beir(tmp_path / "good", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(3)],
                      [{"_id": "q1", "text": "one"}], {"test": [("q1", "d0", 1)]})
    (tmp_path / "run.trec").write_text("q1 Q0 d0 1 2.0 x\n")
    code, out = _invoke(["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(good), "--split", "nosuch",
                         "--work-dir", str(work)])
    assert code == 2 and "split 'nosuch' has no qrels" in out and str(good / "qrels" / "nosuch.tsv") in out, out


@pytest.mark.parametrize("command", [["tune"], ["run", "--recipe", "auto"]])
@pytest.mark.parametrize("minutes", ["0", "inf", "1e+307"])  # (inf, 1e307: once ValueError: cannot convert float NaN
def test_a_budget_of_no_minutes_names_its_option(tmp_path, command, minutes):  # to integer, after every warm-up trial)
    code, out = _invoke([*command, "--budget-minutes", minutes, "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and f"--budget-minutes {minutes}: the search's wall minutes must be a number above 0" in out, out
    assert "invalid config" not in out and not (tmp_path / "w").exists()


def test_gc_dry_run_lists_what_it_would_remove_and_removes_nothing(tmp_path, monkeypatch):
    from ance_core.artifacts import run_stage
    from ance_core.run_records import live_run

    def shard(out):
        (out / "emb_00000.npy").write_bytes(b"x" * 4096)

    work = tmp_path / "work"
    for k in range(3):
        with live_run(work, "run"):
            run_stage(work, "encode", {"k": k}, {}, shard)
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "1", "--dry-run"])
    assert code == 0 and out.count("would remove  encode/") == 2 and "would remove 2 stage folders" in out
    assert len(list((work / "encode").iterdir())) == 3
    # at a terminal it asks first (it removed at once): "no" removes nothing; --yes does not ask
    import ance_cli.use_commands as commands

    monkeypatch.setattr(commands, "asks", lambda: True)
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "1"], input="n\n")
    assert code == 0 and "2 stage folders (0.00 GiB) would be removed: encode" in out and "Remove them?" in out
    assert "nothing removed" in out and len(list((work / "encode").iterdir())) == 3
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "1"], input="y\n")
    assert code == 0 and "removed 2 stage folders" in out and len(list((work / "encode").iterdir())) == 1
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "1"], input="y\n")
    assert code == 0 and "nothing to remove" in out and "Remove them?" not in out
    monkeypatch.undo()
    with live_run(work, "run"):
        run_stage(work, "retrieve", {"k": 0}, {}, shard)
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "2", "--dry-run"])
    assert code == 0 and "would remove 0 stage folders" in out  # the ranking is kept by default
    code, out = _invoke(["gc", "--work-dir", str(work), "--keep-runs", "2", "--drop-rankings"])
    assert code == 0 and "removed 1 stage folders" in out and not list((work / "retrieve").iterdir())
    assert len(list((work / "encode").iterdir())) == 1
    code, out = _invoke(["gc", "--work-dir", str(tmp_path / "nowhere")])
    assert code == 2 and "no such work folder" in out and "Traceback" not in out
    (tmp_path / "plain").mkdir()  # an ordinary folder: "removed 0 stage folders; kept 0" before
    (tmp_path / "afile").write_text("x")
    for folder, message in (("plain", "not a work folder (no stage was ever built in it"), ("afile", "a file, not")):
        code, out = _invoke(["gc", "--work-dir", str(tmp_path / folder)])
        assert code == 2 and message in out and "Traceback" not in out, out


def test_set_overrides_a_config_and_a_wrong_key_is_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 1\n")
    code, out = _invoke(["run", "--config", str(cfg), "--set", "ance.learning_rat=3e-5"])
    assert code == 2 and "ance.learning_rat" in out and "--set ance.learning_rat=3e-5" in out and "Traceback" not in out
    code, out = _invoke(["demo", "--set", "rounds=two", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "rounds" in out and not (tmp_path / "w").exists()
    # without --config: the defaults, with the overrides on top (here a dataset that is not there, refused first)
    code, out = _invoke(["run", "--set", f"data.dataset={tmp_path / 'none'}", "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and f"dataset '{tmp_path / 'none'}' not found" in out and not (tmp_path / "w").exists()


def test_bm25_evaluates_a_dev_split_without_needing_a_dev_split_of_its_own(tmp_path):
    """MS MARCO's evaluation split is dev: `ance bm25 --split dev` evaluates it (before: "dev_split and eval_split are
    both 'dev'"). A real run of the bm25 flow, in its own process with Prefect's ephemeral server."""
    import os
    import subprocess
    import sys

    docs = [{"_id": f"d{i}", "text": text} for i, text in enumerate(
        ["vitamin d lowers cancer risk", "protein folding in cells", "gene expression in mice", "blood pressure"])]
    queries = [{"_id": "q1", "text": "vitamin d cancer"}, {"_id": "q2", "text": "mice gene"}]
    ds = write_beir(tmp_path / "ds", docs, queries, {"train": [("q2", "d2", 2), ("q2", "d1", 1)],
                                                     "dev": [("q1", "d0", 1)]})
    with open(ds / "corpus.jsonl", "a") as f:  # real data is messy: a row cut off is left out, with a warning
        f.write('{"_id": "d9", "text": "a copy interrupted\n')
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "p")}
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "bm25", "--dataset", str(ds), "--split", "dev",
                           "--work-dir", str(tmp_path / "w"), "--json"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ndcg_at_10"] == 1.0
    assert "corpus.jsonl: 1 of its 5 rows cannot be read and is left out: line 5: malformed JSON" in proc.stderr
    # graded training qrels: which pairs a run would train on is no concern of a command that trains nothing
    assert "training positives are the" not in proc.stderr, proc.stderr[-2000:]


def test_bm25_and_a_run_file_evaluate_the_dev_split_a_pipeline_carves(tmp_path):
    """A dataset without a dev split of its own: `--split dev` is the one a pipeline carves from its training queries
    and chooses its result on (before: "split 'dev' has no qrels"); `ance evaluate --checkpoint` takes the same
    path (lookups.evaluation_data). Real runs of the bm25 flow and of `ance evaluate --run`, each in its own process."""
    import os
    import subprocess
    import sys

    words = ["vitamin", "protein", "gene", "blood", "kidney", "neuron", "insulin", "virus", "lung", "bone", "skin",
             "liver"]
    docs = [{"_id": f"d{i}", "text": f"{w} study of {w} cells"} for i, w in enumerate(words)]
    queries = [{"_id": f"q{i}", "text": w} for i, w in enumerate(words)]
    ds = write_beir(tmp_path / "ds", docs, queries, {"train": [(f"q{i}", f"d{i}", 1) for i in range(10)],
                                                      "test": [("q10", "d10", 1), ("q11", "d11", 1)]})
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "p")}

    said = []

    def ance(*args, split="dev"):
        proc = subprocess.run([sys.executable, "-m", "ance_cli", *args, "--dataset", str(ds), "--split", split,
                               "--work-dir", str(tmp_path / "w"), "--json"], capture_output=True, text=True,
                              env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        said.append(proc.stdout)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert ance("bm25")["ndcg_at_10"] == 1.0  # each dev query's one document at rank 1
    from ance_core.data.config import DataConfig
    from ance_core.data.dataset import read_tables
    from tasks.data import prepare_data

    dev = read_tables(prepare_data.fn(DataConfig(dataset=str(ds)), str(tmp_path / "w")).path).split_qrels("dev")
    assert 1 <= len(dev) < 10 and set(dev["query_id"]) < {f"q{i}" for i in range(10)}  # carved from train
    first = dev["query_id"].iloc[0]
    run = tmp_path / "run.trec"  # the first dev query's document at rank 2: its nDCG@10 1/log2(3), the others' 0
    run.write_text(f"{first} Q0 d11 1 2.0 x\n{first} Q0 d{first[1:]} 2 1.0 x\n")
    assert abs(ance("evaluate", "--run", str(run))["ndcg_at_10"] - 0.6309 / len(dev)) < 1e-3
    assert "split 'train'" not in "".join(said)
    # the train split is the queries a pipeline trains on, without the carved dev queries: said (it was not)
    trained = sorted({f"q{i}" for i in range(10)} - set(dev["query_id"]))[0]
    run.write_text(f"{trained} Q0 d{trained[1:]} 1 2.0 x\n")
    assert ance("evaluate", "--run", str(run), split="train")["ndcg_at_10"] == pytest.approx(1 / (10 - len(dev)))
    assert f"split 'train': its {10 - len(dev)} queries that train, as a pipeline's runs split them (the dev split " \
           f"'dev', {len(dev)} queries, left out)" in said[-1], said[-1]


def test_a_collection_numbering_queries_and_documents_alike_is_scored_with_its_own_id_hits(tmp_path):
    """Query i's relevant document is document i (a classic collection's numbering, or a FAQ's): the BEIR rule that
    drops a hit of the query's own id scored a perfect run 0, without a word (found by a review)."""
    docs = [{"_id": str(i), "text": f"passage {i}"} for i in range(1, 5)]
    queries = [{"_id": str(i), "text": f"question {i}"} for i in range(1, 5)]
    ds = write_beir(tmp_path / "ds", docs, queries, {"test": [(str(i), str(i), 1) for i in range(1, 5)]})
    (tmp_path / "run.trec").write_text("".join(f"{i} Q0 {i} 1 2.0 x\n" for i in range(1, 5)))
    code, out = _invoke(["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(ds), "--work-dir",
                         str(tmp_path / "w"), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["ndcg_at_10"] == 1.0, out
    assert "4 qrels judge a document relevant to the query of the same id" in out


def test_evaluate_counts_relevance_from_the_grade_given(tmp_path):
    """`--relevant-grade 2`: MRR@10 and recall as TREC Deep Learning counts them on its graded passage collections."""
    docs = [{"_id": f"d{i}", "text": f"passage {i}"} for i in range(4)]
    ds = write_beir(tmp_path / "ds", docs, [{"_id": "q1", "text": "passage"}],
                    {"test": [("q1", "d1", 1), ("q1", "d2", 3)]})
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 3.0 x\nq1 Q0 d0 2 2.0 x\nq1 Q0 d2 3 1.0 x\n")
    args = ["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(ds), "--work-dir", str(tmp_path / "w"),
            "--json"]
    scores = {}
    for grade in ("1", "2"):
        code, out = _invoke([*args, "--relevant-grade", grade])
        assert code == 0, out
        scores[grade] = json.loads(out.strip().splitlines()[-1])
        assert ("grade 2 or above relevant" in out) == (grade == "2"), out  # the title says which grade counts
    assert scores["1"]["mrr_at_10"] == 1.0 and scores["2"]["mrr_at_10"] == pytest.approx(1 / 3)
    assert scores["1"]["ndcg_at_10"] == scores["2"]["ndcg_at_10"]
    code, out = _invoke([*args, "--relevant-grade", "0"])
    assert code == 2 and "--relevant-grade" in out


def test_a_reused_data_stage_says_again_what_its_reading_left_out(tmp_path, monkeypatch):
    """Found by a review: the second `ance bm25` or `evaluate` on a dataset reused its data stage and said nothing of
    the rows the first left out (their qrels with them), though its scores were still without them."""
    import ance_cli.app

    docs = [{"_id": f"d{i}", "text": f"passage {i}"} for i in range(3)]
    ds = write_beir(tmp_path / "ds", docs, [{"_id": "q1", "text": "passage"}], {"test": [("q1", "d1", 1)]})
    with open(ds / "corpus.jsonl", "a") as f:
        f.write('{"_id": "d9", "text": "cut off\n')
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.0 x\n")
    args = ["evaluate", "--run", str(tmp_path / "run.trec"), "--dataset", str(ds), "--work-dir", str(tmp_path / "w")]
    said = "corpus.jsonl: 1 of its 4 rows cannot be read and is left out: line 4: malformed JSON"
    for _ in range(2):  # built, then reused (a new process: nothing said yet)
        monkeypatch.setattr(ance_cli.app, "_said", set())
        with pytest.warns(AnceWarning, match=said):
            code, out = _invoke(args)
        assert code == 0, out


def test_fp16_training_on_a_cpu_is_refused_before_any_work(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"ance": {"precision": "fp16"}, "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and "ance.precision: fp16 training needs a CUDA GPU" in out and "bf16" in out
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_recipe_auto_on_gpu_ray_workers_is_refused_what_its_final_run_needs_here_before_the_search(tmp_path):
    """A search's trials on GPU Ray workers are not refused fp16 on a CPU-only driver; the run `--recipe auto` trains
    after the search is this process's, and was refused only once the whole budget was spent."""
    code, out = _invoke(["run", "--recipe", "auto", "--set", "ance.precision=fp16", "--set",
                         "execution.task_runner=ray", "--set", "execution.gpus_per_task=1", "--set",
                         f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "ance.precision: fp16 training needs a CUDA GPU" in out, out
    assert not (tmp_path / "w").exists()


def test_a_train_split_without_positives_is_refused_before_any_work(tmp_path, recwarn):
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}, {"_id": "d2", "text": "y"}],
                    [{"_id": "q1", "text": "y"}, {"_id": "q2", "text": "x"}],
                    {"train": [("q1", "d1", 0)], "test": [("q2", "d1", 1)]})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"data": {"dataset": str(ds)}, "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and "qrels/train.tsv: split 'train' has no positive" in out and "Traceback" not in out
    # the error alone, not a warning about the dev split it leaves empty
    assert not [w for w in recwarn if "no dev split" in str(w.message)]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [".locks", "data"]  # the validated tables only


def test_a_corpus_of_empty_texts_is_refused_before_any_work(tmp_path):
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": ""}, {"_id": "d2", "text": " ", "title": ""}],
                    [{"_id": "q1", "text": "y"}], {"train": [("q1", "d1", 1)], "test": [("q1", "d2", 1)]})
    code, out = _invoke(["bm25", "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "corpus.jsonl: all 2 documents have an empty title and text" in out


def test_commands_that_train_nothing_do_not_warn_that_a_run_would_train_on_every_query(tmp_path):
    """Too few training queries to carve a dev split: a training run's concern, said by `ance run`, not by bm25."""
    import warnings

    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"t {i}"} for i in range(3)],
                    [{"_id": "q1", "text": "t 1"}, {"_id": "q2", "text": "t 2"}],
                    {"train": [("q1", "d1", 1)], "test": [("q2", "d2", 1)]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out = _invoke(["bm25", "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 0, out
    assert not [w for w in caught if "no dev split" in str(w.message)] and "no dev split" not in out
    from ance_core.data.config import DataConfig
    from ance_core.errors import AnceWarning
    from tasks.data import prepare_data

    with pytest.warns(AnceWarning, match="no dev split: "):  # (what a training run's data stage says)
        prepare_data.fn(DataConfig(dataset=str(ds)), str(tmp_path / "w2"))


def test_evaluate_scores_a_trec_run_file_and_refuses_ambiguous_or_bad_input(tmp_path):
    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"t {i}"} for i in range(3)],
                    [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "b"}],
                    {"train": [("q1", "d0", 1)], "test": [("q1", "d1", 1), ("q2", "d2", 1)]})
    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 3.0 sys\nq1 Q0 d0 2 2.0 sys\n"
                                       "q2 Q0 d0 1 9.0 sys\nq2 Q0 d2 2 8.0 sys\n")
    args = ["evaluate", "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")]
    code, out = _invoke([*args, "--run", str(tmp_path / "run.trec"), "--json"])
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 0.75  # q1's at 1, q2's at 2
    import gzip  # a gzipped run (as MLflow keeps an evaluation's): read as it is

    (tmp_path / "run.trec.gz").write_bytes(gzip.compress((tmp_path / "run.trec").read_bytes()))
    code, out = _invoke([*args, "--run", str(tmp_path / "run.trec.gz"), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 0.75, out
    (tmp_path / "broken.trec.gz").write_bytes(b"not gzip at all")
    code, out = _invoke([*args, "--run", str(tmp_path / "broken.trec.gz")])
    assert code == 2 and "broken.trec.gz: not a readable gzip file" in out and "Traceback" not in out
    code, out = _invoke([*args, "--run", str(tmp_path / "run.trec"), "--checkpoint", str(tmp_path)])
    assert code == 2 and "one of them" in out
    (tmp_path / "bad.trec").write_text("q1 Q0 d1 1 high sys\n")
    code, out = _invoke([*args, "--run", str(tmp_path / "bad.trec")])
    assert code == 2 and "bad.trec:1: score 'high' is not a number" in out
    (tmp_path / "one-bad.trec").write_text((tmp_path / "run.trec").read_text() + "q2 Q0 d1 3\n")  # cut off
    with pytest.warns(AnceWarning, match=r"one-bad.trec: 1 of its 5 rows cannot be read and is left out: line 5: "
                      "expected 6 whitespace-separated columns"):
        code, out = _invoke([*args, "--run", str(tmp_path / "one-bad.trec"), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 0.75, out
    # a run of other queries (another split's, another collection's) would score 0.0: refused; one that ranks some of
    # the split's queries scores the others as zero: said
    (tmp_path / "other.trec").write_text("x1 Q0 d1 1 3.0 sys\n")
    code, out = _invoke([*args, "--run", str(tmp_path / "other.trec")])
    assert code == 2 and "other.trec: none of its 1 queries (e.g. ['x1']) is a judged query of split 'test'" in out
    (tmp_path / "half.trec").write_text("q1 Q0 d1 1 3.0 sys\n")
    with pytest.warns(AnceWarning, match="half.trec ranks 1 of the 2 judged queries of split 'test': the other 1 "):
        code, out = _invoke([*args, "--run", str(tmp_path / "half.trec"), "--json"])
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 0.5
    # a run of another collection's documents would score 0.0: refused; a few unknown documents or queries: said
    (tmp_path / "docs.trec").write_text("q1 Q0 x1 1 3.0 sys\nq2 Q0 x2 1 2.0 sys\n")
    code, out = _invoke([*args, "--run", str(tmp_path / "docs.trec")])
    assert code == 2 and "docs.trec: none of its 2 document ids (e.g. ['x1', 'x2']) is in the corpus" in out, out
    (tmp_path / "stray.trec").write_text((tmp_path / "run.trec").read_text() + "q1 Q0 nodoc 3 1.0 sys\n"
                                         "qZ Q0 d1 1 1.0 sys\n")
    with pytest.warns(AnceWarning) as caught:
        code, out = _invoke([*args, "--run", str(tmp_path / "stray.trec"), "--json"])
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["mrr_at_10"] == 0.75, out
    said = " ".join(str(w.message) for w in caught)
    assert "1 of its 3 queries are not judged queries of split 'test' and are not scored (e.g. ['qZ'])" in said
    assert "1 of its 4 document ids are not in the corpus" in said and "['nodoc']" in said


def test_lengths_above_the_models_positions_are_refused_before_any_work(tiny_model, tmp_path):
    from transformers import AutoConfig

    most = AutoConfig.from_pretrained(tiny_model).max_position_embeddings
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"name": str(tiny_model)}, "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg), "--set", "model.passage_max_length=100000",
                         "--set", f"ance.query_max_length={most + 1}"])
    assert code == 2 and "Traceback" not in out and not (tmp_path / "w").exists()
    assert f"model.passage_max_length 100000, ance.query_max_length {most + 1}: above the {most} positions" in out


def test_behind_a_proxy_the_hub_is_left_to_its_client(monkeypatch):
    from huggingface_hub import constants

    from ance_core.modeling.checks import hub_reachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://127.0.0.1:9")  # nothing answers there
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert not hub_reachable(timeout=1)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # the probe would not go through it: not asked
    assert hub_reachable(timeout=1)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert not hub_reachable(timeout=1)


def test_a_teacher_that_cannot_be_loaded_or_reads_too_many_tokens_is_refused_before_any_work(tiny_model, tmp_path):
    from transformers import AutoConfig

    most = AutoConfig.from_pretrained(tiny_model).max_position_embeddings
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"name": str(tiny_model)}, "work_dir": str(tmp_path / "w"),
                               "mining": {"teacher": {"model": str(tmp_path / "no-teacher")}}}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and f"cannot load model '{tmp_path / 'no-teacher'}': no such folder" in out
    code, out = _invoke(["run", "--config", str(cfg), "--set", f"mining.teacher.model={tiny_model}",
                         "--set", f"mining.teacher.max_length={most + 1}"])
    assert code == 2 and f"mining.teacher.max_length {most + 1}: above the {most} positions" in out
    assert "Traceback" not in out and not (tmp_path / "w").exists()


def test_a_model_that_cannot_be_loaded_is_one_line_before_any_work(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"name": str(tmp_path / "no-such-model")}, "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and f"cannot load model '{tmp_path / 'no-such-model'}'" in out and "Traceback" not in out
    assert len({line for line in out.splitlines() if line.strip()}) == 1 and not (tmp_path / "w").exists()  # (the
    # runner's output holds stderr twice)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)  # a model's file, not its folder (it said the file was
    cfg.write_text(json.dumps({"model": {"name": str(tmp_path / "model.safetensors")},  # not valid JSON)
                               "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and f"'{tmp_path / 'model.safetensors'}': a file, not a model folder" in out, out
    assert "Traceback" not in out and not (tmp_path / "w").exists()


def test_a_hub_model_offline_is_one_line_at_once_without_the_hubs_retries(tmp_path, monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"model": {"name": "no-org/no-such-model"}, "work_dir": str(tmp_path / "w")}))
    code, out = _invoke(["run", "--config", str(cfg)])
    assert code == 2 and "Traceback" not in out and "Retry" not in out and not (tmp_path / "w").exists()
    assert {line for line in out.splitlines() if line.strip()} == {
        f"error: cannot load model 'no-org/no-such-model': not a local folder nor in the Hugging Face cache, and "
        f"http://127.0.0.1:{port} cannot be reached from here (offline?); download it where there is a network and "
        "give its folder as model.name"}


def test_a_full_disk_or_a_read_only_folder_is_one_line_naming_where(capsys):
    """`ance export` onto a full disk printed 59 lines ending in OSError [Errno 28]: one line now, naming where
    the write failed (a copy's destination), and the remedy."""
    import errno

    import typer

    from ance_cli.guard import guard

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "ckpt/model.safetensors", None,
                      "out/.partial-out-1/model.safetensors")

    def read_only():
        raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/hits.trec")

    for body, line in ((full, "error: out/.partial-out-1/model.safetensors: No space left on device (ENOSPC); free "
                              "space there or write elsewhere, and run the command again"),
                       (read_only, "error: /mnt/ro/hits.trec: Read-only file system (EROFS); write elsewhere")):
        with pytest.raises(typer.Exit) as stop:
            guard(body)
        err = capsys.readouterr().err
        assert stop.value.exit_code == 2 and err.startswith(line) and len(err.splitlines()) == 1, err

    def bug():
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(OSError):  # (any other OSError is a bug: its traceback stays)
        guard(bug)


def test_user_errors_are_logged_without_their_traceback_unless_debugging(monkeypatch, caplog):
    import errno
    import logging

    from ance_cli.guard import DEBUG, one_line_user_errors
    from ance_core.errors import AnceError

    factory = logging.getLogRecordFactory()
    try:
        one_line_user_errors()
        log = logging.getLogger("prefect.flow_runs.test")
        for debug in (False, True):
            if debug:
                monkeypatch.setenv(DEBUG, "1")
            caplog.clear()
            # what the machine refused too (a probe: a read-only folder mid-run ended in one good line, below two task
            # logs' tracebacks), as an OSError or as a library's text
            for error in (AnceError("bad config"), OSError(errno.EROFS, "Read-only file system"),
                          Exception("No space left on device (os error 28)"), RuntimeError("a bug"),
                          OSError(errno.EBADF, "Bad file descriptor")):
                try:
                    raise error
                except Exception:
                    log.error("Encountered exception during execution: %r", error, exc_info=True)
            *users, bug, other = caplog.records
            assert all((user.exc_info is not None) == debug for user in users) and len(users) == 3
            assert bug.exc_info is not None and other.exc_info is not None  # a bug keeps its traceback
    finally:
        logging.setLogRecordFactory(factory)


def test_search_reads_an_index_of_any_layout_and_refuses_a_folder_that_is_not_one(tiny_model, tmp_path):
    """`ance search` on a flat index (shards + flat.json), one stored in parts (`index.shards`), and a faiss file;
    the same hits from each exact one, a TREC run file written; a folder without an index is one line, exit 2."""
    import pandas as pd

    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model
    from ance_core.retrieval.config import EncodeConfig, IndexConfig
    from ance_core.retrieval.encode import encode_corpus
    from ance_core.retrieval.index import build_index
    from ance_core.retrieval.search import read_trec

    ckpt = tmp_path / "ckpt"
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), ckpt)
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(30)], "title": "",
                           "text": [f"passage {i} about topic {i % 7} and more words" for i in range(30)]})
    (tmp_path / "emb").mkdir()
    encode_corpus(ckpt, corpus, EncodeConfig(shard_size=8, precision="fp32"), tmp_path / "emb")
    hits = {}
    for name, cfg in {"flat": IndexConfig(), "flat-parts": IndexConfig(shards=3),
                      "hnsw-parts": IndexConfig(type="hnsw", shards=2)}.items():
        (tmp_path / name).mkdir()
        build_index(tmp_path / "emb", tmp_path / name, cfg)
        code, out = _invoke(["search", "topic 3", "--model", str(ckpt), "--index", str(tmp_path / name),
                             "--top-k", "5", "--trec", str(tmp_path / f"{name}.trec"), "--query-id", "q7"])
        assert code == 0, out
        assert "(the passages' text: --dataset, the collection the index holds)" in out.splitlines()
        hits[name] = [line.split()[2] for line in out.splitlines() if line.strip() and not line.startswith("(")]
        run = read_trec(tmp_path / f"{name}.trec")
        assert run["doc_id"].tolist() == hits[name] and set(run["query_id"]) == {"q7"}
    assert len(hits["flat"]) == 5 and hits["flat-parts"] == hits["flat"]
    # the passages' text shown from a folder that holds the corpus alone (no queries, no qrels: a corpus to search)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "corpus.jsonl").write_text(corpus.to_json(orient="records", lines=True).replace(
        '"doc_id"', '"_id"'))
    code, out = _invoke(["search", "topic 3", "--model", str(ckpt), "--index", str(tmp_path / "flat"), "--top-k", "5",
                         "--dataset", str(tmp_path / "corpus")])
    assert code == 0 and "and more words" in out, out
    code, out = _invoke(["search", "topic 3", "--model", str(ckpt), "--index", str(tmp_path / "emb")])
    assert code == 2 and "not an index folder" in out and "Traceback" not in out
    (empty := tmp_path / "empty-corpus").mkdir()
    (empty / "corpus.jsonl").write_text("")
    # what a review found failing after the search, with a traceback, or writing lines `ance evaluate --run` refuses
    flat = ["search", "topic 3", "--model", str(ckpt), "--index", str(tmp_path / "flat")]
    for args, message in ((["--trec", str(tmp_path)], "a folder; give the run file's path"),
                          (["--trec", str(tmp_path / "q.trec"), "--query-id", "q 7"], "is one word"),
                          (["--trec", str(tmp_path / "q.trec"), "--query-id", ""], "is one word"),
                          (["--hybrid", "--dataset", str(tmp_path / "corpus"), "--work-dir",
                            str(tmp_path / "flat.trec")], "a file, not a folder"),
                          (["--trec", "/proc/q.trec"], "--trec /proc/q.trec: cannot write in /proc"),  # (not after
                          # the search, with a traceback)
                          (["--hybrid", "--dataset", str(tmp_path / "corpus"), "--fusion", "bogus", "--work-dir",
                            str(tmp_path / "new-work")], "--fusion bogus: expected auto, rrf"),
                          (["--hybrid", "--dataset", str(empty), "--work-dir", str(tmp_path / "new-work")],
                           "corpus.jsonl: empty corpus"),  # (its locks and empty data folder were left behind)
                          (["--trec", str(ckpt / "model.safetensors")], "inside the model's or the index's folder"),
                          (["--trec", str(tmp_path / "flat" / "hits.trec")], "inside the model's or the index's")):
        code, out = _invoke([*flat, *args])
        assert code == 2 and message in out and "Traceback" not in out, (args, out)
    assert _invoke(flat)[0] == 0  # (the checkpoint was not overwritten by a run file)
    # a query the terminal's locale could not decode (argv's surrogate escapes): a traceback from pyarrow
    code, out = _invoke(["search", "caf\udce9 cancer", "--model", str(ckpt), "--index", str(tmp_path / "flat")])
    assert code == 2 and "the query is not UTF-8 text (character 3)" in out and "Traceback" not in out, out
    assert not (tmp_path / "q.trec").exists() and not (tmp_path / "new-work").exists()  # (once left there, empty)


def test_fusion_auto_finds_the_runs_choice_in_a_work_folder_moved_since(tmp_path):
    """latest.json names the run's model by the path it had; a work folder copied or moved since (a container's
    /app/work copied out) named another place, and --fusion auto fused by RRF, not by the run's choice."""
    from ance_cli.hybrid import chosen_fusion

    model = tmp_path / "moved" / "train" / "7c63b72d4c656681"
    model.mkdir(parents=True)
    (model / "manifest.json").write_text(json.dumps({"key": model.name}))
    fusion = {"method": "convex", "weight": 0.1, "k": 60}
    (tmp_path / "moved" / "latest.json").write_text(json.dumps({
        "checkpoint": f"/app/work/train/{model.name}", "digest": model.name, "fusion": fusion}))
    how, _, _ = chosen_fusion("auto", model, str(tmp_path / "moved"))
    assert how.label() == "convex, dense weight 0.1"
    other = tmp_path / "moved" / "train" / "0000000000000000"  # another stage's model: no fusion known for it
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"key": other.name}))
    with pytest.warns(AnceWarning, match=f"no run in {tmp_path / 'moved'} fused {other} with BM25 on a dev split"):
        how, _, _ = chosen_fusion("auto", other, str(tmp_path / "moved"))
    assert how.label() == "RRF (k=60)"


def test_fusion_auto_finds_the_choice_of_a_model_that_is_no_longer_the_newest_result(tmp_path):
    """Another collection trained since in the same work folder: latest.json names its model, and the earlier model's
    hybrid search fused by RRF with the default BM25 (its run had chosen a convex fusion, stored in its fusion
    stage), saying to give the work folder it was given."""
    from ance_cli.hybrid import chosen_fusion
    from ance_core.retrieval.config import BM25Config

    def write_json(path, record):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))

    work = tmp_path / "work"
    for stage in ("m1", "m2"):
        (work / "train" / stage).mkdir(parents=True)
        write_json(work / "train" / stage / "manifest.json", {"key": stage})
    write_json(work / "latest.json", {"checkpoint": str(work / "train" / "m2"), "digest": "m2",
                                      "fusion": {"method": "rrf", "weight": None, "k": 60}})
    bm25 = BM25Config(k1=1.2, stemmer=None)  # a manifest records a stage's config as its repr
    write_json(work / "bm25" / "b1" / "manifest.json", {"config": {"bm25": str(bm25.scoring()), "top_k": 500}})
    write_json(work / "retrieve" / "r1" / "manifest.json", {"inputs": {"checkpoint": "m1"}})
    write_json(work / "fusion" / "f1" / "manifest.json", {"config": {"top_k": 500}, "inputs": {"dense": "r1",
                                                                                               "bm25": "b1"}})
    write_json(work / "fusion" / "f1" / "fusion.json", {"chosen": {"method": "convex", "weight": 0.3, "k": 60}})
    how, bm25_cfg, depth = chosen_fusion("auto", work / "train" / "m1", str(work))
    assert how.label() == "convex, dense weight 0.3" and depth == 500
    assert bm25_cfg.scoring() == bm25.scoring()
    how, _, _ = chosen_fusion("auto", work / "train" / "m2", str(work))  # the newest result's, from latest.json
    assert how.label() == "RRF (k=60)"
    how, bm25_cfg, depth = chosen_fusion("0.7", work / "train" / "m1", str(work))  # (the fusion given, the rest the
    # run's: it was the default BM25, 1000 deep)
    assert how.label() == "convex, dense weight 0.7" and depth == 500 and bm25_cfg.scoring() == bm25.scoring()
    # the model fused since by a run on another collection (a start_checkpoint run whose best dense model it stayed):
    # the newest fusion, unless the collection searched is told; then the one fused on its corpus
    import os

    from ance_core.data.sources import dataset_digest

    own = write_beir(tmp_path / "own", [{"_id": "d1", "text": "x"}], [{"_id": "q", "text": "x"}],
                     {"train": [("q", "d1", 1)]})
    write_json(work / "data" / "a" / "manifest.json", {"inputs": {"content": dataset_digest(own)}})
    write_json(work / "data" / "b" / "manifest.json", {"inputs": {"content": "another collection"}})
    write_json(work / "fusion" / "f1" / "manifest.json", {"config": {"top_k": 500}, "inputs": {
        "dense": "r1", "bm25": "b1", "data": "a"}})
    write_json(work / "fusion" / "f2" / "manifest.json", {"config": {"top_k": 1000}, "inputs": {
        "dense": "r1", "bm25": "b1", "data": "b"}})
    write_json(work / "fusion" / "f2" / "fusion.json", {"chosen": {"method": "rrf", "weight": None, "k": 60}})
    os.utime(work / "fusion" / "f1", (1, 1))  # (the older)
    assert chosen_fusion("auto", work / "train" / "m1", str(work))[0].label() == "RRF (k=60)"
    how, _, depth = chosen_fusion("auto", work / "train" / "m1", str(work), str(own))
    assert how.label() == "convex, dense weight 0.3" and depth == 500


def test_search_pairs_a_model_with_the_index_of_its_own_encoding(tiny_model, tmp_path, monkeypatch):
    """In a work folder, `ance search` without --index finds the index of the model's encoding (through the stage
    manifests), and refuses --index holding another checkpoint's encoding, naming the right one."""
    import pandas as pd

    from ance_core.artifacts import write_json
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import checkpoint_digest, init_model
    from ance_core.retrieval.config import EncodeConfig, IndexConfig
    from ance_core.retrieval.encode import encode_corpus
    from ance_core.retrieval.index import build_index

    work = tmp_path / "work"
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(20)], "title": "",
                           "text": [f"passage {i} about topic {i % 7} and more words" for i in range(20)]})
    for n, temperature in enumerate((0.05, 0.5)):  # two checkpoints, each encoded and indexed as stages are
        ckpt = work / "model" / f"m{n}"
        init_model(ModelConfig(name=str(tiny_model), passage_max_length=32, init_temperature=temperature), ckpt)
        (emb := work / "encode" / f"e{n}").mkdir(parents=True)
        encode_corpus(ckpt, corpus, EncodeConfig(precision="fp32"), emb)
        write_json(emb / "manifest.json", {"key": emb.name, "inputs": {"checkpoint": checkpoint_digest(ckpt)}})
        (index := work / "index" / f"i{n}").mkdir(parents=True)
        build_index(emb, index, IndexConfig())
        write_json(index / "manifest.json", {"key": index.name, "inputs": {"embeddings": emb.name}})
    scores = {}
    for args in ([], ["--index", str(work / "index" / "i1")]):
        code, out = _invoke(["search", "topic 3", "--model", str(work / "model" / "m1"), "--top-k", "3", *args])
        assert code == 0, out
        scores[len(args)] = out
    assert scores[0] == scores[2]  # the index found is m1's
    code, out = _invoke(["search", "topic 3", "--model", str(work / "model" / "m1"), "--index",
                         str(work / "index" / "i0")])
    assert code == 2 and "Traceback" not in out
    assert f"holds the encoding of checkpoint {checkpoint_digest(work / 'model' / 'm0')}, not of --model" in out
    assert f"this model's index is {work / 'index' / 'i1'}" in out

    # a training stage's folder (its key is its name) is told by key; an exact index is preferred to a newer HNSW one
    (stage := work / "train" / "k2").mkdir(parents=True)
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32, init_temperature=0.2), stage)
    write_json(stage / "manifest.json", {"key": "k2"})
    (emb := work / "encode" / "e2").mkdir(parents=True)
    encode_corpus(stage, corpus, EncodeConfig(precision="fp32"), emb)
    write_json(emb / "manifest.json", {"key": "e2", "inputs": {"checkpoint": "k2"}})
    for name, cfg in (("i2", IndexConfig()), ("i3", IndexConfig(type="hnsw"))):
        (index := work / "index" / name).mkdir()
        build_index(emb, index, cfg)
        write_json(index / "manifest.json", {"key": name, "config": {"type": cfg.type}, "inputs": {"embeddings": "e2"}})
    from ance_cli.lookups import index_of
    from ance_core.retrieval.provenance import indexes_of

    assert index_of(stage, None) == work / "index" / "i2"
    # the model evaluated on another collection since: its index of that corpus is newer, and was searched in place of
    # the one of --dataset's corpus (or, without --dataset, of the corpus it trained on)
    from ance_core.data.sources import dataset_digest

    own, other = (write_beir(tmp_path / name, [{"_id": "d1", "text": name}], [{"_id": "q", "text": "x"}],
                             {"train": [("q", "d1", 1)]}) for name in ("own", "other"))
    for name, dataset in (("own", own), ("other", other)):
        (work / "data" / name).mkdir(parents=True)
        write_json(work / "data" / name / "manifest.json", {"inputs": {"content": dataset_digest(dataset)}})
        (work / "data" / name / "corpus.parquet").touch()
    write_json(stage / "manifest.json", {"key": "k2", "inputs": {"data": "own"}})
    write_json(emb / "manifest.json", {"key": "e2", "inputs": {"checkpoint": "k2", "data": "own"}})
    (emb3 := work / "encode" / "e3").mkdir()
    write_json(emb3 / "manifest.json", {"key": "e3", "inputs": {"checkpoint": "k2", "data": "other"}})
    (index := work / "index" / "i4").mkdir()
    write_json(index / "manifest.json", {"key": "i4", "inputs": {"embeddings": "e3"}})
    os.utime(work / "index" / "i2", (1, 1))  # (older than i4)
    assert indexes_of(stage, work)[0] == index  # the newest
    assert index_of(stage, None) == index_of(stage, None, str(own)) == work / "index" / "i2"
    assert index_of(stage, None, str(other)) == index
    write_beir(tmp_path / "third", [{"_id": "d1", "text": "third"}], [{"_id": "q", "text": "x"}],
               {"train": [("q", "d1", 1)]})
    with pytest.raises(AnceError, match="none of the 3 indexes of .* holds its corpus.s documents .*`ance evaluate "
                       "--checkpoint"):
        index_of(stage, None, str(tmp_path / "third"))
    monkeypatch.chdir(work / "index")  # a relative --index is checked as well
    code, out = _invoke(["search", "topic 3", "--model", str(stage), "--index", "i1"])
    assert code == 2 and "holds the encoding of checkpoint" in out and f"index is {work / 'index' / 'i2'}" in out


def test_an_ance_warning_is_one_line_without_the_source_that_warns(monkeypatch, capsys):
    import warnings

    from ance_cli.guard import plain_warnings
    from ance_core.errors import warn

    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: others.append(str(message)))
    plain_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warn("qrels.tsv: 1 of 3 qrels name documents that are not in the corpus")
        warnings.warn("something else", UserWarning, stacklevel=1)
        warn("qrels.tsv: 1 of 3 qrels name documents that are not in the corpus")  # (the file read again: `search
        # --hybrid` read a new corpus for its data stage, then for its texts, and said it twice)
    assert capsys.readouterr().err == "warning: qrels.tsv: 1 of 3 qrels name documents that are not in the corpus\n"
    assert others == ["something else"]  # other warnings as Python shows them


def test_recipes_lists_each_recipes_overrides_which_rebuild_it():
    """`ance recipes --json`: each recipe's --set arguments give its config over the defaults (`ance run` with
    them trains the recipe), and where it was chosen."""
    from ance_core.pipeline.loading import load_config
    from ance_core.pipeline.recipes import recipe_config

    code, out = _invoke(["recipes", "--json"])
    listed = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and list(listed) == ["demo", "full", "full-maxp", "auto"]
    for name in ("demo", "full", "full-maxp"):  # full-maxp's sets unset two lengths (null)
        assert load_config(None, sets=listed[name]["sets"]) == recipe_config(name)
        assert listed[name]["chosen"]
    assert listed["auto"]["sets"] == [] and "dev split" in listed["auto"]["chosen"]
    code, out = _invoke(["recipes"])
    assert code == 0 and "demo: --set mining.sampler=simans" in out


def test_a_bad_tune_setting_is_named_by_its_own_flag_before_any_work(tmp_path):
    code, out = _invoke(["tune", "--tune-set", "foo=[1]", "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "invalid config (with --tune-set foo=[1])" in out and "Traceback" not in out
    code, out = _invoke(["tune", "--tune-set", "seeds", "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "--tune-set seeds: expected key=value" in out
    code, out = _invoke(["tune", "--tune-set", "learning_rates=[-1e-5]", "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "learning_rates.0" in out and "greater than 0" in out
    assert not (tmp_path / "w").exists()


def test_hybrid_search_refuses_a_corpus_other_than_the_indexs(tmp_path):
    """A MaxP index lists a document once per window: the same corpus. Another corpus, or one document more, is not."""
    from types import SimpleNamespace

    import pandas as pd

    from ance_cli.lookups import check_same_corpus
    from ance_core.errors import AnceError

    index, data = tmp_path / "index", tmp_path / "data"
    index.mkdir()
    data.mkdir()
    (index / "docid").write_text("d1\nd1\nd2\n")
    for ids, fits in ((["d2", "d1"], True), (["d1", "d2", "d3"], False), (["x1", "x2"], False)):
        pd.DataFrame({"doc_id": ids, "title": "", "text": "t"}).to_parquet(data / "corpus.parquet")
        if fits:
            check_same_corpus(index, SimpleNamespace(path=str(data)), "mine")
        else:
            with pytest.raises(AnceError, match=rf"--dataset mine: its corpus \({len(ids)} documents\) is not the one "
                               rf"the index .* holds \(2 documents, {2 * (ids[0] == 'd1')} of them in mine\)"):
                check_same_corpus(index, SimpleNamespace(path=str(data)), "mine")


def test_hybrid_search_refuses_a_corpus_of_the_same_ids_with_other_texts(tmp_path):
    """The same document ids with other texts (another version of the collection): the index's encoding is told from
    the stage manifests (index -> encode -> data) and a sample of texts compared; refused, naming a document. Where
    the index's data stage is gone, it cannot be told."""
    from types import SimpleNamespace

    import pandas as pd

    from ance_cli.lookups import check_same_corpus, check_same_texts
    from ance_core.errors import AnceError

    work = tmp_path / "work"
    index, encode, encoded = work / "index" / "i1", work / "encode" / "e1", work / "data" / "d1"
    for folder, manifest in ((index, {"inputs": {"embeddings": "e1"}}), (encode, {"inputs": {"data": "d1"}}),
                             (encoded, {})):
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    (index / "docid").write_text("".join(f"d{i}\n" for i in range(100)))
    texts = [f"passage {i}" for i in range(100)]
    pd.DataFrame({"doc_id": [f"d{i}" for i in range(100)], "title": "", "text": texts}).to_parquet(
        encoded / "corpus.parquet")
    mine = tmp_path / "mine"
    mine.mkdir()
    for changed, fits in ((None, True), (99, False), (0, False)):
        pd.DataFrame({"doc_id": [f"d{i}" for i in range(100)], "title": "",
                      "text": [t + " v2" * (i == changed) for i, t in enumerate(texts)]}).to_parquet(
            mine / "corpus.parquet")
        if fits:
            check_same_corpus(index, SimpleNamespace(path=str(mine)), "mine")
        else:
            with pytest.raises(AnceError, match=rf"--dataset mine: 1 of \d+ documents compared hold other texts than "
                               rf"the corpus the index .* was encoded from \(e.g. 'd{changed}': 'passage {changed} v2' "
                               rf"against 'passage {changed}'\)"):
                check_same_corpus(index, SimpleNamespace(path=str(mine)), "mine")
    with pytest.raises(AnceError, match="'d5'"):  # the hits `ance search --dataset` prints, compared the same way
        check_same_texts(index, {"d4": "passage 4", "d5": "another text"}, "mine")
    import shutil

    shutil.rmtree(encoded)  # (gc removed it): nothing to compare with
    check_same_texts(index, {"d5": "another text"}, "mine")


def test_a_models_work_folder_is_the_one_it_is_a_stage_of(tmp_path):
    """`ance search --hybrid` without --work-dir writes its data and BM25 stages in the model's work folder: only when
    the model is a stage folder of one (not a project folder that happens to hold a data/ folder)."""
    from ance_cli.lookups import model_work_dir

    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / "models" / "my-ance").mkdir(parents=True)
    assert model_work_dir(project / "models" / "my-ance") == "work"
    stage = tmp_path / "work" / "train" / "abc"
    stage.mkdir(parents=True)
    (stage / "manifest.json").write_text("{}")
    (tmp_path / "work" / ".locks").mkdir()
    assert model_work_dir(stage) == str(tmp_path / "work")


def test_options_a_command_would_ignore_or_fail_on_late_are_refused_first(tmp_path, tiny_model):
    """Found by a probe: `ance tune --out <a folder>` failed with a traceback after the whole search; `ance search
    --fusion rrf` without --hybrid showed the plain ranking as if fused."""
    code, out = _invoke(["tune", "--out", str(tmp_path), "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and f"--out {tmp_path}: a folder" in out and not (tmp_path / "w").exists(), out
    code, out = _invoke(["tune", "--out", str(tmp_path / "no" / "r.yaml"), "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and f"no folder {tmp_path / 'no'} to write it in" in out, out
    for extra in (["--fusion", "rrf"], ["--work-dir", str(tmp_path)]):
        code, out = _invoke(["search", "a query", "--model", str(tiny_model), *extra])
        assert code == 2 and f"{extra[0]}: for --hybrid only" in out, out


def test_a_config_file_that_replaces_a_recipes_setting_is_said(tmp_path):
    """`ance run --recipe demo --config f.yaml`: the file's sections are merged over the recipe, which a probe found
    replaced demo's learning rate without a word (`ance tune` said so)."""
    (tmp_path / "f.yaml").write_text("warmup:\n  learning_rate: 0.001\n")
    said = (f"--recipe demo: the config file {tmp_path / 'f.yaml'} replaces the recipe's warmup.learning_rate=4e-05 "
            "(the config: 0.001)")
    with pytest.warns(AnceWarning, match=re.escape(said)):
        code, out = _invoke(["run", "--recipe", "demo", "--config", str(tmp_path / "f.yaml"), "--set", "nosuch=1",
                             "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and "nosuch: not a section or setting of the config" in out, out  # (stopped before any work)


def test_a_compressed_model_searches_its_own_index_and_refuses_another_compressions(tiny_model, tmp_path):
    """A compressed model (<work>/compress/<key>/model) was paired with any index: its index's manifest names the
    compress stage, not an encode stage, so which checkpoint encoded it read as unknown (a warning saying 'no
    manifest'), and a PCA model searched a truncation's index of the same dimension, its hits meaning nothing; without
    --index, its work folder was taken to be <work>/compress."""
    import pandas as pd

    from ance_cli.lookups import index_of
    from ance_core.artifacts import write_json
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model
    from ance_core.retrieval.config import EncodeConfig, IndexConfig
    from ance_core.retrieval.encode import encode_corpus
    from ance_core.retrieval.index import build_index

    work = tmp_path / "work"
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(12)], "title": "",
                           "text": [f"passage {i} about topic {i % 5}" for i in range(12)]})
    models, indexes = [], []
    for n, temperature in enumerate((0.05, 0.5)):  # two compress stages: their model and encoding, indexed
        stage = work / "compress" / f"k{n}"
        init_model(ModelConfig(name=str(tiny_model), passage_max_length=32, init_temperature=temperature),
                   stage / "model")
        encode_corpus(stage / "model", corpus, EncodeConfig(precision="fp32"), stage)
        write_json(stage / "manifest.json", {"key": stage.name})
        (index := work / "index" / f"i{n}").mkdir(parents=True)
        build_index(stage, index, IndexConfig())
        write_json(index / "manifest.json", {"key": index.name, "inputs": {"embeddings": stage.name}})
        models.append(stage / "model")
        indexes.append(index)
    assert index_of(models[1], None) == indexes[1] and index_of(models[0], indexes[0]) == indexes[0]
    with pytest.raises(AnceError, match=f"not of --model {models[1]}: its scores would mean nothing; this model's "
                       f"index is {indexes[1]}"):
        index_of(models[1], indexes[0])


def test_search_reads_the_texts_of_its_hits_alone_from_the_corpus(tmp_path):
    """`ance search --dataset` printed ten hits' texts from the whole corpus loaded as a table (~3 GB of text at MS
    MARCO's size); it keeps the hits' documents only, joined as the encoder saw them, from either layout."""
    from ance_cli.lookups import corpus_titles

    corpus = [{"_id": f"d{i}", "title": "T" * (i % 2), "text": f"text {i}"} for i in range(50)]
    beir = write_beir(tmp_path / "beir", corpus, [{"_id": "q1", "text": "q"}], {"test": [("q1", "d1", 1)]})
    assert corpus_titles(str(beir), ["d3", "d4", "d99"]) == {"d3": "T text 3", "d4": "text 4"}
    (marco := tmp_path / "marco").mkdir()
    (marco / "collection.tsv").write_text("".join(f"{i}\tpassage {i}\n" for i in range(50)))
    assert corpus_titles(str(marco), ["7"]) == {"7": "passage 7"}


@pytest.mark.parametrize("args, says", [
    (["--recipe", "dmeo"], "--recipe dmeo: the search varies one of demo, full, full-maxp"),
    (["--seed", "-1"], "--seed -1: a seed is a whole number from 0 to"),
    (["--set", "warmup_only=true"], "warmup_only True: the search compares warm-ups and whole recipes"),
    (["--set", "start_checkpoint=/some/model"], "start_checkpoint /some/model: the search compares warm-ups"),
    (["--out", "/proc/recipe.yaml"], "--out /proc/recipe.yaml: cannot write in /proc"),
])
def test_tune_refuses_what_it_cannot_search_naming_the_flag_before_any_work(tmp_path, args, says):
    """Found by a review: a base config with start_checkpoint failed inside the search, after its data stage, with a
    pydantic dump; warmup_only was silently dropped; --recipe and --seed were named as the search's fields; an --out
    in a folder it cannot write in failed after the whole search."""
    code, out = _invoke(["tune", *args, "--set", f"work_dir={tmp_path / 'w'}"])
    assert code == 2 and says in out and "invalid config" not in out, out
    assert not (tmp_path / "w").exists()


def test_a_split_that_judges_nothing_relevant_is_refused_before_any_work(tmp_path, tiny_model):
    """`ance bm25` / `ance evaluate` on a split whose qrels are all grade 0 printed every metric as 0, exit 0, nothing
    said (`--checkpoint` after encoding the whole corpus). `ance compress` said "every metric would be 0" of its train
    split, whose positives ConAE learns from."""
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}, {"_id": "d2", "text": "y"}],
                    [{"_id": "q1", "text": "y"}, {"_id": "q2", "text": "x"}],
                    {"train": [("q1", "d1", 1)], "test": [("q2", "d1", 0), ("q2", "d2", 0)]})
    (tmp_path / "run.trec").write_text("q2 Q0 d1 1 2.0 x\n")
    for args in (["bm25"], ["evaluate", "--run", str(tmp_path / "run.trec")]):
        code, out = _invoke([*args, "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")])
        assert code == 2 and "split 'test' judges no document relevant (its 2 qrels rows are all of grade 0" in out, out
    unlabelled = write_beir(tmp_path / "unlabelled", [{"_id": "d1", "text": "x"}, {"_id": "d2", "text": "y"}],
                            [{"_id": "q1", "text": "y"}, {"_id": "q2", "text": "x"}],
                            {"train": [("q1", "d1", 0)], "test": [("q2", "d1", 1)]})
    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    code, out = _invoke(["compress", "--checkpoint", str(checkpoint), "--dataset", str(unlabelled), "--work-dir",
                         str(tmp_path / "w")])
    assert code == 2 and "split 'train' judges no document relevant" in out, out
    assert "nothing to learn from (ConAE's compression trains on its queries' positives)" in out, out


def test_evaluate_refuses_a_checkpoint_without_its_model_files_before_any_work(tmp_path, tiny_model):
    """A checkpoint folder holding its ance_model.json only: refused inside the flow, after the data stage was built
    and Prefect's server started."""
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model

    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), ckpt := tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    code, out = _invoke(["evaluate", "--checkpoint", str(ckpt), "--dataset", str(ds),
                         "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "a damaged checkpoint (no model.safetensors)" in out, out
    assert not (tmp_path / "w").exists()
    # weights cut short, or no tokenizer: refused by the encoding, its stages begun and the run recorded (a review)
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), ckpt := tmp_path / "cut")
    (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:1000])
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), bare := tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    for folder, said in ((ckpt, "a damaged checkpoint (SafetensorError"), (bare, "its tokenizer knows")):
        code, out = _invoke(["evaluate", "--checkpoint", str(folder), "--dataset", str(ds),
                             "--work-dir", str(tmp_path / "w")])
        assert code == 2 and said in out and "Traceback" not in out, out
        assert not (tmp_path / "w").exists()


def test_hybrid_search_reuses_the_data_stage_its_index_was_encoded_from(tmp_path):
    """A model trained with dev_fraction 0.5: `ance search --hybrid` read the dataset under the default split settings,
    so it built a second copy of the collection and a second BM25 index, which no run records (gc removed them an hour
    later, and the next search built them again)."""
    from ance_core.artifacts import write_json
    from ance_core.data.config import DataConfig
    from ance_core.retrieval.provenance import encoded_corpus
    from tasks.data import prepare_data, stage_data_config

    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(4)],
                    [{"_id": f"q{i}", "text": f"query {i}"} for i in range(4)],
                    {"train": [(f"q{i}", f"d{i}", 1) for i in range(4)]})
    work = tmp_path / "work"
    data = prepare_data.fn(DataConfig(dataset=str(ds), dev_fraction=0.5, dev_seed=3), str(work))
    (encode := work / "encode" / "e1").mkdir(parents=True)
    write_json(encode / "manifest.json", {"key": "e1", "inputs": {"checkpoint": "k", "data": data.digest}})
    (index := work / "index" / "i1").mkdir(parents=True)
    write_json(index / "manifest.json", {"key": "i1", "inputs": {"embeddings": "e1"}})
    again = prepare_data.fn(stage_data_config(encoded_corpus(index), str(ds)), str(work))
    assert again.path == data.path and again.cached
    assert stage_data_config(encoded_corpus(tmp_path / "elsewhere"), str(ds)) == DataConfig(dataset=str(ds),
                                                                                           download=False)


def test_evaluate_a_checkpoint_on_dev_carves_the_dev_split_as_its_run_did(tmp_path):
    """A model trained with dev_fraction 0.5: `ance evaluate --checkpoint ... --split dev` scored it on the default
    carve (dev_fraction 0.2), other queries than those its run chose on, without a word (found by a review). Its
    run's carve is read from the data stage its training read; a checkpoint that cannot be traced keeps the defaults,
    and the command says which carve it used."""
    from ance_cli.lookups import evaluation_data, trained_data
    from ance_core.artifacts import write_json
    from ance_core.data.config import DataConfig
    from tasks.data import prepare_data

    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(10)],
                    [{"_id": f"q{i}", "text": f"query {i}"} for i in range(10)],
                    {"train": [(f"q{i}", f"d{i}", 1) for i in range(10)]})
    work = tmp_path / "work"
    ran = DataConfig(dataset=str(ds), dev_fraction=0.5, dev_seed=3)
    data = prepare_data.fn(ran, str(work))
    (trained := work / "train" / "t1").mkdir(parents=True)
    write_json(trained / "manifest.json", {"key": "t1", "inputs": {"checkpoint": "k", "negatives": "n",
                                                                   "data": data.digest}})
    (init := work / "model" / "m1").mkdir(parents=True)
    write_json(init / "manifest.json", {"key": "m1", "inputs": {}})

    got = trained_data(trained, str(ds))
    assert (got.dev_fraction, got.dev_seed, got.dev_fold) == (0.5, 3, 0)
    assert trained_data(init, str(ds)) is None and trained_data(None, str(ds)) is None
    other = write_beir(tmp_path / "other", [{"_id": "d0", "text": "x"}], [{"_id": "q0", "text": "y"}],
                       {"train": [("q0", "d0", 1)]})
    assert trained_data(trained, str(other)) is None  # the stage holds another dataset's content

    dev = evaluation_data(str(ds), "dev", str(work), trained)
    assert prepare_data.fn(dev, str(work)).path == data.path  # the run's own data stage, reused
    assert evaluation_data(str(ds), "train", str(work), trained).dev_fraction == 0.5
    assert evaluation_data(str(ds), "test", str(work), trained).eval_split == "test"
    assert evaluation_data(str(ds), "dev", str(work), init).dev_fraction == DataConfig().dev_fraction

    import contextlib
    import io

    for ckpt, expected in ((trained, "as the run that trained the checkpoint carved it (data.dev_fraction 0.5, "
                            "dev_seed 3)"), (init, "with the defaults (data.dev_fraction 0.2, dev_seed 0)")):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            evaluation_data(str(ds), "dev", str(work), ckpt)
        assert f"split 'dev': carved from the 'train' queries {expected}" in buffer.getvalue(), buffer.getvalue()
        assert "so that run's carve is not known" not in buffer.getvalue()
    import shutil

    shutil.rmtree(data.path)  # the run's data stage collected: the defaults, and why
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert evaluation_data(str(ds), "dev", str(work), trained).dev_fraction == DataConfig().dev_fraction
    assert "with the defaults (data.dev_fraction 0.2, dev_seed 0): the data stage the checkpoint's run read is gone" \
        in buffer.getvalue(), buffer.getvalue()


def test_a_damaged_data_stage_is_one_line_naming_its_folder(tmp_path):
    """A cached data stage whose corpus.parquet was cut short (a disk that filled, a copy interrupted): every command
    reading it ended in pyarrow's traceback (found by a review)."""
    from ance_core.data.config import DataConfig
    from tasks.data import prepare_data

    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(4)],
                    [{"_id": f"q{i}", "text": f"query {i}"} for i in range(4)],
                    {"train": [(f"q{i}", f"d{i}", 1) for i in range(3)], "test": [("q3", "d3", 1)]})
    stage = prepare_data.fn(DataConfig(dataset=str(ds)), str(tmp_path / "w")).path
    (tmp_path / "w" / "data").joinpath(stage, "corpus.parquet").write_text("junk")
    code, out = _invoke(["bm25", "--dataset", str(ds), "--split", "test", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and f"{stage}: a damaged stage folder (ArrowInvalid" in out and "Traceback" not in out, out
    assert "remove it and run again" in out


def test_a_dev_split_that_cannot_be_carved_is_not_said_to_be_carved(tmp_path):
    """A dataset without training queries: `--split dev` printed "split 'dev': carved from the 'train' queries with the
    defaults", then an error saying none is carved (found by a review)."""
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    code, out = _invoke(["bm25", "--dataset", str(ds), "--split", "dev", "--work-dir", str(tmp_path / "w")])
    assert code == 2 and "split 'dev' has no qrels" in out and "split 'dev': carved" not in out, out


def test_a_search_without_a_dev_split_is_refused_before_its_flow(tmp_path, tiny_model, monkeypatch):
    """`ance tune` and `ance run --recipe auto` with data.dev_fraction 0 (or dev_split null) were refused inside the
    search's flow, after Prefect's server started and the data stage was built, with a run record left (found by a
    review); `--recipe auto`'s message named `ance tune`, a command the user never ran."""
    ds = write_beir(tmp_path / "ds", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(8)],
                    [{"_id": f"q{i}", "text": f"query {i}"} for i in range(8)],
                    {"train": [(f"q{i}", f"d{i}", 1) for i in range(6)], "test": [("q6", "d6", 1)]})
    base = ["--set", f"data.dataset={ds}", "--set", f"model.name={tiny_model}", "--set",
            "model.passage_max_length=32"]
    import flows.tune

    def searched(*args, **kwargs):
        raise AssertionError("the search's flow started")

    monkeypatch.setattr(flows.tune, "tune_recipe", searched)
    for command, dev in ((["tune"], "data.dev_fraction=0"), (["run", "--recipe", "auto"], "data.dev_fraction=0"),
                         (["tune"], "data.dev_split=null")):
        work = tmp_path / f"w-{command[0]}-{dev.split('=')[0]}"
        code, out = _invoke([*command, *base, "--set", dev, "--set", f"work_dir={work}"])
        assert code == 2 and "the recipe search (ance tune, --recipe auto) chooses on the dev split" in out, out
        assert "Traceback" not in out and not ((work / ".live").exists() and any((work / ".live").iterdir()))


def test_search_messages_name_what_the_user_gave(tmp_path, tiny_model):
    """--fusion 0 and 1 were refused as not "between 0 and 1"; a model outside a work folder was told there is "no
    index of its encoding in /tmp/index", a folder the user never named (found by a review)."""
    from ance_core.modeling.config import ModelConfig
    from ance_core.modeling.model import init_model

    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), ckpt := tmp_path / "ckpt")
    ds = write_beir(tmp_path / "ds", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "y"}],
                    {"test": [("q1", "d1", 1)]})
    for weight in ("0", "1"):
        code, out = _invoke(["search", "cells", "--model", str(ckpt), "--hybrid", "--dataset", str(ds), "--fusion",
                             weight])
        assert code == 2 and "weight strictly between 0 and 1" in out, out
    code, out = _invoke(["search", "cells", "--model", str(ckpt)])
    assert code == 2 and f"{ckpt} is no stage of a work folder, so its index cannot be found; give one with --index" \
        in out, out


def test_an_index_that_does_not_say_which_checkpoint_encoded_it_is_searched_with_a_warning(tmp_path):
    """An index folder without its manifest (copied without it) was searched with any model silently, its scores
    meaningless when another checkpoint encoded it (found by a review)."""
    from ance_cli.lookups import index_of
    from ance_core.retrieval.config import IndexConfig
    from ance_core.retrieval.index import build_index
    from tests.core.retrieval.test_encode_index import _random_encoding

    _random_encoding(tmp_path / "emb", n=20)
    (index := tmp_path / "index").mkdir()
    build_index(tmp_path / "emb", index, IndexConfig(type="flat", device="cpu"))
    with pytest.warns(AnceWarning, match="which checkpoint encoded it is not recorded"):
        assert index_of(tmp_path / "model", index) == index


def test_a_stop_signal_while_exiting_ends_the_process_without_a_traceback(tmp_path):
    """SIGTERM after a run had finished, while its exit handlers stopped the embedded Prefect server, raised into the
    handler: "Exception ignored in atexit callback" and a traceback. Now one line, and the process ends at once."""
    import subprocess
    import sys
    import time

    ready = tmp_path / "exiting"
    script = f"""
import atexit, pathlib, signal, time
from ance_cli.guard import exit_on_sigterm, guard
signal.signal(signal.SIGTERM, exit_on_sigterm)
def slow_exit():  # (as Prefect's embedded server stops: waiting on its process)
    pathlib.Path({str(ready)!r}).touch()
    time.sleep(60)
atexit.register(slow_exit)
guard(lambda: print("done"))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out == "done\n", (out, err)
    assert "stopped (SIGTERM) while exiting, after the command had ended" in err and "Traceback" not in err, err
