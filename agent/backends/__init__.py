"""Node backends: `linux` (a real host) and `sim` (an emulated one)."""
