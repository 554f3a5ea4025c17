"""`ance` commands that use what was trained: bm25, evaluate, search, export, gc."""

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ance_cli.app import app, preflight, print_metrics
from ance_cli.guard import STAGES, guard
from ance_cli.hybrid import chosen_fusion, fusion_weight, hybrid_search, run_fusion
from ance_cli.lookups import (
    check_same_texts,
    corpus_titles,
    evaluation_data,
    index_of,
    model_work_dir,
    say_training_split,
    score_run,
    training_free,
)

QUERY_ID = "q1"  # `ance search --query-id` unless given


@app.command()
def bm25(
    dataset: Annotated[str, typer.Option(help="Dataset name under the data home, or a folder")] = "scifact",
    split: Annotated[str, typer.Option(help="qrels split to evaluate")] = "test",
    work_dir: Annotated[str, typer.Option()] = "work",
    as_json: Annotated[bool, typer.Option("--json")] = False,
):
    """Evaluate the BM25 baseline (top-1000) on a split."""
    from ance_core.retrieval.config import BM25Config
    from flows.evaluate import bm25_baseline

    def body():
        data = evaluation_data(dataset, split, work_dir)
        say_training_split(data, preflight(data, work_dir, (split,)), split)
        metrics = bm25_baseline(data, BM25Config(), work_dir, split=split)
        print_metrics(metrics, f"BM25 on {dataset} {split}", as_json)

    guard(training_free(body), resumes=STAGES)


