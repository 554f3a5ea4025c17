"""The `ance` command: demo, run, compare, compress, bm25, evaluate, search, export.

Commands that compute metrics accept --json and then print them as one JSON object on their last line.
User errors (bad data, bad config, missing files) print one line and exit with status 2, without a traceback.
"""

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from ance_cli.guard import (
    DEBUG,
    EPHEMERAL_TIMEOUT,
    EPHEMERAL_TIMEOUT_DEFAULT,
    exit_on_sigterm,
    guard,
    one_line_user_errors,
    plain_warnings,
)
from ance_cli.lookups import chosen_fusion, corpus_titles, evaluation_data, hybrid_search, index_of, score_run

SETS_HELP = ("Override a config field: --set key.sub=value (dotted keys into the sections; the value typed by the "
             "config, e.g. --set ance.learning_rate=3e-5 --set rounds=2); repeatable, applied after the config file")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train dense retrievers with ANCE, orchestrated by Prefect.")


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of user errors (or set "
                                                  "ANCE_DEBUG=1)")] = False) -> None:
    if debug:
        os.environ[DEBUG] = "1"
    signal.signal(signal.SIGTERM, exit_on_sigterm)


def _print_pipeline(result: dict, as_json: bool) -> None:
    typer.echo("")
    typer.echo(result["markdown"])
    if "compression" in result:
        typer.echo(f"## Compression of the final model\n\n{result['compression']['table']}\n")
        typer.echo(f"compression table and files: {result['compression']['files']}")
    typer.echo(f"result checkpoint: {result['final_checkpoint']}")
    typer.echo(f"report: {result['report_dir']}/results.md; plots: {result['plots_dir']}")
    if "tracking" in result:
        from tracking.closing import closing_lines

        for line in closing_lines(result["tracking"], result["selected"], result.get("warnings", ()),
                                  on_dev=result.get("dev_split") is not None):
            typer.echo(line)
    if as_json:
        chosen = next(r for r in result["results"] if r["model"] == result["selected"])
        summary = {k: v for k, v in chosen.items() if k != "model"}
        keys = ("selected", "results", "warnings", "stages", "final_checkpoint", "last_checkpoint", "report_dir",
                "plots_dir", "async_refresh", "negatives", "tracking", "mlflow_run_id", "mlflow_uri", "compression",
                "retention", "started_from", "fusion")
        typer.echo(json.dumps(summary | {k: result[k] for k in keys if k in result}))


def _preflight(data, work_dir: str, splits: tuple[str, ...], trains: bool = False, negatives: int = 0) -> None:
    """Validate the dataset before Prefect starts, so bad data is one clear line, not a failed flow run (`trains`: the
    train split must have positives, and each of its queries `negatives` documents not relevant to it).

    This is the data stage itself (keyed by content), so the flow's first task then reuses its output."""
    from ance_core.artifacts import writable_work_dir
    from ance_core.data.checks import check_trainable
    from ance_core.data.dataset import read_tables
    from ance_core.data.sources import resolve_dataset
    from tasks.common import faults_off
    from tasks.data import prepare_data

    fresh = not Path(work_dir).expanduser().exists()
    writable_work_dir(work_dir)
    try:
        with faults_off():  # a drill's injected faults are for the flow's tasks, which retry them
            tables = read_tables(prepare_data.fn(data, work_dir).path, corpus_columns=["doc_id"] if trains else [])
        for split in splits:
            tables.split_qrels(split)
        if trains:
            check_trainable(tables, resolve_dataset(data.dataset, data.data_home, download=False), data.train_split,
                            negatives)
    except Exception:
        folder = Path(work_dir).expanduser()
        if fresh and not any(not p.name.startswith(".") for p in folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)  # the empty folder this command made is not left behind
        raise  # (a validated data stage is kept: it is whole, and the next run reuses it)


def _run_pipeline(config, as_json: bool) -> None:
    from ance_core.pipeline.config import negatives_needed
    from flows.ance_pipeline import ance_pipeline, check_pipeline

    check_pipeline(config)
    _preflight(config.data, config.work_dir, (config.data.train_split, config.data.eval_split), trains=True,
               negatives=negatives_needed(config))
    _print_pipeline(ance_pipeline(config), as_json)


