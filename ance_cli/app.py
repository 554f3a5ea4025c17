"""The `ance` command's Typer app, its global options, and what its commands share: the pipeline's pre-flight and
the printing of results (tables, metrics, the JSON line)."""

import json
import os
import signal
from typing import Annotated

import typer

from ance_cli.guard import (
    DEBUG,
    exit_on_sigterm,
    interrupt,
    stop_within_under_prefects_handler,
)

SETS_HELP = ("Override a config field: --set key.sub=value (dotted keys into the sections; the value typed by the "
             "config, e.g. --set ance.learning_rate=3e-5 --set rounds=2); repeatable, applied after the config file")

# markdown: a docstring's paragraph is reflowed to the terminal's width, not broken where the source breaks it
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown", help="Train dense retrievers with ANCE, orchestrated by Prefect.")


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of user errors (or set "
                                                  "ANCE_DEBUG=1)")] = False) -> None:
    if debug:
        os.environ[DEBUG] = "1"
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    signal.signal(signal.SIGINT, interrupt)
    stop_within_under_prefects_handler()


def shown_by_the_log() -> bool:
    """Whether the flow's log has already shown its tables and closing lines where this command prints them: a handler
    of Prefect's flow-run logger (its console handler, on stderr) writes the flow's INFO lines (its prints) to the
    terminal, file or pipe stdout is (`ance run`, or `ance run > log 2>&1`). The command's ending then adds only what is
    new; where stdout goes elsewhere (`> result.md`, a pipe of its own), or the log shows no INFO lines there, stdout
    gets the whole summary."""
    import logging
    import sys

    try:
        terminal = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stream without a file descriptor (a capture, a closed one)
        return False
    logger = logging.getLogger("prefect.flow_runs")
    if not logger.isEnabledFor(logging.INFO):
        return False
    while logger is not None:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.level <= logging.INFO:
                try:
                    if os.path.samestat(os.fstat(handler.stream.fileno()), terminal):
                        return True
                except (OSError, ValueError, AttributeError):
                    continue
        logger = logger.parent if logger.propagate else None
    return False


def print_pipeline(result: dict, as_json: bool) -> None:
    shown = shown_by_the_log()
    typer.echo("")
    if not shown:
        typer.echo(result["markdown"])
    if "compression" in result:
        if not shown:
            typer.echo(f"## Compression of the final model\n\n{result['compression']['table']}\n")
        typer.echo(f"compression table and files: {result['compression']['files']}")
    typer.echo(f"result checkpoint: {result['final_checkpoint']}")
    typer.echo(f"report: {result['report_dir']}/results.md; plots: {result['plots_dir']}")
    if "tracking" in result and not shown:
        from tracking.closing import closing_lines

        for line in closing_lines(result["tracking"], result["selected"], result.get("warnings", ()),
                                  on_dev=result.get("dev_split") is not None, best=result.get("best_on_dev"),
                                  selection=result.get("selection")):
            typer.echo(line)
    if as_json:
        chosen = next(r for r in result["results"] if r["model"] == result["selected"])
        summary = {k: v for k, v in chosen.items() if k != "model"}
        keys = ("selected", "best_on_dev", "selection", "results", "warnings", "stages", "final_checkpoint",
                "last_checkpoint", "report_dir", "plots_dir", "async_refresh", "negatives", "tracking", "mlflow_run_id",
                "mlflow_uri", "compression", "retention", "started_from", "fusion", "recipe_search")
        typer.echo(json.dumps(summary | {k: result[k] for k in keys if k in result}))


_said: set[str] = set()  # a reused data stage's warnings said again by this process (`preflight`): once each


