"""`cachepilot policy list | check | register-tids`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cachepilot.main import main
from cachepilot.models import runtime
from cachepilot.models.policy_cli import CP_TID_REGISTERED
from cachepilot.models.traces import records
from cachepilot.models.traces.readers import open_trace

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "bpf" / "policies" / "template" / "policy.bpf.c"
HAVE_BPF_TOOLS = bool(shutil.which("clang") and shutil.which("bpftool"))


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_every_policy_with_what_it_does(capsys):
    rc, out, _ = run(capsys, "policy", "list", "--json")
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(runtime.available_policies()) == set(rows)
    for name in ("lfu", "s3fifo", "lhd", "mglru", "hyperbolic", "get_scan",
                 "admit_filter"):
        assert rows[name]["source"] == f"bpf/policies/{name}.bpf.c"
        assert len(rows[name]["description"]) > 20
    assert rows["get_scan"]["tid_maps"] == ["gs_tids"]
    assert rows["admit_filter"]["tid_maps"] == ["af_tids"]
    assert rows["lfu"]["tid_maps"] == []
    rc, out, _ = run(capsys, "policy", "list")
    assert rc == 0 and "s3fifo" in out and "[tids: gs_tids]" in out


@pytest.mark.skipif(not HAVE_BPF_TOOLS, reason="clang/bpftool not installed")
def test_check_compiles_the_template_both_ways_and_prints_its_curve(
        capsys, tmp_path):
    report = tmp_path / "report.json"
    rc, out, err = run(capsys, "policy", "check", str(TEMPLATE),
                       "--accesses", "60000", "--json", str(report))
    assert rc == 0, err
    assert "native build: ok (policy 'clock')" in out
    assert "bpf build: ok" in out and "BTF:" in out
    assert "check passed" in out
    rep = json.loads(report.read_text())
    sizes = rep["curve"]["sizes"]
    assert len(sizes) == 6 and sizes == sorted(sizes)
    ratios = rep["curve"]["miss_ratio"]
    assert all(0 < r < 1 for r in ratios)
    assert ratios[-1] < ratios[0]
    assert rep["stats"]["fallback_evictions"] == 0
    # every size is printed
    for s in sizes:
        assert f"\n{s:>12}  " in out
    # CLOCK is close to LRU, not equal to it everywhere
    assert rep["curve"]["miss_ratio"] != rep["lru"]["miss_ratio"]


def test_check_fails_a_policy_that_leaves_eviction_to_the_fallback(
        capsys, tmp_path):
    lazy = tmp_path / "lazy.bpf.c"
    lazy.write_text(TEMPLATE.read_text()
                    .replace("CP_POLICY(clock,", "CP_POLICY(lazy_clock,")
                    .replace("return CACHE_EXT_ITER_EVICT;",
                             "return CACHE_EXT_ITER_STOP;"))
    rc, out, err = run(capsys, "policy", "check", str(lazy), "--no-bpf",
                       "--accesses", "20000")
    assert rc == 1
    assert "check failed" in err
    assert "bpf build: skipped" in out


def test_check_refuses_bad_input_with_one_line(tmp_path):
    broken = tmp_path / "broken.bpf.c"
    broken.write_text('#include "cache_ext_policy.h"\nthis is not C\n')
    for argv in (["policy", "check", str(broken), "--no-bpf"],
                 ["policy", "check", str(tmp_path / "missing.bpf.c")],
                 ["policy", "check", str(TEMPLATE), "--sizes", "10,5"],
                 ["policy", "register-tids", "abc", "--policy-map", "/x"],
                 ["policy", "register-tids", "0", "--policy-map", "/x"],
                 ["policy", "register-tids", "12"]):
        proc = subprocess.run([sys.executable, "-m", "cachepilot", *argv],
                              capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert lines[0].startswith("cachepilot policy: error:")


def test_register_tids_annotates_a_trace_for_the_simulator(capsys, tmp_path):
    keys = np.concatenate([np.arange(600), np.arange(10**6, 10**6 + 20000),
                           np.arange(600)]).astype(np.uint64)
    tids = np.concatenate([np.full(600, 1001), np.full(20000, 2002),
                           np.full(600, 1001)]).astype(np.uint32)
    src, dst = tmp_path / "in.cpaccess", tmp_path / "out.cpaccess"
    records.write_records(src, records.make_records(keys, tids=tids))
    rc, out, _ = run(capsys, "policy", "register-tids", "2002",
                     "--trace", str(src), "--out", str(dst))
    assert rc == 0 and "20000 accesses" in out
    got_keys, got_tids = [], []
    for k, t in open_trace(dst).chunks_with_tids():
        got_keys.append(k)
        got_tids.append(t)
    got_keys, got_tids = np.concatenate(got_keys), np.concatenate(got_tids)
    assert np.array_equal(got_keys, keys)
    assert np.array_equal(got_tids & ~np.uint32(CP_TID_REGISTERED), tids)
    assert np.array_equal((got_tids & np.uint32(CP_TID_REGISTERED)) != 0,
                          tids == 2002)
    # the simulation of get_scan sees the registration: the final GET
    # re-reads all hit, where the unannotated trace makes them miss
    annotated = runtime.Cache("get_scan", 1000)
    annotated.access(got_keys[:-600], got_tids[:-600])
    assert annotated.access(got_keys[-600:], got_tids[-600:]) == 0
    plain = runtime.Cache("get_scan", 1000)
    plain.access(keys[:-600], tids[:-600])
    assert plain.access(keys[-600:], tids[-600:]) > 300
    # and --remove takes it back
    back = tmp_path / "back.cpaccess"
    rc, _, _ = run(capsys, "policy", "register-tids", "2002", "--remove",
                   "--trace", str(dst), "--out", str(back))
    assert rc == 0
    _, recs = records.read_records(back)
    assert np.array_equal(recs["tid"], tids)


needs_bpffs = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("bpftool") or
    not Path("/sys/fs/bpf").is_dir(),
    reason="needs root, bpftool and a bpffs at /sys/fs/bpf")


def dump_map(pin: Path) -> list:
    return json.loads(subprocess.run(["bpftool", "-j", "map", "dump", "pinned", str(pin)],
                                     check=True, capture_output=True, text=True).stdout)


def pinned_map(tag: str, key: int, value: int, entries: int, name: str) -> Path:
    """A hash map made with bpftool and pinned in bpffs (the caller unlinks it)."""
    pin = Path(f"/sys/fs/bpf/cachepilot_test_{tag}_{os.getpid()}")
    subprocess.run(["bpftool", "map", "create", str(pin), "type", "hash",
                    "key", str(key), "value", str(value), "entries", str(entries),
                    "name", name], check=True)
    return pin


@needs_bpffs
def test_register_tids_fills_a_pinned_kernel_map(capsys):
    pin = pinned_map("tids", 4, 1, 64, "gs_tids")
    try:
        rc, out, err = run(capsys, "policy", "register-tids", "4242", "77",
                           "--policy-map", str(pin))
        assert rc == 0, err
        dump = dump_map(pin)
        found = {int.from_bytes(bytes(int(b, 16) for b in e["key"]), "little")
                 for e in dump}
        assert found == {4242, 77}
        assert all([int(b, 16) for b in e["value"]] == [1] for e in dump)
        rc, _, _ = run(capsys, "policy", "register-tids", "77", "--remove",
                       "--policy-map", str(pin))
        assert rc == 0
        dump = dump_map(pin)
        assert len(dump) == 1
        # a process: all its threads at once
        rc, _, err = run(capsys, "policy", "register-tids", "--threads-of",
                         str(os.getpid()), "--policy-map", str(pin))
        assert rc == 0, err
        dump = dump_map(pin)
        found = {int.from_bytes(bytes(int(b, 16) for b in e["key"]), "little")
                 for e in dump}
        threads = {int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")}
        assert found == threads | {4242}
    finally:
        pin.unlink()


@needs_bpffs
def test_register_tids_refuses_a_map_that_is_not_a_tid_map(capsys):
    pin = pinned_map("notids", 8, 8, 4, "other")
    try:
        rc, _, err = run(capsys, "policy", "register-tids", "5",
                         "--policy-map", str(pin))
        assert rc == 2 and "not a tid map" in err
    finally:
        pin.unlink()
    rc, _, err = run(capsys, "policy", "register-tids", "5",
                     "--cgroup", "tenant-a", "--policy", "get_scan")
    assert rc == 2 and "give the cgroup's directory" in err
    # an existing cgroup directory: the pin policyctl makes, by cgroup id
    rc, _, err = run(capsys, "policy", "register-tids", "5",
                     "--cgroup", "/", "--policy", "get_scan")
    assert rc == 2
    assert f"/sys/fs/bpf/cachepilot/{os.stat('/').st_ino}/gs_tids" in err


LIBRARY = ["lfu", "s3fifo", "lhd", "mglru", "hyperbolic", "get_scan",
           "admit_filter"]


def test_mrc_draws_every_policy_of_the_library_in_one_pass(
        oltp_lis, tmp_path, capsys):
    """`cachepilot mrc OLTP.lis.zst --policy all --method minisim --plot`:
    one curve per policy, the library's included, each a real curve."""
    out_json, png = tmp_path / "all.json", tmp_path / "all.png"
    rc = main(["mrc", str(oltp_lis), "--policy", "all", "--method",
               "minisim", "--json", str(out_json), "--plot", str(png),
               "--no-progress"])
    capsys.readouterr()
    assert rc == 0
    curves = {c["policy"]: c for c in json.loads(out_json.read_text())["curves"]}
    assert set(LIBRARY) <= set(curves)
    assert set(runtime.available_policies()) <= set(curves)
    for name in LIBRARY:
        ratios = curves[name]["miss_ratio"]
        assert curves[name]["method"] == "minisim"
        assert ratios[-1] < ratios[0] - 0.3     # OLTP's curve falls a lot
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
