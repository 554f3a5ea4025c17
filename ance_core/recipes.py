"""Named training recipes: overrides of the pipeline config's defaults, each chosen on the dev split (RESULTS.md:
the search log, and the three-seed tables on the test split).

- `demo`: the defaults themselves (`make demo`; about 13 minutes on a 2-core CPU for SciFact).
- `full`: a longer run of the same pipeline (`make quality`, `ance demo --recipe full`; about 45 minutes).
"""

from typing import Any

from ance_core.config import PipelineConfig
from ance_core.errors import AnceError

RECIPES: dict[str, dict[str, Any]] = {
    "demo": {},
    "full": {"rounds": 2, "warmup": {"epochs": 2}, "mining": {"sampler": "simans"}},
}


def recipe_config(name: str, **overrides: Any) -> PipelineConfig:
    """The pipeline config of a recipe, with top-level `overrides` (e.g. work_dir) on top."""
    if name not in RECIPES:
        raise AnceError(f"unknown recipe '{name}'; choose one of {', '.join(RECIPES)}")
    return PipelineConfig.model_validate(RECIPES[name] | overrides)
