"""User-facing errors: printed as one clear line, never as a traceback."""


class UserError(Exception):
    """Bad input or an unmet precondition.  The message is shown as is."""

    exit_code = 2
