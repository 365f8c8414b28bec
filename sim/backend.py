"""The sim backend: an emulated host on a virtual clock.

Each tenant replays its workload (the seeded generators of models/generators.py,
or a trace) through the policy runtime (models/runtime.py's `Cache`) at its
memory limit.  One collect() is one
control interval of virtual time: the tenant issues
`accesses_per_interval` page accesses (a sample of its operation stream),
the cache counts the misses, and the tenant's service model turns the miss
ratio into throughput:

    time per operation = t_hit + miss_ratio * t_miss
    throughput         = concurrency / time per operation

The same accesses feed an MRCBuilder (SHARDS for LRU, miniature simulations
for the other policies), so the reports carry curves built as a real
agent's are.  Its sampling rate (`curve_rate`) is 1.0 by default, unlike a
real agent's 0.01: a tenant's accesses per interval are already a small
sample of its operations, and sampling them again would only add noise;
a lower rate shows what SHARDS' sampling does to the decisions.  Limits and policy swaps take effect at the next interval;
the cache keeps its contents across a swap (`Cache.swap_policy`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models.mrc import PAGE_SIZE
from cachepilot.models.runtime import mark_registered
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport

# Curve resolution: points per curve, spread evenly up to the node's memory,
# and LOW_POINTS more log-spaced from LOW_PAGES (1 MiB) up to the first.
CURVE_POINTS = 24
LOW_POINTS = 4
LOW_PAGES = 256


def curve_sizes(memory_bytes: int, points: int = CURVE_POINTS) -> np.ndarray:
    """The sizes (pages) a sim tenant's curves are read at.  Below the
    first even point a curve is read on the straight line to (0, 1), which
    shrinks every difference between policies there: on the demo's node
    the first point lies above a tenant's floor, and a tenant held at its
    floor read s3fifo's lead over linux as half what a full simulation
    gives, too little for a switch.  So a few points sit below it, down to
    1 MiB, as the agent's log-spaced grid (agent/curves.py) has."""
    top = max(points, memory_bytes // PAGE_SIZE)
    even = np.linspace(top / points, top, points)
    low = np.geomspace(min(LOW_PAGES, even[0]), even[0], LOW_POINTS + 1)[:-1]
    return np.unique(np.concatenate([low, even]).astype(np.int64))


class PhaseStream:
    """The access stream of one workload phase: next(n) -> (keys, tids).

    `threads` names the stream's threads, tid -> (comm, cmdline), so that a
    tenant's thread rules (`slo_threads`) match in the sim as they do on a
    host: a get-scan phase has a `get` and a `scan` thread; the other kinds
    carry no thread ids, and a rule matches nothing there."""

    def __init__(self, phase, seed: int, key_base: int):
        from cachepilot.models import generators as gen
        self.phase = phase
        # policy -> the threads the application registers with it
        self.registered: dict[str, np.ndarray] = {}
        self.threads: dict[int, tuple[str, str]] = {}
        pages = max(1, phase.footprint // PAGE_SIZE)
        self.key_base = key_base
        kind = phase.kind
        if kind == "zipf":
            self.gen = gen.zipf(pages, phase.skew, seed=seed)
        elif kind == "uniform":
            self.gen = gen.uniform(pages, seed=seed)
        elif kind == "scan":
            self.gen = gen.scan(pages, seed=seed)
        elif kind == "loop":
            self.gen = gen.loop(pages, seed=seed)
        elif kind == "get-scan":
            self.gen = gen.get_scan(pages, phase.skew, scan_fraction=phase.scan_fraction,
                                    scan_pages=max(1, phase.scan_length // PAGE_SIZE),
                                    seed=seed)
            # the key-value store tells get_scan its scan thread, as the
            # cache_ext paper's modified RocksDB does
            self.registered = {"get_scan": np.array([gen.SCAN_TID], np.uint32)}
            self.threads = {gen.GET_TID: ("get", "kv get"), gen.SCAN_TID: ("scan", "kv scan")}
        elif kind == "trace":
            self.gen = gen.trace_stream(phase.trace, phase.trace_format,
                                        skip=phase.trace_offset)
        else:
            raise UserError(f"sim: unknown workload kind {kind!r}")

    def next(self, n: int):
        out = self.gen.next(n)
        keys, tids = (out if isinstance(out, tuple) else (out, None))
        # Phases of one tenant touch distinct pages (a new phase is new data).
        keys = np.asarray(keys, dtype=np.uint64) + np.uint64(self.key_base)
        return keys, tids

    def counted_tids(self, rule) -> list[int]:
        """The threads a tenant's `slo_threads` rule names here; empty (every
        thread counts) without a rule or where it matches none."""
        if rule is None:
            return []
        return sorted(t for t, (comm, cmdline) in self.threads.items()
                      if rule.matches(comm, cmdline))

    def counted(self, rule, tids) -> np.ndarray | None:
        """Per access of a batch, whether the tenant's throughput counts it
        (None: every access)."""
        mine = self.counted_tids(rule)
        if not mine or tids is None:
            return None
        return np.isin(np.asarray(tids), np.asarray(mine, dtype=np.uint32))


class SimTenant:
    def __init__(self, spec, node_spec, policies, limit_bytes: int, seed: int,
                 curve_rate: float, interval_s: float, curves: bool = True):
        from cachepilot.models.builder import MRCBuilder
        from cachepilot.models.runtime import Cache
        if spec.workload is None:
            raise UserError(f"tenant {spec.name!r}: a sim tenant needs a `workload`")
        for i, ph in enumerate(spec.workload.phases):
            # Fail at start, not in the middle of a run when the phase begins.
            if ph.kind == "trace" and not Path(ph.trace).is_file():
                raise UserError(f"tenant {spec.name!r}: phase {i}: trace {ph.trace}: "
                                f"no such file")
        self.spec = spec
        self.workload = spec.workload
        self.interval_s = interval_s
        self.seed = seed
        self.limit_bytes = int(limit_bytes)
        self.policy = spec.initial_policy
        self.allowed = [p for p in (spec.policies or policies) if p in policies]
        if self.policy not in policies:
            raise UserError(f"tenant {spec.name!r}: initial policy {self.policy!r} is not "
                            f"available (have {', '.join(policies)})")
        self.cache = Cache(self.policy, max(1, self.limit_bytes // PAGE_SIZE))
        self.sizes = curve_sizes(node_spec.memory_bytes)
        # A node that reports nothing (the static baseline) needs no curves.
        self.builder = MRCBuilder(self.allowed, rate=curve_rate, sizes=self.sizes,
                                  counted=spec.slo_threads is not None) \
            if curves else None
        self.interval = 0
        self.phase_index = -1
        self.stream = None
        self.history: list[dict] = []

    def phase_at(self, interval: int) -> int:
        start = 0
        for i, ph in enumerate(self.workload.phases):
            if ph.intervals is None or interval < start + ph.intervals:
                return i
            start += ph.intervals
        return len(self.workload.phases) - 1

    def phase_stream(self, idx: int) -> PhaseStream:
        """A fresh copy of phase idx's access stream (offline sweeps replay
        exactly what the tenant ran)."""
        return PhaseStream(self.workload.phases[idx], self.seed * 1009 + idx,
                           key_base=idx << 40)

    def replay(self, idx: int, n: int):
        """The first n accesses of phase idx again, for an offline oracle:
        (keys, tids, counted), counted as step() counts them (None: all).
        Drawn an interval's worth at a time, as step() draws them: the
        generators' streams depend on the batch sizes asked of them."""
        stream = self.phase_stream(idx)
        per = self.workload.accesses_per_interval
        parts = [stream.next(min(per, n - i)) for i in range(0, n, per)]
        keys = np.concatenate([k for k, _ in parts])
        tids = None if parts[0][1] is None else np.concatenate([t for _, t in parts])
        return keys, tids, stream.counted(self.spec.slo_threads, tids)

    def step(self) -> TenantReport:
        idx = self.phase_at(self.interval)
        if idx != self.phase_index:
            self.phase_index = idx
            self.stream = self.phase_stream(idx)
            if self.builder is not None:
                for policy in self.allowed:
                    self.builder.register_threads(
                        policy, self.stream.registered.get(policy, []))
                if self.builder.counted:
                    self.builder.count_threads(self.stream.counted_tids(self.spec.slo_threads))
        n = self.workload.accesses_per_interval
        keys, tids = self.stream.next(n)
        reg = self.stream.registered.get(self.policy)
        # the throughput counts the operations of the threads slo_threads
        # names (a store's GETs, not its scanner), as a host's agent does
        m = self.cache.miss_ratio(
            keys, mark_registered(tids, reg) if reg is not None and tids is not None
            else tids, self.stream.counted(self.spec.slo_threads, tids))
        svc = self.workload.service
        throughput = svc.throughput(m)
        curves = []
        if self.builder is not None:
            self.builder.feed(keys, tids=tids)
            curves = self.builder.snapshot()
            self.builder.end_window()
        resident = min(self.limit_bytes, _resident_bytes(self.cache))
        inserted = n * m / self.interval_s
        self.interval += 1
        report = TenantReport(
            tenant=self.spec.name, cgroup=self.spec.cgroup, interval_s=self.interval_s,
            # the pages its cache took in (and gave up) per second of the
            # interval: n accesses were simulated, whatever the service
            # model makes of them in operations
            accesses_per_s=throughput, inserts_per_s=inserted,
            removals_per_s=inserted if resident >= self.limit_bytes else 0.0,
            refaults_per_s=0.0, limit_bytes=self.limit_bytes,
            usage_file_bytes=resident, usage_anon_bytes=0, policy=self.policy,
            throughput=throughput, miss_ratio=m, curves=curves,
            policy_capacity_pages=int(self.cache.stats["policy_capacity"]),
            policy_overflow_pages=int(self.cache.stats["policy_overflow"]),
            # every miss reads its page from the emulated disk
            read_bytes_per_s=throughput * m * PAGE_SIZE)
        self.history.append({"interval": self.interval, "phase": idx, "limit_bytes":
                             self.limit_bytes, "policy": self.policy, "miss_ratio": m,
                             "throughput": throughput})
        return report

    def apply(self, d: Directive, node_memory: int) -> ApplyResult:
        msgs = []
        limit = int(d.limit_bytes)
        floor = self.spec.floor_bytes
        ceiling = self.spec.ceiling_bytes or node_memory
        if limit < floor:
            msgs.append(f"limit {limit} below the floor {floor}; clamped")
            limit = floor
        if limit > ceiling:
            msgs.append(f"limit {limit} above the ceiling {ceiling}; clamped")
            limit = ceiling
        limit = max(PAGE_SIZE, limit)
        policy = self.policy
        ok = True
        if d.policy and d.policy != self.policy:
            if d.policy in self.allowed:
                self.cache.swap_policy(d.policy)
                policy = d.policy
            else:
                ok = False
                msgs.append(f"policy {d.policy!r} not allowed for this tenant "
                            f"(allowed: {', '.join(self.allowed)}); kept {self.policy}")
        self.policy = policy
        self.limit_bytes = limit
        self.cache.capacity_pages = max(1, limit // PAGE_SIZE)
        return ApplyResult(self.spec.name, limit, policy, ok, "; ".join(msgs))


def _resident_bytes(cache) -> int:
    return int(cache.nr_cached) * PAGE_SIZE


class SimBackend:
    """Backend protocol (agent/backend.py) over emulated tenants."""

    def __init__(self, config, node_name: str, seed: int | None = None,
                 curve_rate: float = 1.0, curves: bool = True):
        from cachepilot.models.runtime import available_policies
        try:
            self.node = config.node(node_name)
        except KeyError:
            raise UserError(f"sim: no node named {node_name!r} in the config") from None
        have = list(available_policies())
        self.policies = [p for p in (self.node.policies or have) if p in have]
        specs = config.tenants_on(node_name)
        if not specs:
            raise UserError(f"sim: node {node_name!r} has no tenants")
        equal = self.node.memory_bytes // len(specs)
        base = self.node.seed if seed is None else seed
        self.tenants: dict[str, SimTenant] = {}
        for i, t in enumerate(specs):
            tseed = t.workload.seed if (t.workload and t.workload.seed is not None) \
                else base * 7919 + i
            self.tenants[t.name] = SimTenant(
                t, self.node, self.policies, t.initial_limit_bytes or equal, tseed,
                curve_rate, config.control.interval_s, curves)

    def info(self) -> NodeInfo:
        # what the node spec says its tenants share besides memory, if it says
        return NodeInfo(self.node.name, self.node.memory_bytes, 0, True, list(self.policies),
                        "sim",
                        disk_read_bytes_per_s=float(
                            getattr(self.node, "disk_read_bytes_per_s", None) or 0.0),
                        cores=float(getattr(self.node, "cores", None) or 0.0))

    def tick(self) -> None:
        """Nothing between intervals: the virtual clock moves in collect()."""

    def assign(self, tenants) -> None:
        """A sim node is built from the controller's own config, so the
        tenants it is assigned are those it emulates; a different list
        means the node was started from another config."""
        names = sorted(t.name for t in tenants)
        if names != sorted(self.tenants):
            raise UserError(f"sim node {self.node.name}: the controller assigns tenants "
                            f"{', '.join(names) or 'none'}, but this node emulates "
                            f"{', '.join(sorted(self.tenants))}: start it from the "
                            f"controller's config")

    def collect(self) -> list[TenantReport]:
        return [t.step() for t in self.tenants.values()]

    def apply(self, directives: list[Directive]) -> list[ApplyResult]:
        out = []
        for d in directives:
            t = self.tenants.get(d.tenant)
            if t is None:
                out.append(ApplyResult(d.tenant, 0, "", False, "no such tenant on this node"))
                continue
            out.append(t.apply(d, self.node.memory_bytes))
        return out

    def current(self) -> dict:
        return {name: {"limit_bytes": t.limit_bytes, "policy": t.policy,
                       "phase": t.phase_index} for name, t in self.tenants.items()}

    def close(self) -> None:
        pass
