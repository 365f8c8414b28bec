#!/usr/bin/env python3
"""Overhead of the node agent on the workloads it watches.

fio does 4 KiB buffered random reads from a file that is fully in the page
cache (2 jobs, psync), in a memory cgroup, under four conditions,
interleaved in one run (several repetitions, the order rotating):

  none     nothing attached
  empty    empty tp_btf programs on the same tracepoints (`sampler
           --empty`): the floor, what attaching any program costs
  sampler  the BPF sampler alone watching the cgroup at R = 0.01
  agent    the real `cachepilot agent` (its sampler child included)
           watching the cgroup at R = 0.01

The figure is fio's CPU time per I/O (user + system of its job threads
as fio accounts them; the tracepoint programs run in their system time)
over `none`; target <= 1.02 for the agent.  The same ratio over the whole
fio process's rusage (start-up included) is reported beside, and so is the
agent's own CPU time per I/O.  The kernel-measured time per run of the access program (bpf_stats, in a
separate run since it adds two clock reads per run) is reported for the
empty program and the sampler, with the host's load average.

Writes experiments/results/agent_overhead.json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cachepilot.agent.sampler import (Sampler, threshold_for_rate,  # noqa: E402
                                      why_unavailable)
from cachepilot.agent import damon  # noqa: E402
from cachepilot.agent.testbed import (SCRATCH, fio_randread, have, in_cgroup,  # noqa: E402
                                      make_file, scratch_cgroup, v1_memory_available)

RESULTS = REPO / "experiments" / "results"


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_fio(cg, path, ios_per_job, jobs, seed):
    """One fio run; its CPU per I/O two ways: `cpu_us_per_io` from fio's own
    accounting of its job threads (getrusage per thread over the I/O phase:
    what the reads cost, fio's start-up excluded) and `proc_cpu_us_per_io`
    from the whole process's rusage (start-up included, ~0.15 s a run
    here, which dilutes ratios towards 1)."""
    before = children_cpu()
    t0 = time.monotonic()
    # per-job reports: fio's grouped report does not give the threads' CPU
    out = fio_randread(cg, path, ios_per_job, jobs=jobs, seed=seed,
                       extra=["--group_reporting=0"])
    wall = time.monotonic() - t0
    proc_cpu = children_cpu() - before
    fio_jobs = out["json"]["jobs"]
    ios = sum(int(j["read"]["total_ios"]) for j in fio_jobs)
    thread_cpu = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3
                     for j in fio_jobs)
    return {"ios": ios, "cpu_s": thread_cpu, "proc_cpu_s": proc_cpu, "wall_s": wall,
            "cpu_us_per_io": 1e6 * thread_cpu / ios,
            "proc_cpu_us_per_io": 1e6 * proc_cpu / ios}


def start_agent(cg, rate, workdir):
    cfg = workdir / "agent.yaml"
    cfg.write_text(f"roots: [{cg.parent}]\ncgroups: [{cg.name}]\ninterval_s: 1\n"
                   f"sampling: {{rate: {rate}}}\npolicies: [lru]\nprometheus: {{port: 0}}\n")
    # a fresh log per start: the wait below must see this agent's line
    path = workdir / f"agent-{len(list(workdir.glob('agent-*.log')))}.log"
    log = open(path, "w")
    proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "cachepilot"), "agent",
                             "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    # wait until it watches the cgroup and has finished starting (its log
    # says so), so its start-up does not overlap the measured run
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if f"watching {cg}" in path.read_text() and "node " in path.read_text():
            time.sleep(0.5)
            return proc, log
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited: {path.read_text()[-500:]}")
        time.sleep(0.1)
    raise SystemExit("the agent did not start watching within 60 s")


def bpf_prog_costs():
    """{program name: (run_time_ns, run_cnt)} of every loaded program."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    costs = {}
    try:
        for prog in json.loads(out.stdout or "[]"):
            name = prog.get("name")
            ns, cnt = costs.get(name, (0, 0))
            costs[name] = (ns + prog.get("run_time_ns", 0), cnt + prog.get("run_cnt", 0))
    except ValueError:
        pass
    return costs


