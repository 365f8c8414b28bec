"""The foundation every cachepilot config stands on.

A config is a pydantic model over Strict, read from YAML by load(), and
every way it can be wrong becomes one UserError line that names the file,
the key path and what was expected:

    configs/x.yaml: tenants[2].slo.min_throughput: expected a number >= 0, got -5

The pieces are shared so that the agent's and the controller's configs
speak alike and a new config (a state store, identities) takes them as
they are: Strict (a misspelt key is an error), Bytes (sizes with binary
units), FilePath (a path the loader resolves against the config file's
folder), format_errors() and load().
"""
from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from cachepilot.core.errors import UserError


class Strict(BaseModel):
    # A misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)

# -- sizes ---------------------------------------------------------------------

_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
          "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any) -> int:
    """An integer byte count from 4096, "4KiB", "1.5G", ... (binary units)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 4096 or \"512MiB\"")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("expected a size >= 0")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError("expected a size >= 0")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError("expected a size such as 4096 or \"512MiB\"")


Bytes = Annotated[int, BeforeValidator(parse_bytes)]


# -- paths ---------------------------------------------------------------------

class _RelativeToFile:
    """Marks a Path field that load() resolves against the config's folder."""


FilePath = Annotated[Path, _RelativeToFile()]


def _marked(annotation) -> bool:
    if any(isinstance(m, _RelativeToFile) for m in getattr(annotation, "__metadata__", ())):
        return True
    return any(_marked(a) for a in typing.get_args(annotation))


def resolve_paths(model: BaseModel, base: Path) -> None:
    """Make every relative FilePath in the model (and the models inside it)
    relative to `base` instead of to the working directory."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        marked = (any(isinstance(m, _RelativeToFile) for m in field.metadata)
                  or _marked(field.annotation))
        if isinstance(value, Path) and marked and not value.is_absolute():
            setattr(model, name, base / value)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, BaseModel):
                resolve_paths(item, base)


# -- errors --------------------------------------------------------------------

def _key(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part)[:1].isupper() or \
                str(part).startswith("function-"):
            continue    # union branch tags and validator names
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _show(value) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">",
           "less_than_equal": "<=", "less_than": "<"}
_TYPES = {"float_parsing": "a number", "float_type": "a number",
          "int_parsing": "an integer", "int_type": "an integer",
          "int_from_float": "an integer", "bool_parsing": "true or false",
          "bool_type": "true or false", "string_type": "a valid string",
          "list_type": "a list", "model_type": "a mapping", "dict_type": "a mapping",
          "model_attributes_type": "a mapping"}


def _expectation(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    got = f", got {_show(err['input'])}" if "input" in err else ""
    if kind == "missing":
        return "required key is missing"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"expected a number {_BOUNDS[kind]} {bound}{got}"
    if kind in _TYPES:
        return f"expected {_TYPES[kind]}{got}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected', 'one of the allowed values')}{got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length', 1)} item(s){got}"
    if kind == "string_pattern_mismatch":
        return f"expected letters, digits and _.:- only{got}"
    if kind == "value_error":
        msg = str(ctx.get("error", err["msg"]))
        plain = isinstance(err.get("input"), (dict, list))
        return msg + ("" if plain else got)
    return err["msg"][0].lower() + err["msg"][1:] + got


UnknownKey = Callable[[tuple], "str | None"]


def format_errors(path: str, err: ValidationError,
                  unknown_key: UnknownKey | None = None) -> str:
    """One line for a failed validation: at most five problems, one per
    key path.  `unknown_key(loc)` may say what was expected in place of a
    misspelt key (None: plain "unknown key")."""
    errors = err.errors(include_url=False)
    # A union (e.g. slo.source) reports once per branch: when a mapping was
    # given, the "expected 'accesses'" branch says nothing useful.
    if len(errors) > 1:
        errors = [e for e in errors if not (
            e["type"] == "literal_error" and isinstance(e.get("input"), dict))]
    seen, out = set(), []
    for e in errors:
        key = _key(e["loc"])
        if key in seen:             # one message per key path
            continue
        seen.add(key)
        if e["type"] == "extra_forbidden":
            what = (unknown_key(e["loc"]) if unknown_key else None) or "unknown key"
        else:
            what = _expectation(e)
        out.append(f"{path}: {key}: {what}")
    return "; ".join(out[:5]) + (f" (and {len(out) - 5} more)" if len(out) > 5 else "")


# -- reading -------------------------------------------------------------------

def read_yaml(path) -> tuple[Path, Any]:
    """Return (path, parsed document); the document is never None."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UserError(f"{p}: no such config file") from None
    except OSError as err:
        raise UserError(f"{p}: cannot read: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{p}{where}: not valid YAML: {problem}") from None
    if data is None:
        raise UserError(f"{p}: the config is empty")
    return p, data


def validate(model: type[M], data: Any, path: str = "<config>",
             unknown_key: UnknownKey | None = None,
             cross_check: Callable[[M], list[str]] | None = None) -> M:
    """An already parsed document as `model`; `cross_check(cfg)` lists the
    problems that span several entries (each "key: what was expected")."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping at the top level, got "
                        f"{type(data).__name__}")
    try:
        cfg = model.model_validate(data)
    except ValidationError as err:
        raise UserError(format_errors(path, err, unknown_key)) from None
    errs = cross_check(cfg) if cross_check else []
    if errs:
        raise UserError("; ".join(f"{path}: {e}" for e in errs[:5]))
    return cfg


def load(model: type[M], path, unknown_key: UnknownKey | None = None,
         cross_check: Callable[[M], list[str]] | None = None) -> tuple[M, Path]:
    """Read, validate and resolve a YAML config: (config, resolved file).
    Every FilePath in it is made relative to the file's folder."""
    p, data = read_yaml(path)
    cfg = validate(model, data, str(p), unknown_key, cross_check)
    source = p.resolve()
    resolve_paths(cfg, source.parent)
    return cfg, source
