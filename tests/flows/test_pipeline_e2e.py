"""End to end: the `ance run` command (Prefect flow, ephemeral server: `make demo`'s mode) on a ~200-document SciFact
subset with a tiny random BERT; every stage's artifacts are checked, then an identical re-run reuses every stage."""

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.tiny import TINY_COMPRESSION, run_pipeline_cli, tiny_pipeline_config, write_beir

pytestmark = pytest.mark.slow
PIPELINE = pytest.mark.xdist_group("tiny-pipeline")  # the tests of the one tiny pipeline run: on one worker
ROUNDS = 2
DIMS, INDEXES = tuple(TINY_COMPRESSION["dims"]), tuple(TINY_COMPRESSION["index_types"])  # the tiny BERT's h is 32


@pytest.fixture(scope="module")
def pipeline(tiny_pipeline):
    """The tiny pipeline's run (tests/tiny.py `TinyPipeline`): its work folder, its result, and a re-run."""
    return tiny_pipeline.work, tiny_pipeline.first, tiny_pipeline.run


def _folders(work: Path, stage: str) -> list[Path]:
    return sorted(p for p in (work / stage).iterdir() if not p.name.startswith("."))


@PIPELINE
def test_every_stage_wrote_its_artifacts(pipeline, tiny_scifact):
    work, result, _ = pipeline
    tables = _folders(work, "data")[0]
    for name in ("corpus.parquet", "queries.parquet", "qrels.parquet", "manifest.json"):
        assert (tables / name).is_file()
    assert len(pd.read_parquet(tables / "corpus.parquet")) == 200
    assert len(_folders(work, "bm25")) == 3  # test and dev runs (top-1000) and train candidates (top-100)
    qrels = pd.read_parquet(tables / "qrels.parquet")  # the dev split: about 20% of the 40 train queries (each query
    dev, train = (set(qrels.loc[qrels["split"] == s, "query_id"]) for s in ("dev", "train"))  # by its own hash)
    assert len(dev) == 11 and len(train) == 29 and not dev & train
    assert (_folders(work, "model")[0] / "ance_model.json").is_file()
    encodes = _folders(work, "encode")
    assert len(encodes) == ROUNDS + 2  # zero-shot, warm-up, each round: each checkpoint encoded exactly once
    for folder in encodes:
        shards = sorted(folder.glob("emb_*.npy"))
        assert len(shards) == 4  # 200 passages in shards of 64
        assert sum(len(np.load(s)) for s in shards) == len((folder / "docids.txt").read_text().splitlines()) == 200
    first_emb = np.load(encodes[0] / "emb_00000.npy")
    assert first_emb.std(axis=0).mean() > 1e-3  # passages get distinct vectors (no collapse to one point)
    for folder in _folders(work, "index"):  # flat ones are their encoding's shards (hard links), others a faiss file
        assert (folder / "docid").is_file() and ((folder / "index").is_file() or (folder / "flat.json").is_file())
    from ance_core.artifacts import read_manifest

    for index in (f for f in _folders(work, "index") if (f / "flat.json").is_file()):
        source = next(work.glob(f"*/{read_manifest(index)['inputs']['embeddings']}"))  # an encode or compress folder
        assert (index / "emb_00000.npy").stat().st_ino == (source / "emb_00000.npy").stat().st_ino
    assert np.load(encodes[0] / "emb_00000.npy").dtype == np.float16  # encode.dtype's default
    qrels = pd.read_parquet(tables / "qrels.parquet")
    positives = qrels[(qrels["split"] == "train") & (qrels["relevance"] > 0)].groupby("query_id")["doc_id"].apply(set)
    mined = _folders(work, "mine")
    assert len(mined) == ROUNDS + 1
    for folder in mined:
        negatives = pd.read_parquet(folder / "negatives.parquet")
        assert len(negatives) == len(qrels[(qrels["split"] == "train") & (qrels["relevance"] > 0)])
        for row in negatives.itertuples():
            assert not set(row.negative_ids) & positives[row.query_id]
    trained = _folders(work, "train")
    assert len(trained) == ROUNDS + 1
    for folder in trained:
        assert len((folder / "train_log.jsonl").read_text().splitlines()) == 3
        for name in ("model.safetensors", "head.safetensors", "tokenizer.json", "optimizer.safetensors"):
            assert (folder / name).is_file()
    for folder in _folders(work, "evaluate"):
        assert (folder / "run.trec").is_file() and (folder / "per_query.parquet").is_file()
    assert not list(work.rglob(".partial-*"))


