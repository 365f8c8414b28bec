"""Conversion between protocol/types.py dataclasses and their protobuf mirrors.

Converting *from* the wire is also where untrusted input is checked, one
tenant at a time: a tenant entry whose numbers are not valid raises
WireError (the controller refuses that entry and holds the tenant); a curve
that is not a valid MRC (sizes not strictly increasing, NaN, ratios outside
[0, 1], mismatched lengths) refuses that tenant's curves, which the report
then carries without, saying why (TenantReport.refused).
"""
from __future__ import annotations

import json
import math

import numpy as np

from cachepilot.models.mrc import MRC, curve_fault
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol.tenant import NodeTenant
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport


class WireError(ValueError):
    """A message that does not describe a valid object."""


# Bounds on what one report may carry: far above any real curve, low enough
# that a confused or hostile node cannot make the controller chew on junk.
MAX_CURVE_POINTS = 10_000
MAX_CURVES_PER_TENANT = 64


# -- curves ----------------------------------------------------------------
def curve_to_pb(curve: MRC) -> pb.Curve:
    return pb.Curve(policy=curve.policy, method=curve.method, rate=float(curve.rate),
                    sizes_pages=[int(s) for s in curve.sizes],
                    miss_ratio=[float(m) for m in curve.miss_ratio],
                    meta_json=json.dumps(curve.meta, default=_jsonable) if curve.meta else "")


def curve_from_pb(msg: pb.Curve, where: str = "curve") -> MRC:
    """The curve a message carries, every field checked (the points with
    the MRC's own rules, curve_fault, once: the MRC is made without
    checking them again)."""
    n = len(msg.sizes_pages)
    if n > MAX_CURVE_POINTS:
        raise WireError(f"{where}: {n} points, more than {MAX_CURVE_POINTS}")
    if n != len(msg.miss_ratio):
        raise WireError(f"{where}: {n} sizes but {len(msg.miss_ratio)} miss ratios")
    sizes = np.fromiter(msg.sizes_pages, dtype=np.int64, count=n)
    ratios = np.fromiter(msg.miss_ratio, dtype=np.float64, count=n)
    why = curve_fault(sizes, ratios)
    if why is not None:
        raise WireError(f"{where}: {why}")
    if not math.isfinite(msg.rate) or not 0.0 < msg.rate <= 1.0:
        raise WireError(f"{where}: sampling rate {msg.rate!r} is not within (0, 1]")
    meta = {}
    if msg.meta_json:
        try:
            meta = json.loads(msg.meta_json)
        except ValueError:
            raise WireError(f"{where}: meta_json is not JSON") from None
        if not isinstance(meta, dict):
            raise WireError(f"{where}: meta_json is not a JSON object")
    return MRC.checked(sizes, ratios, msg.policy or "lru", msg.method or "exact",
                       float(msg.rate), meta)


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


# -- node facts --------------------------------------------------------------
def node_info_to_pb(info: NodeInfo) -> pb.NodeInfo:
    return pb.NodeInfo(node_id=info.node_id, memory_bytes=int(info.memory_bytes),
                       cgroup_version=int(info.cgroup_version),
                       has_cache_ext=bool(info.has_cache_ext),
                       policies=list(info.policies), backend=info.backend,
                       disk_read_bytes_per_s=float(info.disk_read_bytes_per_s),
                       cores=float(info.cores))


def node_info_from_pb(msg: pb.NodeInfo) -> NodeInfo:
    if not msg.node_id:
        raise WireError("node: empty node_id")
    if msg.memory_bytes <= 0:
        raise WireError(f"node {msg.node_id}: memory_bytes must be positive")
    for name in ("disk_read_bytes_per_s", "cores"):
        v = getattr(msg, name)
        if not math.isfinite(v) or v < 0:
            raise WireError(f"node {msg.node_id}: {name} {v!r} must be finite and "
                            f"non-negative")
    return NodeInfo(node_id=msg.node_id, memory_bytes=int(msg.memory_bytes),
                    cgroup_version=int(msg.cgroup_version),
                    has_cache_ext=bool(msg.has_cache_ext),
                    policies=list(msg.policies), backend=msg.backend or "linux",
                    disk_read_bytes_per_s=float(msg.disk_read_bytes_per_s),
                    cores=float(msg.cores))


# -- reports -----------------------------------------------------------------
_RATE_FIELDS = ("interval_s", "accesses_per_s", "inserts_per_s", "removals_per_s",
                "refaults_per_s", "throughput", "miss_ratio", "cpu_per_s")
MAX_ERROR_TEXT = 500
# non-negative integers: bytes, and pages where the name says so
_COUNT_FIELDS = ("limit_bytes", "usage_file_bytes", "usage_anon_bytes",
                 "policy_capacity_pages", "policy_overflow_pages")


