"""Reading a config: a YAML or JSON file (duplicate keys refused), `--set key=value` overrides on top, and
validation errors that name the file, the field or the override (`load_config`)."""

import difflib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ance_core.errors import AnceError, warn
from ance_core.pipeline.config import PipelineConfig, validation_message
from ance_core.stage_config import StageConfig


def load_config(path: str | Path | None, schema: type[StageConfig] = PipelineConfig, sets: Sequence[str] = (),
                base: dict | None = None, flag: str = "--set", base_section: str | None = None) -> Any:
    """Read a YAML or JSON config (a pipeline's by default; without a path, `base` or the defaults), with `--set`
    overrides (`apply_sets`) on top; errors name the file, the offending field or the override (as `flag`).
    `base_section`: a file that is a pipeline config gives its section of that name (`ance compress --config`)."""
    raw: Any = dict(base or {})
    if path is not None:
        raw = read_config_file(path)
        if base_section is not None and base_section in raw and base_section not in schema.model_fields:
            if others := [k for k in raw if k != base_section]:
                warn(f"{path}: its {base_section} section is read; its other sections ({', '.join(others)}) are not "
                     "this command's")
            raw = raw[base_section] or {}
    raw = apply_sets(raw, sets, schema, flag)
    try:
        return schema.model_validate(raw)
    except ValidationError as e:
        where = f"{path}: " if path is not None else ""
        also = f" (with {' '.join(f'{flag} {s}' for s in sets)})" if sets else ""
        said = format_validation_error(e, schema)
        one = said.strip() if "\n" not in said else None  # (one error: one line; several: one a line under it)
        raise AnceError(f"{where}invalid config{also}: {one}" if one else f"{where}invalid config{also}:\n{said}") \
            from None


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key given twice in one mapping (it kept the last silently: `rounds: 1` above
    `rounds: 2` ran two rounds, whichever the reader meant)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key, _ in node.value:
            name = self.construct_object(key, deep=deep)
            if not isinstance(name, typing.Hashable):  # (PyYAML's own error says so)
                continue
            if name in seen:  # (where the second is; the first's line said)
                raise yaml.constructor.ConstructorError(None, None, f"'{name}' is given twice (first on line "
                                                        f"{seen[name].line + 1})", key.start_mark)
            seen[name] = key.start_mark
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> dict:
    """A YAML or JSON config file's mapping of sections; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise AnceError(f"{path}: {'a folder, not a config file' if path.is_dir() else 'config file not found'}")
    try:
        data = path.read_bytes()  # UTF-8, or UTF-16 with its byte-order mark (PowerShell's `>`), as the data files
        text = data.decode("utf-16") if data[:2] in (b"\xff\xfe", b"\xfe\xff") else data.decode("utf-8")
        raw = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
        if raw is None:  # (empty, or comments only: a file saved before it was written, the wrong file)
            warn(f"{path}: an empty config file: every setting is the default")
            raw = {}
    except yaml.YAMLError as e:  # where and what, in one line (PyYAML's own text spans several)
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise AnceError(f"{where}: not valid YAML/JSON: {problem}") from None
    except UnicodeDecodeError as e:
        raise AnceError(f"{path}: not valid YAML/JSON: {e}") from None
    if not isinstance(raw, dict):
        raise AnceError(f"{path}: expected a mapping of config sections, got {type(raw).__name__}")
    try:
        return unshared(raw)
    except AnceError as e:
        raise AnceError(f"{path}: {e}") from None


def unshared(value: Any, _within: tuple[int, ...] = ()) -> Any:
    """A copy of a YAML document in which no two places share a mapping or list: a YAML alias (`ance: *warmup`, as
    yaml.safe_dump writes two equal sections) is copied, so that a --set of one section does not change the other
    (copy.deepcopy keeps the sharing). An alias inside the node it names (`warmup: &w {self: *w}`) is refused."""
    if isinstance(value, (dict, list)):
        if id(value) in _within:
            raise AnceError("the config holds a YAML alias inside the mapping or list it names (a loop); write the "
                            "values out")
        within = (*_within, id(value))
        if isinstance(value, dict):
            return {k: unshared(v, within) for k, v in value.items()}
        return [unshared(v, within) for v in value]
    return value


def _text_field(schema: type[BaseModel] | None, parts: list[str]) -> bool:
    """Whether the dotted field is a plain string (`data.eval_split=2019` stays the text '2019')."""
    for part in parts:
        field = schema.model_fields.get(part) if schema is not None else None
        if field is None:
            return False
        kinds = [a for a in typing.get_args(field.annotation) if a is not type(None)] or [field.annotation]
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        schema = models[0] if models else None
    return kinds == [str]


def apply_sets(raw: dict, sets: Sequence[str], schema: type[BaseModel] | None = None, flag: str = "--set") -> dict:
    """`key.sub=value` overrides on a config mapping (a copy): dotted keys into its sections, each value read as a YAML
    scalar or flow list/mapping (`3e-5`, `true`, `null`, `[ance, bm25]`) and typed by the config model when validated
    (an unknown key is refused there, by name); errors name the override as `flag` gave it. A key given twice is
    refused (the last one won, silently, whichever was meant)."""
    out, given = unshared(raw), {}
    for item in sets:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            example = "ance.learning_rate=3e-5" if flag == "--set" else "eta=2"
            raise AnceError(f"{flag} {item}: expected key=value with a dotted key, e.g. {flag} {example}")
        if (first := given.setdefault(".".join(parts), item)) is not item:
            raise AnceError(f"{flag} {first} and {flag} {item} both set {'.'.join(parts)}: give it once")
        stripped = text.strip()
        if stripped and stripped[:1] not in ("'", '"') and stripped.lower() not in ("null", "~") \
                and _text_field(schema, parts):
            # a text field takes the text as typed: YAML would drop a trailing space ('query: ', a prefix), read
            # 'query: ' as a mapping and 2019 as a number, or refuse '[x'; a quoted value is YAML's string, null unsets
            value = text.lstrip()
        else:
            try:
                value = yaml.safe_load(text) if stripped else ""
            except yaml.YAMLError as e:  # in one line (PyYAML's own text spans several)
                mark = getattr(e, "problem_mark", None)
                where = f" at character {mark.column + 1}" if mark is not None else ""
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise AnceError(f"{flag} {item}: the value is not valid YAML{where}: {problem} (a text value in "
                                f"quotes, inside the shell's: {flag} \"{key}='...'\")") from None
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise AnceError(f"{flag} {item}: '{'.'.join(parts[:depth + 1])}' is a value ({child!r}), not a "
                                "section")
            node = child
        node[parts[-1]] = value
    return out


def format_validation_error(e: ValidationError, schema: type[BaseModel] | None = None) -> str:
    """One indented line per error, naming the field; a key the config does not have says the nearest setting of its
    section by name when `schema` is given (`warmup.lerning_rate`: did you mean warmup.learning_rate?)."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"  {loc}: {_unknown_key(schema, [str(p) for p in err['loc']])}")
            continue
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""  # (a
        # section's or the config's own error: its message names the fields, the whole of its input is noise)
        lines.append(f"  {loc}: {validation_message(err)}{got}" if loc else f"  {validation_message(err)}{got}")
    return "\n".join(lines)


