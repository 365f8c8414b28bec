"""Trace readers and cachepilot's own sampled-access record format."""
from cachepilot.models.traces import records
from cachepilot.models.traces.readers import (FORMATS, Trace, TraceError,
                                              detect_format, open_binary,
                                              open_trace, read_keys,
                                              write_oracle_general)

__all__ = ["records", "FORMATS", "Trace", "TraceError", "detect_format",
           "open_binary", "open_trace", "read_keys", "write_oracle_general"]
