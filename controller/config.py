"""The controller's YAML config: what an operator writes, validated on load.

    control:     how the loop behaves (interval, step limit, hysteresis,
                 autopilot threshold and streak, warm-up, safety margin,
                 whether directives are enforced or only recommended)
    controller:  where it listens, how callers prove who they are (a
                 certificate per node and one for admins, or a shared
                 token), where its state is kept (`store`: the embedded
                 SQLite file, or etcd://host:port[/prefix])
    nodes:       the hosts (name, memory offered to tenants, backend)
    tenants:     one per cgroup: its node, cgroup (or pods), throughput
                 source, SLO, priority, floor and ceiling, allowed
                 policies, thread rules, and -- for the sim backend and
                 the planner -- its workload and service model.  This is
                 the one list of tenants: each agent receives its own
                 when it registers (protocol/tenant.py)

Sizes may be written as integers (bytes) or as strings with a unit
("512MiB", "4G", "64k"; binary multiples).  Durations are seconds.

Every error names the file, the key path and what was expected, e.g.
``configs/x.yaml: tenants[2].slo.min_throughput: expected a number >= 0, got -5``.
"""
from __future__ import annotations

import math
import os

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, PrivateAttr, field_validator, model_validator

from cachepilot.controller.etcd import parse_url
from cachepilot.core import config as base
from cachepilot.core.config import Bytes, FilePath, Strict
from cachepilot.core.errors import UserError, unreadable
from cachepilot.protocol.tenant import (NodeTenant, PodRef, PolicyThreads, ThreadRule,
                                        PrometheusThroughput, Throughput)

Name = Annotated[str, Field(min_length=1, max_length=128,
                            pattern=r"^[A-Za-z0-9_.:-]+$")]
PolicyName = Annotated[str, Field(min_length=1, max_length=64,
                                  pattern=r"^[a-z0-9_-]+$")]


# -- control loop ------------------------------------------------------------

class ModelPrior(Strict):
    """Per-operation time = t_hit_s + miss_ratio * t_miss_s, with
    `concurrency` operations in flight: throughput = concurrency / time.
    Used as the throughput model until enough observations exist, and as
    the sim backend's ground truth when it sits in a workload."""
    t_hit_s: float = Field(2e-6, ge=0)
    t_miss_s: float = Field(1e-4, gt=0)
    concurrency: float = Field(1.0, gt=0)

    def throughput(self, miss_ratio: float) -> float:
        return self.concurrency / (self.t_hit_s + miss_ratio * self.t_miss_s)


Mode = Literal["recommend", "enforce"]


# control fields the engine had once, and what became of each (issue 45:
# a dozen tunables; docs/design.md lists the round's fixed figures)
_FIXED = "now a fixed figure of the engine (docs/design.md); delete the line"
REMOVED_CONTROL = {
    "autopilot_memory_threshold": _FIXED, "autopilot_doubt": _FIXED,
    "autopilot_trials": _FIXED, "watchdog_intervals": _FIXED, "watchdog_margin": _FIXED,
    "watchdog_cooldown": _FIXED, "slo_headroom": _FIXED, "slo_headroom_sigmas": _FIXED,
    "slo_feasibility_rounds": _FIXED, "slo_feedback_step": _FIXED,
    "shrink_after_rounds": _FIXED, "model_min_points": _FIXED, "model_min_spread": _FIXED,
    "calibration_window": "curve calibration is gone (it was off by default and did not "
                          "pay on the scenario corpus); delete the line",
    "calibration_max_age": "curve calibration is gone; delete the line",
    "calibration_currency": "curve calibration is gone; delete the line",
    "slo_shortfall_weight": "an SLO no size meets is weighed by throughput like any "
                            "tenant; delete the line",
}


