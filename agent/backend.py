"""The node backend interface: what the agent loop needs from a host.

Two implementations: `linux` (agent/backends/linux.py, a real host: eBPF
sampler, cgroup files) and `sim` (sim/backend.py, an emulated host on
a virtual clock).  The gRPC node client (agent/client.py) drives either one
the same way: every interval it calls collect(), sends the reports, and hands
the controller's directives to apply().
"""
from __future__ import annotations

from typing import Protocol

from cachepilot.protocol.tenant import NodeTenant
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport


class Backend(Protocol):
    def info(self) -> NodeInfo:
        """Static facts the node registers with."""

    def tick(self) -> None:
        """Mid-interval, sampling.slices - 1 times: read what the host has
        counted so far (one time slice of the curves).  A no-op where
        collect() has all it needs."""

    def collect(self) -> list[TenantReport]:
        """One interval's reports, one per watched tenant.  Called once per
        control interval; a linux backend measures over wall time since the
        last call, the sim backend advances its virtual clock one interval."""

    def assign(self, tenants: list[NodeTenant]) -> None:
        """The tenants the controller names for this node at registration
        (protocol/tenant.py): from now on these are the ones watched."""

    def apply(self, directives: list[Directive]) -> list[ApplyResult]:
        """Apply limits and policies under the safety rules; never raises for
        a refused directive, reports it in the result instead."""

    def close(self) -> None:
        """Release kernel objects (BPF links, sampler); leave limits as they are."""
