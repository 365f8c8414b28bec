"""cachepilot as a user installs it: a fresh venv outside the checkout,
`pip install <checkout>` with its dependencies resolved from the package
index (build isolation, so setuptools and wheel come from there too), then
the installed `cachepilot` command: `doctor`, and `profile` sampling fio in
a real memory cgroup.  The build prints no setuptools warning, and the
installed package carries the sampler, the policy loader and every policy
object and finds them in itself, never in the checkout.

One install (about a minute) serves every test here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot.agent.testbed import (SCRATCH, have, in_cgroup, make_file, scratch_cgroup,
                                      v1_memory_available, v2_memory_root)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# the interpreter the checkout's .venv was made from, not the .venv itself
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"
# setuptools' informational line for every wheel (bdist_wheel turns
# byte-compiling off); no other line may mention a warning
BENIGN = ("byte-compiling is disabled",)


def clean_env() -> dict:
    """The environment of a user's shell: nothing of the test's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not Path(p).resolve().is_relative_to(REPO))
    return env


class Venv:
    def __init__(self, home: Path):
        self.home = home
        self.bin = home / "bin"
        self.work = home.parent / "work"      # a working folder outside the checkout
        self.work.mkdir(exist_ok=True)

    def run(self, *args, timeout=300, **kw):
        return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                              env=clean_env(), cwd=self.work, timeout=timeout, **kw)

    def site(self) -> Path:
        r = self.run(self.bin / "python", "-c", "import sysconfig; "
                     "print(sysconfig.get_paths()['purelib'])")
        assert r.returncode == 0, r.stderr
        return Path(r.stdout.strip())


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("installed")
    assert not root.resolve().is_relative_to(REPO)
    v = Venv(root / "venv")
    r = subprocess.run([str(BASE_PYTHON), "-m", "venv", str(v.home)], capture_output=True,
                       text=True, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    r = v.run(v.bin / "pip", "install", "-v", REPO, timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    noisy = [line for line in (r.stdout + r.stderr).splitlines()
             if ("warning" in line.lower() or "deprecat" in line.lower())
             and not any(b in line for b in BENIGN)]
    assert not noisy, "\n".join(noisy[:40])
    # the dependencies came from the index into the venv, and agree
    r = v.run(v.bin / "pip", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    return v


def test_the_dependencies_resolve_inside_the_venv(venv):
    site = venv.site()
    r = venv.run(venv.bin / "python", "-c",
                 "import numpy, scipy, grpc, yaml, zstandard, cachepilot; "
                 "print(numpy.__file__); print(grpc.__file__); print(cachepilot.__file__)")
    assert r.returncode == 0, r.stderr
    for p in r.stdout.split():
        assert Path(p).is_relative_to(site), p


def test_the_package_carries_the_bpf_side(venv):
    site = venv.site()
    records = list(site.glob("cachepilot-*.dist-info/RECORD"))
    assert len(records) == 1
    names = {line.split(",")[0] for line in records[0].read_text().splitlines()}
    assert "cachepilot/agent/bpf/sampler" in names
    assert "cachepilot/agent/bpf/policyctl" in names
    policies = {Path(n).name for n in names if n.startswith("cachepilot/agent/bpf/policies/")}
    built = {p.name for p in (REPO / "bpf" / "out" / "policies").glob("*.bpf.o")}
    assert built and policies == built
    # the native core and the proto come along too
    assert any(n.startswith("cachepilot/models/_mrc") for n in names)
    assert any(n.startswith("cachepilot/models/_runtime") for n in names)
    assert "cachepilot/protocol/cachepilot.proto" in names
    # ... and none of the C sources as packages of their own
    assert not any(n.startswith("cachepilot/models/native/") for n in names)
    assert os.access(site / "cachepilot/agent/bpf/sampler", os.X_OK)
    # the policy sources and the header they are written against, so that
    # a policy of the user's own compiles against the installed package
    assert "cachepilot/bpf/include/cache_ext_policy.h" in names
    assert "cachepilot/bpf/policies/template/policy.bpf.c" in names
    shipped = {Path(n).name for n in names if n.startswith("cachepilot/bpf/policies/")
               and n.count("/") == 3}
    assert shipped == {p.name for p in (REPO / "bpf" / "policies").glob("*.bpf.c")}


def test_a_users_policy_compiles_against_the_installed_package(venv):
    mine = venv.work / "mine.bpf.c"
    mine.write_text((REPO / "bpf" / "policies" / "lru.bpf.c").read_text())
    r = venv.run(venv.bin / "python", "-c",
                 "import cachepilot.models.runtime as rt; "
                 f"print(rt.POLICY_INCLUDE); print(rt.load_policy_source({str(mine)!r}))")
    assert r.returncode == 0, r.stderr
    include, name = r.stdout.split()
    assert Path(include).is_relative_to(venv.site())
    assert name == "lru@mine"


def test_installed_code_finds_its_own_binaries(venv):
    site = venv.site()
    r = venv.run(venv.bin / "python", "-c",
                 "import cachepilot, cachepilot.agent.binaries as b; "
                 "print(cachepilot.__file__); print(b.sampler()); print(b.policy_dir()); "
                 "print(b.policyctl())")
    assert r.returncode == 0, r.stderr
    for p in r.stdout.split():
        assert Path(p).is_relative_to(site), p
        assert not Path(p).resolve().is_relative_to(REPO), p


def test_the_installed_command_answers(venv):
    r = venv.run(venv.bin / "cachepilot", "--help")
    assert r.returncode == 0 and "doctor" in r.stdout, r.stdout + r.stderr
    # a command that needs the native core, on a trace it makes itself
    trace = venv.work / "zipf.txt"
    r = venv.run(venv.bin / "cachepilot", "trace", "gen", "zipf", "--keys", "500",
                 "--count", "20000", "-o", trace)
    assert r.returncode == 0, r.stderr
    r = venv.run(venv.bin / "cachepilot", "mrc", trace, "--json", venv.work / "mrc.json")
    assert r.returncode == 0, r.stderr
    doc = json.loads((venv.work / "mrc.json").read_text())
    assert doc["requests"] == 20000 and doc["curves"][0]["miss_ratio"]


def test_installed_doctor_then_profile_samples_for_real(venv):
    r = venv.run(venv.bin / "cachepilot", "doctor", "--json")
    doc = json.loads(r.stdout)
    if os.geteuid() != 0:
        assert r.returncode == 1 and not doc["can_sample"]
        pytest.skip("sampling for real needs root")
    sampler = [c for c in doc["checks"] if c["name"] == "sampler"][0]
    assert r.returncode == 0 and doc["can_sample"], doc
    assert str(venv.site()) in sampler["detail"]
    root = Path("/sys/fs/cgroup/memory") if v1_memory_available() is None else v2_memory_root()
    if root is None or not have("fio"):
        pytest.skip("no memory cgroup hierarchy or no fio")
    data = make_file(SCRATCH / "packaging-32m.dat", 32 << 20)
    out = venv.work / "profile.json"
    with scratch_cgroup("cp_packaging", root) as cg:
        reader = subprocess.Popen(in_cgroup(cg, [
            "fio", "--name=r", f"--filename={data}", "--rw=randread", "--bs=4k",
            "--time_based", "--runtime=8", "--invalidate=0"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            r = venv.run(venv.bin / "cachepilot", "profile", "--cgroup", cg,
                         "--duration", "3", "--rate", "0.1", "--json", out)
        finally:
            reader.wait(timeout=60)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert "stats-only" not in r.stderr + json.dumps(prof)
    c = prof["cgroup"]
    # 32 MiB read at random for 3 s: every one of its 8192 pages many times
    assert c["accesses"] > 8192 and c["sampled"] > 0, c
    curve = prof["curves"][0]
    assert len(curve["sizes"]) > 1
    # the file fits in memory: a cache of the whole file misses (almost) nothing
    assert curve["miss_ratio"][-1] < 0.2, curve