class ControlSpec(Strict):
    interval_s: float = Field(1.0, gt=0)
    # "recommend": decide and log every round, show the directives in
    # `admin tenants` and the metrics, but send nothing that changes a
    # cgroup; "enforce": send them.  A tenant's own `mode` overrides it.
    mode: Mode = "enforce"
    # No node's limits move by more than this fraction of its memory per
    # interval, summed over its tenants.
    max_step_fraction: float = Field(0.1, gt=0, le=1)
    # Limit changes smaller than this fraction of the node's memory are
    # ignored (keeps limits from jittering on noise in the curves).
    hysteresis: float = Field(0.005, ge=0, lt=1)
    # The memory beyond the SLOs moves only when the new division is
    # modelled to gain more than this fraction over the limits in force
    # (engine/allocate.keep_unless_better).  Where two divisions are
    # worth about the same -- a tenant whose curve is flat but for one
    # step -- one interval's noise flips between them, and every flip
    # evicts a cache its tenant has to read back from disk.  0: always move.
    reallocation_gain: float = Field(0.03, ge=0, le=1)
    # A controller that falls behind (a replica that took over a dead
    # one's nodes) answers a report that waited over `shed_after` of an
    # interval for it without a decision round, unless its node has gone
    # `shed_max_rounds` reports without one (controller/service.py).
    shed_after: float = Field(0.3, gt=0)
    shed_max_rounds: int = Field(2, ge=0)
    # Policy autopilot: switch only when the predicted relative throughput
    # gain exceeds this (engine/autopilot.py) ...
    autopilot_threshold: float = Field(0.05, ge=0)
    # ... in this many intervals before as many intervals have not shown it.
    autopilot_k: int = Field(3, ge=1)
    # The policy that runs no hooks: the kernel's own.  A tenant on another
    # policy goes back to it when that policy no longer beats it by more
    # than half of `autopilot_threshold` for `autopilot_k` intervals in a
    # row -- a cache_ext policy costs CPU on every access, which no curve
    # shows, so it has to earn it.  None: no policy is preferred.
    autopilot_baseline: str | None = "linux"
    # What memory beyond the SLOs maximises: "throughput", the sum of the
    # tenants' modelled operations per second; or "relative", the sum of
    # each tenant's throughput relative to what it would get at an equal
    # share of its node -- for tenants that count different operations
    # (a GET and a 4 KiB read are not worth the same).
    objective: Literal["throughput", "relative"] = "throughput"
    # The share of intervals an SLO is to be met in: an SLO tenant's safe
    # size follows its misses toward where it misses 1 - share of the
    # intervals it held that size in (engine/round.py _slo_feedback).
    slo_target_share: float = Field(0.95, gt=0, lt=1)
    # Intervals after start that SLO attainment does not count.
    warmup_intervals: int = Field(5, ge=0)
    # Never set a limit below anonymous usage + this margin.
    anon_margin_bytes: Bytes = 16 << 20
    # Throughput model: observations kept per tenant (engine/model.py).
    model_window: int = Field(64, ge=2)
    # How many standard errors of doubt a curve is read with: sampled
    # curves as if every size needed that many more of its estimate
    # (engine/curves.py), and a challenger policy as missing that many of
    # its spread over the last windows more (engine/round.py _doubt).
    curve_error_sigmas: float = Field(2.0, ge=0, le=10)
    # A node with no report for this many intervals is lost.
    lost_after_intervals: int = Field(3, ge=1)
    # With replicas on etcd (controller/fleet.py), the leader plans the
    # fleet's consolidation every this many intervals from the demands each
    # replica publishes for its nodes (0: never).
    plan_every_intervals: int = Field(30, ge=0)
    # Prior for tenants that do not give their own.
    prior: ModelPrior = ModelPrior()

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data):
        """A field the engine no longer has is named with what became of
        it, rather than refused as merely unknown."""
        if isinstance(data, dict):
            for key in data:
                if key in REMOVED_CONTROL:
                    raise ValueError(f"control.{key} was removed: {REMOVED_CONTROL[key]}")
        return data


