"""Synthetic tenants for engine tests and the controller benchmark.

A tenant's true behaviour is a miss-ratio curve per policy of a simple
analytic shape (a power-law fall to a floor of compulsory misses, the shape
of a zipf workload's LRU curve) and a service model; `report` produces the
TenantReport an agent would send for it at a given limit and policy, with
the observed miss ratio and throughput that curve and model imply.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cachepilot.models import policy_settling
from cachepilot.models.mrc import MRC, PAGE_SIZE
from cachepilot.protocol.types import TenantReport


def power_curve(policy: str, footprint_pages: float, alpha: float, floor: float,
                max_pages: float, points: int = 50) -> MRC:
    """Miss ratio (1 + s / (footprint/20)) ** -alpha falling to `floor` at
    the footprint, on `points` log-spaced sizes up to max_pages."""
    sizes = np.unique(np.geomspace(16, max_pages, points).astype(np.int64))
    scale = footprint_pages / 20.0
    m = np.maximum((1.0 + sizes / scale) ** -alpha, floor)
    m = np.where(sizes >= footprint_pages, floor, m)
    return MRC(sizes, np.minimum(m, 1.0), policy, "synthetic", 1.0)


# caches' worth of insertions a synthetic report covers: four times what
# the slowest policy was measured to need to settle after a switch, so
# that the switch's settling (which the engine predicts, and a synthetic
# tenant skips) is a small part of the report
TURNOVERS = 4.0 * max(policy_settling.load().values())


@dataclass
class SynthTenant:
    name: str
    curves: dict[str, MRC]
    t_hit: float = 2e-6
    t_miss: float = 1e-4
    concurrency: float = 1.0
    anon_bytes: int = 0
    extra: dict = field(default_factory=dict)
    # per policy, the CPU seconds its hooks add to every access (a hit's
    # path is CPU: t_hit is CPU time, a miss waits on the disk); where set,
    # the curves carry them as an agent's would and reports the CPU used
    hook_s: dict[str, float] = field(default_factory=dict)
    # per policy, the CPU seconds its miss path (insertion, eviction) adds
    # to every page read that misses, in the reading thread (an operation
    # at m = 1 misses pages_per_op of them); the curves carry them likewise
    miss_hook_s: dict[str, float] = field(default_factory=dict)
    pages_per_op: float = 1.0       # page reads an operation makes (a 64 KiB read: 16)
    # the curves its reports carry where they are not what it does: an
    # agent's curves that still rest on an old phase's samples
    shown: dict[str, MRC] | None = None

    def throughput(self, miss_ratio: float, policy: str | None = None) -> float:
        hook = self.hook_s.get(policy, 0.0) if policy else 0.0
        miss = self.miss_hook_s.get(policy, 0.0) if policy else 0.0
        return self.concurrency / (self.t_hit + hook
                                   + miss_ratio * (self.t_miss + self.pages_per_op * miss))

    def report(self, limit_bytes: int, policy: str,
               interval_s: float | None = None) -> TenantReport:
        """What an agent would report at this limit and policy.  The tenant
        is at its steady state at once, as a real cache is only after its
        misses have inserted several times its size; so a report covers,
        unless told, the time they take to insert TURNOVERS times its limit
        (1 s to an hour), and the rates the engine infers from (how fast a
        cache fills, how much of it a new policy has reshaped) agree with
        what the tenant does."""
        m = float(self.curves[policy].at(limit_bytes / PAGE_SIZE))
        thr = self.throughput(m, policy)
        if interval_s is None:
            inserts = thr * self.pages_per_op * m
            need = TURNOVERS * limit_bytes / PAGE_SIZE
            interval_s = float(np.clip(need / inserts if inserts > 0 else np.inf, 1.0, 3600.0))
        curves = list((self.shown or self.curves).values())
        cpu = 0.0
        if self.hook_s or self.miss_hook_s:
            curves = [MRC(c.sizes, c.miss_ratio, c.policy, c.method, c.rate,
                          dict(c.meta, hook_ns_per_access=self.hook_s.get(c.policy, 0.0) * 1e9,
                               hook_ns_per_miss=self.miss_hook_s.get(c.policy, 0.0) * 1e9))
                      for c in curves]
            cpu = thr * (self.t_hit + self.hook_s.get(policy, 0.0)
                         + m * self.pages_per_op * self.miss_hook_s.get(policy, 0.0))
        return TenantReport(
            tenant=self.name, cgroup=self.name, interval_s=interval_s,
            accesses_per_s=thr * self.pages_per_op, inserts_per_s=thr * self.pages_per_op * m,
            removals_per_s=thr * self.pages_per_op * m,
            refaults_per_s=0.0, limit_bytes=int(limit_bytes),
            usage_file_bytes=int(limit_bytes), usage_anon_bytes=self.anon_bytes,
            policy=policy, throughput=thr, miss_ratio=m, curves=curves, cpu_per_s=cpu)


def random_tenant(rng: np.random.Generator, name: str, policies: list[str],
                  node_pages: float, points: int = 50) -> SynthTenant:
    """A tenant whose footprint, skew and per-policy advantage are drawn
    from rng; policies differ by a random factor on alpha and floor."""
    footprint = float(rng.uniform(0.05, 0.6) * node_pages)
    alpha = float(rng.uniform(0.4, 1.6))
    floor = float(rng.uniform(0.0, 0.1))
    curves = {}
    for p in policies:
        f = float(rng.uniform(0.8, 1.25))
        curves[p] = power_curve(p, footprint, alpha * f, floor, node_pages, points)
    return SynthTenant(name, curves, t_hit=float(rng.uniform(1e-6, 5e-6)),
                       t_miss=float(rng.uniform(5e-5, 3e-4)))
