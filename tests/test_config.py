"""Config loading: valid files load with their defaults and units; every
kind of bad input is refused with one line naming file, key and expectation."""
import re
import textwrap

import pytest

from cachepilot.controller.config import load_config
from cachepilot.core.config import parse_bytes
from cachepilot.core.errors import UserError

GOOD = """
control: {interval_s: 2, max_step_fraction: 0.05, hysteresis: 0.01}
controller: {insecure: true, listen: "127.0.0.1:0"}
nodes:
  - {name: n1, memory_bytes: 2GiB, policies: [linux, lru, s3fifo]}
  - {name: n2, memory_bytes: 1073741824}
tenants:
  - name: web
    node: n1
    slo: {min_throughput: 20000}
    priority: 2
    floor_bytes: 64MiB
    ceiling_bytes: 1.5G
    policies: [lru, s3fifo]
    workload:
      phases:
        - {kind: zipf, skew: 1.2, footprint: 512MiB, intervals: 10}
        - {kind: scan, footprint: 1GiB}
      service: {t_hit_s: 1.0e-6, t_miss_s: 2.0e-4}
  - name: batch
    node: n2
    slo: {min_throughput: 10, source: {url: "http://127.0.0.1:9090", metric: ops_total, labels: {job: b}}}
"""


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_config(p)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(str(p))
    return msg


def test_good_config_loads_with_units_and_defaults(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.control.interval_s == 2
    assert cfg.control.autopilot_k == 3            # default
    assert cfg.node("n1").memory_bytes == 2 << 30
    web = cfg.tenant("web")
    assert web.floor_bytes == 64 << 20
    assert web.ceiling_bytes == int(1.5 * (1 << 30))
    assert web.cgroup == "web"                    # defaults to the name
    assert web.workload.phases[0].footprint == 512 << 20
    assert cfg.tenant("batch").slo.source.metric == "ops_total"
    assert cfg.tenant("batch").slo.source != "accesses"
    assert [t.name for t in cfg.tenants_on("n1")] == ["web"]
    assert cfg.prior_for(cfg.tenant("batch")) == cfg.control.prior


def test_example_from_the_issue_negative_slo(tmp_path):
    msg = error_of(tmp_path, """
        nodes: [{name: n1, memory_bytes: 1GiB}]
        tenants:
          - {name: a, node: n1}
          - {name: b, node: n1}
          - {name: c, node: n1, slo: {min_throughput: -5}}
        """)
    assert msg.endswith("tenants[2].slo.min_throughput: expected a number >= 0, got -5")


@pytest.mark.parametrize("body, key, expect", [
    ("nodes: []", "nodes", "at least 1"),
    ("nodes: [{name: n1, memory_bytes: 12 parsecs}]", "nodes[0].memory_bytes", "size"),
    ("nodes: [{name: n1, memory_bytes: 1G, backnd: sim}]", "nodes[0].backnd", "unknown key"),
    ("nodes: [{name: n1, memory_bytes: 1G, backend: kvm}]", "nodes[0].backend", "'sim' or 'linux'"),
    ("nodes: [{name: n1}]", "nodes[0].memory_bytes", "required"),
    ("control: {max_step_fraction: 1.5}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "control.max_step_fraction", "<= 1"),
    ("control: {autopilot_k: 0}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "control.autopilot_k", ">= 1"),
    ("control: {watchdog_cooldown: 5}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "control.watchdog_cooldown was removed", "a fixed figure of the engine"),
    ("control: {calibration_window: 6}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "control.calibration_window was removed", "curve calibration is gone"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n9}]",
     "tenants[0].node", "one of the nodes (n1)"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, slo: {min_throughput: fast}}]",
     "tenants[0].slo.min_throughput", "a number"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, slo: {min_throughput: 5, source: rumour}}]",
     "tenants[0].slo.source", "'accesses'"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, slo: {min_throughput: 5, source: {url: x}}}]",
     "tenants[0].slo.source.metric", "required"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, floor_bytes: 2G}]",
     "tenants[0].floor_bytes", "at most"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, floor_bytes: 512M, ceiling_bytes: 256M}]",
     "tenants[0]", "above ceiling_bytes"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, floor_bytes: 600M}, {name: b, node: n1, floor_bytes: 600M}]",
     "tenants", "floors on node 'n1'"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1}, {name: a, node: n1}]",
     "tenants[1].name", "already used"),
    ("nodes: [{name: n1, memory_bytes: 1G, policies: [lru]}]\ntenants: [{name: a, node: n1, policies: [lru, s3fifo]}]",
     "tenants[0].policies", "s3fifo not offered"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, workload: {phases: [{kind: zipf}, {kind: scan}]}}]",
     "tenants[0].workload.phases", "not the last phase"),
    ("nodes: [{name: n1, memory_bytes: 1G}]\ntenants: [{name: a, node: n1, workload: {phases: [{kind: trace}]}}]",
     "tenants[0].workload.phases[0]", "needs a `trace` path"),
    ("controller: {listen: ':1'}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "controller", "tls_cert and tls_key are required"),
    ("controller: {insecure: true, store: foo}\nnodes: [{name: n1, memory_bytes: 1G}]",
     "controller.store", "expected 'sqlite' or etcd://host:port[/prefix], got 'foo'"),
])
def test_bad_input_names_key_and_expectation(tmp_path, body, key, expect):
    msg = error_of(tmp_path, body)
    assert f": {key}:" in msg or f": {key} " in msg, msg
    assert expect in msg, msg


