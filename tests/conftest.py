"""Shared pytest fixtures for the whole suite.

`shared_traces` is the folder of reference traces that lives beside the
project (../shared/traces).  The traces are never copied into the project, so
a checkout without them skips the tests that need them, with the reason.
"""
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test when the folder is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"reference traces not available: {SHARED_TRACES} is absent")
    return SHARED_TRACES


def shared_trace(name: str) -> Path:
    """Path of one reference trace; skips when it (or its folder) is absent."""
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"reference trace not available: {path} is absent")
    return path


@pytest.fixture(scope="session")
def cloudphysics_txt(shared_traces) -> Path:
    return shared_trace("cloudphysics.txt")


@pytest.fixture(scope="session")
def cloudphysics_csv(shared_traces) -> Path:
    return shared_trace("cloudphysics.csv")


@pytest.fixture(scope="session")
def oltp_lis(shared_traces) -> Path:
    return shared_trace("OLTP.lis.zst")