class ControllerSpec(Strict):
    listen: str = "127.0.0.1:50551"
    # TLS is the default; `insecure: true` runs plaintext (loopback demos)
    # and the controller warns loudly when it does.
    insecure: bool = False
    tls_cert: FilePath | None = None
    tls_key: FilePath | None = None
    tls_ca: FilePath | None = None      # for agents verifying the controller
    # Mutual TLS: every caller presents a certificate signed by this CA; a
    # node's names the node (CN), an admin's carries the admin role
    # (`cachepilot certs` makes them all).  Or, instead, a shared token.
    client_ca: FilePath | None = None
    token: str | None = Field(None, min_length=8)
    token_file: FilePath | None = None
    # What `cachepilot admin` presents to a controller that wants client
    # certificates (`cachepilot certs admin`); its --cert/--key override.
    admin_cert: FilePath | None = None
    admin_key: FilePath | None = None
    # The state store (controller/store.py): SLOs set through the admin
    # API, the decision log, node registrations and last directives,
    # autopilot holds.  Default: <name>.state.db beside the config file, or
    # in $STATE_DIRECTORY under a systemd unit with StateDirectory=.
    state_path: FilePath | None = None
    # Decision rounds whose per-tenant traces (`cachepilot admin explain`)
    # the store keeps; default: a day of control intervals.
    trace_rounds: int | None = Field(None, ge=1)
    # Where that store lives: "sqlite" (the embedded default, at
    # state_path) or an etcd: etcd://host:port[/prefix] (prefix default
    # /cachepilot; controller/store_etcd.py), for a controller whose state
    # must outlive its host.
    store: str = "sqlite"
    # With an etcd store every controller process is a replica that owns a
    # share of the nodes (controller/fleet.py): its name among them
    # (default: its advertised address), the address agents are redirected
    # to (default: listen; required when listen is a wildcard such as
    # 0.0.0.0), and how long it may go silent before its nodes move to the
    # others (default: half a control interval, at least 1 s: then its
    # nodes are served again within two intervals of its death; rounded up
    # to whole seconds, as etcd's leases are).  A name another live
    # replica holds is refused.  `cachepilot controller --replica NAME
    # --advertise HOST:PORT` set the first two per process.
    replica: Name | None = None
    advertise: str | None = None
    replica_ttl_s: float | None = Field(None, ge=1, le=3600)
    metrics_port: int | None = Field(None, ge=0, le=65535)

    @field_validator("store")
    @classmethod
    def _store(cls, store):
        if store != "sqlite":
            try:
                parse_url(store)
            except ValueError:
                raise ValueError("expected 'sqlite' or etcd://host:port[/prefix]") from None
        return store

    @model_validator(mode="after")
    def _auth(self):
        if self.token is not None and self.token_file is not None:
            raise ValueError("give token or token_file, not both")
        token = self.token is not None or self.token_file is not None
        if token and self.client_ca is not None:
            raise ValueError("give client_ca (a certificate per node and for admins) "
                             "or a token, not both")
        if (self.admin_cert is None) != (self.admin_key is None):
            raise ValueError("give admin_cert and admin_key together")
        if not self.insecure:
            if self.tls_cert is None or self.tls_key is None:
                raise ValueError("tls_cert and tls_key are required unless "
                                 "insecure: true")
            if not token and self.client_ca is None:
                raise ValueError("client_ca (certificates per node: `cachepilot certs`) "
                                 "or a token is required unless insecure: true")
        elif self.client_ca is not None:
            raise ValueError("client_ca needs TLS: it cannot be used with insecure: true")
        return self

    @property
    def mutual_tls(self) -> bool:
        return self.client_ca is not None and not self.insecure

    def token_value(self) -> str | None:
        """The shared token, read from token_file when given there."""
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as err:
                raise UserError(unreadable(self.token_file, "token file", err)) from None
        return self.token

    def client_root_cert(self) -> bytes | None:
        """The PEM a client verifies the controller with (None when
        insecure); a self-signed controller certificate is its own CA."""
        if self.insecure:
            return None
        ca = self.tls_ca or self.tls_cert
        try:
            return ca.read_bytes()
        except OSError as err:
            raise UserError(unreadable(ca, "CA certificate", err)) from None


# -- nodes ---------------------------------------------------------------------

class NodeSpec(Strict):
    name: Name
    memory_bytes: Bytes = Field(gt=0)
    backend: Literal["sim", "linux"] = "sim"
    address: str | None = None          # agent address, when it listens
    seed: int = 0                       # sim: base seed of its generators
    # Policies the node may load (linux) or emulates (sim); None = all it has.
    policies: list[PolicyName] | None = None
    # linux: only cgroups under these roots are touched.
    cgroup_roots: list[str] = Field(default_factory=list)
    # What its tenants share besides memory, for the consolidation planner:
    # disk read bandwidth (bytes per second) and CPU cores.  Default: what
    # its agent registers (its blkio/io.max throttle, its CPUs), else none.
    disk_read_bytes_per_s: Bytes | None = Field(None, gt=0)
    cores: float | None = Field(None, gt=0)


