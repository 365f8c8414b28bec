"""The node agent's YAML config, validated on load.

The keys: node_id, roots (the cgroup directories it may watch and
touch), cgroups and tenants (stand-alone only: with a controller, its
config holds the tenants), interval_s, sampling, policies, memory,
disk_read_bytes_per_s and cores (what the node offers), safety,
limit_knob (v2), cache_ext, prometheus and controller (the controller to
follow and this node's identity).  What each holds and its defaults:
docs/internals.md#agent-config.  Sizes are bytes or strings with binary
units ("512MiB"); an error names the file, the key and what was expected.
"""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from cachepilot.core import config as base
from cachepilot.core.config import Bytes, FilePath, Strict, parse_bytes
from cachepilot.protocol.tenant import (AccessesThroughput, NodeTenant,  # noqa: F401
                                        PodRef, PrometheusThroughput, Throughput,
                                        unknown_key_message)


def _per_second(value: Any) -> int:
    """A size read as per second: "200MiB" or "200MiB/s"."""
    if isinstance(value, str) and value.strip().endswith("/s"):
        value = value.strip()[:-2]
    return parse_bytes(value)


BytesPerSecond = Annotated[int, BeforeValidator(_per_second)]


# A tenant as the node sees it: one model for the agent's own list and
# for what the controller sends at registration (protocol/tenant.py).
TenantSpec = NodeTenant


class Sampling(Strict):
    """Fixed-rate SHARDS at `rate`; with `max_samples`, fixed-size SHARDS
    that starts at `rate` and lowers the kernel's threshold as distinct
    sampled pages exceed the bound.  `slices`: how many times per interval
    the agent reads the kernel's distinct-page sketches; each read is one
    time slice of the "stack" estimator (models/stack.py), which uses them
    to count every page read, not just the sample's.

    `samples_per_s` gives each tenant its own rate instead: about that
    many sampled accesses a second, whatever its speed (agent/rates.py).
    One rate for all gives a tenant that reads 40,000 pages a second
    hundreds of samples an interval and one that reads 800 a handful,
    while a curve's error and the agent's CPU both follow the samples.
    A tenant then starts at `max_rate` (`start_rate`), until its first
    interval says how fast it reads, and rates stay within [min_rate,
    max_rate]: moving down is warm at once (the new builder is fed the
    tenant's last intervals again), moving up costs a handover of several
    windows, so a tenant started low had no curve for its first rounds.

    `min_window_samples`: a tenant's counting window closes at the end of
    an interval only once it holds that many sampled accesses (or after
    `max_window_intervals`), so a slow tenant's curve rests on several
    intervals rather than on a handful of samples."""
    rate: float = Field(0.01, gt=0, le=1)
    max_samples: int | None = Field(None, ge=64)
    samples_per_s: float | None = Field(None, gt=0)
    min_rate: float = Field(1 / 1024, gt=0, le=1)
    max_rate: float = Field(0.25, gt=0, le=1)
    min_window_samples: int = Field(0, ge=0)
    max_window_intervals: int = Field(6, ge=1, le=100)
    ring_bytes: int = Field(1 << 22, ge=4096)
    slices: int = Field(32, ge=1, le=128)

    @property
    def start_rate(self) -> float:
        """Where a newly watched tenant's sampling starts: `rate`, or
        `max_rate` when each tenant gets its own."""
        return self.max_rate if self.samples_per_s else self.rate

    @model_validator(mode="after")
    def _power_of_two(self):
        if self.ring_bytes & (self.ring_bytes - 1):
            raise ValueError("ring_bytes: expected a power of two")
        if self.min_rate > self.max_rate:
            raise ValueError("min_rate: expected at most max_rate")
        if self.samples_per_s is not None and self.max_samples is not None:
            raise ValueError("samples_per_s: give it or max_samples, not both")
        return self


class Safety(Strict):
    floor: Bytes = 64 << 20
    anon_margin: Bytes = 32 << 20
    anon_margin_ratio: float = Field(0.1, ge=0, le=10)
    max_step: Bytes = 1 << 30


class PrometheusEndpoint(Strict):
    address: str = "127.0.0.1"
    port: int = Field(9105, ge=0, le=65535)


