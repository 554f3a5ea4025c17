"""`ance` commands that train: demo, run, recipes, tune, compare, compress."""

import json
from pathlib import Path
from typing import Annotated

import typer

from ance_cli.app import SETS_HELP, app, preflight, print_table, run_pipeline, shown_by_the_log
from ance_cli.guard import fail, guard, refuse_twice


@app.command()
def demo(
    recipe: Annotated[str, typer.Option(help="demo (7-12 min on a 2-core CPU with bf16 in hardware, ~25 without) or "
                                         "full (2 SimANS rounds, 2 epochs a stage: about 1.5x the demo) or "
                                         "full-maxp (full on MaxP documents: about 2x full)")] = "demo",
    rounds: Annotated[int | None, typer.Option(help="ANCE rounds after the warm-up (default: the recipe's)")] = None,
    work_dir: Annotated[str | None, typer.Option(help="Where stage outputs are kept [default: work]")] = None,
    compress: Annotated[bool, typer.Option("--compress", help="Then compress the final model's embeddings (ConAE, "
                                           "PCA, truncation to 256/128/64; flat, HNSW and IVF-PQ indexes)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final metrics as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP.replace(
        "applied after the config file", "applied after the recipe"))] = None,
):
    """The full pipeline on SciFact with all-MiniLM-L6-v2 on this machine, ending with the results table."""
    from ance_core.pipeline.recipes import recipe_config

    # (a section, not a CompressConfig: --set compression.dims=[64] goes into it)
    compression = {"index_types": ["flat", "hnsw", "ivfpq"]} if compress else None

    def body():
        refuse_twice(sets, [("--rounds", rounds, "rounds"), ("--work-dir", work_dir, "work_dir")])
        overrides = {"work_dir": "work" if work_dir is None else work_dir, "compression": compression}
        config = recipe_config(recipe, sets or (), **overrides | ({"rounds": rounds} if rounds is not None else {}))
        run_pipeline(config, as_json)

    guard(body, resumes=True)


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON pipeline config; without one, "
                                                "the pipeline's defaults (and --set on top)")] = None,
    recipe: Annotated[str | None, typer.Option(help="Start from a recipe (demo, full, full-maxp; auto: chosen on the "
                                               "dataset's dev split by `ance tune`, then trained), the config file's "
                                               "sections merged over it")] = None,
    budget_minutes: Annotated[float | None, typer.Option(help="--recipe auto: wall minutes of the search's trials "
                                                         "(default: the search's)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final metrics as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    tune_sets: Annotated[list[str] | None, typer.Option("--tune-set", help="--recipe auto: a search setting, as "
                                                        "`ance tune --tune-set`")] = None,
):
    """The pipeline with a config file (sections: data, model, bm25, warmup, encode, index, mining, ance, ...)."""
    from ance_core.errors import warn
    from ance_core.pipeline.loading import load_config
    from ance_core.pipeline.recipes import AUTO, recipe_config, recipe_drift

    def body():
        if recipe != AUTO and (given := [f for f, v in (("--budget-minutes", budget_minutes),
                                                         ("--tune-set", tune_sets)) if v is not None]):
            fail(f"{' and '.join(given)}: search settings, for --recipe auto only (the recipe is "
                 f"{recipe or 'the pipeline defaults'}: nothing is searched)")
        refuse_twice(tune_sets, [("--budget-minutes", budget_minutes, "budget_minutes")], "--tune-set")
        if recipe is None:
            return run_pipeline(load_config(config, sets=sets or ()), as_json)
        if recipe != AUTO:
            if config is not None and (drift := recipe_drift(recipe_config(recipe, (), config), recipe)):
                warn(f"--recipe {recipe}: the config file {config} replaces the recipe's {', '.join(drift)}")
            return run_pipeline(recipe_config(recipe, sets or (), config), as_json)
        tuned = _tune(config, sets, budget_minutes, tune_sets=tune_sets, final_run=True)
        if not shown_by_the_log():
            typer.echo(tuned["markdown"])
        from ance_core.pipeline.config import PipelineConfig
        from flows.auto import SEARCH_KEYS

        run_pipeline(PipelineConfig.model_validate(tuned["config"]), as_json,
                     {"recipe_search": {k: tuned[k] for k in SEARCH_KEYS}})

    guard(body, resumes=True)


