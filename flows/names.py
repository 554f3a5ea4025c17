"""What a flow run is called in the Prefect UI (and in MLflow, whose runs take its name). Light: flows/stages.py's
flows, started in processes of their own, import it."""

import re

from prefect.context import FlowRunContext
from prefect.utilities.names import generate_slug

from ance_core.data.config import DataConfig


def dataset_run_name() -> str:
    """A flow's `flow_run_name`: the collection its parameters name (`config.data`, or `data`) before Prefect's two
    random words, `scifact-witty-otter`, so that the UI's lists of runs (and the MLflow runs named after them) say what
    each ran on; the two words alone where no collection can be read (a name never fails the run)."""
    words = generate_slug(2)
    try:
        parameters = FlowRunContext.get().parameters
        config = parameters.get("config")
        data = parameters.get("data") or (config.get("data") if isinstance(config, dict) else
                                          getattr(config, "data", None))
        data = DataConfig.model_validate(data) if isinstance(data, dict) else data or DataConfig()
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', data.collection).strip('-')}-{words}"
    except Exception:  # noqa: BLE001
        return words