def report_to_pb(report: TenantReport) -> pb.TenantReport:
    msg = pb.TenantReport(tenant=report.tenant, cgroup=report.cgroup, policy=report.policy,
                          curves=[curve_to_pb(c) for c in report.curves],
                          throughput_unknown=report.throughput is None,
                          throughput_error=report.throughput_error[:MAX_ERROR_TEXT],
                          read_bytes_per_s=float(report.read_bytes_per_s or 0.0),
                          read_bytes_unknown=report.read_bytes_per_s is None)
    for name in _RATE_FIELDS:
        setattr(msg, name, float(getattr(report, name) or 0.0))
    for name in _COUNT_FIELDS:
        setattr(msg, name, int(getattr(report, name)))
    return msg


def report_from_pb(msg: pb.TenantReport) -> TenantReport:
    where = f"tenant {msg.tenant!r}"
    if not msg.tenant:
        raise WireError("report: empty tenant name")
    values = {}
    for name in _RATE_FIELDS:
        v = getattr(msg, name)
        if not math.isfinite(v) or v < 0:
            raise WireError(f"{where}: {name} {v!r} must be finite and non-negative")
        values[name] = float(v)
    if values["miss_ratio"] > 1.0 + 1e-9:
        raise WireError(f"{where}: miss_ratio {values['miss_ratio']} is above 1")
    for name in _COUNT_FIELDS:
        v = getattr(msg, name)
        if v < 0:
            raise WireError(f"{where}: {name} must be non-negative")
        values[name] = int(v)
    if msg.throughput_unknown:
        values["throughput"] = None
    v = msg.read_bytes_per_s
    if not math.isfinite(v) or v < 0:
        raise WireError(f"{where}: read_bytes_per_s {v!r} must be finite and non-negative")
    values["read_bytes_per_s"] = None if msg.read_bytes_unknown else float(v)
    refused = ""
    try:
        if len(msg.curves) > MAX_CURVES_PER_TENANT:
            raise WireError(f"{where}: {len(msg.curves)} curves, more than "
                            f"{MAX_CURVES_PER_TENANT}")
        curves = [curve_from_pb(c, f"{where} curve {i} ({c.policy})")
                  for i, c in enumerate(msg.curves)]
    except WireError as err:
        curves, refused = [], str(err)
    return TenantReport(tenant=msg.tenant, cgroup=msg.cgroup, policy=msg.policy,
                        curves=curves, throughput_error=msg.throughput_error[:MAX_ERROR_TEXT],
                        refused=refused, **values)


# -- tenants a node is given ---------------------------------------------------
def tenant_to_pb(t: NodeTenant) -> pb.TenantAssignment:
    return pb.TenantAssignment(name=t.name, spec_json=t.model_dump_json(exclude_none=True))


def tenant_from_pb(msg: pb.TenantAssignment) -> NodeTenant:
    """The tenant a controller assigned, checked by the same model a
    stand-alone agent's config uses; WireError names what is wrong."""
    from pydantic import ValidationError

    from cachepilot.core.config import format_errors
    try:
        t = NodeTenant.model_validate_json(msg.spec_json or "{}")
    except ValidationError as err:
        raise WireError(format_errors(f"tenant {msg.name!r} from the controller",
                                      err)) from None
    if t.name != msg.name:
        raise WireError(f"tenant {msg.name!r} from the controller: its spec names "
                        f"{t.name!r}")
    return t


# -- directives and their results --------------------------------------------
def directive_to_pb(d: Directive) -> pb.Directive:
    return pb.Directive(tenant=d.tenant, limit_bytes=int(d.limit_bytes),
                        policy=d.policy, reason=d.reason)


def directive_from_pb(msg: pb.Directive) -> Directive:
    return Directive(tenant=msg.tenant, limit_bytes=int(msg.limit_bytes),
                     policy=msg.policy, reason=msg.reason)


def apply_result_to_pb(r: ApplyResult) -> pb.ApplyResult:
    return pb.ApplyResult(tenant=r.tenant, applied_limit_bytes=int(r.applied_limit_bytes),
                          applied_policy=r.applied_policy, ok=bool(r.ok), message=r.message,
                          policy_refused=not r.policy_ok, policy_message=r.policy_message)


def apply_result_from_pb(msg: pb.ApplyResult) -> ApplyResult:
    return ApplyResult(tenant=msg.tenant, applied_limit_bytes=int(msg.applied_limit_bytes),
                       applied_policy=msg.applied_policy, ok=bool(msg.ok), message=msg.message,
                       policy_ok=not msg.policy_refused, policy_message=msg.policy_message)