def preflight(data, work_dir: str, splits: tuple[str, ...], trains: bool = False, negatives: int = 0,
              doc_ids: bool = False, learns: str = "", relevant_grade: int = 1,
              grade_setting: str = "eval.relevant_grade"):
    """Validate the dataset before Prefect starts, so bad data is one clear line, not a failed flow run (`trains`: the
    train split must have positives, and each of its queries `negatives` documents not relevant to it). Returns its
    tables (the corpus's doc ids among them when it `trains` or is asked for `doc_ids`). `learns`: what learns from
    the train split's positives otherwise (said when it has none). `relevant_grade`: the evaluation's
    (`grade_setting`), which a split it evaluates must reach.

    This is the data stage itself (keyed by content), so the flow's first task then reuses its output."""
    from ance_core.artifacts import stage_warnings
    from ance_core.data.checks import check_trainable
    from ance_core.data.dataset import qrels_file, read_tables
    from ance_core.data.sources import resolve_dataset
    from ance_core.errors import AnceError, warn
    from ance_core.work_folder import made_work_dir
    from tasks.common import faults_off
    from tasks.data import prepare_data

    with made_work_dir(work_dir):  # (one this command made is removed again when the data is refused)
        _check_split_files(data, splits)
        with faults_off():  # a drill's injected faults are for the flow's tasks, which retry them
            columns = ["doc_id"] if trains or doc_ids else []
            ref = prepare_data.fn(data, work_dir)
            if ref.cached:  # what the data's reading said when it was built (rows left out, ids repeated), said again
                for message in set(stage_warnings(ref.path)) - _said:  # (a command that reuses it said nothing)
                    _said.add(message)
                    warn(message)
            tables = read_tables(ref.path, corpus_columns=columns)
        for split in splits:
            try:
                qrels = tables.split_qrels(split)
            except AnceError as e:  # which folder, and the file it would be in
                folder = resolve_dataset(data.dataset, data.data_home, download=False)
                where = qrels_file(folder, split, data.format)
                carved = (f"; none is carved from its '{data.train_split}' queries (data.dev_fraction "
                          f"{data.dev_fraction} of those with a positive leaves no dev query, or the dataset has no "
                          "train split): a pipeline run on it trains on every query and its result is its last model"
                          if split == data.dev_split and data.dev_fraction else "")
                raise AnceError(f"{folder}: {e}; a split's qrels are read from {where}{carved}") from None
            learned = trains and split == data.train_split  # (its positives are checked below: check_trainable)
            if not (qrels["relevance"] > 0).any() and not learned:
                why = (f"nothing to learn from ({learns})" if learns and split == data.train_split
                       else "every metric on it would be 0")
                raise AnceError(f"{data.dataset}: split '{split}' judges no document relevant (its {len(qrels)} qrels "
                                f"rows are all of grade 0 or below): {why}")
            if (top := qrels["relevance"].max()) < relevant_grade and not learned:
                raise AnceError(f"{grade_setting} {relevant_grade}: no qrels row of split "
                                f"'{split}' of {data.dataset} reaches it (its top grade is {top}), so MRR@10 and "
                                f"recall would be 0 for every model; set at most {top}")
        if trains:
            check_trainable(tables, resolve_dataset(data.dataset, data.data_home, download=False), data.train_split,
                            negatives, data.format)
        return tables  # (a validated data stage is kept on a refusal after it: it is whole, and reused)


def _check_split_files(data, splits: tuple[str, ...]) -> None:
    """A split with no qrels file in a local dataset folder, refused before the data stage reads the collection (the
    carved dev split is made by that stage; a dataset to download, a folder that is no dataset or has no labels are
    left to it, which says so)."""
    from ance_core.data.layout import split_files
    from ance_core.data.sources import resolve_dataset
    from ance_core.errors import AnceError

    try:
        folder = resolve_dataset(data.dataset, data.data_home, download=False)
        files, where = split_files(folder, data.format)
    except AnceError:
        return
    for split in splits:
        if files and split != data.dev_split and split not in files:
            raise AnceError(f"{folder}: split '{split}' has no qrels (available splits: {', '.join(files)}); a split's "
                            f"qrels are read from {where(split)}")


def run_pipeline(config, as_json: bool, extra: dict | None = None) -> None:
    """The pipeline run and printed; `extra` joins its result (`--recipe auto`: the search that chose the config)."""
    from ance_core.pipeline.config import negatives_needed
    from flows.ance_pipeline import ance_pipeline, check_pipeline
    from flows.start import with_local_start

    config = with_local_start(config)  # (a registered model's URI: its folder, before the checks read it)
    check_pipeline(config)
    preflight(config.data, config.work_dir, (config.data.train_split, config.data.eval_split), trains=True,
               negatives=negatives_needed(config), relevant_grade=config.eval.relevant_grade)
    print_pipeline(ance_pipeline(config) | (extra or {}), as_json)



def print_table(result: dict, where: str, json_keys: tuple[str, ...]) -> None:
    """A table flow's ending: its table, where its files are, the MLflow lines, and the JSON line when asked."""
    from tracking.closing import closing_lines

    shown = shown_by_the_log()
    typer.echo("")
    if not shown:
        typer.echo(result["table"])
    typer.echo(where)
    for line in () if shown else closing_lines(result["tracking"]):
        typer.echo(line)
    if json_keys:
        typer.echo(json.dumps({k: result[k] for k in json_keys}))



def print_metrics(metrics: dict, title: str, as_json: bool) -> None:
    typer.echo(title)
    for k, v in metrics.items():
        typer.echo(f"  {k:<16}{v:.4f}")
    if as_json:
        typer.echo(json.dumps(metrics))