@app.command()
def demo(
    recipe: Annotated[str, typer.Option(help="demo (the defaults, ~10 min) or full (~16 min)")] = "demo",
    rounds: Annotated[int | None, typer.Option(help="ANCE rounds after the warm-up (default: the recipe's)")] = None,
    work_dir: Annotated[str, typer.Option(help="Where stage outputs are kept")] = "work",
    compress: Annotated[bool, typer.Option("--compress", help="Then compress the final model's embeddings (ConAE, "
                                           "PCA, truncation to 256/128/64; flat, HNSW and IVF-PQ indexes)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final metrics as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
):
    """The full pipeline on SciFact with all-MiniLM-L6-v2 on this machine, ending with the results table."""
    from ance_core.compression.config import CompressConfig
    from ance_core.pipeline.recipes import recipe_config

    compression = CompressConfig(index_types=["flat", "hnsw", "ivfpq"]) if compress else None

    def body():
        overrides = {"work_dir": work_dir, "compression": compression}
        config = recipe_config(recipe, sets or (), **overrides | ({"rounds": rounds} if rounds is not None else {}))
        _run_pipeline(config, as_json)

    guard(body)


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON pipeline config; without one, "
                                                "the pipeline's defaults (and --set on top)")] = None,
    recipe: Annotated[str | None, typer.Option(help="Start from a recipe (demo, full; auto: chosen on the dataset's "
                                               "dev split by `ance tune`, then trained), the config file's sections "
                                               "merged over it")] = None,
    budget_minutes: Annotated[float | None, typer.Option(help="--recipe auto: wall minutes of the search's trials "
                                                         "(default: the search's)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final metrics as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    tune_sets: Annotated[list[str] | None, typer.Option("--tune-set", help="--recipe auto: a search setting, as "
                                                        "`ance tune --tune-set`")] = None,
):
    """The pipeline with a config file (sections: data, model, bm25, warmup, encode, index, mining, ance, ...)."""
    from ance_core.pipeline.config import load_config
    from ance_core.pipeline.recipes import AUTO, recipe_config

    def body():
        if recipe is None:
            return _run_pipeline(load_config(config, sets=sets or ()), as_json)
        if recipe != AUTO:
            return _run_pipeline(recipe_config(recipe, sets or (), config), as_json)
        tuned = _tune(config, sets, budget_minutes, tune_sets=tune_sets)
        typer.echo(tuned["markdown"])
        from ance_core.pipeline.config import PipelineConfig

        _run_pipeline(PipelineConfig.model_validate(tuned["config"]), as_json)

    guard(body)


def _tune(config: Path | None, sets: list[str] | None, budget_minutes: float | None, seeds: list[int] | None = None,
          recipe: str | None = None, tune_sets: list[str] | None = None) -> dict:
    """The recipe search (flows/tune.py) on a config file / --sets over the search's base recipe."""
    from ance_core.pipeline.config import load_config, negatives_needed
    from ance_core.pipeline.recipes import recipe_config
    from ance_core.pipeline.tune import TuneConfig
    from flows.ance_pipeline import check_pipeline
    from flows.tune import tune_recipe

    given = {k: v for k, v in {"budget_minutes": budget_minutes, "seeds": seeds, "recipe": recipe}.items()
             if v is not None}
    tune = load_config(None, TuneConfig, tune_sets or (), base=given)
    base = recipe_config(tune.recipe, sets or (), config)
    check_pipeline(base)
    _preflight(base.data, base.work_dir, (base.data.train_split, base.data.eval_split), trains=True,
               negatives=negatives_needed(base))
    return tune_recipe(base, tune)


@app.command()
def recipes(as_json: Annotated[bool, typer.Option("--json", help="Print the recipes as JSON")] = False):
    """The named recipes (`ance run --recipe NAME`): each one's overrides of the pipeline's defaults, as --set
    arguments, and where it was chosen."""
    from ance_core.pipeline.recipes import AUTO, CHOSEN, RECIPES, recipe_sets

    names = [*RECIPES, AUTO]
    if as_json:
        typer.echo(json.dumps({name: {"sets": recipe_sets(name), "chosen": CHOSEN[name]} for name in names}))
        return
    for name in names:
        sets = " ".join(f"--set {s}" for s in recipe_sets(name)) or "(searched per dataset)"
        typer.echo(f"{name}: {sets}\n    {CHOSEN[name]}")


