"""What a flow run is called in the Prefect UI (and in MLflow, whose runs take its name). Light: flows/stages.py's
flows, started in processes of their own, import it."""

import re

from prefect.context import FlowRunContext
from prefect.utilities.names import generate_slug

from ance_core.data.config import DataConfig


def dataset_run_name() -> str:
    """A flow's `flow_run_name`: the collection its parameters name (`config.data`, or `data`) before Prefect's two
    random words, `scifact-witty-otter`, so that the UI's lists of runs (and the MLflow runs named after them) say what
    each ran on; the two words alone where no collection can be read (a name never fails the run). A name the user
    gave the run is kept."""
    words = generate_slug(2)
    try:
        context = FlowRunContext.get()
        given = context.flow_run.name if context.flow_run is not None else None
        if given and not re.fullmatch(r"[a-z]+-[a-z]+", given):  # a name the user gave (`prefect deployment run
            return given  # --flow-run-name`), not the two words Prefect made up: kept
        parameters = context.parameters
        config = parameters.get("config")
        data = parameters.get("data") or (config.get("data") if isinstance(config, dict) else
                                          getattr(config, "data", None))
        data = DataConfig.model_validate(data) if isinstance(data, dict) else data or DataConfig()
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', data.collection).strip('-')}-{words}"
    except Exception:  # noqa: BLE001
        return words
