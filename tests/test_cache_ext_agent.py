"""The agent's policy actuation (agent/cache_ext.py and the linux backend's
directives) against a stand-in policyctl and cgroup tree, and the real
policyctl's refusals that need no cache_ext kernel.  Attaching for real is
the VM's business (kernel/tests/agent-in-vm.sh, make kernel-test)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot.agent.backends.linux import LinuxBackend
from cachepilot.agent.cache_ext import (POLICYCTL, PolicyActuator, PolicyError,
                                        running_policy)
from cachepilot.agent.config import config_from_dict
from cachepilot.protocol.types import Directive

from test_cgroups_tree import make_v2

MiB = 1 << 20

# A stand-in policyctl: keeps the "kernel" in memory.cache_ext of the cgroup
# and the pins in a folder, logs its calls, refuses policy "bad".
FAKE = r'''#!{python}
import os, sys
args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("--"):
    opts.setdefault(args[0], []).append(args[1]); args = args[2:]
pins = opts["--pin-root"][0]
open(os.path.join(pins, "calls.log"), "a").write(" ".join(args) + "\n")
cmd = args[0]
def cgid(cg): return str(os.stat(cg).st_ino)
def say(cg, policy):
    open(os.path.join(cg, "memory.cache_ext"), "w").write(f"policy {{policy}}\nnodes_all_cgroups 0\n")
if cmd in ("attach", "swap"):
    cg, pol = args[1], args[2]
    if pol == "bad":
        sys.stderr.write("policyctl: bad: the kernel refused to load it: Permission denied (libbpf: R1 invalid mem access)\n")
        sys.exit(1)
    os.makedirs(os.path.join(pins, cgid(cg)), exist_ok=True)
    open(os.path.join(pins, cgid(cg), "link"), "w").close()
    say(cg, pol)
    # sized for the cgroup's limit as it is now (the host's 8 GiB without one)
    limit = open(os.path.join(cg, "memory.max")).read().strip()
    pages = int(opts.get("--capacity", [0])[0]) or (int(limit) if limit.isdigit() else 8 << 30) // 4096
    open(os.path.join(pins, cgid(cg), "cp_stats"), "w").write(f"capacity {{pages}}\noverflow 0\n")
elif cmd == "stats":
    f = os.path.join(pins, cgid(args[1]), "cp_stats")
    if not os.path.exists(f):
        sys.stderr.write("policyctl: no policy of ours runs there\n")
        sys.exit(1)
    sys.stdout.write(open(f).read())
    sys.exit(0)
elif cmd == "detach":
    cg = args[1]
    for f in ("link", "cp_stats"):
        if os.path.exists(os.path.join(pins, cgid(cg), f)):
            os.unlink(os.path.join(pins, cgid(cg), f))
    os.rmdir(os.path.join(pins, cgid(cg)))
    say(cg, "none")
elif cmd == "list":
    for d in sorted(os.listdir(pins)):
        if d.isdigit():
            print(d, "x_ops")
elif cmd == "drop":
    d = os.path.join(pins, args[1])
    for f in os.listdir(d): os.unlink(os.path.join(d, f))
    os.rmdir(d)
print("ok")
'''


@pytest.fixture
def fake(tmp_path):
    loader = tmp_path / "policyctl"
    loader.write_text(FAKE.format(python=sys.executable))
    loader.chmod(0o755)
    pins = tmp_path / "pins"
    pins.mkdir()
    pdir = tmp_path / "policies"
    pdir.mkdir()
    for p in ("lru", "mru", "fifo"):
        (pdir / f"{p}.bpf.o").write_bytes(b"")
    root = tmp_path / "cg"
    make_v2(root / "db", current=100 * MiB, file=80 * MiB, anon=10 * MiB)
    make_v2(root / "web", current=100 * MiB, file=80 * MiB, anon=10 * MiB)
    act = PolicyActuator([str(root)], "linux", policy_dir=pdir, pin_root=pins, loader=loader)
    return act, root, pins


def calls(pins):
    p = pins / "calls.log"
    return p.read_text().splitlines() if p.exists() else []


def test_running_policy_reads_the_kernel(tmp_path):
    assert running_policy(tmp_path, "linux") == "linux"        # no cache_ext file
    (tmp_path / "memory.cache_ext").write_text("policy none\nnodes_all_cgroups 3\n")
    assert running_policy(tmp_path, "linux") == "linux"
    (tmp_path / "memory.cache_ext").write_text("policy mru\ntracked 5\n")
    assert running_policy(tmp_path, "linux") == "mru"


def test_attach_then_swap_then_detach(fake):
    act, root, pins = fake
    db = str(root / "db")
    cgid = os.stat(db).st_ino
    assert "attached" in act.apply(db, "mru", cgid)
    assert running_policy(db, "linux") == "mru"
    assert "swapped live" in act.apply(db, "fifo", cgid)       # a pin exists: swap
    assert act.apply(db, "fifo", cgid) == "fifo already runs"  # nothing to do
    assert "detached" in act.apply(db, "linux", cgid)
    assert running_policy(db, "linux") == "linux"
    verbs = [c.split()[0] for c in calls(pins)]
    assert verbs == ["attach", "swap", "detach"]
    assert act.available() == ["fifo", "lru", "mru"]


def test_tids_go_with_the_attach(fake):
    act, root, pins = fake
    db = str(root / "db")
    act.apply(db, "mru", os.stat(db).st_ino, {"gs_tids": [12, 40], "af_tids": []})
    assert calls(pins)[-1] == f"attach {db} mru gs_tids=12,40"


def test_a_refusal_is_one_line_and_changes_nothing(fake):
    act, root, pins = fake
    db = str(root / "db")
    act.apply(db, "mru", os.stat(db).st_ino)
    with pytest.raises(PolicyError) as err:
        act.apply(db, "bad", os.stat(db).st_ino)
    assert "refused" in str(err.value) and "\n" not in str(err.value)
    assert running_policy(db, "linux") == "mru"


def test_detaching_a_policy_that_is_not_ours_is_refused(fake):
    act, root, pins = fake
    web = root / "web"
    (web / "memory.cache_ext").write_text("policy lfu\n")     # attached by someone else
    with pytest.raises(PolicyError, match="no link of ours"):
        act.apply(str(web), "linux", os.stat(web).st_ino)
    assert running_policy(web, "linux") == "lfu"


def test_adopt_keeps_watched_pins_and_drops_those_of_gone_cgroups(fake):
    act, root, pins = fake
    db, web = str(root / "db"), str(root / "web")
    act.apply(db, "mru", os.stat(db).st_ino)
    (pins / "999999999").mkdir()                 # a cgroup id that exists nowhere
    (pins / "999999999" / "link").write_text("")
    lines = act.adopt({os.stat(db).st_ino: db})
    assert any("adopted" in ln and "mru runs" in ln for ln in lines)
    assert any("999999999" in ln and "gone" in ln for ln in lines)
    assert not (pins / "999999999").exists()
    assert (pins / str(os.stat(db).st_ino)).exists()
    # a pin of an existing cgroup the agent does not watch is left alone
    act.apply(web, "lru", os.stat(web).st_ino)
    lines = act.adopt({os.stat(db).st_ino: db})
    assert any("left the pinned policy" in ln for ln in lines)
    assert (pins / str(os.stat(web).st_ino)).exists()


def backend(root, fake_act, **extra):
    cfg = config_from_dict({"roots": [str(root)], "cgroups": ["*"], "memory": "8GiB",
                            "safety": {"floor": "64MiB", "anon_margin": "32MiB",
                                       "max_step": "1GiB"}, **extra})
    b = LinuxBackend(cfg, start_sampler=False)
    b.actuator = fake_act        # as on a cache_ext kernel
    return b


def test_backend_reports_what_runs_not_what_was_asked(fake):
    act, root, pins = fake
    b = backend(root, act)
    (res,) = b.apply([Directive("db", 200 * MiB, "mru")])
    assert res.ok and res.policy_ok and res.applied_policy == "mru"
    (res,) = b.apply([Directive("db", 200 * MiB, "bad")])
    assert res.ok and not res.policy_ok            # the limit part stands alone
    assert "refused" in res.policy_message and res.applied_policy == "mru"
    reports = {r.tenant: r for r in b.collect()}
    assert reports["db"].policy == "mru" and reports["web"].policy == "linux"


def test_backend_drops_the_pins_of_a_deleted_cgroup_once(fake, caplog):
    act, root, pins = fake
    b = backend(root, act)
    b.apply([Directive("db", 200 * MiB, "mru")])
    cgid = os.stat(root / "db").st_ino
    for f in (root / "db").iterdir():
        f.unlink()
    (root / "db").rmdir()
    assert [r.tenant for r in b.collect()] == ["web"]
    assert not (pins / str(cgid)).exists()
    said = [r.getMessage() for r in caplog.records if "pins removed" in r.getMessage()]
    assert len(said) == 1
    assert [r.tenant for r in b.collect()] == ["web"]   # carries on, says nothing more
    assert len([r for r in caplog.records if "pins removed" in r.getMessage()]) == 1


def test_backend_resizes_a_policy_for_a_raised_limit_and_reports_its_room(fake, caplog):
    """A policy is sized for the limit it was loaded under; raising the
    limit past that loads it afresh (a swap to itself) for the new limit,
    and the report carries the capacity and the pages it had no room for,
    with one warning per growth of that count."""
    act, root, pins = fake
    db = root / "db"
    (db / "memory.max").write_text(f"{100 * MiB}\n")
    b = backend(root, act)
    (res,) = b.apply([Directive("db", 100 * MiB, "mru")])
    assert res.ok and res.policy_ok
    stats = pins / str(os.stat(db).st_ino) / "cp_stats"
    assert act.stats(str(db)).capacity_pages == 100 * MiB // 4096
    (res,) = b.apply([Directive("db", 200 * MiB, "mru")])
    assert res.ok and res.policy_ok and res.applied_limit_bytes == 200 * MiB
    assert f"swap {db} mru" in calls(pins)
    reports = {r.tenant: r for r in b.collect()}
    assert (reports["db"].policy_capacity_pages, reports["db"].policy_overflow_pages) == \
        (200 * MiB // 4096, 0)
    assert (reports["web"].policy_capacity_pages, reports["web"].policy_overflow_pages) == (0, 0)
    # a lower limit needs no new instance
    swaps = len([c for c in calls(pins) if c.startswith("swap")])
    b.apply([Directive("db", 150 * MiB, "mru")])
    assert len([c for c in calls(pins) if c.startswith("swap")]) == swaps
    # pages the policy had no room for: reported, warned about once
    stats.write_text(f"capacity {200 * MiB // 4096}\noverflow 7\n")
    for _ in range(2):
        reports = {r.tenant: r for r in b.collect()}
        assert reports["db"].policy_overflow_pages == 7
    warned = [r for r in caplog.records if "had no room for 7 pages" in r.getMessage()]
    assert len(warned) == 1


# -- the real loader's refusals (no cache_ext kernel needed) -------------------

need_loader = pytest.mark.skipif(not POLICYCTL.exists(),
                                 reason=f"{POLICYCTL} not built (make -C bpf)")


def policyctl(*args):
    return subprocess.run([str(POLICYCTL), *args], capture_output=True, text=True)


@need_loader
@pytest.mark.parametrize("name", ["../../etc/passwd", "/tmp/x", "lru.bpf.o", "a b", ""])
def test_policyctl_takes_names_not_paths(name, tmp_path):
    p = policyctl("--pin-root", str(tmp_path), "attach", str(tmp_path), name)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a policy name" in lines[0]


@need_loader
def test_policyctl_refuses_cgroups_outside_its_roots(tmp_path):
    (tmp_path / "roots").mkdir()
    (tmp_path / "elsewhere").mkdir()
    p = policyctl("--root", str(tmp_path / "roots"), "--pin-root", str(tmp_path),
                  "attach", str(tmp_path / "elsewhere"), "lru")
    assert p.returncode == 1
    assert p.stderr.strip().count("\n") == 0
    assert "outside the configured roots" in p.stderr


@need_loader
@pytest.mark.parametrize("pages", ["0", "-1", "12x", "", "1e6"])
def test_policyctl_refuses_a_capacity_that_is_not_a_page_count(pages, tmp_path):
    p = policyctl("--capacity", pages, "--pin-root", str(tmp_path), "attach",
                  str(tmp_path), "lru")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"policyctl: --capacity {pages}: "
                                              "not a number of pages"]


@need_loader
def test_policyctl_stats_says_when_no_policy_of_ours_runs(tmp_path):
    p = policyctl("--pin-root", str(tmp_path), "stats", str(tmp_path))
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no policy statistics pinned" in lines[0]


@need_loader
def test_policyctl_loads_only_from_its_policy_directory(tmp_path):
    pdir = tmp_path / "policies"
    pdir.mkdir()
    (tmp_path / "evil.bpf.o").write_bytes(b"\x7fELF")
    (pdir / "evil.bpf.o").symlink_to(tmp_path / "evil.bpf.o")
    p = policyctl("--policy-dir", str(pdir), "--pin-root", str(tmp_path),
                  "attach", str(tmp_path), "evil")
    assert p.returncode == 1 and "outside the policy directory" in p.stderr
    p = policyctl("--policy-dir", str(pdir), "--pin-root", str(tmp_path),
                  "attach", str(tmp_path), "nosuch")
    assert p.returncode == 1 and "no policy nosuch" in p.stderr


@need_loader
def test_policyctl_usage_and_empty_list(tmp_path):
    assert policyctl().returncode == 2
    assert policyctl("frobnicate").returncode == 2
    p = policyctl("--pin-root", str(tmp_path / "none"), "list")
    assert p.returncode == 0 and p.stdout == ""


def bpffs_ok() -> bool:
    return os.geteuid() == 0 and Path("/sys/fs/bpf").is_dir() and \
        subprocess.run(["mountpoint", "-q", "/sys/fs/bpf"]).returncode == 0


def dump_tids(pin: Path) -> set[int]:
    import json
    dump = json.loads(subprocess.run(["bpftool", "-j", "map", "dump", "pinned", str(pin)],
                                     check=True, capture_output=True, text=True).stdout)
    return {int.from_bytes(bytes(int(b, 16) for b in e["key"]), "little") for e in dump}


@need_loader
@pytest.mark.skipif(not bpffs_ok(), reason="needs root and bpffs at /sys/fs/bpf")
def test_policyctl_tids_replaces_the_set_in_the_pinned_map(tmp_path, capsys):
    """The pin layout the agent, policyctl and `policy register-tids
    --cgroup` share: <pin root>/<cgroup id>/<map>."""
    from cachepilot.main import main
    pins = Path(f"/sys/fs/bpf/cachepilot-test-{os.getpid()}")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    pin = pins / str(os.stat(cgroup).st_ino) / "gs_tids"
    pin.parent.mkdir(parents=True)
    try:
        subprocess.run(["bpftool", "map", "create", str(pin), "type", "hash", "key", "4",
                        "value", "1", "entries", "64", "name", "gs_tids"], check=True)
        p = policyctl("--pin-root", str(pins), "tids", str(cgroup), "gs_tids", "5,6", "7")
        assert p.returncode == 0, p.stderr
        assert dump_tids(pin) == {5, 6, 7}
        p = policyctl("--pin-root", str(pins), "tids", str(cgroup), "gs_tids", "6")
        assert p.returncode == 0 and dump_tids(pin) == {6}
        p = policyctl("--pin-root", str(pins), "tids", str(cgroup), "af_tids", "6")
        assert p.returncode == 1 and "no map af_tids pinned" in p.stderr
        # register-tids finds the same pin from the cgroup's directory
        import cachepilot.models.policy_cli as pc
        old = pc.BPFFS_ROOT
        pc.BPFFS_ROOT = pins
        try:
            assert main(["policy", "register-tids", "99", "--cgroup", str(cgroup),
                         "--policy", "get_scan"]) == 0
        finally:
            pc.BPFFS_ROOT = old
        assert dump_tids(pin) == {6, 99}
    finally:
        subprocess.run(["rm", "-rf", str(pins)])
