"""cachepilot: an autopilot for the Linux page cache on multi-tenant hosts."""

__version__ = "0.1.0"