@app.command()
def evaluate(
    checkpoint: Annotated[Path | None, typer.Option(help="A checkpoint folder written by training (or init), or a "
                                                    "registered model's URI, `models:/<name>@<alias>` or "
                                                    "`models:/<name>/<version>` (in --work-dir's MLflow "
                                                    "store)")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Score this TREC run file (any system's: qid Q0 docid "
                                             "rank score tag) instead of a checkpoint")] = None,
    dataset: Annotated[str, typer.Option(help="Dataset name under the data home, or a folder")] = "scifact",
    split: Annotated[str, typer.Option()] = "test",
    work_dir: Annotated[str, typer.Option()] = "work",
    relevant_grade: Annotated[int, typer.Option(min=1, help="The lowest qrels grade MRR@10 and recall count as "
                                                "relevant (eval.relevant_grade; TREC Deep Learning's passage "
                                                "collections: 2)")] = 1,
    hybrid: Annotated[bool, typer.Option("--hybrid", help="--checkpoint: evaluate its ranking fused with BM25's, "
                                         "by the fusion its run chose on its dev split (the run's result when "
                                         "that was a + BM25 row; RRF where no run of its work folder chose one)")
                      ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
):
    """Encode the corpus with a checkpoint, index it and evaluate it on a split (--hybrid: fused with BM25, as the
    run's hybrid row); or score a TREC run file."""
    from ance_core.errors import AnceError
    from ance_core.modeling.model import checkpoint_files, load_checkpoint, read_meta
    from ance_core.retrieval.config import EvalConfig
    from flows.evaluate import evaluate_checkpoint
    from flows.start import local_checkpoint

    graded = f" (MRR@10 and recall: grade {relevant_grade} or above relevant)" if relevant_grade != 1 else ""

    def body():
        nonlocal checkpoint
        if (checkpoint is None) == (run is None):
            raise AnceError("give --checkpoint (a model to encode, index and search with) or --run (a TREC run file "
                            "to score), one of them")
        if hybrid and run is not None:
            raise AnceError("--hybrid: for --checkpoint only (a run file is scored as it is)")
        if run is not None:
            return print_metrics(score_run(run, dataset, split, work_dir, relevant_grade), f"{run} on {dataset} "
                                 f"{split}{graded}", as_json)
        checkpoint = Path(local_checkpoint(work_dir, str(checkpoint)))  # (a models:/ URI: downloaded once)
        read_meta(checkpoint)  # fail fast, before any work, on a folder that is not a checkpoint
        checkpoint_files(checkpoint)  # (or one whose model files are missing: said inside the flow, data built)
        load_checkpoint(checkpoint)  # (or cut short, or without its tokenizer: said by the encoding, stages begun)
        data = evaluation_data(dataset, split, work_dir, checkpoint)
        say_training_split(data, preflight(data, work_dir, (split,), relevant_grade=relevant_grade,
                                                         grade_setting="--relevant-grade"), split)
        evaluation, fused, how = EvalConfig(relevant_grade=relevant_grade), None, ""
        if hybrid:
            fused, depth, how = run_fusion(checkpoint, work_dir, dataset)
            evaluation = evaluation.model_copy(update={"top_k": depth})
        metrics = evaluate_checkpoint(str(checkpoint.resolve()), data, work_dir=work_dir, split=split,
                                      evaluation=evaluation, hybrid=fused)
        dense = metrics.pop("dense", None)
        print_metrics(metrics, f"{checkpoint}{how} on {dataset} {split}{graded}", as_json=False)
        if dense:  # (--json: the dense model's own metrics under "dense")
            typer.echo(f"  ({checkpoint} alone: nDCG@10 {dense['ndcg_at_10']:.4f})")
        if as_json:
            typer.echo(json.dumps(metrics | ({"dense": dense} if dense else {})))

    guard(training_free(body), resumes=STAGES)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Query text")],
    model: Annotated[Path, typer.Option(help="Checkpoint folder")],
    index: Annotated[Path | None, typer.Option(help="Index folder (an index stage's: `docid` and the index); "
                                               "default: the newest index of --model's encoding in its work "
                                               "folder, of --dataset's corpus (without it, of the corpus --model "
                                               "trained on)")] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many hits")] = 10,
    dataset: Annotated[str | None, typer.Option(help="Show passage text from this dataset's corpus")] = None,
    trec: Annotated[Path | None, typer.Option("--trec", help="Also write the hits as a TREC run file here")] = None,
    query_id: Annotated[str, typer.Option(help="The query's id in the TREC run file (--trec)")] = QUERY_ID,
    hybrid: Annotated[bool, typer.Option("--hybrid", help="Fuse the model's ranking with BM25's over --dataset's "
                                         "corpus (its BM25 index in --work-dir, built once)")] = False,
    fusion: Annotated[str, typer.Option(help="--hybrid's fusion: auto (the one a run in the work folder chose on "
                                        "its dev split for this model's hybrid row; else "
                                        "rrf), rrf, or the dense ranking's weight in a convex combination of "
                                        "normalised scores, e.g. 0.7")] = "auto",
    work_dir: Annotated[str | None, typer.Option(help="--hybrid: the work folder of the data (or corpus) and BM25 "
                                                 "stages, and of the run whose fusion `auto` reads (default: the one "
                                                 "--model is a stage of, else ./work)")] = None,
):
    """Print the top hits of a query (and write them as a TREC run file with --trec); --hybrid fuses them with
    BM25's."""
    from ance_core.errors import AnceError
    from ance_core.modeling.model import read_meta
    from ance_core.retrieval.search import search_text
    from ance_core.work_folder import writable_folder

    def body():
        if not query.strip():
            raise AnceError("the query is empty: give the text to search for (ance search \"...\" --model ...)")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as e:  # bytes the terminal's locale could not decode (argv's surrogate escapes)
            raise AnceError(f"the query is not UTF-8 text (character {e.start}): set a UTF-8 locale "
                            "(LANG=C.UTF-8) or type it again") from None
        given = [f for f, unset in (("--fusion", fusion == "auto"), ("--work-dir", work_dir is None)) if not unset]
        if given and not hybrid:
            raise AnceError(f"{' and '.join(given)}: for --hybrid only (without it the model's own ranking is shown)")
        if query_id != QUERY_ID and trec is None:
            raise AnceError(f"--query-id {query_id}: the query's id in the run file, for --trec only")
        read_meta(model)
        if trec is not None and not trec.parent.is_dir():
            raise AnceError(f"--trec {trec}: no folder {trec.parent} to write it in")
        if trec is not None and trec.is_dir():
            raise AnceError(f"--trec {trec}: a folder; give the run file's path (e.g. {trec / 'hits.trec'})")
        if trec is not None and (not query_id or len(query_id.split()) != 1 or query_id != query_id.strip()):
            raise AnceError(f"--query-id '{query_id}': a TREC run's query id is one word (no spaces, not empty)")
        if trec is not None and any(trec.resolve().is_relative_to(Path(f).resolve()) for f in (model, index) if f):
            raise AnceError(f"--trec {trec}: inside the model's or the index's folder, whose files it would "
                            "overwrite; write the run file elsewhere")
        if trec is not None:
            writable_folder(trec.parent, f"--trec {trec}")  # (before the search, not a traceback after it)
        if hybrid:
            from ance_core.artifacts import read_only
            from ance_core.work_folder import made_work_dir

            if dataset is None:
                raise AnceError("--hybrid needs --dataset: the corpus BM25 searches (the one --model's index holds)")
            fusion_weight(fusion)  # (checked before the work folder is made: a typo leaves no empty folder)
            searched = index_of(model, index, dataset)  # (likewise: no index to fuse, no folder made)
            work = work_dir or model_work_dir(model)
            # (a read-only one is read: its data and BM25 stages as a run left them; one this command made is
            # removed again when the corpus is refused)
            with contextlib.nullcontext() if read_only(work) else made_work_dir(work):
                how, bm25_cfg, depth = chosen_fusion(fusion, model, work, dataset)
                hits = hybrid_search(model, searched, query, top_k, dataset, work, how, bm25_cfg, depth)
            typer.echo(f"hybrid: {model.name}'s ranking fused with BM25's by {how.label()}")
        else:
            hits = search_text(model, searched := index_of(model, index, dataset), query, top_k)
        shown = [h.doc_id for h in hits]
        texts = corpus_titles(dataset, shown) if dataset else {}
        if dataset:  # the passages printed must be the ones the index holds
            if missing := [d for d in shown if d not in texts]:
                raise AnceError(f"--dataset {dataset}: {len(missing)} of the {len(shown)} hits are not in its corpus "
                                f"(e.g. '{missing[0]}'): give the dataset the model's index was encoded from")
            check_same_texts(searched, {d: texts[d] for d in shown}, dataset)
        if trec is not None:
            import pandas as pd

            from ance_core.retrieval.search import write_trec

            write_trec(pd.DataFrame({"query_id": query_id, "doc_id": [h.doc_id for h in hits],
                                     "rank": range(1, len(hits) + 1), "score": [h.score for h in hits]}), trec,
                       tag=Path(model).name)
        for rank, hit in enumerate(hits, 1):
            text = f"  {texts[hit.doc_id][:100]}" if dataset else ""
            typer.echo(f"{rank:>3}  {hit.score:9.4f}  {hit.doc_id}{text}")
        if dataset is None and hits:
            typer.echo("(the passages' text: --dataset, the collection the index holds)", err=True)

    guard(training_free(body))