@app.command()
def tune(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON pipeline config merged over "
                                                "the base recipe (the dataset, the model, ...)")] = None,
    recipe: Annotated[str, typer.Option(help="The recipe the candidates vary (the baseline)")] = "demo",
    budget_minutes: Annotated[float | None, typer.Option(help="Wall minutes of trials (default 90)")] = None,
    seeds: Annotated[list[int] | None, typer.Option("--seed", help="The rungs' seeds (repeatable; default 42 43 "
                                                    "44)")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the winner's whole config here (YAML, for `ance run "
                                             "--config`)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the choice as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    tune_sets: Annotated[list[str] | None, typer.Option("--tune-set", help="Override a search setting: "
                                                        "learning_rates, positives, warmup_epochs, eta, margin "
                                                        "(e.g. --tune-set learning_rates=[4e-5,1e-5])")] = None,
):
    """Choose a recipe on the dataset's dev split: variants of --recipe (learning rate, which graded positives train,
    warm-up epochs) as trials with successive halving over seeds; prints the table and the winner."""

    def body():
        result = _tune(config, sets, budget_minutes, seeds, recipe, tune_sets)
        typer.echo(result["markdown"])
        typer.echo(f"recipe search report: {result['report_dir']}; the winner's config: "
                   f"{result['report_dir']}/recipe.yaml")
        if out is not None:
            import shutil

            shutil.copyfile(Path(result["report_dir"], "recipe.yaml"), out)
            typer.echo(f"written: {out}")
        if as_json:
            typer.echo(json.dumps({k: result[k] for k in ("winner", "overrides", "reason", "stopped", "report_dir",
                                                          "mlflow_run_id", "trials")}))

    guard(body)


@app.command()
def compare(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON CompareConfig")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
):
    """Compare negative samplers from one BM25 warm-up checkpoint (the compare-negatives deployment's flow)."""
    from ance_core.pipeline.config import CompareConfig, load_config, negatives_needed

    def body():
        from flows.compare import compare_negatives

        c = load_config(config, CompareConfig, sets or ())
        _preflight(c.data, c.work_dir, (c.data.train_split, c.data.eval_split), trains=True,
                   negatives=negatives_needed(c))
        result = compare_negatives(c)
        _print_table(result, f"report: {result['report_dir']}/results.md; table and plots: {result['files']}",
                     ("results", "train_seconds", "tracking", "table") if as_json else ())

    guard(body)


def _print_table(result: dict, where: str, json_keys: tuple[str, ...]) -> None:
    """A table flow's ending: its table, where its files are, the MLflow lines, and the JSON line when asked."""
    from tracking.closing import closing_lines

    typer.echo("")
    typer.echo(result["table"])
    typer.echo(where)
    for line in closing_lines(result["tracking"]):
        typer.echo(line)
    if json_keys:
        typer.echo(json.dumps({k: result[k] for k in json_keys}))


@app.command(name="compress")
def compress_command(
    checkpoint: Annotated[Path | None, typer.Option(help="A trained checkpoint folder; default: the dataset's "
                                                    "champion in MLflow, else the work folder's newest model")] = None,
    dataset: Annotated[str, typer.Option(help="Dataset name under the data home, or a folder")] = "scifact",
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON CompressConfig")] = None,
    work_dir: Annotated[str, typer.Option()] = "work",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON last")] = False,
):
    """Compress a trained model's embeddings (ConAE and the PCA / truncation baselines) and measure quality, index
    size and search latency on the evaluation split (the compress deployment's flow)."""
    from ance_core.compression.config import CompressConfig
    from ance_core.data.config import DataConfig
    from ance_core.modeling.model import read_meta
    from ance_core.pipeline.config import load_config

    def body():
        from flows.compress import compress_flow

        if checkpoint is not None:
            read_meta(checkpoint)  # fail fast, before any work, on a folder that is not a checkpoint
        c = load_config(config, CompressConfig) if config else CompressConfig()
        data = DataConfig(dataset=dataset)
        _preflight(data, work_dir, (data.train_split, data.eval_split))
        result = compress_flow(str(checkpoint.resolve()) if checkpoint else None, data, compression=c,
                               work_dir=work_dir)
        _print_table(result, f"table and files: {result['files']}",
                     ("rows", "files", "checkpoint", "tracking") if as_json else ())

    guard(body)


