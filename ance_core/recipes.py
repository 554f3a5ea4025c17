"""Named training recipes: overrides of the pipeline config's defaults, each chosen on the dev split (RESULTS.md:
the search log, and the three-seed tables on the test split).

- `demo`: the defaults themselves (`make demo`; 511 s of stages on a 2-core CPU for SciFact): 1 ANCE round.
- `full`: a longer run of the same pipeline (`make quality`, `ance demo --recipe full`): 2 ANCE rounds with SimANS
  negatives, 2 epochs per stage (dev search run s6: 1,219 s of stages).
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
