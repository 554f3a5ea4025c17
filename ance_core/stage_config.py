"""The base of every stage's config. Each room defines its own stages' configs on it (data/config.py,
modeling/config.py, retrieval/config.py, negatives/config.py, training/config.py, compression/config.py), and
pipeline/config.py composes them into the pipeline's and the comparison's configs.

Frozen and `extra="forbid"`: a typo in a YAML file or the Prefect UI form is refused before any work starts.
"""

import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializationInfo, ValidationInfo, field_validator, model_serializer

# `model_dump(mode="json", context=KEY_DUMP)`: the dump a cache key is made of, without the fields a config declares
# do not change its stage's result (training/config.py: the checkpoint cadence)
KEY_DUMP = {"dump": "cache key"}
# `model_dump(mode="json", context=SPARSE_DUMP)`: without the UNSAID options at their unsaid values (as KEY_DUMP), the
# rest kept: what another process takes as parameters (a deployment's flow run), which code from before an option
# existed still accepts (extra="forbid")
SPARSE_DUMP = {"dump": "sparse"}
SEED_MAX = 2**63 - 1  # an int64: torch's seeds take up to 2**64 - 1 (a seed + rank included); 10**20 failed at a step


class StageConfig(BaseModel):
    # allow_inf_nan=False: an infinite learning rate or budget is refused here, not at the first step or rung it breaks
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # options added after stage keys existed: left out of the dump a cache key is made of (KEY_DUMP) and of the repr
    # (which a stage key holds when the config is nested in a dict) while they hold these values, so the keys of
    # configs that do not use them stay; every other dump has them (the Prefect UI's form opens with the flow's
    # default dumped: without them it showed hybrid unset where the run used true)
    UNSAID: ClassVar[dict[str, Any]] = {}
    # fields that do not change a stage's result (batch sizes of inference): left out of the dump a cache key is made
    # of (KEY_DUMP); declare them `repr=False` too, for a key that holds the repr
    NOT_IN_KEY: ClassVar[tuple[str, ...]] = ()
    # fields whose default changed after stage keys existed: left out of the cache-key dump (KEY_DUMP) and the repr
    # while they hold the value that was the default, but kept in every other dump, so a config saved and loaded again
    # keeps a value a user chose (it is no longer the default)
    KEY_UNSAID: ClassVar[dict[str, Any]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A number field given true or false (YAML's `rounds: yes`, `--set rounds=true`) is refused: pydantic would
        take it as 1 or 0."""
        if isinstance(value, bool) and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{str(value).lower()} is not a number")
        return value

    @model_serializer(mode="wrap")
    def _unsaid_dump(self, handler, info: SerializationInfo):
        data = handler(self)
        if info.context in (KEY_DUMP, SPARSE_DUMP):
            self.drop_unsaid(data)
        if info.context == KEY_DUMP:
            for name in self.NOT_IN_KEY:
                data.pop(name, None)
            for name, value in self.KEY_UNSAID.items():
                if name in data and getattr(self, name) == value:
                    del data[name]
        return data

    def drop_unsaid(self, data: dict) -> dict:
        """`data` (a dump of this config) without the UNSAID fields that hold their unsaid value (in place)."""
        for name, value in self.UNSAID.items():
            if name in data and getattr(self, name) == value:
                del data[name]
        return data

    def __repr_args__(self):
        unsaid = self.UNSAID | self.KEY_UNSAID
        return [(k, v) for k, v in super().__repr_args__() if not (k in unsaid and v == unsaid[k])]


def _numeric(annotation: Any) -> bool:
    """Whether a field's type takes an int or a float and not a bool (`int`, `float | None`, `int | Literal[...]`)."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return bool not in args and any(_numeric(a) for a in args)
    return False
