"""Where the agent's BPF loaders and policy objects are.

An installed package carries them in `cachepilot/agent/bpf/` (the wheel's
build step runs `make -C bpf` and copies `bpf/out` there); a checkout has
them in `bpf/out/` beside the source.  The package's copy wins, so a wheel
installed elsewhere never reaches into a checkout it does not belong to.
"""
from __future__ import annotations

from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "bpf"
CHECKOUT = Path(__file__).resolve().parents[1] / "bpf" / "out"


def bpf_dir() -> Path:
    """The folder holding `sampler`, `policyctl` and `policies/`: the
    package's when it has a sampler, else the checkout's (which may not be
    built yet; callers say so)."""
    return PACKAGED if (PACKAGED / "sampler").exists() else CHECKOUT


def _existing(p: Path) -> Path | None:
    return p if p.exists() else None


def sampler() -> Path | None:
    return _existing(bpf_dir() / "sampler")


def policyctl() -> Path | None:
    return _existing(bpf_dir() / "policyctl")


def policy_dir() -> Path | None:
    return _existing(bpf_dir() / "policies")
