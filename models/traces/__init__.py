"""Trace readers and cachepilot's own sampled-access record format."""
from cachepilot.models.traces import records  # noqa: F401
