"""Named training recipes: overrides of the pipeline config's defaults, each chosen on the dev split (RESULTS.md:
the search log, the three-seed tables and the paired comparisons).

- `demo` (`make demo`, `ance demo`; about 7.5 min on a 2-core CPU for SciFact, the environment included): the
  defaults with SimANS negatives in the ANCE round and a learning rate of 4e-5 in both stages. SimANS beat
  ANCE-uniform on the dev split under each of three seeds (+0.015 nDCG@10 on average); the pipeline's own default
  sampler stays `ance`, the paper's method, so a config that names no sampler trains ANCE. The learning rate was
  chosen on the dev splits of SciFact, CISI and NPL together (issue 30's search: RESULTS.md); the pipeline's own
  default stays 2e-5.
- `full` (`make quality`, `ance demo --recipe full`): 2 SimANS rounds, 2 epochs per stage (dev search run s6), with
  the demo's learning rate of 4e-5 (taken from the demo's search, not searched on `full` itself).
"""

from collections.abc import Sequence
from typing import Any

from ance_core.errors import AnceError
from ance_core.pipeline.config import PipelineConfig, load_config

RECIPES: dict[str, dict[str, Any]] = {
    "demo": {"mining": {"sampler": "simans"}, "warmup": {"learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5}},
    "full": {"rounds": 2, "warmup": {"epochs": 2, "learning_rate": 4e-5}, "ance": {"learning_rate": 4e-5},
             "mining": {"sampler": "simans"}},
}


def recipe_config(name: str, sets: Sequence[str] = (), **overrides: Any) -> PipelineConfig:
    """The pipeline config of a recipe, with top-level `overrides` (e.g. work_dir) and then `--set` overrides
    (`key.sub=value`, pipeline/config.py `apply_sets`) on top."""
    if name not in RECIPES:
        raise AnceError(f"unknown recipe '{name}'; choose one of {', '.join(RECIPES)}")
    return load_config(None, PipelineConfig, sets, base=RECIPES[name] | overrides)