def test_without_a_controller_section_only_loopback_plaintext(tmp_path):
    cfg = load_config(write(tmp_path, "nodes: [{name: n1, memory_bytes: 1G}]\n"))
    assert not cfg.has_controller_section
    assert cfg.controller.insecure and cfg.controller.listen.startswith("127.0.0.1:")
    cfg = load_config(write(tmp_path, "controller: {insecure: true, listen: '0.0.0.0:1'}\n"
                                      "nodes: [{name: n1, memory_bytes: 1G}]\n"))
    assert cfg.has_controller_section


def test_tls_default_needs_token(tmp_path):
    msg = error_of(tmp_path, """
        controller: {tls_cert: c.pem, tls_key: k.pem}
        nodes: [{name: n1, memory_bytes: 1G}]
        """)
    assert "token" in msg


def test_relative_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "tok").write_text("s3cret-token\n")
    cfg = load_config(write(tmp_path, """
        controller: {tls_cert: certs/c.pem, tls_key: certs/k.pem, token_file: tok}
        nodes: [{name: n1, memory_bytes: 1G}]
        """))
    assert cfg.controller.tls_cert == tmp_path / "certs" / "c.pem"
    assert cfg.controller.token_value() == "s3cret-token"


def test_unreadable_files_and_bad_yaml(tmp_path):
    with pytest.raises(UserError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    msg = error_of(tmp_path, "nodes: [\n")
    assert "not valid YAML" in msg
    assert re.search(r"c\.yaml:\d+:\d+: ", msg), msg
    assert "empty" in error_of(tmp_path, "")
    assert "mapping" in error_of(tmp_path, "- 1\n- 2\n")


@pytest.mark.parametrize("text, value", [
    (4096, 4096), ("4096", 4096), ("4k", 4096), ("4KiB", 4096), ("1.5G", 3 << 29),
    ("2 MiB", 2 << 20), ("1t", 1 << 40)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["-1", -1, "1x", "", True, [1]])
def test_parse_bytes_refuses(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


# -- the agent's config: a tenant's policy thread rules (agent/threads.py) ----

AGENT_TENANT = """
roots: [/sys/fs/cgroup/memory]
tenants:
  - name: kv
    cgroup: kv
    policy_threads:
{}
"""


def agent_config(tmp_path, policy_threads: str):
    from cachepilot.agent.config import load_config as load_agent_config
    body = textwrap.indent(textwrap.dedent(policy_threads).strip(), " " * 6)
    return load_agent_config(write(tmp_path, AGENT_TENANT.format(body), "agent.yaml"))


def test_agent_tenant_policy_threads_load(tmp_path):
    cfg = agent_config(tmp_path, """
        get_scan: {scan_threads: {comm: "db_scan*"}}
        admit_filter: {bypass_threads: {comm: "rocksdb:low*", cmdline: "*db_bench*"}}
        """)
    rules = cfg.tenants[0].thread_rules()
    assert set(rules) == {"get_scan", "admit_filter"}
    assert rules["get_scan"]["scan_threads"].comm == "db_scan*"
    assert rules["get_scan"]["scan_threads"].cmdline is None
    assert rules["admit_filter"]["bypass_threads"].cmdline == "*db_bench*"
    plain = agent_config(tmp_path, "{}")          # none given: no rules
    assert plain.tenants[0].thread_rules() == {}


@pytest.mark.parametrize("body, key, expect", [
    ("get_scn: {scan_threads: {comm: a*}}", "tenants[0].policy_threads.get_scn",
     "unknown policy; expected one of admit_filter, get_scan"),
    ("get_scan: {bypass_threads: {comm: a*}}",
     "tenants[0].policy_threads.get_scan.bypass_threads",
     "unknown role of get_scan; expected scan_threads"),
    ("admit_filter: {bypass_threads: {name: a*}}",
     "tenants[0].policy_threads.admit_filter.bypass_threads.name",
     "unknown key; expected `comm` and/or `cmdline`"),
    ("get_scan: {scan_threads: {}}", "tenants[0].policy_threads.get_scan.scan_threads",
     "needs `comm`"),
    ("get_scan: {scan_threads: {comm: ''}}",
     "tenants[0].policy_threads.get_scan.scan_threads.comm", "non-empty glob"),
    ("get_scan: {scan_threads: {comm: 7}}",
     "tenants[0].policy_threads.get_scan.scan_threads.comm", "valid string"),
    ("get_scan: {scan_threads: {comm: 'rocksdb:high_priority*'}}",
     "tenants[0].policy_threads.get_scan.scan_threads.comm", "at most 15 bytes"),
    ("get_scan: {}", "tenants[0].policy_threads.get_scan", "at least one role: scan_threads"),
    ("get_scan: 'db_scan*'", "tenants[0].policy_threads.get_scan", "expected a mapping"),
])
def test_agent_policy_threads_errors_name_key_and_expectation(tmp_path, body, key, expect):
    with pytest.raises(UserError) as err:
        agent_config(tmp_path, body)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "agent.yaml")), msg
    assert f": {key}: " in msg, msg
    assert expect in msg, msg


def test_agent_policies_per_tenant_and_unknown_names(tmp_path):
    """A tenant's `policies` narrows the curves built for it; an unknown
    policy name, at the node or a tenant, is a config error naming the key
    (it used to surface as a traceback from the curve builder)."""
    from cachepilot.agent.config import config_from_dict
    base = {"roots": ["/sys/fs/cgroup"],
            "tenants": [{"name": "kv", "cgroup": "kv", "policies": ["linux", "s3fifo"]},
                        {"name": "web", "cgroup": "web"}]}
    cfg = config_from_dict(base, "a.yaml")
    assert cfg.tenants[0].policies == ["linux", "s3fifo"]
    assert cfg.tenants[1].policies is None
    for where, patch in (("policies", {"policies": ["lru", "nosuch"]}),
                         ("tenants[1].policies",
                          {"tenants": [base["tenants"][0],
                                       {"name": "web", "cgroup": "web",
                                        "policies": ["nosuch"]}]})):
        with pytest.raises(UserError) as err:
            config_from_dict({**base, **patch}, "a.yaml")
        msg = str(err.value)
        assert f"{where}: unknown policy 'nosuch'; accepted: " in msg, msg
        assert "s3fifo" in msg and "\n" not in msg
    with pytest.raises(UserError, match="tenants.0.policies|tenants\\[0\\].policies"):
        config_from_dict({**base, "tenants": [{"name": "kv", "cgroup": "kv",
                                               "policies": []}]}, "a.yaml")


def test_agent_builds_each_tenants_own_curves(tmp_path, monkeypatch):
    """The backend's builders compute the tenant's policies when it names
    them, the node's otherwise."""
    from types import SimpleNamespace
    from cachepilot.agent.backends import linux
    from cachepilot.agent.config import config_from_dict
    root = tmp_path / "cg"
    for n in ("kv", "web"):
        (root / n).mkdir(parents=True)
    cfg = config_from_dict({"roots": [str(root)], "policies": ["lru", "fifo", "mru"],
                            "tenants": [{"name": "kv", "cgroup": "kv",
                                         "policies": ["lru", "s3fifo"]},
                                        {"name": "web", "cgroup": "web"}]}, "a.yaml")
    made = []
    monkeypatch.setattr(linux, "make_builder", lambda policies, **kw: made.append(
        tuple(policies)) or SimpleNamespace(threshold=1 << 20))
    monkeypatch.setattr(linux.cgroups, "version_of", lambda p: 2)
    monkeypatch.setattr(linux.cgroups, "cgroup_id", lambda p: len(str(p)))
    monkeypatch.setattr(linux.cgroups, "read_stats", lambda p: SimpleNamespace())
    backend = linux.LinuxBackend.__new__(linux.LinuxBackend)
    backend.cfg, backend.policies, backend.memory_bytes = cfg, ["lru", "fifo", "mru"], 1 << 30
    backend.watched, backend.default_policy, backend.budget = {}, "none", None
    backend.tenants = cfg.tenants
    backend.sampler = SimpleNamespace(watch=lambda cgid, threshold: None,
                                      counters=lambda: (0, {}))
    backend._refresh()
    assert sorted(made) == [("lru", "fifo", "mru"), ("lru", "s3fifo")]


def test_lookups_by_name_follow_the_lists_they_index():
    """Config.tenant/node/tenants_on answer from an index (a controller
    looks tenants up on every report); the index must never answer from a
    list that was replaced, grown or copied."""
    from cachepilot.controller.config import config_from_dict
    c = config_from_dict({"nodes": [{"name": "n1", "memory_bytes": 1 << 30},
                                    {"name": "n2", "memory_bytes": 1 << 30}],
                          "tenants": [{"name": "a", "node": "n1"},
                                      {"name": "b", "node": "n2"}]})
    assert c.tenant("a").node == "n1" and [t.name for t in c.tenants_on("n2")] == ["b"]
    copy = c.model_copy(deep=True)
    assert copy.tenant("a") is copy.tenants[0] and copy.tenant("a") is not c.tenant("a")
    c.tenants.append(c.tenants[1].model_copy(update={"name": "z", "node": "n1"}))
    assert [t.name for t in c.tenants_on("n1")] == ["a", "z"] and c.tenant("z").node == "n1"
    c.tenants = [c.tenants[1]]
    with pytest.raises(KeyError):
        c.tenant("a")
    assert c.tenants_on("n1") == [] and c.node("n2").name == "n2"
    with pytest.raises(KeyError):
        c.node("n3")
