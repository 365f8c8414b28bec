"""What every part of cachepilot stands on: user-facing errors
(errors.py), the config foundation (config.py) and the rule for when a
tenant's operations changed (phase.py).  It imports no other
cachepilot package."""