def _tune(config: Path | None, sets: list[str] | None, budget_minutes: float | None, seeds: list[int] | None = None,
          recipe: str | None = None, tune_sets: list[str] | None = None, final_run: bool = False) -> dict:
    """The recipe search (flows/tune.py) on a config file / --sets over the search's base recipe."""
    from ance_core.errors import warn
    from ance_core.pipeline.config import negatives_needed
    from ance_core.pipeline.loading import load_config
    from ance_core.pipeline.recipes import RECIPES, recipe_config
    from ance_core.pipeline.tune import MAX_BUDGET, TuneConfig, earlier_budget
    from ance_core.stage_config import SEED_MAX
    from flows.ance_pipeline import check_pipeline
    from flows.tune import tune_recipe
    from flows.tune_inputs import no_dev_split

    # (each named as its option, not as the search's field)
    if budget_minutes is not None and not 0 < budget_minutes <= MAX_BUDGET:
        fail(f"--budget-minutes {budget_minutes:g}: the search's wall minutes must be a number above 0 and at most "
             f"{MAX_BUDGET:g} (a year)")
    if recipe is not None and recipe not in RECIPES:
        fail(f"--recipe {recipe}: the search varies one of {', '.join(RECIPES)}")
    if seeds is not None and (bad := [s for s in seeds if not 0 <= s <= SEED_MAX]):
        fail(f"--seed {bad[0]}: a seed is a whole number from 0 to {SEED_MAX}")
    given = {k: v for k, v in {"budget_minutes": budget_minutes, "seeds": seeds, "recipe": recipe}.items()
             if v is not None}
    tune = load_config(None, TuneConfig, tune_sets or (), base=given, flag="--tune-set")
    base = recipe_config(tune.recipe, sets or (), config)
    for setting, value, why in (("start_checkpoint", base.start_checkpoint, "a run from a checkpoint has no warm-up"),
                                ("warmup_only", base.warmup_only, "its trials train whole recipes")):
        if value:  # (else refused inside the search, after its data stage, as a candidate's pydantic error)
            fail(f"{setting} {value}: the search compares warm-ups and whole recipes, and {why}; unset it, or train "
                 "this config with `ance run`")
    if "budget_minutes" not in tune.model_fields_set and (earlier := earlier_budget(base, tune)):
        tune = tune.model_copy(update={"budget_minutes": earlier[0]})  # its reused trials budgeted as they were
        warn(f"recipe search: the budget is the one of the search in {earlier[1]} ({earlier[0]:g} minutes), whose "
             "trials this one reuses (--budget-minutes to give another)")
    # (trials on GPU workers check their devices there; the run --recipe auto trains after them is this process's)
    check_pipeline(base, devices=final_run or not base.execution.on_gpu_workers)
    if base.data.dev_split is None:
        fail(no_dev_split(base))
    tables = preflight(base.data, base.work_dir, (base.data.train_split, base.data.eval_split), trains=True,
                       negatives=negatives_needed(base), relevant_grade=base.eval.relevant_grade)
    # (else refused inside the search's flow; under cv, which names the fold without dev queries, it is, before any
    # training)
    if base.selection != "cv" and not (tables.qrels["split"] == base.data.dev_split).any():
        fail(no_dev_split(base))
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
    recipe: Annotated[str | None, typer.Option(help="The recipe the candidates vary (the baseline) [default: "
                                               "demo]")] = None,
    budget_minutes: Annotated[float | None, typer.Option(help="Wall minutes of trials (default: the budget of the "
                                                         "newest finished search of the same settings in the work "
                                                         "folder, whose trials this one reuses; else 90)")] = None,
    seeds: Annotated[list[int] | None, typer.Option("--seed", help="The rungs' seeds (repeatable; default 42 43 "
                                                    "44)")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the winner's whole config here (YAML, for `ance run "
                                             "--config`)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the choice as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP)] = None,
    tune_sets: Annotated[list[str] | None, typer.Option("--tune-set", help="Override a search setting: "
                                                        "recipe, learning_rates, positives, warmup_epochs, seeds, "
                                                        "eta, margin, budget_minutes (e.g. --tune-set "
                                                        "learning_rates=[4e-5,1e-5])")] = None,
):
    """Choose a recipe on the dataset's dev split: variants of --recipe (learning rate, which graded positives train,
    warm-up epochs) as trials with successive halving over seeds; prints the table and the winner. With --set
    selection=cv each trial runs once per dev fold and is scored on every fold's dev queries pooled (for dev splits of
    a dozen queries; about 1 / data.dev_fraction times the cost)."""

    def body():
        if out is not None and out.is_dir():  # (found after the whole search, with a traceback)
            fail(f"--out {out}: a folder; give the file to write the winner's config to, e.g. {out / 'recipe.yaml'}")
        if out is not None and not out.parent.is_dir():
            fail(f"--out {out}: no folder {out.parent} to write it in")
        if out is not None:  # (a folder it cannot write in: a traceback after the whole search)
            from ance_core.work_folder import writable_folder

            writable_folder(out.parent, f"--out {out}")
        refuse_twice(tune_sets, [("--budget-minutes", budget_minutes, "budget_minutes"), ("--seed", seeds, "seeds"),
                                 ("--recipe", recipe, "recipe")], "--tune-set")
        result = _tune(config, sets, budget_minutes, seeds, recipe, tune_sets)
        if not shown_by_the_log():  # (on a terminal the flow's log has shown it)
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

    guard(body, resumes=True)