# -- tenants -------------------------------------------------------------------

class PrometheusSource(Strict):
    url: str = Field(pattern=r"^https?://")
    metric: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)


class SLO(Strict):
    min_throughput: float = Field(ge=0)   # operations per second
    # Where the throughput is read (older form of the tenant's
    # `throughput`): "accesses", the backend's own count (sim: operations
    # served; linux: page-cache accesses per second); or a Prometheus query.
    source: Union[Literal["accesses"], PrometheusSource] = "accesses"


class PhaseSpec(Strict):
    """One phase of a synthetic (or traced) workload."""
    kind: Literal["zipf", "uniform", "scan", "loop", "get-scan", "trace"]
    footprint: Bytes = Field(64 << 20, gt=0)  # working set, bytes
    skew: float = Field(1.0, ge=0)           # zipf, get-scan
    # get-scan: the share of scan accesses; its threads are named `get`
    # and `scan` for a tenant's `slo_threads`
    scan_fraction: float = Field(0.1, ge=0, le=1)
    scan_length: Bytes = Field(16 << 20, gt=0)     # get-scan: bytes per scan
    trace: FilePath | None = None            # kind: trace
    trace_format: str | None = None
    # kind: trace: page accesses of the trace skipped before the replay
    # starts (it wraps round to the start at the end)
    trace_offset: int = Field(0, ge=0)
    # Length of the phase in control intervals; None = until the end.
    intervals: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _trace_needs_path(self):
        if self.kind == "trace" and self.trace is None:
            raise ValueError("a trace phase needs a `trace` path")
        return self


class WorkloadSpec(Strict):
    """What a sim tenant runs (and what the planner profiles)."""
    phases: list[PhaseSpec] = Field(min_length=1)
    accesses_per_interval: int = Field(20000, ge=1)
    service: ModelPrior = ModelPrior()
    seed: int | None = None

    @field_validator("phases")
    @classmethod
    def _only_last_open(cls, phases):
        for i, p in enumerate(phases[:-1]):
            if p.intervals is None:
                raise ValueError(f"phase {i} has no `intervals` but is not "
                                 f"the last phase")
        return phases

    def phase_spans(self, intervals: int) -> list[tuple[int, int, int]]:
        """(phase index, first interval, last interval), 1-based, of the
        phases a run of `intervals` intervals reaches."""
        spans, start = [], 1
        for i, ph in enumerate(self.phases):
            end = intervals if ph.intervals is None else \
                min(intervals, start + ph.intervals - 1)
            if start <= intervals:
                spans.append((i, start, end))
            start = end + 1
        return spans


