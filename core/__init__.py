"""What every part of cachepilot stands on: user-facing errors
(errors.py), the config foundation (config.py), the rule for when a
tenant's operations changed (phase.py) and sizes and rates in words
(units.py).  It imports no other
cachepilot package."""