@app.command()
def compare(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON CompareConfig")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON last")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help=SETS_HELP.replace(
        "--set rounds=2", "--set samplers=[bm25,simans]"))] = None,
):
    """Compare negative samplers from one BM25 warm-up checkpoint (the compare-negatives deployment's flow)."""
    from ance_core.pipeline.config import CompareConfig, negatives_needed
    from ance_core.pipeline.loading import load_config

    def body():
        from flows.compare import compare_negatives

        c = load_config(config, CompareConfig, sets or ())
        preflight(c.data, c.work_dir, (c.data.train_split, c.data.eval_split), trains=True,
                   negatives=negatives_needed(c), relevant_grade=c.eval.relevant_grade)
        result = compare_negatives(c)
        print_table(result, f"report: {result['report_dir']}/results.md; table and plots: {result['files']}",
                     ("results", "train_seconds", "tracking", "table") if as_json else ())

    guard(body, resumes=True)


@app.command(name="compress")
def compress_command(
    checkpoint: Annotated[Path | None, typer.Option(help="A trained checkpoint folder; default: the dataset's "
                                                    "champion in MLflow, else the work folder's newest model")] = None,
    dataset: Annotated[str, typer.Option(help="Dataset name under the data home, or a folder")] = "scifact",
    name: Annotated[str | None, typer.Option(help="The collection's name in the MLflow registry (data.name): whose "
                                             "champion is compressed by default, and the registered model the "
                                             "compressed versions join (default: the dataset folder's name)")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or JSON CompressConfig (or a pipeline "
                                                "config: its compression section)")] = None,
    work_dir: Annotated[str, typer.Option()] = "work",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON last")] = False,
):
    """Compress a trained model's embeddings (ConAE and the PCA / truncation baselines) and measure quality, index
    size and search latency on the evaluation split (the compress deployment's flow)."""
    from pydantic import ValidationError

    from ance_core.compression.config import CompressConfig
    from ance_core.data.config import DataConfig
    from ance_core.modeling.checks import check_loadable
    from ance_core.modeling.model import read_meta
    from ance_core.pipeline.config import validation_message
    from ance_core.pipeline.loading import load_config

    def body():
        from ance_core.artifacts import read_manifest
        from flows.compress import check_compression, compress_flow
        from flows.start import trained_checkpoint
        from tasks.common import faults_off
        from tasks.data import prepare_data
        from tracking.registry import check_model_name

        if checkpoint is not None:
            read_meta(checkpoint)  # fail fast, before any work, on a folder that is not a checkpoint
        c = load_config(config, CompressConfig, base_section="compression") if config else CompressConfig()
        try:
            data = DataConfig(dataset=dataset, name=name)
        except ValidationError as e:
            fail(f"--name {name!r}: {validation_message(e.errors()[0])}")
        check_model_name(data, "--name")
        teacher, _ = trained_checkpoint(work_dir, data.collection, str(checkpoint) if checkpoint else None)
        read_meta(teacher)  # (a checkpoint: not a pretrained model's folder, nor a folder gc removed)
        check_loadable(teacher)  # (its weights and tokenizer: before the data and the corpus encoding)
        preflight(data, work_dir, (data.train_split, data.eval_split),
                  learns="ConAE's compression trains on its queries' positives")
        with faults_off():  # (the pre-flight's data stage, reused)
            documents = read_manifest(prepare_data.fn(data, work_dir).path)["summary"]["documents"]
        check_compression(teacher, c, documents)  # before the corpus is encoded
        result = compress_flow(str(checkpoint.resolve()) if checkpoint else None, data, compression=c,
                               work_dir=work_dir)
        print_table(result, f"table and files: {result['files']}",
                     ("rows", "files", "checkpoint", "tracking") if as_json else ())

    guard(body, resumes=True)