def per_run(before, after, name):
    ns = after.get(name, (0, 0))[0] - before.get(name, (0, 0))[0]
    cnt = after.get(name, (0, 0))[1] - before.get(name, (0, 0))[1]
    return {"ns_per_run": ns / cnt if cnt else float("nan"), "runs": cnt}


def measure_program_costs(cg, path, rate, ios, jobs, reps):
    """Kernel-measured time per run (bpf_stats on for these runs only; it adds
    two clock reads per run, which the empty program's figure shows) of the
    empty access program and of the sampler's programs, interleaved."""
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = knob.read_text().strip()
    rows = {"empty": [], "sampler": []}
    try:
        for rep in range(reps):
            for cond in (("empty", "sampler") if rep % 2 == 0 else ("sampler", "empty")):
                with Sampler(empty=(cond == "empty")) as s:
                    if cond == "sampler":
                        s.watch(os.stat(cg).st_ino, threshold_for_rate(rate))
                    knob.write_text("1")
                    a = bpf_prog_costs()
                    run_fio(cg, path, ios, jobs, seed=1000 + rep)
                    b = bpf_prog_costs()
                    knob.write_text(old)
                if cond == "empty":
                    rows["empty"].append(per_run(a, b, "empty_get_pages"))
                else:
                    rows["sampler"].append(per_run(a, b, "on_get_pages"))
    finally:
        knob.write_text(old)
    med = {k: statistics.median(r["ns_per_run"] for r in v) for k, v in rows.items()}
    return {"runs": rows, "median_ns_per_run": med,
            "sampler_above_empty_ns": med["sampler"] - med["empty"]}


def agent_cpu_seconds(proc) -> float:
    """CPU time of the agent and its sampler child so far."""
    from cachepilot.agent.metrics import _proc_cpu_seconds
    kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                          text=True).stdout.split()
    return sum(_proc_cpu_seconds(p) for p in [proc.pid, *map(int, kids)])


def stop_agent(proc, log):
    before = children_cpu()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    log.close()
    return children_cpu() - before      # the agent's CPU, its sampler's included


