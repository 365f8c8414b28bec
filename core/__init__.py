"""What every part of cachepilot stands on: user-facing errors
(errors.py) and the config foundation (config.py).  It imports no other
cachepilot package."""