@PIPELINE
def test_metrics_are_numbers_in_range(pipeline):
    _, result, _ = pipeline
    models = [r["model"] for r in result["results"]]
    dense = ["zero-shot", "warmup", *(f"ANCE round {k}" for k in range(1, ROUNDS + 1))]
    dev = {r["model"]: r["dev_ndcg_at_10"] for r in result["results"]}
    best_dense = [m for m in dense if dev[m] == max(dev[d] for d in dense)][-1]
    assert models == ["BM25", *dense, f"{best_dense} + BM25"]  # the hybrid row: the best dense model on dev + BM25
    for row in result["results"]:
        for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "recall_at_1000"):
            assert 0.0 <= row[key] <= 1.0
    assert result["results"][0]["ndcg_at_10"] > 0.5  # BM25 on a 200-document subset finds the positives
    # the run's result is its best model on the dev split (BM25 is not a model, the hybrid is), whatever the test
    # split says (`selection: best`, the default)
    models = [m for m in dev if m != "BM25"]
    best = max(dev[m] for m in models)
    assert result["selected"] == result["best_on_dev"] == [m for m in models if dev[m] == best][-1]
    assert result["selection"] == "best"
    chosen = next(r for r in result["results"] if r["model"] == result["selected"])
    assert result["ndcg_at_10"] == chosen["ndcg_at_10"]
    assert f"**{result['selected']}** (result)" in Path(result["report_dir"], "results.md").read_text()
    stages = {(s["for"], s["stage"]): s["path"] for s in result["stages"]}
    checkpoint_of = result["selected"].removesuffix(" + BM25")  # a hybrid result's checkpoint is its dense model's
    assert result["final_checkpoint"] == (stages[(checkpoint_of, "train")] if checkpoint_of != "zero-shot"
                                          else stages[("zero-shot", "init")])
    fusion = json.loads(Path(stages[(f"{best_dense} + BM25", "fusion")], "fusion.json").read_text())
    assert fusion["split"] == "dev" and len(fusion["candidates"]) == 10
    hybrid = next(r for r in result["results"] if r["model"] == f"{best_dense} + BM25")
    assert hybrid["dev_ndcg_at_10"] == pytest.approx(max(c["dev_ndcg_at_10"] for c in fusion["candidates"]))
    # training moved the model: the final checkpoint ranks differently from the starting one
    dense = [r for r in result["results"] if r["model"] in dense]
    assert len({round(r["ndcg_at_10"], 6) for r in dense} | {round(r["recall_at_100"], 6) for r in dense}) > 2


@PIPELINE
def test_identical_rerun_reuses_every_stage(pipeline):
    _, first, run = pipeline
    # the CLI validated and stored the dataset before the flow started; everything else ran in the flow, and only
    # a folder this run had already built is reused (a round that starts from the model an earlier round started
    # from, when that round made dev worse, retrieves its training queries with the same model)
    assert first["stages"][0]["stage"] == "prepare" and first["stages"][0]["cached"]
    for i, stage in enumerate(first["stages"][1:], 1):
        assert not stage["cached"] or stage["path"] in {s["path"] for s in first["stages"][:i]}, stage
    second = run()
    assert all(stage["cached"] for stage in second["stages"]), [s for s in second["stages"] if not s["cached"]]
    assert second["results"] == first["results"]
    assert second["final_checkpoint"] == first["final_checkpoint"]
    # its models' checkpoints are the first run's: pointed at, not uploaded again (~90 MB a checkpoint at MiniLM's size)
    from mlflow.tracking import MlflowClient

    from tracking.uploads import HELD_IN_TAG

    client = MlflowClient(second["mlflow_uri"])

    def children(result: dict) -> dict:
        parent = client.get_run(result["mlflow_run_id"])
        return {r.info.run_name: r for r in client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}

    before, again = children(first), children(second)
    held = {name: run.data.tags[HELD_IN_TAG] for name, run in again.items() if HELD_IN_TAG in run.data.tags}
    assert {"warmup", *(f"ANCE round {k}" for k in range(1, ROUNDS + 1))} <= set(held)
    assert held == {name: before[name].info.run_id for name in held}
    assert all(client.list_artifacts(again[name].info.run_id, "checkpoint") == [] for name in held)