def _print_metrics(metrics: dict, title: str, as_json: bool) -> None:
    typer.echo(title)
    for k, v in metrics.items():
        typer.echo(f"  {k:<16}{v:.4f}")
    if as_json:
        typer.echo(json.dumps(metrics))


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
        data = evaluation_data(dataset, split)
        _preflight(data, work_dir, (split,))
        metrics = bm25_baseline(data, BM25Config(), work_dir)
        _print_metrics(metrics, f"BM25 on {dataset} {split}", as_json)

    guard(body)


@app.command()
def evaluate(
    checkpoint: Annotated[Path | None, typer.Option(help="A checkpoint folder written by training (or init)")] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Score this TREC run file (any system's: qid Q0 docid "
                                             "rank score tag) instead of a checkpoint")] = None,
    dataset: Annotated[str, typer.Option(help="Dataset name under the data home, or a folder")] = "scifact",
    split: Annotated[str, typer.Option()] = "test",
    work_dir: Annotated[str, typer.Option()] = "work",
    as_json: Annotated[bool, typer.Option("--json")] = False,
):
    """Encode the corpus with a checkpoint, index it and evaluate it on a split; or score a TREC run file."""
    from ance_core.errors import AnceError
    from ance_core.modeling.model import read_meta
    from flows.evaluate import evaluate_checkpoint

    def body():
        if (checkpoint is None) == (run is None):
            raise AnceError("give --checkpoint (a model to encode, index and search with) or --run (a TREC run file "
                            "to score), one of them")
        if run is not None:
            return _print_metrics(score_run(run, dataset, split, work_dir), f"{run} on {dataset} {split}", as_json)
        read_meta(checkpoint)  # fail fast, before any work, on a folder that is not a checkpoint
        data = evaluation_data(dataset, split)
        _preflight(data, work_dir, (split,))
        metrics = evaluate_checkpoint(str(checkpoint.resolve()), data, work_dir=work_dir)
        _print_metrics(metrics, f"{checkpoint} on {dataset} {split}", as_json)

    guard(body)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Query text")],
    model: Annotated[Path, typer.Option(help="Checkpoint folder")],
    index: Annotated[Path | None, typer.Option(help="Index folder (an index stage's: `docid` and the index); "
                                               "default: the newest index of --model's encoding in its work "
                                               "folder")] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 10,
    dataset: Annotated[str | None, typer.Option(help="Show passage text from this dataset's corpus")] = None,
    trec: Annotated[Path | None, typer.Option("--trec", help="Also write the hits as a TREC run file here")] = None,
    query_id: Annotated[str, typer.Option(help="The query's id in the TREC run file")] = "q1",
    hybrid: Annotated[bool, typer.Option("--hybrid", help="Fuse the model's ranking with BM25's over --dataset's "
                                         "corpus (its BM25 index in --work-dir, built once)")] = False,
    fusion: Annotated[str, typer.Option(help="--hybrid's fusion: auto (the one the work folder's newest run chose "
                                        "on its dev split, when its result is this model or its hybrid row; else "
                                        "rrf), rrf, or the dense ranking's weight in a convex combination of "
                                        "normalised scores, e.g. 0.7")] = "auto",
    work_dir: Annotated[str, typer.Option(help="--hybrid: the work folder of the data and BM25 stages")] = "work",
):
    """Print the top hits of a query (and write them as a TREC run file with --trec); --hybrid fuses them with
    BM25's."""
    from ance_core.errors import AnceError
    from ance_core.modeling.model import read_meta
    from ance_core.retrieval.search import search_text

    def body():
        read_meta(model)
        if trec is not None and not trec.parent.is_dir():
            raise AnceError(f"--trec {trec}: no folder {trec.parent} to write it in")
        if hybrid:
            if dataset is None:
                raise AnceError("--hybrid needs --dataset: the corpus BM25 searches (the one --model's index holds)")
            how, bm25_cfg, depth = chosen_fusion(fusion, model, work_dir)
            hits = hybrid_search(model, index_of(model, index), query, top_k, dataset, work_dir, how, bm25_cfg, depth)
            typer.echo(f"hybrid: {model.name}'s ranking fused with BM25's by {how.label()}")
        else:
            hits = search_text(model, index_of(model, index), query, top_k)
        if trec is not None:
            import pandas as pd

            from ance_core.retrieval.search import write_trec

            write_trec(pd.DataFrame({"query_id": query_id, "doc_id": [h.doc_id for h in hits],
                                     "rank": range(1, len(hits) + 1), "score": [h.score for h in hits]}), trec,
                       tag=Path(model).name)
        texts = corpus_titles(dataset) if dataset else {}
        for rank, hit in enumerate(hits, 1):
            typer.echo(f"{rank:>3}  {hit.score:9.4f}  {hit.doc_id}  {texts.get(hit.doc_id, '')[:100]}")

    guard(body)