def _unknown_key(schema: type[BaseModel] | None, loc: list[str]) -> str:
    """What an unknown key is: not a setting of its section, and the section's closest setting by name if one is."""
    model, section = schema, ".".join(loc[:-1])
    for part in loc[:-1]:
        model = _model_of(model.model_fields.get(part)) if model is not None else None
    what = f"not a setting of {section}" if section else "not a section or setting of the config"
    if model is None:
        return what
    if "." in loc[-1]:  # (a config file written as --set's: `warmup.batch_size: 4`)
        head, _, rest = loc[-1].partition(".")
        return f"{what}: a dotted key is --set's; a file nests it, `{head}: {{{rest}: ...}}`"
    if not section and (owners := [f"{name}.{loc[-1]}" for name, field in model.model_fields.items()
                                   if loc[-1] in getattr(_model_of(field), "model_fields", ())]):
        return f"{what}; it is set in a section: {', '.join(owners)}"  # (`--set learning_rate=...`)
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.75)
    if close:
        return f"{what}; did you mean {'.'.join([*loc[:-1], close[0]])}?"
    few = list(model.model_fields) if len(model.model_fields) <= 12 else []  # (a section's, the search's settings)
    return f"{what} (its settings: {', '.join(few)})" if few else what


def _model_of(field) -> type[BaseModel] | None:
    """The config model a field holds (a section, optional or not), or None."""
    kinds = typing.get_args(field.annotation) or [field.annotation] if field is not None else []
    return next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