class CacheExt(Strict):
    """Where cache_ext policy objects are loaded from (a directive names a
    policy; only <policy_dir>/<name>.bpf.o can be loaded) and where their
    links are pinned in bpffs.  Defaults: bpf/out/policies beside the agent,
    /sys/fs/bpf/cachepilot.  `calibrate_dir`: a folder on a disk file
    system where the agent, at start, writes the small file it reads to
    measure each policy's cost per cached read (agent/hookcost.py); null
    turns the measurement off."""
    policy_dir: FilePath | None = None
    pin_root: Path = Path("/sys/fs/bpf/cachepilot")
    calibrate_dir: Path | None = Path("/var/tmp")


class ControllerLink(Strict):
    address: str = Field(min_length=1)
    # Other controller replicas (controller/fleet.py): tried in turn when
    # the one in use does not answer.  A replica that does not own this
    # node redirects it to the one that does, listed here or not.
    fallbacks: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    cert_file: FilePath | None = None    # this node's certificate (mutual TLS)
    key_file: FilePath | None = None
    token_file: FilePath | None = None   # or a shared token
    ca_file: FilePath | None = None
    server_name: str | None = None
    insecure: bool = False

    @model_validator(mode="after")
    def _pair(self):
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give cert_file and key_file together")
        return self


class AgentConfig(Strict):
    node_id: str = Field(default_factory=socket.gethostname, min_length=1)
    roots: list[str] = Field(min_length=1)
    cgroups: list[str] = Field(default_factory=list)
    tenants: list[TenantSpec] = Field(default_factory=list)
    interval_s: float = Field(10.0, gt=0)
    sampling: Sampling = Field(default_factory=Sampling)
    policies: list[str] | None = None
    max_cache: Bytes | None = None      # largest size a curve covers
    memory: Bytes | None = None         # memory offered to tenants (default: MemTotal)
    # bytes per second the tenants' disk can read; 0/absent: not known (then
    # the smallest read throttle of the roots, where every root has one)
    disk_read_bytes_per_s: BytesPerSecond | None = None
    cores: float | None = Field(None, gt=0)   # CPUs they share (default: the agent's)
    safety: Safety = Field(default_factory=Safety)
    limit_knob: Literal["max", "high"] = "max"
    prometheus: PrometheusEndpoint = Field(default_factory=PrometheusEndpoint)
    cache_ext: CacheExt = Field(default_factory=CacheExt)
    controller: ControllerLink | None = None

    @model_validator(mode="after")
    def _something_to_watch(self):
        if self.controller is not None and (self.cgroups or self.tenants):
            raise ValueError("`tenants` and `cgroups` are for an agent without a "
                             "controller: with `controller`, the controller's config "
                             "holds the tenants and sends this node its own when it "
                             "registers; remove them here")
        if self.controller is None and not self.cgroups and not self.tenants:
            raise ValueError("expected at least one entry in `cgroups` or `tenants` "
                             "(or a `controller` that names this node's tenants)")
        names = [t.name for t in self.tenants]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"tenant names must be unique; repeated: {', '.join(sorted(dup))}")
        for where, names in [("policies", self.policies)] + [
                (f"tenants[{i}].policies", t.policies) for i, t in enumerate(self.tenants)]:
            bad = _unknown_policy(names or [])
            if bad:
                raise ValueError(f"{where}: {bad}")
        return self


def _unknown_policy(names: list[str]) -> str | None:
    """Why `names` cannot all be built as curves, or None.  Unchecked when
    the MRC engine's runtime is not built (the agent then runs LRU only)."""
    try:
        from cachepilot.models.runtime import unknown_policy
    except Exception:   # noqa: BLE001 - engine parts not built
        return None
    return unknown_policy(names)


def config_from_dict(data: Any, path: str = "<config>") -> AgentConfig:
    """Validate an already parsed document; errors name `path` and the key."""
    return base.validate(AgentConfig, data, path, unknown_key=unknown_key_message)


def load_config(path) -> AgentConfig:
    """Read and validate the agent's YAML config (core/config.py); paths in
    it are relative to the file."""
    cfg, _ = base.load(AgentConfig, path, unknown_key=unknown_key_message)
    return cfg
