"""What crosses between a node backend, the node agent and the controller.

These are plain dataclasses; protocol/cachepilot.proto mirrors them on the
wire and protocol/wire.py converts.  Sizes in bytes unless the name says pages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cachepilot.models.mrc import MRC, PAGE_SIZE


@dataclass
class NodeInfo:
    node_id: str
    memory_bytes: int                 # memory the node offers its tenants
    cgroup_version: int               # 1 or 2; 0 for the sim backend
    has_cache_ext: bool
    policies: list[str]               # policies this node can load / emulate
    backend: str = "linux"            # "linux" or "sim"
    disk_read_bytes_per_s: float = 0.0  # what its tenants' disk reads (0: not known)
    cores: float = 0.0                # CPUs its tenants share (0: not known)


@dataclass
class TenantReport:
    tenant: str                       # tenant name from the config
    cgroup: str                       # cgroup path (or sim name)
    interval_s: float
    accesses_per_s: float             # page-cache accesses
    inserts_per_s: float              # insertions = misses
    removals_per_s: float
    refaults_per_s: float
    limit_bytes: int                  # current memory limit (0 = none)
    usage_file_bytes: int
    usage_anon_bytes: int
    policy: str                       # policy in force ("linux" = kernel default)
    # from the tenant's throughput source; None when the source did not
    # answer (unknown is not 0: 0 would read as a starving tenant)
    throughput: float | None
    miss_ratio: float                 # observed over the interval
    curves: list[MRC] = field(default_factory=list)
    # curves are against the limit an operator would set: the agent has
    # already shifted them by the anonymous memory the cgroup holds (meta
    # key "anon_offset_pages"), so size == limit.
    policy_capacity_pages: int = 0    # pages our cache_ext policy was sized
                                      # for (0: none of ours runs)
    policy_overflow_pages: int = 0    # pages it had no room for since loaded
    throughput_error: str = ""        # why throughput is None
    cpu_per_s: float = 0.0            # CPU seconds the cgroup used per second
                                      # (0: not known)
    # bytes its tasks read from block devices per second: what its misses
    # ask of a disk it shares (None: no I/O accounting for it)
    read_bytes_per_s: float | None = None
    # Set where the report is received, never sent: why part of it was
    # refused (a malformed curve refuses that tenant's curves, not the
    # node's report; a malformed entry stands in for itself by the last
    # one taken, without curves).
    refused: str = ""

    @property
    def disk_reads_per_s(self) -> float:
        """Bytes/s the tenant reads from its disk: measured where I/O
        accounting reaches it, else the pages put in its cache (read-ahead
        and all) -- on cgroup v1 a host's tenants may share one blkio
        cgroup, and then only their inserts tell them apart."""
        if self.read_bytes_per_s is not None:
            return float(self.read_bytes_per_s)
        return float(self.inserts_per_s) * PAGE_SIZE

    @property
    def held_reason(self) -> str:
        """Why the controller must hold this tenant where it is this round
        ("" when nothing stops it deciding)."""
        if self.refused:
            return f"refused: {self.refused}"
        if self.throughput is None:
            return "throughput unknown" + (f": {self.throughput_error}"
                                           if self.throughput_error else "")
        return ""


@dataclass
class Directive:
    tenant: str
    limit_bytes: int
    policy: str
    reason: str = ""


@dataclass
class ApplyResult:
    """What a node did with one directive.  The limit and the policy are
    reported apart: a kernel without cache_ext, or a policy the kernel
    refused, fails the policy part while the limit part may still be ok."""
    tenant: str
    applied_limit_bytes: int
    applied_policy: str               # the policy running after, read back
    ok: bool                          # the limit part
    message: str = ""                 # why the limit was refused or clamped
    policy_ok: bool = True            # the policy part (True: nothing asked)
    policy_message: str = ""          # what was done, or why not