@PIPELINE
def test_search_and_evaluate_commands_use_the_trained_checkpoint(pipeline, tiny_scifact, tmp_path, monkeypatch):
    work, result, _ = pipeline
    from typer.testing import CliRunner

    from ance_cli.main import app
    from ance_core.artifacts import read_manifest

    final = Path(result["final_checkpoint"])
    # the index built from the final checkpoint's encoding (manifests record each stage's inputs)
    encodes = {p.name: read_manifest(p)["inputs"]["checkpoint"] for p in _folders(work, "encode")}
    index = next(p for p in _folders(work, "index")  # (the others index compressed vectors)
                 if encodes.get(read_manifest(p)["inputs"]["embeddings"]) == final.name)
    out = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index), "-k", "3",
                                   "--dataset", str(tiny_scifact)])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "1"
    scores = [float(line.split()[1]) for line in lines]
    assert scores == sorted(scores, reverse=True)
    trec = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index), "-k", "3",
                                    "--trec", str(tmp_path / "hits.trec"), "--query-id", "q7"])
    assert trec.exit_code == 0 and [line.split()[:4] for line in (tmp_path / "hits.trec").read_text().splitlines()] \
        == [["q7", "Q0", line.split()[2], str(k)] for k, line in enumerate(lines, 1)]
    # --hybrid: the same ranking fused with BM25's over the dataset's corpus (by RRF: another work folder's run, which
    # chose no fusion for this model: said)
    from ance_core.errors import AnceWarning

    with pytest.warns(AnceWarning, match=f"--fusion auto: no run in {tmp_path / 'w'} fused .* so no fusion chosen"):
        fused = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index), "-k",
                                         "3", "--dataset", str(tiny_scifact), "--hybrid",
                                         "--work-dir", str(tmp_path / "w")])
    assert fused.exit_code == 0, fused.output
    lines = fused.output.strip().splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("hybrid: "))
    head, hits = lines[at], lines[at + 1:]
    assert "fused with BM25's by RRF (k=60)" in head and len(hits) == 3
    assert all(0 < float(line.split()[1]) <= round(2 / 61, 4) for line in hits)  # at most 1/61 from each run
    # a corpus to search that comes without queries or qrels: BM25 over the corpus alone, the same fused hits
    (corpus_only := tmp_path / "corpus-only").mkdir()
    shutil.copy(tiny_scifact / "corpus.jsonl", corpus_only)
    with pytest.warns(AnceWarning, match="--fusion auto"):
        alone = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index), "-k",
                                         "3", "--dataset", str(corpus_only), "--hybrid",
                                         "--work-dir", str(tmp_path / "w")])
    assert alone.exit_code == 0, alone.output
    assert alone.output.strip().splitlines()[-3:] == hits
    # without --work-dir: the work folder the model is a stage of, whose latest.json records the fusion its run chose
    from ance_core.retrieval.fusion import Fusion

    latest = json.loads((work / "latest.json").read_text())
    assert Path(latest["checkpoint"]).resolve() == final.resolve() and latest.get("fusion") and latest["collection"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "-k", "3", "--dataset",
                                       str(tiny_scifact), "--hybrid"])
    assert own.exit_code == 0 and not [w for w in caught if "--fusion auto" in str(w.message)], own.output
    assert f"fused with BM25's by {Fusion.of(latest['fusion']).label()}" in own.output
    # the same record read from the run's stage manifests (fusion -> dense ranking -> checkpoint, the BM25 stage's
    # settings), for a model that is no longer the work folder's newest result
    from ance_core.retrieval.provenance import fusion_of

    found = fusion_of(final, work)
    assert found and {k: found[k] for k in ("method", "weight", "k", "bm25", "depth")} == \
        {k: latest["fusion"][k] for k in ("method", "weight", "k", "bm25", "depth")}
    # the work folder read-only (a mounted or shared copy): its data and BM25 stages are read as they are, unlocked;
    # a stage it lacks is one line (the stage locks refused the search of a read-only folder)
    import ance_core.artifacts

    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *args, **kwargs: (
        mode != os.W_OK or not Path(path).resolve().is_relative_to(work.resolve())) and writable(path, mode))

    def refused_lock(path, *args, **kwargs):
        raise PermissionError(30, "Read-only file system", str(path))

    monkeypatch.setattr(ance_core.artifacts, "FileLock", refused_lock)
    files = sorted(work.rglob("*"))
    mounted = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "-k", "3", "--dataset",
                                       str(tiny_scifact), "--hybrid"])
    assert mounted.exit_code == 0 and mounted.output.splitlines()[-3:] == own.output.splitlines()[-3:], mounted.output
    lacking = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "-k", "3", "--dataset",
                                       str(corpus_only), "--hybrid"])
    assert lacking.exit_code == 2 and "read-only, and it holds no corpus stage" in lacking.output, lacking.output
    assert sorted(work.rglob("*")) == files
    monkeypatch.undo()
    # another corpus than the one the model's index holds: refused, not two collections interleaved
    other = write_beir(tmp_path / "other", [{"_id": "x1", "title": "", "text": "cancer cells divide"}],
                       [{"_id": "q1", "text": "cancer"}], {"test": [("q1", "x1", 1)]})
    mixed = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--dataset", str(other),
                                     "--hybrid"])
    assert mixed.exit_code == 2 and "'s encoding in" in mixed.output and "holds its corpus's documents (another " \
        "collection's" in mixed.output and "ance evaluate --checkpoint" in mixed.output, mixed.output
    with_index = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index),
                                          "--dataset", str(other), "--hybrid"])  # (the index given: compared)
    assert with_index.exit_code == 2 and "its corpus (1 document) is not the one the index" in with_index.output
    refused = CliRunner().invoke(app, ["search", "cancer cells", "--model", str(final), "--index", str(index),
                                       "--hybrid"])
    assert refused.exit_code == 2 and "--hybrid needs --dataset" in refused.output
    # any system's TREC run scored as the pipeline scores: the result's own evaluation run gives its metrics
    evaluation = next(s["path"] for s in result["stages"]
                      if s["stage"] == "evaluate" and s["for"] == result["selected"])
    scored = CliRunner().invoke(app, ["evaluate", "--run", str(Path(evaluation, "run.trec")), "--dataset",
                                      str(tiny_scifact), "--split", "test", "--work-dir", str(tmp_path / "w"),
                                      "--json"])
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.output.strip().splitlines()[-1])["ndcg_at_10"] == pytest.approx(result["ndcg_at_10"],
                                                                                              abs=1e-3)

    env = os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "evaluate", "--checkpoint", str(final), "--dataset",
                           str(tiny_scifact), "--split", "test", "--work-dir", str(tmp_path / "w"), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    # the same checkpoint evaluated on its own (other encode batch size: bf16 rounding may differ slightly); a hybrid
    # result's checkpoint is its dense model's
    row = next(r for r in result["results"] if r["model"] == result["selected"].removesuffix(" + BM25"))
    assert metrics["recall_at_1000"] == pytest.approx(row["recall_at_1000"], abs=0.02)
    assert metrics["ndcg_at_10"] == pytest.approx(row["ndcg_at_10"], abs=0.03)
    # --hybrid: the run's hybrid row (its dense model fused with BM25 by the fusion the run chose on dev), which is
    # the figure the results table reports for it; the dense model's own metrics beside it
    hybrid_row = next(r for r in result["results"] if r["model"].endswith(" + BM25"))
    fused = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(final), "--dataset", str(tiny_scifact), "--split",
                                     "test", "--work-dir", str(tmp_path / "w"), "--hybrid", "--json"])
    assert fused.exit_code == 0, fused.output
    assert f"{final} + BM25 (" in fused.output and f"{final} alone: nDCG@10" in fused.output, fused.output
    both = json.loads(next(line for line in reversed(fused.output.splitlines()) if line.startswith("{")))
    assert both["ndcg_at_10"] == pytest.approx(hybrid_row["ndcg_at_10"], abs=0.03)
    assert both["dense"]["ndcg_at_10"] == pytest.approx(metrics["ndcg_at_10"], abs=1e-6)


