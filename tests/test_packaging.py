"""cachepilot as a package, away from its checkout: the wheel builds without
a setuptools warning, carries the sampler, the policy loader and every
policy object, and the installed code (run from a folder outside the
checkout) finds them in the package, passes `cachepilot doctor`, and
samples a real cgroup with `cachepilot profile`."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cachepilot.agent.testbed import (SCRATCH, have, in_cgroup, make_file, scratch_cgroup,
                                      v1_memory_available, v2_memory_root)

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(REPO)], capture_output=True, text=True,
                       timeout=900, cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    # setuptools' warnings (deprecated fields, undeclared packages) would
    # show on stderr; the editable notice of `make build` is not built here
    assert "Warning" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    wheels = list(out.glob("cachepilot-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_the_wheel_carries_the_bpf_side(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cachepilot/agent/bpf/sampler" in names
    assert "cachepilot/agent/bpf/policyctl" in names
    policies = {Path(n).name for n in names if n.startswith("cachepilot/agent/bpf/policies/")}
    built = {p.name for p in (REPO / "bpf" / "out" / "policies").glob("*.bpf.o")}
    assert built and policies == built
    # the native core and the proto come along too
    assert any(n.startswith("cachepilot/models/_mrc") for n in names)
    assert "cachepilot/protocol/cachepilot.proto" in names
    # ... and none of the C sources as packages of their own
    assert not any(n.startswith("cachepilot/models/native/") for n in names)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The wheel unpacked into a folder of its own (dependencies from the
    test's venv), and a working directory outside the checkout."""
    site = tmp_path_factory.mktemp("site")
    r = subprocess.run([PY, "-m", "pip", "install", "--no-deps", "--target", str(site),
                        str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    env = dict(os.environ, PYTHONPATH=str(site))
    return site, env


def run_installed(installed, *args, **kw):
    site, env = installed
    return subprocess.run([PY, *args], capture_output=True, text=True, env=env,
                          cwd=site.parent, timeout=kw.pop("timeout", 300), **kw)


def test_installed_code_finds_its_own_binaries(installed):
    site, _ = installed
    r = run_installed(installed, "-c", "import cachepilot, cachepilot.agent.binaries as b; "
                      "print(cachepilot.__file__); print(b.sampler()); print(b.policy_dir())")
    assert r.returncode == 0, r.stderr
    module, sampler, policies = r.stdout.split()
    for p in (module, sampler, policies):
        assert Path(p).is_relative_to(site), p
    assert not Path(sampler).is_relative_to(REPO)


def test_installed_doctor_and_profile_sample_for_real(installed):
    r = run_installed(installed, "-m", "cachepilot", "doctor", "--json")
    doc = json.loads(r.stdout)
    if os.geteuid() != 0:
        assert r.returncode == 1 and not doc["can_sample"]
        pytest.skip("sampling for real needs root")
    sampler = [c for c in doc["checks"] if c["name"] == "sampler"][0]
    assert r.returncode == 0 and doc["can_sample"], doc
    assert str(installed[0]) in sampler["detail"]
    root = Path("/sys/fs/cgroup/memory") if v1_memory_available() is None else v2_memory_root()
    if root is None or not have("fio"):
        pytest.skip("no memory cgroup hierarchy or no fio")
    data = make_file(SCRATCH / "packaging-32m.dat", 32 << 20)
    with scratch_cgroup("cp_packaging", root) as cg:
        reader = subprocess.Popen(in_cgroup(cg, [
            "fio", "--name=r", f"--filename={data}", "--rw=randread", "--bs=4k",
            "--time_based", "--runtime=6", "--invalidate=0"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            out = installed[0].parent / "profile.json"
            r = run_installed(installed, "-m", "cachepilot", "profile", "--cgroup", str(cg),
                              "--duration", "3", "--rate", "0.1", "--json", str(out))
        finally:
            reader.wait(timeout=60)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    text = json.dumps(prof)
    assert "stats-only" not in r.stderr + text
    c = prof["cgroup"]
    assert c["accesses"] > 1000 and c["sampled"] > 0, c
    assert prof["curves"] and len(prof["curves"][0]["sizes"]) > 1
