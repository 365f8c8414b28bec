"""What the agent and controller configs share: reading a YAML file (a
missing, unreadable, malformed or empty file is a one-line UserError) and
byte sizes with binary units."""
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator

from cachepilot.core.errors import UserError


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