class TenantSpec(Strict):
    name: Name
    node: Name
    cgroup: str | None = None           # defaults to the tenant name (without `pod`)
    pod: PodRef | None = None           # or a Kubernetes pod, by name or labels
    # Where its node reads the tenant's throughput (default: accesses);
    # `slo.source` is the older place for the same thing.
    throughput: Throughput | None = None
    slo: SLO | None = None
    # "recommend" or "enforce" for this tenant alone (None: control.mode)
    mode: Mode | None = None
    priority: int = 0                   # higher is served first
    floor_bytes: Bytes = 0
    ceiling_bytes: Bytes | None = None  # None: the node's memory
    # Allowed policies; None = every policy the node offers.
    policies: list[PolicyName] | None = Field(None, min_length=1)
    # The threads an application-informed policy treats specially, by a
    # rule matched on the node every interval (protocol/tenant.py).
    policy_threads: PolicyThreads | None = None
    # The threads whose operations the tenant's throughput counts (its GET
    # threads, not the scan beside them): its curves count their misses.
    # A real node's agent matches the rule; the sim counts every access,
    # as its tenants' throughput does.
    slo_threads: ThreadRule | None = None
    initial_policy: PolicyName = "linux"
    initial_limit_bytes: Bytes | None = None  # None: an equal share
    model: ModelPrior | None = None     # prior; None = control.prior
    workload: WorkloadSpec | None = None
    # Planner input when no workload is given: a JSON file of curves as
    # written by `cachepilot mrc --json` (a list of MRC dicts, or an object
    # with a "curves" list).
    curves_file: FilePath | None = None

    @model_validator(mode="after")
    def _defaults(self):
        if self.pod is not None and self.cgroup is not None:
            raise ValueError("give cgroup or pod, not both")
        if self.cgroup is None and self.pod is None:
            self.cgroup = self.name
        if self.throughput is not None and self.slo is not None and \
                self.slo.source != "accesses":
            raise ValueError("give the throughput source once: `throughput` or "
                             "`slo.source`, not both")
        if self.ceiling_bytes is not None and self.floor_bytes > self.ceiling_bytes:
            raise ValueError(f"floor_bytes ({self.floor_bytes}) is above "
                             f"ceiling_bytes ({self.ceiling_bytes})")
        if self.policies is not None and len(set(self.policies)) != len(self.policies):
            raise ValueError("policies lists a policy twice")
        return self


    def throughput_source(self) -> Throughput:
        """Where the node reads this tenant's throughput."""
        if self.throughput is not None:
            return self.throughput
        src = self.slo.source if self.slo is not None else "accesses"
        if isinstance(src, PrometheusSource):
            return PrometheusThroughput(source="prometheus", url=src.url,
                                        metric=src.metric, labels=src.labels)
        return NodeTenant.model_fields["throughput"].default_factory()

    def node_tenant(self) -> NodeTenant:
        """What this tenant's node is told about it at registration."""
        return NodeTenant(name=self.name, cgroup=self.cgroup, pod=self.pod,
                          throughput=self.throughput_source(),
                          floor=self.floor_bytes or None, ceiling=self.ceiling_bytes,
                          policies=self.policies, policy_threads=self.policy_threads,
                          slo_threads=self.slo_threads)

    def mode_in(self, control: "ControlSpec") -> str:
        return self.mode or control.mode


class Config(Strict):
    control: ControlSpec = ControlSpec()
    # A file without a controller section (planner inputs, embedded runs)
    # gets plaintext on loopback only -- never a network-facing port without
    # TLS -- and `has_controller_section` says it was not configured.
    controller: ControllerSpec = Field(
        default_factory=lambda: ControllerSpec(insecure=True, listen="127.0.0.1:50551"))
    nodes: list[NodeSpec] = Field(min_length=1)
    tenants: list[TenantSpec] = Field(default_factory=list)
    _lookup: tuple | None = PrivateAttr(None)
    # Where the file was loaded from (relative paths resolve against it).
    source: Path | None = Field(None, exclude=True)

    @property
    def has_controller_section(self) -> bool:
        return "controller" in self.model_fields_set

    def node(self, name: str) -> NodeSpec:
        return self._find(0, name)

    def tenant(self, name: str) -> TenantSpec:
        return self._find(1, name)

    def tenants_on(self, node: str) -> list[TenantSpec]:
        return [t for t in self._index()[2].get(node, ()) if t.node == node]

    def _find(self, which: int, name: str):
        for fresh in (False, True):
            found = self._index(fresh)[which].get(name)
            if found is not None and found.name == name:
                return found
        raise KeyError(name)

    def _index(self, fresh: bool = False):
        """(nodes by name, tenants by name, tenants by node).  A controller
        looks tenants up on every report, and scanning the list made each
        report cost more the bigger the fleet.  Rebuilt when a list is
        replaced or changes length, or when a lookup misses; a tenant's
        placement is not edited in place."""
        old = self._lookup
        if fresh or old is None or old[0] is not self.nodes or old[1] is not self.tenants \
                or old[2] != (len(self.nodes), len(self.tenants)):
            by_node: dict[str, list] = {}
            for t in self.tenants:
                by_node.setdefault(t.node, []).append(t)
            self._lookup = (self.nodes, self.tenants, (len(self.nodes), len(self.tenants)),
                            ({n.name: n for n in self.nodes},
                             {t.name: t for t in self.tenants}, by_node))
        return self._lookup[3]

    def prior_for(self, tenant: TenantSpec) -> ModelPrior:
        return tenant.model or self.control.prior

    def trace_rounds(self) -> int:
        """Rounds of traces kept: controller.trace_rounds, or a day of intervals."""
        return self.controller.trace_rounds or max(1, math.ceil(86400 / self.control.interval_s))


