"""The base of every stage's config. Each room defines its own stages' configs on it (data/config.py,
modeling/config.py, retrieval/config.py, negatives/config.py, training/config.py, compression/config.py), and
pipeline/config.py composes them into the pipeline's and the comparison's configs.

Frozen and `extra="forbid"`: a typo in a YAML file or the Prefect UI form is refused before any work starts.
"""

from pydantic import BaseModel, ConfigDict


class StageConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
