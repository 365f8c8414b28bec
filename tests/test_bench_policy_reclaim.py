"""experiments/bench_policy_reclaim.py's reading of the guest's log: every
policy against fifo, and fio's CPU per read against the kernel's own policy
(`none`, which has no programs and no cache_ext counters)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import bench_policy_reclaim as bench  # noqa: E402


def fio_block(tag: str, ios: int, cpu_pct: float, runtime_ms: int = 10_000) -> str:
    job = {"jobs": [{"read": {"total_ios": ios}, "usr_cpu": cpu_pct / 2,
                     "sys_cpu": cpu_pct / 2, "job_runtime": runtime_ms}]}
    return f"FIO-BEGIN {tag}\n{json.dumps(job, indent=1)}\nFIO-END\n"


def policy_run(policy: str, rnd: int, ios: int, cpu_pct: float, evict_ns: int,
               other_ns: int, reclaimed: int = 1000, calls: int = 40) -> str:
    progs = [{"type": "struct_ops", "run_cnt": calls, "run_time_ns": evict_ns},
             {"type": "struct_ops", "run_cnt": 5000, "run_time_ns": other_ns},
             {"type": "tracepoint", "run_cnt": calls, "run_time_ns": 10 ** 9}]
    return (fio_block(f"{policy} {rnd}", ios, cpu_pct) +
            f"STATS {policy} {rnd} reclaimed {reclaimed} evict_calls {calls} "
            f"rejected 0 fallbacks 0\n" +
            f"PROGS {policy} {rnd} {json.dumps(progs)}\n")


def guest_log() -> str:
    # fio's CPU per read: 10 s x 50 % = 5 s; over 50,000 reads 100 us (kernel),
    # over 40,000 125 us (fifo), over 25,000 200 us (lfu)
    out = []
    for rnd in range(3):
        out.append(fio_block(f"none {rnd}", 50_000, 50.0))
        out.append(policy_run("fifo", rnd, 40_000, 50.0, evict_ns=100_000, other_ns=400_000))
        out.append(policy_run("lfu", rnd, 25_000, 50.0, evict_ns=300_000, other_ns=700_000))
    return "".join(out)


def test_every_policy_reads_against_fifo_and_the_kernels_own():
    table = bench.summarise(bench.parse(guest_log()))
    assert set(table) == {"none", "fifo", "lfu"}
    assert table["none"]["cpu_us_per_read"] == pytest.approx(100.0)
    assert table["none"]["cpu_per_read_vs_kernel"] == pytest.approx(1.0)
    assert "reclaim_vs_fifo" not in table["none"]
    assert table["fifo"]["cpu_per_read_vs_kernel"] == pytest.approx(1.25)
    assert table["lfu"]["cpu_per_read_vs_kernel"] == pytest.approx(2.0)
    assert table["lfu"]["cpu_per_read_vs_fifo"] == pytest.approx(1.6)
    # the evict_folios program is the one run as often as the cgroup's evict calls
    assert table["lfu"]["reclaim_vs_fifo"] == pytest.approx(3.0)
    assert table["lfu"]["hooks_vs_fifo"] == pytest.approx(2.0)


def test_without_the_kernels_own_run_the_ratio_is_unknown_not_made_up():
    log = "".join(policy_run(p, 0, 40_000, 50.0, 100_000, 400_000) for p in ("fifo", "lfu"))
    table = bench.summarise(bench.parse(log))
    assert set(table) == {"fifo", "lfu"}
    assert all(t["cpu_per_read_vs_kernel"] != t["cpu_per_read_vs_kernel"]   # NaN
               for t in table.values())


def test_a_policy_run_without_its_counters_is_an_error_but_the_kernels_needs_none():
    log = guest_log() + fio_block("s3fifo 0", 30_000, 50.0)
    with pytest.raises(SystemExit, match="s3fifo/0 is incomplete"):
        bench.parse(log)


def test_the_plot_has_the_kernels_panel(tmp_path):
    table = bench.summarise(bench.parse(guest_log()))
    bench.plot(table, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