# One reader thread doing 4 KiB preads at random offsets of the cached file,
# timing only its loop with its own CPU clock: a finer instrument than fio
# for the few tens of ns the programs cost per read (no fio start-up, no
# second job, one process per run).
PREAD_LOOP_C = r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t thread_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	static char buf[4096];
	uint64_t x, pages, n, t0, t1;
	int fd;

	if (argc != 4 && argc != 5)
		return 2;
	fd = open(argv[1], O_RDONLY);
	if (fd < 0)
		return 1;
	/* a fifth argument, "random": no read-ahead (reads meant to miss) */
	if (argc == 5 && posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM))
		return 1;
	pages = lseek(fd, 0, SEEK_END) / 4096;
	n = strtoull(argv[2], NULL, 0);
	x = strtoull(argv[3], NULL, 0) | 1;
	t0 = thread_ns();
	for (uint64_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (pread(fd, buf, sizeof(buf), (off_t)(x % pages) * 4096) != sizeof(buf))
			return 1;
	}
	t1 = thread_ns();
	printf("%.3f\n", (double)(t1 - t0) / n);
	return 0;
}
"""


def build_pread_loop(workdir: Path) -> Path:
    src, exe = workdir / "pread_loop.c", workdir / "pread_loop"
    src.write_text(PREAD_LOOP_C)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def pread_ns(exe, cg, path, reads, seed, cpu):
    argv = ["taskset", "-c", str(cpu), str(exe), str(path), str(reads), str(seed)]
    res = subprocess.run(in_cgroup(cg, argv), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"pread loop failed: {res.stderr.strip()[-300:]}")
    return float(res.stdout)


def measure_pread(cg, path, rate, workdir, reps, reads, copies):
    """Thread CPU ns per 4 KiB read with nothing attached, the empty access
    program attached `copies` times, and the sampler's access program
    attached `copies` times, interleaved.  A few tens of ns drown in this
    host's run-to-run noise; multiplied by `copies` they do not, and
    divided back they give the cost of one program per read: the
    tracepoint's dispatch into an empty program (the floor no program can
    go below), and what the sampler's program adds on top."""
    exe = build_pread_loop(workdir)
    conds = ("none", "empty", "sampler")
    rows = {c: [] for c in conds}
    for rep in range(reps):
        k = rep % len(conds)
        cpu = rep % os.cpu_count()
        for cond in conds[k:] + conds[:k]:
            if cond == "none":
                rows[cond].append(pread_ns(exe, cg, path, reads, rep + 1, cpu))
                continue
            with Sampler(empty=(cond == "empty"), copies=copies) as s:
                if cond == "sampler":
                    s.watch(os.stat(cg).st_ino, threshold_for_rate(rate))
                rows[cond].append(pread_ns(exe, cg, path, reads, rep + 1, cpu))
    med = {c: statistics.median(v) for c, v in rows.items()}
    low = {c: sorted(v)[len(v) // 4] for c, v in rows.items()}   # first quartile
    return {"reads_per_run": reads, "copies": copies, "ns_per_read": rows,
            "median_ns_per_read": med, "q1_ns_per_read": low,
            # per program attached, from the medians and from the first quartiles
            "floor_ns": (med["empty"] - med["none"]) / copies,
            "sampler_above_floor_ns": (med["sampler"] - med["empty"]) / copies,
            "floor_ns_q1": (low["empty"] - low["none"]) / copies,
            "sampler_above_floor_ns_q1": (low["sampler"] - low["empty"]) / copies}


CONDITIONS = ("none", "empty", "sampler", "agent")


def run_condition(cond, cg, path, args, workdir, seed):
    """One fio run under one condition; what it attached is gone afterwards."""
    if cond == "none":
        return run_fio(cg, path, args.ios, args.jobs, seed=seed)
    if cond in ("empty", "sampler"):
        with Sampler(empty=(cond == "empty")) as s:
            if cond == "sampler":
                s.watch(os.stat(cg).st_ino, threshold_for_rate(args.rate))
            return run_fio(cg, path, args.ios, args.jobs, seed=seed)
    proc, log = start_agent(cg, args.rate, workdir)
    try:
        before = agent_cpu_seconds(proc)
        r = run_fio(cg, path, args.ios, args.jobs, seed=seed)
        r["agent_cpu_us_per_io"] = 1e6 * (agent_cpu_seconds(proc) - before) / r["ios"]
    finally:
        stop_agent(proc, log)
    return r


def first_quartile(values):
    return sorted(values)[len(values) // 4]


def ratio_interval(num, den, draws=2000, seed=1):
    """95 % bootstrap interval of median(num) / median(den): how far this
    host's run-to-run noise lets the ratio be trusted."""
    import numpy as np
    rng = np.random.default_rng(seed)
    num, den = np.asarray(num), np.asarray(den)
    r = [np.median(rng.choice(num, num.size)) / np.median(rng.choice(den, den.size))
         for _ in range(draws)]
    return [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--ios", type=int, default=300_000, help="reads per fio job")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--file-mb", type=int, default=128)
    ap.add_argument("--cost-reps", type=int, default=4,
                    help="interleaved bpf_stats runs per program")
    ap.add_argument("--pread-reps", type=int, default=16,
                    help="interleaved single-reader runs per condition")
    ap.add_argument("--pread-reads", type=int, default=100_000)
    ap.add_argument("--copies", type=int, default=16,
                    help="times the access program is attached in the pread runs")
    args = ap.parse_args()
    for reason in (v1_memory_available(), why_unavailable()):
        if reason:
            print(f"bench_agent_overhead: skipped: {reason}")
            return 0
    if not have("fio"):
        print("bench_agent_overhead: skipped: fio is not installed")
        return 0

    path = make_file(SCRATCH / f"overhead-{args.file_mb}m.dat", args.file_mb << 20)
    runs = {c: [] for c in CONDITIONS}
    load = {"start": os.getloadavg()}
    # the host's DAMON pageout, if any, would evict parts of the cached
    # file mid-run and turn cache hits into disk reads
    with damon.paused(), scratch_cgroup("cp_overhead") as cg, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        run_fio(cg, path, 200_000, args.jobs, seed=99)      # warm: all pages cached
        startup = run_fio(cg, path, 1, 1, seed=98)       # fio's start-up, for the record
        for rep in range(args.reps):
            # rotate the order so no condition always follows another
            k = rep % len(CONDITIONS)
            order = CONDITIONS[k:] + CONDITIONS[:k]
            for cond in order:
                r = run_condition(cond, cg, path, args, workdir, seed=rep + 1)
                r["loadavg_1m"] = os.getloadavg()[0]
                runs[cond].append(r)
                print(f"rep {rep} {cond:7s}: {r['cpu_us_per_io']:.4f} us CPU/IO, "
                      f"{r['ios'] / r['wall_s'] / 1e3:.0f} kIOPS, load {r['loadavg_1m']:.2f}",
                      flush=True)
        load["after_fio_runs"] = os.getloadavg()
        prog = measure_program_costs(cg, path, args.rate, args.ios, args.jobs, args.cost_reps)
        pread = measure_pread(cg, path, args.rate, workdir, args.pread_reps,
                              args.pread_reads, args.copies)
    load["end"] = os.getloadavg()

    cpu = {c: [r["cpu_us_per_io"] for r in runs[c]] for c in CONDITIONS}
    none_med = statistics.median(cpu["none"])
    ratios, paired = {}, {}
    for c in CONDITIONS[1:]:
        ratios[c] = statistics.median(cpu[c]) / none_med
        # paired by repetition (same seed, same rotation)
        paired[c] = [a / n for a, n in zip(cpu[c], cpu["none"])]
    agent_cpu = [r["agent_cpu_us_per_io"] for r in runs["agent"]]
    result = {
        "workload": f"fio randread 4k psync, {args.jobs} jobs x {args.ios} reads, "
                    f"{args.file_mb} MiB file fully cached",
        "rate": args.rate, "reps": args.reps, "conditions": list(CONDITIONS),
        "cpu_us_per_io": cpu,
        "median_cpu_us_per_io": {c: statistics.median(v) for c, v in cpu.items()},
        "ratio_of_medians": ratios,
        "ratio_of_medians_95ci": {c: ratio_interval(cpu[c], cpu["none"]) for c in ratios},
        # the least disturbed quarter of the runs: interference only adds time
        "ratio_of_first_quartiles": {c: first_quartile(cpu[c]) / first_quartile(cpu["none"])
                                     for c in ratios},
        "paired_ratios": paired,
        "paired_ratio_median": {c: statistics.median(v) for c, v in paired.items()},
        "agent_own_cpu_us_per_io": agent_cpu,
        "fio_startup_cpu_s": startup["proc_cpu_s"],
        "proc_cpu_us_per_io": {c: [r["proc_cpu_us_per_io"] for r in runs[c]]
                               for c in CONDITIONS},
        "proc_ratio_of_medians": {
            c: statistics.median(r["proc_cpu_us_per_io"] for r in runs[c])
            / statistics.median(r["proc_cpu_us_per_io"] for r in runs["none"])
            for c in CONDITIONS[1:]},
        "access_program_bpf_stats": prog,
        "pread_loop": pread,
        "loadavg": load,
        "target": 1.02,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agent_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / "agent_overhead.png")
    print(f"\nfio job threads' CPU per I/O (median of {args.reps}): " + ", ".join(
        f"{c} {statistics.median(cpu[c]):.4f} us" for c in CONDITIONS))
    for c in CONDITIONS[1:]:
        lo, hi = result["ratio_of_medians_95ci"][c]
        print(f"ratio {c:7s}/ none: median of runs {ratios[c]:.4f} "
              f"(95 % bootstrap {lo:.3f}-{hi:.3f}), "
              f"median of paired reps {statistics.median(paired[c]):.4f}, "
              f"of first quartiles {result['ratio_of_first_quartiles'][c]:.4f}")
    print(f"target for the agent: <= 1.02 -> "
          f"{'met' if ratios['agent'] <= 1.02 else 'NOT met'} (ratio of medians)")
    print(f"agent's own CPU (and its sampler's) per watched I/O while fio ran: "
          f"{statistics.median(agent_cpu):.4f} us")
    med = prog["median_ns_per_run"]
    print(f"access program, bpf_stats (includes its two clock reads): empty "
          f"{med['empty']:.1f} ns, sampler {med['sampler']:.1f} ns per run "
          f"-> {prog['sampler_above_empty_ns']:.1f} ns above the empty program")
    pm = pread["median_ns_per_read"]
    print(f"one pread loop, thread CPU per read (median of {args.pread_reps}): none "
          f"{pm['none']:.0f} ns, empty x{args.copies} {pm['empty']:.0f} ns, "
          f"sampler x{args.copies} {pm['sampler']:.0f} ns")
    print(f"  per program per read: tracepoint dispatch into an empty program (the floor) "
          f"{pread['floor_ns']:.1f} ns (first quartiles: {pread['floor_ns_q1']:.1f}), "
          f"the sampler's program above it {pread['sampler_above_floor_ns']:.1f} ns "
          f"({pread['sampler_above_floor_ns_q1']:.1f})")
    fio_none_ns = 1e3 * statistics.median(cpu["none"])
    print(f"  against fio's {fio_none_ns:.0f} ns per read: floor alone "
          f"{1 + pread['floor_ns'] / fio_none_ns:.4f}, floor + sampler "
          f"{1 + (pread['floor_ns'] + pread['sampler_above_floor_ns']) / fio_none_ns:.4f}; "
          f"1.02 leaves {0.02 * fio_none_ns:.0f} ns per read for everything")
    print(f"the same over fio's whole-process CPU (its start-up, "
          f"{startup['proc_cpu_s'] * 1e3:.0f} ms a run, included): " + ", ".join(
              f"{c} {r:.4f}" for c, r in result["proc_ratio_of_medians"].items()))
    print(f"load average (1, 5, 15 min): start {load['start']}, end {load['end']}")
    return 0


def plot(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    cpu = result["cpu_us_per_io"]
    labels = {"none": "no programs", "empty": "empty programs (floor)",
              "sampler": f"sampler, R={result['rate']}", "agent": f"agent, R={result['rate']}"}
    for cond, marker in zip(result["conditions"], "o^sD"):
        ax.plot(range(len(cpu[cond])), cpu[cond], marker + "-", label=labels[cond])
    ax.set_xlabel("repetition")
    ax.set_ylabel("fio job threads' CPU per I/O (us)")
    ax.set_ylim(0, max(max(v) for v in cpu.values()) * 1.2)
    ax.legend(fontsize=8)
    conds = result["conditions"][1:]
    ratios = [result["ratio_of_medians"][c] for c in conds]
    bx.bar(range(len(conds)), ratios, color=["0.6", "C2", "C3"])
    for i, r in enumerate(ratios):
        bx.text(i, r + 0.003, f"{r:.3f}", ha="center", fontsize=9)
    bx.axhline(1.02, color="k", linestyle="--", linewidth=1, label="target 1.02")
    bx.axhline(1.0, color="0.5", linewidth=0.8)
    bx.set_xticks(range(len(conds)), [labels[c] for c in conds], fontsize=8)
    bx.set_ylim(min(0.95, min(ratios) - 0.02), max(1.06, max(ratios) + 0.02))
    bx.set_ylabel("CPU per I/O over no programs (ratio of medians)")
    bx.legend(fontsize=8)
    load = result["loadavg"]["start"][0]
    fig.suptitle(f"agent overhead: {result['ratio_of_medians']['agent']:.3f} "
                 f"(target <= 1.02); load average at start {load:.2f}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