@app.command(name="export")
def export_command(
    checkpoint: Annotated[str, typer.Option(help="A checkpoint folder, or a registered model version: "
                                            "`models:/<name>@<alias>` or `models:/<name>/<version>`")],
    out: Annotated[Path, typer.Option(help="The model folder to write (missing or empty, unless --force)")],
    fmt: Annotated[str, typer.Option("--format", help="sentence-transformers, or onnx (the encoder for onnxruntime "
                                     "on CPU, with an MLflow model that serves it)")] = "sentence-transformers",
    int8: Annotated[bool, typer.Option("--int8", help="--format onnx: also quantise the weights to int8 (dynamic "
                                       "quantisation) and serve that")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace --out when it is an earlier export")] = False,
    work_dir: Annotated[str, typer.Option(help="For a models:/ URI: the work folder whose MLflow store "
                                          "(mlflow.db) holds it; MLFLOW_TRACKING_URI overrides")] = "work",
):
    """Write a checkpoint as a standard sentence-transformers model folder, with a model card (README.md), or as an
    ONNX export folder served by onnxruntime (--format onnx [--int8])."""
    from ance_core.errors import AnceError
    from ance_core.export.sentence_transformers import FORMATS, check_target, export_checkpoint

    def write(folder: str, provenance: dict | None = None) -> dict:
        if fmt == "onnx":
            return _export_onnx(folder, out, int8, force)
        return export_checkpoint(folder, out, fmt, force, provenance)

    def body():
        if fmt not in (*FORMATS, "onnx"):
            raise AnceError(f"unknown export format '{fmt}'; choose one of {', '.join((*FORMATS, 'onnx'))}")
        if int8 and fmt != "onnx":
            raise AnceError("--int8 quantises an ONNX export: add --format onnx")
        if not checkpoint.startswith("models:/"):
            result = write(checkpoint)
        else:
            import tempfile

            from tracking.registry import download_registered_model

            check_target(out, force)  # before the download
            with tempfile.TemporaryDirectory(prefix="ance-export-") as tmp:
                folder, provenance = download_registered_model(checkpoint, tmp, work_dir)
                result = write(folder, provenance)
        if fmt == "onnx":
            typer.echo(f"{checkpoint} -> {out} (onnx: {result['serve']}, {result['dim']}-dim; largest difference "
                       f"from PyTorch {result['max_relative_difference']:.1e} of the largest value)")
            typer.echo(f"serve: mlflow models serve -m {out} --env-manager local; in Python: "
                       f"ance_core.export.encoder.Encoder(\"{out}\").encode(texts, kind=\"query\")")
            return
        typer.echo(f"{result['source']} -> {out} ({fmt}: {result['dim']}-dim, {result['pooling']} pooling, dot "
                   f"product; queries {result['query_max_length']} tokens, passages {result['passage_max_length']})")
        typer.echo(f"model card: {out / 'README.md'}; in Python: SentenceTransformer(\"{out}\").encode_query(...)")

    guard(body)


def _export_onnx(checkpoint: str, out: Path, int8: bool, force: bool) -> dict:
    """The ONNX export folder, then the MLflow model files that make it servable (`mlflow models serve -m OUT`)."""
    import shutil
    import tempfile

    from ance_core.export.onnx import export_onnx
    from tracking.pyfunc import mlflow_model_files

    def servable(folder: Path) -> None:  # (inside the export's atomic folder: a failure leaves no half export)
        with tempfile.TemporaryDirectory(prefix="ance-export-mlflow-") as tmp:
            for f in mlflow_model_files(folder, tmp):
                shutil.copy2(f, folder / f.name)

    return export_onnx(checkpoint, out, int8, force, finish=servable)


def asks() -> bool:
    """Whether `ance gc` asks before it removes: at a terminal (a script's or a schedule's gc does not)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


@app.command()
def gc(
    work_dir: Annotated[str, typer.Option(help="The work folder to clean")] = "work",
    keep_runs: Annotated[int, typer.Option(min=1, help="Keep the stages of the last N runs to finish (and what "
                                           "they were built from); ance bm25 and ance evaluate --checkpoint are runs "
                                           "too")] = 3,
    keep_refreshes: Annotated[int, typer.Option(min=1, help="Of each kept run, keep the encodings and indexes of "
                                                "its last N refreshes")] = 2,
    keep_rankings: Annotated[bool, typer.Option("--keep-rankings/--drop-rankings", help="Keep the kept refreshes' "
                                                "rankings (retrieve folders), or drop every ended run's")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Remove without asking (in a terminal it asks first; a "
                                      "script's gc does not ask)")] = False,
):
    """Remove the stage folders the retention policy does not keep, and the champion copies of earlier promotions.
    Never removed: what a running run uses, the model latest.json names, partial folders, the MLflow store (registered
    versions) and the newest champion copy (docs/scaling.md)."""
    from ance_core.errors import AnceError
    from ance_core.retention import RetentionConfig, collect

    def body():
        folder = Path(work_dir)
        if not work_dir.strip():
            raise AnceError("--work-dir is empty: give the work folder to collect")
        if not folder.is_dir():
            raise AnceError(f"{work_dir}: {'a file, not a' if folder.exists() else 'no such'} work folder")
        if not (folder / ".locks").is_dir():  # (every stage a run builds takes its lock there)
            raise AnceError(f"{work_dir}: not a work folder (no stage was ever built in it: no .locks/); nothing to "
                            "collect")
        policy = RetentionConfig(keep_runs=keep_runs, keep_refreshes=keep_refreshes, keep_rankings=keep_rankings)
        if not (dry_run or yes) and asks():  # someone at a terminal: what would go, then a question
            plan = collect(work_dir, policy, dry_run=True)
            if not plan.remove:
                typer.echo(f"nothing to remove; kept {len(plan.keep)} stage folders")
                return
            typer.echo(f"{len(plan.remove)} stage folders ({plan.freed_bytes / 2**30:.2f} GiB) would be removed: "
                       + ", ".join(sorted({f.stage for f in plan.remove})) + " (--dry-run lists them)")
            if not typer.confirm("Remove them?", default=False):
                typer.echo("nothing removed")
                return
        plan = collect(work_dir, policy, dry_run)
        verb = "would remove" if dry_run else "removed"
        for folder in plan.remove:  # (a stage folder: <stage>/<key>; a champion copy: champion/<name>)
            typer.echo(f"{verb}  {folder.path.parent.name}/{folder.path.name}")
        typer.echo(f"{verb} {len(plan.remove)} stage folders ({plan.freed_bytes / 2**30:.2f} GiB); kept "
                   f"{len(plan.keep)}")

    guard(body)


