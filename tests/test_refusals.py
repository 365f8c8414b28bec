"""Refuse, don't guess (issue 46, item 3): each refusal with its exact words.

  * a policy name the library has not, anywhere in a controller config;
  * what-if on a tenant whose curves rest on no accesses;
  * a node that registers less memory than its config gives it: the
    controller divides what it has, says so once, and shows both in
    `admin status`;
  * `admin log` with nothing to show;
  * `profile` of a cgroup in which nothing reads (root, BPF, a v1 memory
    cgroup: tests/test_sampler_live.py's conditions).
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest

from cachepilot.controller.config import config_from_dict
from cachepilot.controller.engine import EngineState, whatif
from cachepilot.controller.engine.synthetic import SynthTenant, power_curve
from cachepilot.controller.service import Controller
from cachepilot.core.errors import UserError
from cachepilot.models.mrc import MRC
from cachepilot.models.runtime import available_policies
from cachepilot.protocol.types import NodeInfo

MiB = 1 << 20
KNOWN = ", ".join(sorted(available_policies()))


@pytest.mark.parametrize("where,doc", [
    ("tenants[0].policies", {"tenants": [{"name": "a", "node": "n1",
                                          "policies": ["lru", "arc"]}]}),
    ("tenants[0].initial_policy", {"tenants": [{"name": "a", "node": "n1",
                                                "initial_policy": "arc"}]}),
    ("nodes[0].policies", {"nodes": [{"name": "n1", "memory_bytes": "64MiB",
                                      "policies": ["arc"]}]}),
    ("control.autopilot_baseline", {"control": {"autopilot_baseline": "arc"}}),
])
def test_an_unknown_policy_anywhere_in_a_config_is_refused(where, doc):
    data = {"nodes": [{"name": "n1", "memory_bytes": "64MiB"}], **doc}
    with pytest.raises(UserError) as err:
        config_from_dict(data, "c.yaml")
    assert f"c.yaml: {where}: unknown policy 'arc'; accepted: {KNOWN}" in str(err.value)


def test_an_unknown_policy_stops_a_command_with_one_line(tmp_path):
    cfg = tmp_path / "arc.yaml"
    cfg.write_text("nodes: [{name: n1, memory_bytes: 64MiB}]\n"
                   "tenants: [{name: a, node: n1, policies: [lru, arc]}]\n")
    r = subprocess.run([sys.executable, "-m", "cachepilot", "run", "--config", str(cfg),
                        "--intervals", "1", "--no-live"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"cachepilot run: error: {cfg}: tenants[0].policies: unknown "
                                f"policy 'arc'; accepted: {KNOWN}")


def test_what_if_refuses_a_tenant_whose_curves_rest_on_nothing():
    cfg = config_from_dict({"nodes": [{"name": "n1", "memory_bytes": "64MiB"}],
                            "tenants": [{"name": "idle", "node": "n1"}]})
    t = SynthTenant("idle", {"lru": power_curve("lru", 1000, 1.0, 0.0, 16384, 20)})
    report = t.report(32 * MiB, "lru")
    c = report.curves[0]
    report.curves = [MRC(c.sizes, np.ones(len(c.sizes)), "lru", "shards", 0.01,
                         {"window_accesses": 0.0})]
    with pytest.raises(whatif.WhatIfError) as err:
        whatif.tenant(EngineState(), cfg.tenant("idle"), report, cfg.control)
    assert str(err.value) == ("tenant 'idle': its curves rest on no page accesses yet; "
                              "what-if waits for a report of an interval in which it reads "
                              "files")
    # with accesses behind it, the same curve answers
    report.curves[0].meta["window_accesses"] = 5000.0
    p = whatif.tenant(EngineState(), cfg.tenant("idle"), report, cfg.control)
    assert p.miss_ratio == 1.0


def test_a_node_with_less_memory_than_configured_gets_what_it_has(caplog):
    from cachepilot.protocol.types import TenantReport
    cfg = config_from_dict({
        "controller": {"insecure": True},
        "nodes": [{"name": "n1", "memory_bytes": "64MiB"}],
        "tenants": [{"name": f"t{i}", "node": "n1"} for i in range(2)]})
    c = Controller(cfg)
    info = NodeInfo("n1", 32 * MiB, 1, False, ["linux"], "sim")
    session = c.register(info)[0]
    c.register(info)
    session = c.register(info)[0]
    warned = [e for e in c.log if e.kind == "memory"]
    assert [e.message for e in warned] == [
        "node n1 registered 32.0 MiB, less than the 64.0 MiB the config gives it: its "
        "tenants share 32.0 MiB"]
    synth = {f"t{i}": SynthTenant(f"t{i}", {"linux": power_curve("linux", 6000, 1.0, 0.0,
                                                                  16384, 30)})
             for i in range(2)}
    limits = {n: 16 * MiB for n in synth}
    for seq in range(1, 8):
        reports = [s.report(limits[n], "linux") for n, s in synth.items()]
        directives, _, _ = c.report("n1", session, seq, reports, [])
        limits.update({d.tenant: d.limit_bytes for d in directives})
        assert sum(limits.values()) <= 32 * MiB + 2 * 4096
    node = c.status().nodes[0]
    assert (node.memory_bytes, node.config_memory_bytes) == (32 * MiB, 64 * MiB)


def test_admin_log_with_nothing_to_show_says_so():
    from cachepilot.controller.cli import empty_log
    args = argparse.Namespace(tenant="", since="")
    assert empty_log(args) == ("no log entries: the controller logs registrations, and "
                               "decisions once nodes report")
    args = argparse.Namespace(tenant="shop", since="2h")
    assert empty_log(args) == ("no log entries of tenant shop since 2h: the controller logs "
                               "registrations, and decisions once nodes report")


@pytest.mark.root
def test_profile_of_a_cgroup_in_which_nothing_reads():
    from cachepilot.agent.sampler import why_unavailable
    from cachepilot.agent.testbed import scratch_cgroup, v1_memory_available
    for reason in (v1_memory_available(), why_unavailable()):
        if reason:
            pytest.skip(reason)
    with scratch_cgroup("cp_empty_profile") as cg:
        r = subprocess.run([sys.executable, "-m", "cachepilot", "profile", "--cgroup",
                            str(cg), "--duration", "1"], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().endswith(
        f"cachepilot profile: error: {cg}: no page-cache accesses in 1 s of sampling; "
        f"nothing to draw a curve from. Check that the workload's processes are in this "
        f"cgroup (its cgroup.procs), that they read files (anonymous memory is not page "
        f"cache) and that they run during --duration")
    assert "Traceback" not in r.stderr