@app.command(name="export")
def export_command(
    checkpoint: Annotated[str, typer.Option(help="A checkpoint folder, or a registered model version: "
                                            "models:/<name>@<alias> or models:/<name>/<version>")],
    out: Annotated[Path, typer.Option(help="The model folder to write (missing or empty, unless --force)")],
    fmt: Annotated[str, typer.Option("--format", help="sentence-transformers")] = "sentence-transformers",
    force: Annotated[bool, typer.Option("--force", help="Replace --out when it is not empty")] = False,
    work_dir: Annotated[str, typer.Option(help="For a models:/ URI: the work folder whose MLflow store "
                                          "(mlflow.db) holds it; MLFLOW_TRACKING_URI overrides")] = "work",
):
    """Write a checkpoint as a standard sentence-transformers model folder, with a model card (README.md)."""
    from ance_core.errors import AnceError
    from ance_core.export.sentence_transformers import FORMATS, check_target, export_checkpoint

    def body():
        if fmt not in FORMATS:
            raise AnceError(f"unknown export format '{fmt}'; choose one of {', '.join(FORMATS)}")
        if not checkpoint.startswith("models:/"):
            result = export_checkpoint(checkpoint, out, fmt, force)
        else:
            import tempfile

            from tracking.registry import download_registered_model

            check_target(out, force)  # before the download
            with tempfile.TemporaryDirectory(prefix="ance-export-") as tmp:
                folder, provenance = download_registered_model(checkpoint, tmp, work_dir)
                result = export_checkpoint(folder, out, fmt, force, provenance)
        typer.echo(f"{result['source']} -> {out} ({fmt}: {result['dim']}-dim, {result['pooling']} pooling, dot "
                   f"product; queries {result['query_max_length']} tokens, passages {result['passage_max_length']})")
        typer.echo(f"model card: {out / 'README.md'}; in Python: SentenceTransformer(\"{out}\").encode_query(...)")

    guard(body)


@app.command()
def gc(
    work_dir: Annotated[str, typer.Option(help="The work folder to clean")] = "work",
    keep_runs: Annotated[int, typer.Option(min=1, help="Keep the stages of the last N runs (and what they were "
                                           "built from)")] = 3,
    keep_refreshes: Annotated[int, typer.Option(min=1, help="Of each kept run, keep the encodings and indexes of "
                                                "its last N refreshes")] = 2,
    keep_rankings: Annotated[bool, typer.Option("--keep-rankings/--drop-rankings", help="Keep the kept refreshes' "
                                                "rankings (retrieve folders), or drop every ended run's")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing")] = False,
):
    """Remove the stage folders the retention policy does not keep. Never removed: what a running run uses, the model
    latest.json names, partial folders, the MLflow store (registered versions) and the champion (README: Disk)."""
    from ance_core.errors import AnceError
    from ance_core.retention import RetentionConfig, collect

    def body():
        if not Path(work_dir).is_dir():
            raise AnceError(f"{work_dir}: no such work folder")
        plan = collect(work_dir, RetentionConfig(keep_runs=keep_runs, keep_refreshes=keep_refreshes,
                                                   keep_rankings=keep_rankings), dry_run)
        verb = "would remove" if dry_run else "removed"
        for folder in plan.remove:
            typer.echo(f"{verb}  {folder.stage}/{folder.key}")
        typer.echo(f"{verb} {len(plan.remove)} stage folders ({plan.freed_bytes / 2**30:.2f} GiB); kept "
                   f"{len(plan.keep)}")

    guard(body)


def main() -> None:  # pragma: no cover
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Prefect's ephemeral server sends a telemetry heartbeat that can hit a locked SQLite file and print a traceback.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault(EPHEMERAL_TIMEOUT, EPHEMERAL_TIMEOUT_DEFAULT)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    one_line_user_errors()
    plain_warnings()
    sys.exit(app())
