"""`ance-train-auto`: `ance run --recipe auto` as one flow, for the Prefect UI and deployments: the recipe search on
the dataset's dev split (the `ance-tune` flow, as a subflow), then the winner trained in full (the `ance-train` flow,
as a subflow; when the winner ran whole under the first seed, that run is one of its trials: every stage cached).
Unlike the CLI, it does not take the budget of an earlier search of the same settings: tune.budget_minutes is the
search's."""

from prefect import flow

from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.recipes import recipe_config
from ance_core.pipeline.tune import TuneConfig
from flows.ance_pipeline import ance_pipeline, check_pipeline
from flows.names import dataset_run_name
from flows.tune import tune_recipe
from flows.tune_inputs import from_the_form

SEARCH_KEYS = ("winner", "overrides", "reason", "stopped", "report_dir", "mlflow_run_id")


@flow(name="ance-train-auto", flow_run_name=dataset_run_name, log_prints=True)
def tune_and_train(config: PipelineConfig = recipe_config(TuneConfig().recipe),
                   tune: TuneConfig = TuneConfig()) -> dict:
    """The recipe chosen on the dev split of `config`'s dataset, then trained.

    Args:
        config: The base the candidates vary: the search's base recipe (tune.recipe, `demo`) with the user's changes.
        tune: What the search varies (learning rates, graded positives, warm-up epochs), its seeds and its budget.
    """
    config = from_the_form(config, tune)  # (its subflow is no deployment's run: the form is read here)
    check_pipeline(config)  # (the run after the search trains here, whatever devices the trials had)
    tuned = tune_recipe(config, tune)
    result = ance_pipeline(PipelineConfig.model_validate(tuned["config"]))
    return result | {"recipe_search": {k: tuned[k] for k in SEARCH_KEYS}}
