"""Reading a YAML config file for any component: one place that turns a
missing, unreadable, malformed or empty file into a one-line UserError."""
from pathlib import Path
from typing import Any

import yaml

from cachepilot.errors import UserError


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
