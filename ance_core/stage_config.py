"""The base of every stage's config. Each room defines its own stages' configs on it (data/config.py,
modeling/config.py, retrieval/config.py, negatives/config.py, training/config.py, compression/config.py), and
pipeline/config.py composes them into the pipeline's and the comparison's configs.

Frozen and `extra="forbid"`: a typo in a YAML file or the Prefect UI form is refused before any work starts.
"""

from pydantic import BaseModel, ConfigDict

# `model_dump(mode="json", context=KEY_DUMP)`: the dump a cache key is made of, without the fields a config declares
# do not change its stage's result (training/config.py: the checkpoint cadence)
KEY_DUMP = {"dump": "cache key"}


class StageConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
