"""The config reference (docs/config-reference.md), generated from the config models themselves: every section and
field of `PipelineConfig` (compression's `CompressConfig` among its sections), of the recipe search's `TuneConfig` and
of `CompareConfig`'s top level (its sections are the pipeline's), with its type, its default and its description.
`python -m ance_core.pipeline.reference > docs/config-reference.md` writes it; a test fails when the committed file
differs from what the code generates, so the two cannot drift.
"""

import json
import types
import typing
from typing import Any

from pydantic import BaseModel

from ance_core.pipeline.config import CompareConfig, PipelineConfig
from ance_core.pipeline.tune import TuneConfig

HEADER = """# Config reference

Generated from the config models (`python -m ance_core.pipeline.reference > docs/config-reference.md`; a test checks
that this file is what the code generates). A pipeline config file (`ance run --config x.yaml`) sets any of these;
`--set section.field=value` sets one on the command line. Unknown keys are refused.

"""
# (prefix, model, title, whether its sections are listed: the comparison's are the pipeline's, listed above it)
ROOTS = [("", PipelineConfig, "The pipeline (`ance run`, `ance demo`, the `ance-train` deployment; its `compression` "
                                "section is `ance compress`'s config too)", True),
         ("tune", TuneConfig, "The recipe search (`ance tune`, `ance run --recipe auto`: `--tune-set`)", True),
         ("", CompareConfig, "The negative samplers compared (`ance compare --config`, the `compare-negatives` "
                             "deployment): its top level; each section is the pipeline's of the same name", False)]


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: int, float | None, flat | ivf | hnsw, list[str], a section's name."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def default_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(section)"
    text = json.dumps(value, default=str)
    return f"`{text}`"


def _section(model: type[BaseModel]) -> type[BaseModel] | None:
    """The config model a field holds (a section), else None."""
    for candidate in (model, *typing.get_args(model)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], prefix: str) -> tuple[list[str], list[tuple[str, type[BaseModel]]]]:
    """The table rows of `model`'s own fields, and its sections (to be listed after it)."""
    out, sections = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        section = _section(field.annotation)
        if section is not None:
            sections.append((key, section))
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        kind = section.__name__ if section is not None else type_name(field.annotation)
        default = "(required)" if field.is_required() else default_text(field.get_default(call_default_factory=True))
        out.append(f"| `{key}` | {kind} | {default} | {description} |")
    return out, sections


def reference() -> str:
    parts = [HEADER]
    for prefix, root, title, nested in ROOTS:
        queue = [(prefix, root)]
        parts.append(f"## {title}\n")
        while queue:
            key, model = queue.pop(0)
            table, sections = rows(model, key)
            doc = " ".join((model.__doc__ or "").split())
            parts.append(f"### `{key or 'top level'}` — {model.__name__}\n\n{doc}\n\n"
                         "| field | type | default | description |\n|---|---|---|---|\n" + "\n".join(table) + "\n")
            queue.extend(sections if nested else [])
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