# -- loading -------------------------------------------------------------------

def _cross_check(cfg: Config) -> list[str]:
    """Checks that span several entries: names, placements, floors."""
    errs = []
    seen = {}
    for i, n in enumerate(cfg.nodes):
        if n.name in seen:
            errs.append(f"nodes[{i}].name: {n.name!r} is already used by "
                        f"nodes[{seen[n.name]}]")
        seen[n.name] = i
    names = {}
    floors: dict[str, int] = {}
    for i, t in enumerate(cfg.tenants):
        if t.name in names:
            errs.append(f"tenants[{i}].name: {t.name!r} is already used by "
                        f"tenants[{names[t.name]}]")
        names[t.name] = i
        if t.node not in seen:
            errs.append(f"tenants[{i}].node: expected one of the nodes "
                        f"({', '.join(sorted(seen))}), got {t.node!r}")
            continue
        node = cfg.nodes[seen[t.node]]
        if t.ceiling_bytes is not None and t.ceiling_bytes > node.memory_bytes:
            errs.append(f"tenants[{i}].ceiling_bytes: expected at most the "
                        f"node's memory ({node.memory_bytes}), got {t.ceiling_bytes}")
        if t.floor_bytes > node.memory_bytes:
            errs.append(f"tenants[{i}].floor_bytes: expected at most the "
                        f"node's memory ({node.memory_bytes}), got {t.floor_bytes}")
        if node.policies is not None and t.policies is not None:
            extra = [p for p in t.policies if p not in node.policies]
            if extra:
                errs.append(f"tenants[{i}].policies: {', '.join(extra)} not "
                            f"offered by node {node.name!r} "
                            f"({', '.join(node.policies)})")
        floors[t.node] = floors.get(t.node, 0) + t.floor_bytes
    errs += _unknown_policies(cfg)
    for node_name, total in floors.items():
        node = cfg.nodes[seen[node_name]]
        if total > node.memory_bytes:
            errs.append(f"tenants: floors on node {node_name!r} add up to "
                        f"{total} bytes, more than its {node.memory_bytes}")
    return errs


def _unknown_policies(cfg: Config) -> list[str]:
    """A policy name anywhere in the config that the library has not: a
    typo would otherwise leave a tenant on the baseline without a word.
    Unchecked where the MRC engine's runtime is not built."""
    try:
        from cachepilot.models.runtime import unknown_policy
    except Exception:   # noqa: BLE001 - engine parts not built
        return []
    where = [("control.autopilot_baseline", [cfg.control.autopilot_baseline]
              if cfg.control.autopilot_baseline else [])]
    where += [(f"nodes[{i}].policies", n.policies or []) for i, n in enumerate(cfg.nodes)]
    for i, t in enumerate(cfg.tenants):
        where += [(f"tenants[{i}].policies", t.policies or []),
                  (f"tenants[{i}].initial_policy", [t.initial_policy])]
    return [f"{key}: {why}" for key, names in where
            if (why := unknown_policy(names)) is not None]


def config_from_dict(data: Any, path: str = "<config>") -> Config:
    """Validate an already parsed document; errors name `path` and the key."""
    return base.validate(Config, data, path, cross_check=_cross_check)


def load_config(path) -> Config:
    """Read and validate a YAML config (core/config.py); UserError with
    file, key path and expectation on any problem.  Paths in it are
    relative to the file."""
    cfg, source = base.load(Config, path, cross_check=_cross_check)
    cfg.source = source
    use_credentials(cfg.controller)
    return cfg


SECRET_FIELDS = ("tls_cert", "tls_key", "tls_ca", "client_ca", "token_file")


def use_credentials(spec: ControllerSpec, env=os.environ) -> None:
    """Under systemd, a file the unit passes with LoadCredential= under the
    name of one the config gives (controller.key for tls_key:
    /etc/cachepilot/controller.key) is read from the unit's credentials
    directory instead: systemd, as root, hands a key kept 0600 to root to
    the controller's unprivileged user that way."""
    folder = env.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return
    for name in SECRET_FIELDS:
        path = getattr(spec, name)
        if path is not None and (Path(folder) / path.name).is_file():
            setattr(spec, name, Path(folder) / path.name)
