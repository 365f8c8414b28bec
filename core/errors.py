"""User-facing errors: printed as one clear line, never as a traceback."""


class UserError(Exception):
    """Bad input or an unmet precondition.  The message is shown as is."""

    exit_code = 2


def unreadable(path, what: str, err: OSError) -> str:
    """'PATH: cannot read the WHAT: REASON', and, for a missing file that a
    cachepilot command makes, '; run `COMMAND` first'."""
    import re
    from pathlib import Path
    p = Path(path)
    msg = f"{p}: cannot read the {what}: {err.strerror or err}"
    if not isinstance(err, FileNotFoundError):
        return msg
    folder = str(p.parent)
    node = re.fullmatch(r"node-([A-Za-z0-9_.:-]+)\.(crt|key)", p.name)
    if p.name in ("ca.crt", "controller.crt", "controller.key", "admin.crt", "admin.key"):
        return f"{msg}; run `cachepilot certs init {folder}` first"
    if node:
        return f"{msg}; run `cachepilot certs node {node.group(1)} --dir {folder}` first"
    if "token" in what:
        return f"{msg}; make one with `head -c 32 /dev/urandom | base64 > {p}`"
    return msg
