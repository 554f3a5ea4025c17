"""What the recipe search (flows/tune.py) takes before its first trial: its base config from a deployment's run form,
and what it says of a dev split it cannot choose on and of seeds the user set that it does not use."""

from prefect.context import FlowRunContext

from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.recipes import form_rebased
from ance_core.pipeline.tune import TuneConfig
from flows.trial import SEED_FIELDS


def started_from_a_deployment() -> bool:
    """Whether this flow run was started from a deployment (the Prefect UI's run form, a schedule, `prefect deployment
    run`), not called by the CLI or by another flow."""
    context = FlowRunContext.get()
    return context is not None and context.flow_run is not None and context.flow_run.deployment_id is not None


def from_the_form(config: PipelineConfig, tune: TuneConfig) -> PipelineConfig:
    """A deployment's `config` as the search's base (`form_rebased`): a run form opens with demo's config, and one
    left so beside `tune.recipe` full searches full. The CLI's config is built from the recipe it names, and a setting
    in it that equals demo's is the user's: it is kept."""
    if not started_from_a_deployment():
        return config
    config, taken = form_rebased(config, tune.recipe, TuneConfig().recipe)
    if taken:
        print(f"tune.recipe '{tune.recipe}': the config held the run form's '{TuneConfig().recipe}' values, so the "
              f"search's base takes '{tune.recipe}''s: {', '.join(taken)}")
    return config


def no_dev_split(config: PipelineConfig) -> str:
    """Why a search of `config` has no dev split to choose on."""
    d = config.data
    if d.dev_split is None:
        return "the recipe search (ance tune, --recipe auto) chooses on the dev split, and data.dev_split is null"
    return (f"the recipe search (ance tune, --recipe auto) chooses on the dev split, and {d.dataset} has none: no "
            f"split '{d.dev_split}', and data.dev_fraction {d.dev_fraction} carved none from the training queries "
            "(raise it, e.g. 0.2, or add the split)")


def unused_seeds(config: PipelineConfig, seeds: list[int]) -> dict[str, int]:
    """The seeds a user set on the base config (not their defaults) that a search under `seeds` does not use."""
    return {f"{f}.seed": seed for f in SEED_FIELDS if (seed := getattr(config, f).seed) != seeds[0]
            and seed != type(getattr(config, f)).model_fields["seed"].default}
