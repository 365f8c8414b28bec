"""The deployment files under deploy/: the systemd units pass
`systemd-analyze verify` (and its offline security score stays low), the
Prometheus rules pass `promtool check rules`, and promtool's rule unit tests
(deploy/prometheus/cachepilot-rules.test.yaml) provoke every alert."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CACHEPILOT = Path(sys.executable).parent / "cachepilot"    # the venv running the tests
UNITS = ("cachepilot-agent.service", "cachepilot-controller.service")


def need(tool):
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (make deps installs it)")
    return path


def units_for_this_host(tmp_path):
    """The units with ExecStart naming this checkout's cachepilot, since
    verify checks that the command exists (the shipped units name
    /usr/local/bin/cachepilot, where pip puts it system-wide)."""
    out = []
    for name in UNITS:
        text = (DEPLOY / "systemd" / name).read_text()
        assert "/usr/local/bin/cachepilot " in text
        (tmp_path / name).write_text(text.replace("/usr/local/bin/cachepilot", str(CACHEPILOT)))
        out.append(tmp_path / name)
    return out


def test_units_verify(tmp_path):
    analyze = need("systemd-analyze")
    units = units_for_this_host(tmp_path)
    r = subprocess.run([analyze, "verify", "--man=no", *map(str, units)],
                       capture_output=True, text=True, timeout=120)
    # verify exits 0 on an unknown key but says so: any line is a finding
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr
    # ... and it does catch a broken unit (so the check above can fail)
    bad = tmp_path / "bad.service"
    bad.write_text(units[0].read_text().replace("Restart=", "Restartt="))
    r = subprocess.run([analyze, "verify", "--man=no", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert "Unknown key" in r.stderr


@pytest.mark.parametrize("unit,most", [("cachepilot-agent.service", 5.0),
                                       ("cachepilot-controller.service", 2.0)])
def test_units_are_hardened(tmp_path, unit, most):
    """systemd's own exposure score (0 safest, 10 unprotected): the agent
    needs BPF and cgroup writes, the controller needs nothing."""
    analyze = need("systemd-analyze")
    path = [u for u in units_for_this_host(tmp_path) if u.name == unit][0]
    r = subprocess.run([analyze, "security", "--offline=yes", str(path)],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= most
    text = path.read_text()
    if unit == "cachepilot-agent.service":
        caps = re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M).group(1).split()
        assert sorted(caps) == ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE"]
        assert "ProtectControlGroups=yes" not in text      # it writes limits
    else:
        assert re.search(r"^CapabilityBoundingSet=$", text, re.M)


def test_rules_check_and_every_alert_is_provoked():
    promtool = need("promtool")
    rules = DEPLOY / "prometheus" / "cachepilot-rules.yaml"
    r = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "cachepilot-rules.test.yaml"],
                       cwd=rules.parent, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    alerts = {rule["alert"] for g in yaml.safe_load(rules.read_text())["groups"]
              for rule in g["rules"] if "alert" in rule}
    tests = yaml.safe_load((rules.parent / "cachepilot-rules.test.yaml").read_text())
    fired = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", [])
             if a["exp_alerts"]}
    assert alerts == fired


def test_rule_tests_fail_when_a_rule_changes(tmp_path):
    """The rule unit tests are not vacuous: doubling an alert's `for:`
    makes them fail."""
    promtool = need("promtool")
    src = DEPLOY / "prometheus"
    text = (src / "cachepilot-rules.yaml").read_text()
    (tmp_path / "cachepilot-rules.yaml").write_text(text.replace("for: 10m", "for: 20m"))
    shutil.copy(src / "cachepilot-rules.test.yaml", tmp_path)
    r = subprocess.run([promtool, "test", "rules", "cachepilot-rules.test.yaml"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "CachepilotSLOMissed" in r.stdout + r.stderr
