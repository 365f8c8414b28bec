#!/usr/bin/env python3
"""Overhead of the node agent on the workloads it watches.

fio does 4 KiB buffered random reads from a file that is fully in the page
cache (2 jobs, psync), in a memory cgroup, with and without the agent
watching that cgroup at sampling rate R = 0.01.  The two conditions are
interleaved in one run, several repetitions, alternating which goes first.
The figure is fio's CPU time per I/O (user + system, the tracepoint
programs run in fio's system time), agent over no agent; target <= 1.02.

The agent is the real `cachepilot agent` process (its BPF sampler child
included), started before and stopped after each agent run; its own CPU
time per I/O is reported beside.

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

from cachepilot.agent.sampler import why_unavailable  # noqa: E402
from cachepilot.agent.testbed import (SCRATCH, fio_randread, have, make_file,  # noqa: E402
                                      scratch_cgroup, v1_memory_available)

RESULTS = REPO / "experiments" / "results"


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_fio(cg, path, ios_per_job, jobs, seed):
    before = children_cpu()
    t0 = time.monotonic()
    out = fio_randread(cg, path, ios_per_job, jobs=jobs, seed=seed)
    wall = time.monotonic() - t0
    cpu = children_cpu() - before
    return {"ios": out["ios"], "cpu_s": cpu, "wall_s": wall,
            "cpu_us_per_io": 1e6 * cpu / out["ios"]}


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


def bpf_prog_cost(names=("on_get_pages",)):
    """(run_time_ns, run_cnt) summed over the sampler's programs of that name."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    ns = cnt = 0
    try:
        for prog in json.loads(out.stdout or "[]"):
            if prog.get("name") in names:
                ns += prog.get("run_time_ns", 0)
                cnt += prog.get("run_cnt", 0)
    except ValueError:
        pass
    return ns, cnt


def measure_program_cost(cg, path, rate, workdir, ios, jobs):
    """Kernel-measured time per run of the access program (bpf_stats on for
    this one run only; it adds a clock read per run, so this is an upper
    bound)."""
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = knob.read_text().strip()
    proc, log = start_agent(cg, rate, workdir)
    try:
        knob.write_text("1")
        a = bpf_prog_cost()
        r = run_fio(cg, path, ios, jobs, seed=77)
        b = bpf_prog_cost()
    finally:
        knob.write_text(old)
        stop_agent(proc, log)
    runs = b[1] - a[1]
    per_run = (b[0] - a[0]) / runs if runs else float("nan")
    return {"ns_per_run": per_run, "runs": runs, "fio_ios": r["ios"],
            "fio_cpu_us_per_io": r["cpu_us_per_io"]}


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--ios", type=int, default=300_000, help="reads per fio job")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--file-mb", type=int, default=128)
    args = ap.parse_args()
    for reason in (v1_memory_available(), why_unavailable()):
        if reason:
            print(f"bench_agent_overhead: skipped: {reason}")
            return 0
    if not have("fio"):
        print("bench_agent_overhead: skipped: fio is not installed")
        return 0

    path = make_file(SCRATCH / f"overhead-{args.file_mb}m.dat", args.file_mb << 20)
    runs = {"none": [], "agent": []}
    agent_cpu = []
    with scratch_cgroup("cp_overhead") as cg, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        run_fio(cg, path, 200_000, args.jobs, seed=99)      # warm: all pages cached
        for rep in range(args.reps):
            order = ["none", "agent"] if rep % 2 == 0 else ["agent", "none"]
            for cond in order:
                if cond == "agent":
                    proc, log = start_agent(cg, args.rate, workdir)
                    before = agent_cpu_seconds(proc)
                    r = run_fio(cg, path, args.ios, args.jobs, seed=rep + 1)
                    cpu = agent_cpu_seconds(proc) - before
                    stop_agent(proc, log)
                    agent_cpu.append(1e6 * cpu / r["ios"])
                    r["agent_cpu_us_per_io"] = agent_cpu[-1]
                else:
                    r = run_fio(cg, path, args.ios, args.jobs, seed=rep + 1)
                runs[cond].append(r)
                print(f"rep {rep} {cond:5s}: {r['cpu_us_per_io']:.4f} us CPU/IO, "
                      f"{r['ios'] / r['wall_s'] / 1e3:.0f} kIOPS", flush=True)
        prog = measure_program_cost(cg, path, args.rate, workdir, args.ios, args.jobs)
    none = [r["cpu_us_per_io"] for r in runs["none"]]
    agent = [r["cpu_us_per_io"] for r in runs["agent"]]
    # paired by repetition (same seed, adjacent in time)
    paired = [a / n for a, n in zip(agent, none)]
    ratio_median = statistics.median(agent) / statistics.median(none)
    result = {
        "workload": f"fio randread 4k psync, {args.jobs} jobs x {args.ios} reads, "
                    f"{args.file_mb} MiB file fully cached",
        "rate": args.rate, "reps": args.reps,
        "cpu_us_per_io": {"none": none, "agent": agent},
        "ratio_of_medians": ratio_median,
        "paired_ratios": paired,
        "paired_ratio_median": statistics.median(paired),
        "agent_own_cpu_us_per_io": agent_cpu,
        "access_program": prog,
        "access_program_share_of_io_cpu": prog["ns_per_run"] / 1e3 / statistics.median(none),
        "target": 1.02,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agent_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / "agent_overhead.png")
    print(f"\nfio CPU per I/O: no agent {statistics.median(none):.4f} us, "
          f"agent at R={args.rate} {statistics.median(agent):.4f} us")
    print(f"ratio (agent / none): median of runs {ratio_median:.4f}, "
          f"median of paired reps {statistics.median(paired):.4f} (target <= 1.02)")
    print(f"agent's own CPU (and its sampler's) per watched I/O while fio ran: "
          f"{statistics.median(agent_cpu):.4f} us")
    print(f"access program, kernel-measured: {prog['ns_per_run']:.0f} ns per read "
          f"(upper bound, bpf_stats on) = {result['access_program_share_of_io_cpu']:.2%} "
          f"of fio's CPU per I/O")
    return 0


def plot(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    none, agent = result["cpu_us_per_io"]["none"], result["cpu_us_per_io"]["agent"]
    ax.plot(range(len(none)), none, "o-", label="no agent")
    ax.plot(range(len(agent)), agent, "s-", label=f"agent, R={result['rate']}")
    ax.set_xlabel("repetition")
    ax.set_ylabel("fio CPU time per I/O (us)")
    ax.set_ylim(0, max(none + agent) * 1.2)
    ax.set_title(f"agent overhead: ratio {result['ratio_of_medians']:.3f} (target <= 1.02)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