@PIPELINE
def test_pipeline_run_is_tracked_in_the_embedded_mlflow_store(pipeline):
    from mlflow.tracking import MlflowClient

    _, result, _ = pipeline
    client = MlflowClient(result["mlflow_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.params["rounds"] == str(ROUNDS) and parent.data.tags["prefect.flow_run_id"]
    # `ance run` started itself again under mimalloc (ance_core/allocator.py), unless told not to
    assert parent.data.tags["allocator"] == ("system" if os.environ.get("ANCE_ALLOCATOR") == "system" else "mimalloc")
    assert parent.data.metrics["ndcg_at_10"] == pytest.approx(result["ndcg_at_10"])
    history = client.get_metric_history(parent.info.run_id, "loss")
    assert [m.step for m in history] == list(range(1, 3 * (ROUNDS + 1) + 1))  # 3 steps a stage, one global axis
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    names = {r.info.run_name: r for r in children}
    hybrid = result["results"][-1]["model"]  # "<the best dense model on dev> + BM25"
    assert set(names) == {"BM25", "zero-shot", "warmup", *(f"ANCE round {k}" for k in range(1, ROUNDS + 1)),
                          hybrid, "compression"} and hybrid.endswith(" + BM25")
    assert names["warmup"].data.metrics["time_train_s"] > 0
    for key in ("grad_norm", "grad_norm_bottom", "grad_norm_top", "examples_per_s"):  # the tiny BERT has 2 layers
        assert len(client.get_metric_history(names["warmup"].info.run_id, key)) == 3, key
    # a stage's own run counts its steps from 1 (Compare lays the same round of two runs on each other); each point
    # is dated when its step trained, not when it was logged
    trained = {(t["for"], t["stage"]): t["path"] for t in result["stages"]}
    for label in ("warmup", *(f"ANCE round {k}" for k in range(1, ROUNDS + 1))):
        log = Path(trained[label, "train"], "train_log.jsonl")
        records = [json.loads(line) for line in log.read_text().splitlines()]
        points = client.get_metric_history(names[label].info.run_id, "loss")
        assert [(m.step, m.timestamp) for m in points] == [(r["step"], r["timestamp"]) for r in records], label
    # negatives statistics (ANCE Fig. 3) for every model trained on mined negatives, also in the flow's result
    assert set(result["negatives"]) == {"warmup", *(f"ANCE round {k}" for k in range(1, ROUNDS + 1))}
    for label in result["negatives"]:
        metrics = names[label].data.metrics
        assert 0.0 <= metrics["neg_overlap_top100"] <= 1.0 and metrics["neg_mean_negative_rank"] >= 1.0
        assert metrics["neg_overlap_top100"] == pytest.approx(result["negatives"][label]["overlap"])
    assert parent.data.metrics["data_time_prepare_s"] >= 0
    assert result["tracking"]["undelivered_calls"] == 0 and result["tracking"]["kept_in"] is None


@PIPELINE
def test_mlflow_has_checkpoints_plots_evaluations_and_a_champion(pipeline):
    from mlflow.tracking import MlflowClient

    _, result, _ = pipeline
    client = MlflowClient(result["mlflow_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "plots")} == {
        "plots/loss.png", "plots/grad_norms.png", "plots/metrics.png", "plots/negatives_overlap.png",
        "plots/quality_over_time.png"}
    assert (Path(result["plots_dir"]) / "quality_over_time.png").is_file()  # the same plots as files
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "report/results.csv"))
    assert list(table["model"][:2]) == ["BM25", "zero-shot"] and "neg_overlap_top100" in table
    assert table.set_index("model").loc["warmup", "ndcg_at_10"] == pytest.approx(
        next(r["ndcg_at_10"] for r in result["results"] if r["model"] == "warmup"))
    children = {r.info.run_name: r for r in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    final = children[f"ANCE round {ROUNDS}"].info.run_id
    files = {a.path for a in client.list_artifacts(final, "checkpoint")}
    assert {"checkpoint/model.safetensors", "checkpoint/head.safetensors", "checkpoint/tokenizer.json"} <= files
    assert "checkpoint/optimizer.safetensors" not in files
    logged = {a.path: a.file_size for a in client.list_artifacts(final, "evaluation")}
    assert "evaluation/run.trec.gz" in logged and "evaluation/run.trec" not in logged  # the TREC run, gzipped
    from ance_core.retrieval.search import read_trec

    evaluation = next(s["path"] for s in result["stages"]
                      if s["stage"] == "evaluate" and s["for"] == f"ANCE round {ROUNDS}")
    kept = Path(evaluation, "run.trec")
    assert logged["evaluation/run.trec.gz"] < kept.stat().st_size / 3
    downloaded = client.download_artifacts(final, "evaluation/run.trec.gz")
    pd.testing.assert_frame_equal(read_trec(downloaded), read_trec(kept))  # `ance evaluate --run` reads it as it is
    sample = Path(client.download_artifacts(children["warmup"].info.run_id, "negatives/negatives_sample.md"))
    text = sample.read_text()
    assert text.count("## Query") == 10 and "- **positive**" in text and "(rank " in text
    name = "ance-scifact-tiny"
    versions = client.search_model_versions(f"name = '{name}'")
    assert len(versions) >= ROUNDS + 1
    # the champion is the run's result, chosen on the dev split; the test split decided nothing
    champion = client.get_model_version_by_alias(name, "champion")
    # (a hybrid result's candidate is its dense model, with its own dense dev score: champions compare like with like)
    assert result["selected"] == parent.data.tags["result_model"]
    assert (parent.data.tags["best_on_dev"], parent.data.tags["selection"]) == (result["best_on_dev"], "best")
    dense = result["selected"].removesuffix(" + BM25")
    assert champion.tags["label"] == dense
    assert float(champion.tags["dev_ndcg_at_10"]) == pytest.approx(
        next(r["dev_ndcg_at_10"] for r in result["results"] if r["model"] == dense), abs=1e-6)
    data = next(s["path"] for s in result["stages"] if s["stage"] == "prepare")
    from ance_core.artifacts import read_manifest

    assert champion.tags["dev_split"] == f"dev {read_manifest(data)['summary']['split_digests']['dev']}"
    assert parent.data.tags["champion.champion_version"] == str(champion.version)  # a re-run's equal model did not
    # take the alias from the first run's
    if result["selected"].endswith(" + BM25"):  # a hybrid result: its version searches as the run's result did
        import mlflow

        assert "checkpoint/retrieval/package.json" in {a.path for a in client.list_artifacts(
            champion.run_id, "checkpoint/retrieval")}
        with pytest.MonkeyPatch.context() as patch:  # (not mlflow.set_tracking_uri: it would stay for later tests)
            patch.setenv("MLFLOW_TRACKING_URI", result["mlflow_uri"])
            hits = mlflow.pyfunc.load_model(f"models:/{name}@champion").predict(
                ["cancer cells"], params={"kind": "search", "k": 5})
        assert hits["rank"].tolist() == [1, 2, 3, 4, 5] and hits["score"].is_monotonic_decreasing


@PIPELINE
def test_the_champion_downloads_as_the_checkpoint_retrain_starts_from(pipeline, tiny_scifact, tmp_path):
    from mlflow.tracking import MlflowClient

    from tracking.registry import champion_checkpoint, model_name

    work, result, _ = pipeline
    folder, source = champion_checkpoint(work, str(tiny_scifact))
    name = model_name(str(tiny_scifact))
    champion = MlflowClient(result["mlflow_uri"]).get_model_version_by_alias(name, "champion")
    assert source == f"models:/{name}@champion (version {champion.version})"
    for file in ("model.safetensors", "head.safetensors", "ance_model.json", "tokenizer.json"):
        assert Path(folder, file).read_bytes() == Path(result["final_checkpoint"], file).read_bytes(), file
    assert champion_checkpoint(work, str(tiny_scifact))[0] == folder  # downloaded once
    from flows.start import start_dev_setting, warn_other_dev_split

    # the dev split each was chosen on: a retrain on another one is warned that the start may know its dev queries
    setting = champion.tags["dev_split"]
    assert start_dev_setting(work, folder) == setting == start_dev_setting(work, result["final_checkpoint"])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warn_other_dev_split(work, folder, setting)  # the same split: nothing said
    assert not [w for w in said if "dev split" in str(w.message)]
    with pytest.warns(UserWarning, match="was chosen on another dev split .* may have trained on some of this run's"):
        warn_other_dev_split(work, folder, "dev 0000000000000000")
    assert start_dev_setting(work, str(tmp_path)) is None  # any other checkpoint: not known
    assert Path(folder, "MLmodel").is_file()  # each logged checkpoint is an MLflow model (test_pyfunc.py)
    missing, why = champion_checkpoint(tmp_path, "no-such-dataset")
    assert missing is None and "models:/ance-no-such-dataset@champion: not found" in why


@pytest.mark.parametrize("warmup_sampler, round_sampler", [("random", "simans"), ("nce", "bm25+random")])
def test_samplers_are_chosen_per_stage_in_the_config(tiny_scifact, tiny_model, tmp_path, warmup_sampler,
                                                     round_sampler):
    train = {"max_steps": 2, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    config = {"data": {"dataset": str(tiny_scifact)}, "model": {"name": str(tiny_model), "passage_max_length": 48},
              "warmup": train, "ance": train, "encode": {"batch_size": 32}, "rounds": 1, "work_dir": str(tmp_path),
              "bm25_negatives": {"sampler": warmup_sampler, "num_negatives": 2},
              "mining": {"sampler": round_sampler, "num_negatives": 2, "top_k": 40}}
    result, _ = run_pipeline_cli(config, tmp_path)
    mined = {s["for"]: s["path"] for s in result["stages"] if s["stage"] == "mine"}
    warm = pd.read_parquet(Path(mined["warmup"], "negatives.parquet"))
    rounds = pd.read_parquet(Path(mined["ANCE round 1"], "negatives.parquet"))
    if warmup_sampler == "random":
        assert all(list(r) == [0, 0] for r in warm["negative_ranks"]) and "warmup" in result["negatives"]
    else:  # nce mines nothing: the warm-up trains on its hardest in-batch negatives
        assert all(len(x) == 0 for x in warm["negative_ids"]) and "warmup" not in result["negatives"]
        assert not any(s["stage"] == "bm25" and s["for"] == "warmup" for s in result["stages"])
    if round_sampler == "simans":  # from the warm-up model's ANN top-40, with the positives' exact scores
        assert all(1 <= r <= 40 for ranks in rounds["negative_ranks"] for r in ranks)
        retrieve = next(s["path"] for s in result["stages"] if s["stage"] == "retrieve-train")
        assert len(pd.read_parquet(Path(retrieve, "positive_scores.parquet"))) == len(rounds)
    else:  # one from BM25's top-40, one random
        assert all(sorted(r)[0] == 0 and 1 <= sorted(r)[1] <= 40 for r in rounds["negative_ranks"])
        assert not any(s["stage"] == "retrieve-train" for s in result["stages"])
    for ids, row in zip(rounds["negative_ids"], rounds.itertuples(), strict=True):
        assert len(set(ids)) == 2 and row.positive_id not in ids


@PIPELINE
def test_compression_table_of_the_final_model(pipeline):
    work, result, _ = pipeline
    from ance_core.artifacts import read_manifest

    compression = result["compression"]
    rows = compression["rows"]
    variants = [("teacher", 32)] + [(m, d) for d in DIMS for m in ("conae", "pca", "truncate")]
    assert [(r["method"], r["dim"], r["index"]) for r in rows] == [(m, d, i) for m, d in variants for i in INDEXES]
    teacher = rows[0]
    # the teacher's flat row is the pipeline's own final evaluation (same checkpoint, same corpus encoding; a hybrid
    # result's checkpoint is its dense model's)
    dense = next(r for r in result["results"] if r["model"] == result["selected"].removesuffix(" + BM25"))
    assert teacher["ndcg_at_10"] == pytest.approx(dense["ndcg_at_10"])
    assert teacher["checkpoint_path"] == result["final_checkpoint"]
    for r in rows:
        assert 0 <= r["ndcg_at_10"] <= 1 and 0 <= r["recall_at_100"] <= 1
        assert "recall_at_1000" not in r  # (the table's rankings are 100 deep: it read as R@100)
        assert r["index_bytes"] > 0 and r["latency_batched_ms"] > 0 and r["latency_single_ms"] > 0
        if r["method"] != "teacher":
            assert read_manifest(r["index_path"])["summary"]["dim"] == r["dim"]
            if r["index"] == "flat":  # a flat index stores 4 bytes per dimension: L/h of the teacher's, plus ids
                assert r["index_bytes"] == pytest.approx(teacher["index_bytes"] * r["dim"] / 32, rel=0.01)
    # the teacher's corpus encoding was read, not recomputed: one encoding per checkpoint as before, and ConAE
    # trained on it
    compressed = {r["checkpoint_path"] for r in rows if r["method"] == "conae"}
    for folder in map(Path, compressed):
        assert (folder / "projector.safetensors").is_file() and (folder / "model.safetensors").is_file()
        manifest = read_manifest(folder.parent)
        assert manifest["summary"]["steps"] > 0 and (folder.parent / "conae.safetensors").is_file()
        assert manifest["inputs"]["embeddings"] in {p.name for p in (work / "encode").iterdir()}
    files = Path(compression["files"])
    table = pd.read_csv(files / "compression.csv")
    assert len(table) == len(rows) and (files / "compression.md").read_text().startswith("| method | dim |")


@PIPELINE
def test_a_compressed_checkpoint_works_with_search_and_evaluate(pipeline, tiny_scifact, tmp_path):
    _, result, _ = pipeline
    from typer.testing import CliRunner

    from ance_cli.main import app

    row = next(r for r in result["compression"]["rows"] if (r["method"], r["dim"], r["index"]) == ("pca", 8, "flat"))
    teacher_index = result["compression"]["rows"][0]["index_path"]
    runner = CliRunner()
    out = runner.invoke(app, ["search", "cancer cells", "--model", row["checkpoint_path"], "--index",
                              row["index_path"], "-k", "3"])
    assert out.exit_code == 0, out.output
    assert len([line for line in out.output.strip().splitlines() if not line.startswith("(")]) == 3  # (and a hint)
    wrong = runner.invoke(app, ["search", "cancer cells", "--model", row["checkpoint_path"], "--index",
                                teacher_index])
    assert wrong.exit_code == 2 and "holds the encoding of checkpoint" in wrong.output, wrong.output
    # a copy out of its work folder has no manifests to tell whose encoding it holds: the dimensions still do
    shutil.copytree(teacher_index, tmp_path / "moved-index")
    wrong = runner.invoke(app, ["search", "cancer cells", "--model", row["checkpoint_path"], "--index",
                                str(tmp_path / "moved-index")])
    assert wrong.exit_code == 2 and "32-dim vectors" in wrong.output and "8-dim queries" in wrong.output

    env = os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "evaluate", "--checkpoint", row["checkpoint_path"],
                           "--dataset", str(tiny_scifact), "--split", "test", "--work-dir", str(tmp_path / "w"),
                           "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    # evaluate re-encodes the corpus through the projector: the compressed model's own numbers
    encoded = sorted((tmp_path / "w" / "encode").iterdir())
    assert np.load(next(p for p in encoded if not p.name.startswith(".")) / "emb_00000.npy").shape[1] == 8
    assert metrics["ndcg_at_10"] == pytest.approx(row["ndcg_at_10"], abs=0.03)
    assert metrics["recall_at_100"] == pytest.approx(row["recall_at_100"], abs=0.03)


@PIPELINE
def test_compression_is_in_mlflow_with_projectors_and_registered_models(pipeline):
    from mlflow.tracking import MlflowClient

    _, result, _ = pipeline
    client = MlflowClient(result["mlflow_uri"])
    run_id = result["tracking"]["compression"]["run_id"]
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.parentRunId"] == result["mlflow_run_id"] and run.info.status == "FINISHED"
    parent = client.get_run(result["mlflow_run_id"])  # ended once the compression was logged (it was ended before
    assert parent.info.status == "FINISHED" and parent.info.end_time >= run.info.end_time  # it started)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"compression.md", "compression.csv"}
    children = {r.info.run_name: r for r in client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")}
    assert len(children) == len(result["compression"]["rows"])
    conae = children["conae-16 flat"]
    assert conae.data.metrics["dim"] == 16 and conae.data.metrics["index_bytes"] > 0
    assert len(client.get_metric_history(conae.info.run_id, "kl")) == 5  # 5 epochs of one batch (40 queries)
    assert "projector/projector.safetensors" in {a.path for a in client.list_artifacts(conae.info.run_id, "projector")}
    ours = {r.info.run_id for r in children.values()}  # (a re-run of the pipeline points at the same versions)
    versions = [v for v in client.search_model_versions("name = 'ance-scifact-tiny-compressed'") if v.run_id in ours]
    assert sorted(float(v.tags["dim"]) for v in versions) == sorted(DIMS)
    assert all(v.source.endswith("/checkpoint") for v in versions)


def test_queries_bm25_cannot_match_get_fallback_negatives_and_the_run_completes(tiny_scifact, tiny_model, tmp_path):
    """A query of out-of-vocabulary words and one of stop-words only: BM25 retrieves nothing for them, their warm-up
    negatives come from the fallback (random documents), one warning names them, the negatives statistics count them
    (--json and MLflow), and the whole pipeline completes."""

    from mlflow.tracking import MlflowClient

    data = tmp_path / "scifact-odd"
    shutil.copytree(tiny_scifact, data)
    docs = [json.loads(line)["_id"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    with open(data / "queries.jsonl", "a") as f:
        f.write(json.dumps({"_id": "q-oov", "text": "zzyqx vlorptk quaxwem"}) + "\n")
        f.write(json.dumps({"_id": "q-stop", "text": "the of and to"}) + "\n")
    with open(data / "qrels" / "train.tsv", "a") as f:
        f.write(f"q-oov\t{docs[0]}\t1\nq-stop\t{docs[1]}\t1\n")
    train = {"max_steps": 2, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    config = {"data": {"dataset": str(data), "dev_fraction": 0.0}, "rounds": 1, "work_dir": str(tmp_path / "work"),
              "model": {"name": str(tiny_model), "passage_max_length": 48}, "warmup": train, "ance": train,
              "encode": {"batch_size": 32}, "bm25_negatives": {"num_negatives": 2}, "mining": {"top_k": 40}}
    result, stdout = run_pipeline_cli(config, tmp_path)
    # no dev split: the hybrid row is the last model fused with BM25 by RRF
    assert [r["model"] for r in result["results"]] == ["BM25", "zero-shot", "warmup", "ANCE round 1",
                                                       "ANCE round 1 + BM25"]
    warned = [w for w in result["warnings"] if "missing negatives were drawn uniformly from the corpus" in w]
    assert len(warned) == 1 and "2 of 42 queries" in warned[0] and "q-oov, q-stop" in warned[0]
    assert "WARNING: mining (bm25" in stdout  # in the closing lines too
    assert result["negatives"]["warmup"]["fallback_queries"] == 2
    assert result["negatives"]["warmup"]["fallback_negatives"] == 4
    assert result["negatives"]["ANCE round 1"]["fallback_queries"] == 0  # the dense ranking has every document
    client = MlflowClient(result["mlflow_uri"])
    children = {r.info.run_name: r for r in client.search_runs(
        [client.get_run(result["mlflow_run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result['mlflow_run_id']}'")}
    assert children["warmup"].data.metrics["neg_fallback_queries"] == 2
    mined = next(s["path"] for s in result["stages"] if (s["for"], s["stage"]) == ("warmup", "mine"))
    table = pd.read_parquet(Path(mined, "negatives.parquet")).set_index("query_id")
    assert table.loc["q-oov", "negative_ranks"].tolist() == [0, 0] and table.loc["q-oov", "fallback"] == 2


def test_the_warmup_margin_drops_bm25_candidates_the_starting_model_scores_above_the_positive(
        tiny_scifact, tiny_model, tmp_path):
    """bm25_negatives.margin 0: BM25 candidates are scored by the pretrained model, and none the model ranks above the
    pair's positive is sampled (the share of negatives above their positive under the starting model is then 0)."""
    from ance_core.artifacts import read_manifest

    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=0, steps=2)
    config["bm25_negatives"] = {"margin": 0.0, "num_negatives": 2}
    result, _ = run_pipeline_cli(config, tmp_path)
    stats = result["negatives"]["warmup"]
    assert stats["above_positive"] == 0.0 and stats["negatives"] > 0
    mined = next(s["path"] for s in result["stages"] if (s["for"], s["stage"]) == ("warmup", "mine"))
    zero_shot_index = next(s["path"] for s in result["stages"] if (s["for"], s["stage"]) == ("zero-shot", "index"))
    assert read_manifest(mined)["inputs"]["scorer_index"] == Path(zero_shot_index).name


def test_a_round_distils_from_a_teacher_on_a_draw_of_negatives_per_epoch(tiny_scifact, tiny_model, tmp_path):
    """A round of 2 epochs with a teacher (a tiny cross-encoder) and 2 negatives per pair: its mine stage draws 2 sets
    of negatives and the teacher scores every pair's group in both, and the round trains on them to the end."""
    from ance_core.artifacts import read_manifest
    from tests.tiny import build_tiny_cross_encoder

    teacher = build_tiny_cross_encoder(tiny_model, tmp_path / "teacher")
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config["ance"] = config["ance"] | {"max_steps": None, "epochs": 2}
    config["mining"] = {"top_k": 50, "num_negatives": 2, "teacher": {"model": str(teacher), "max_length": 64}}
    result, _ = run_pipeline_cli(config, tmp_path)
    assert [r["model"] for r in result["results"]][:4] == ["BM25", "zero-shot", "warmup", "ANCE round 1"]
    mined = next(s["path"] for s in result["stages"] if (s["for"], s["stage"]) == ("ANCE round 1", "mine"))
    assert read_manifest(mined)["summary"]["draws"] == 2
    table = pd.read_parquet(Path(mined, "negatives.parquet"))
    assert len(table["redrawn_ids"].iloc[0]) == 2 and len(table["redrawn_teacher"].iloc[0]) == 2
    assert table["teacher_positive"].notna().all() and len(table["teacher_negatives"].iloc[0]) == 2
    trained = next(s["path"] for s in result["stages"] if (s["for"], s["stage"]) == ("ANCE round 1", "train"))
    log = [json.loads(line) for line in Path(trained, "train_log.jsonl").read_text().splitlines()]
    assert {r["epoch"] for r in log} == {0, 1}


def test_a_warning_said_outside_the_stages_reaches_the_result_and_mlflow(tiny_scifact, tiny_model, tmp_path):
    """Found by a review: the run's warnings (closing lines, --json, MLflow's `warnings` tag) were the stages' and
    the report's only; one the flow said itself (here: dev checks asked for with no dev split to check on; also a
    result served without its retrieval package, a start chosen on another dev split) was in the log alone."""
    from mlflow.tracking import MlflowClient

    train = {"max_steps": 2, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    config = {"data": {"dataset": str(tiny_scifact), "dev_fraction": 0}, "warmup": train, "rounds": 0,
              "model": {"name": str(tiny_model), "passage_max_length": 48}, "encode": {"batch_size": 32},
              "dev_check": {"per_epoch": 1}, "work_dir": str(tmp_path / "work")}
    result, out = run_pipeline_cli(config, tmp_path)
    said = "dev_check is on, but the run has no dev split (dev is neither a split of the dataset nor carved from it)"
    warning = next(w for w in result["warnings"] if w.startswith(said))
    assert f"WARNING: {warning}" in out
    tags = MlflowClient(result["mlflow_uri"]).get_run(result["mlflow_run_id"]).data.tags
    assert said in tags["warnings"]
