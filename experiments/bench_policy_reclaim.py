#!/usr/bin/env python3
"""What each library policy costs the kernel per page it evicts, against
fifo, on the cache_ext kernel in the qemu VM.

Every policy runs in turn (rotating order, several rounds) on a cgroup whose
memory.max is a quarter of a 64 MiB file that fio reads at random, 4 KiB at
a time with readahead off, so nearly every read evicts a page
(kernel/tests/bench-reclaim.sh).  The kernel's BPF statistics give each
policy program's run time; per evicted page (memory.cache_ext "reclaimed"):

- reclaim: the evict_folios program, i.e. choosing the victims, with the
  list walks and scoring it asks of the kernel (the program whose run count
  equals the cgroup's evict_calls);
- hooks: all the policy's programs (evict_folios, folio_added,
  folio_accessed, folio_evicted, admit_folio);
- and fio's own CPU time (usr + sys) per read, the whole system's view.

The same reads also run under the kernel's own policy (`none`: nothing
attached), which has no programs to time; fio's CPU per read there is what
a miss costs without cache_ext, and each policy's is given against it too.
The agent's hook costs (agent/hookcost.py) are for reads that hit; this is
the other half, the reads that miss and evict.

Under TCG absolute times mean little, so every figure is the median over
rounds divided by fifo's (and, for fio's CPU, by the kernel's own).
Writes experiments/results/bench_policy_reclaim.json and .png.

    VM_DIR=/tmp/myvm .venv/bin/python experiments/bench_policy_reclaim.py \\
        [--rounds 3] [--seconds 10] [--policy NAME ...]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import study_output

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
SCRIPT = REPO / "kernel" / "tests" / "bench-reclaim.sh"
KERNEL = "none"        # the kernel's own policy: nothing attached


def parse(log: str) -> list[dict]:
    """One dict per run: policy, round, the fio job, the cache_ext counters
    and the struct_ops programs' statistics."""
    runs: dict[tuple[str, int], dict] = {}
    fio, buf = None, []
    for line in log.splitlines():
        m = re.search(r"FIO-BEGIN (\S+) (\d+)", line)
        if m:
            fio, buf = (m.group(1), int(m.group(2))), []
            continue
        if line.startswith("FIO-END") and fio:
            runs.setdefault(fio, {})["fio"] = json.loads("".join(buf))["jobs"][0]
            fio = None
            continue
        if fio:
            buf.append(line)
            continue
        m = re.match(r"(STATS|PROGS) (\S+) (\d+) (.*)$", line)
        if not m:
            continue
        run = runs.setdefault((m.group(2), int(m.group(3))), {})
        if m.group(1) == "STATS":
            f = m.group(4).split()
            run["cache_ext"] = dict(zip(f[0::2], f[1::2]))
        else:
            run["progs"] = [p for p in json.loads(m.group(4))
                            if p.get("type") == "struct_ops"]
    out = []
    for (policy, rnd), run in sorted(runs.items()):
        need = {"fio"} if policy == KERNEL else {"fio", "cache_ext", "progs"}
        if not need <= run.keys():
            raise SystemExit(f"bench_policy_reclaim: run {policy}/{rnd} is incomplete "
                             f"in the guest's log")
        out.append({"policy": policy, "round": rnd, **run})
    return out


def fio_cpu_us_per_read(job: dict) -> tuple[float, int]:
    """fio's CPU (usr + sys) per read in microseconds, and its reads."""
    ios = job["read"]["total_ios"]
    cpu_us = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] * 1000
    return (cpu_us / ios if ios else math.nan), ios


def figures(run: dict) -> dict:
    """Per evicted page: ns in the evict_folios program, ns in all of the
    policy's programs; CPU us per fio read.  The kernel's own policy has
    fio's figure only."""
    if run["policy"] == KERNEL:
        cpu, ios = fio_cpu_us_per_read(run["fio"])
        if not ios:
            raise SystemExit(f"bench_policy_reclaim: {KERNEL}/{run['round']}: no reads")
        return {"reads": ios, "cpu_us_per_read": cpu}
    ce = run["cache_ext"]
    reclaimed = int(ce["reclaimed"])
    calls = int(ce["evict_calls"])
    progs = run["progs"]
    total_ns = sum(p.get("run_time_ns", 0) for p in progs)
    evict = [p for p in progs if p.get("run_cnt", -1) == calls]
    cpu, ios = fio_cpu_us_per_read(run["fio"])
    if not reclaimed or not evict or not ios:
        raise SystemExit(f"bench_policy_reclaim: {run['policy']}/{run['round']}: "
                         f"reclaimed {reclaimed}, evict_folios found {len(evict)}, "
                         f"reads {ios}")
    return {"reclaimed": reclaimed, "evict_calls": calls, "reads": ios,
            "reclaim_ns_per_page": evict[0].get("run_time_ns", 0) / reclaimed,
            "hooks_ns_per_page": total_ns / reclaimed,
            "cpu_us_per_read": cpu,
            "rejected": int(ce["rejected"]), "fallbacks": int(ce["fallbacks"])}


def summarise(runs: list[dict]) -> dict:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["policy"], []).append(figures(r))
    if "fifo" not in by:
        raise SystemExit("bench_policy_reclaim: fifo, the reference, did not run")
    keys = ("reclaim_ns_per_page", "hooks_ns_per_page", "cpu_us_per_read")
    med = {p: {k: statistics.median(f[k] for f in fs) for k in keys if k in fs[0]}
           for p, fs in by.items()}
    ref = med["fifo"]
    kernel = med.get(KERNEL, {}).get("cpu_us_per_read", math.nan)
    table = {}
    for p, m in med.items():
        row = {**m, "cpu_per_read_vs_fifo": m["cpu_us_per_read"] / ref["cpu_us_per_read"],
               "cpu_per_read_vs_kernel": m["cpu_us_per_read"] / kernel}
        if p != KERNEL:
            row["reclaim_vs_fifo"] = m["reclaim_ns_per_page"] / ref["reclaim_ns_per_page"]
            row["hooks_vs_fifo"] = m["hooks_ns_per_page"] / ref["hooks_ns_per_page"]
        table[p] = {**row, "runs": by[p]}
    return table


def plot(table: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted((p for p in table if p != KERNEL), key=lambda p: table[p]["hooks_vs_fifo"])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5),
                                  gridspec_kw={"width_ratios": [3, 2]})
    x = range(len(names))
    w = 0.27
    for i, (key, label) in enumerate((("reclaim_vs_fifo", "evict_folios per evicted page"),
                                      ("hooks_vs_fifo", "all policy programs per evicted page"),
                                      ("cpu_per_read_vs_fifo", "fio CPU per read"))):
        ax.bar([j + (i - 1) * w for j in x], [table[n][key] for n in names], w, label=label)
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=30)
    ax.set_ylabel("relative to fifo (median over rounds)")
    ax.set_yscale("log")
    ax.set_title("in-kernel policy cost per evicted page, qemu TCG", fontsize=10)
    ax.legend(fontsize=8)
    # fio's CPU per read against the kernel's own policy, where it ran
    if KERNEL in table:
        order = sorted(table, key=lambda p: table[p]["cpu_per_read_vs_kernel"])
        ax2.bar(range(len(order)), [table[p]["cpu_per_read_vs_kernel"] for p in order],
                color=["grey" if p == KERNEL else "tab:green" for p in order])
        ax2.axhline(1.0, color="grey", linestyle=":")
        ax2.set_xticks(range(len(order)))
        ax2.set_xticklabels(["kernel's own" if p == KERNEL else p for p in order],
                            rotation=35, ha="right")
        ax2.set_ylim(min(0.8, *(table[p]["cpu_per_read_vs_kernel"] for p in order)) * 0.95,
                     None)
        ax2.set_ylabel("fio CPU per read, x the kernel's own")
        ax2.set_title("reads that miss: CPU against no cache_ext policy", fontsize=10)
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="fio run time per run")
    ap.add_argument("--policy", action="append", default=[],
                    help="a policy to measure (repeatable; default: the library; fifo "
                         "and the kernel's own, `none`, always run)")
    ap.add_argument("--log", type=Path,
                    help="parse this guest log instead of booting the VM")
    args = ap.parse_args(argv)
    kernel = REPO / "kernel" / "out" / "build" / "arch" / "x86" / "boot" / "bzImage"
    if args.log:
        try:
            log = args.log.read_text(errors="replace")
        except OSError as err:
            print(f"bench_policy_reclaim: error: {args.log}: {err.strerror}", file=sys.stderr)
            return 2
    elif not kernel.exists() or not (REPO / "bpf" / "out" / "policyctl").exists():
        print("bench_policy_reclaim: skipped: needs the cache_ext kernel (make kernel) "
              "and the policy loader (make build)")
        return 0
    else:
        policies = args.policy
        if policies:
            # the references every figure is read against
            policies = [*(r for r in (KERNEL, "fifo") if r not in policies), *policies]
        vm_args = ["-a", str(REPO), "-a", str(args.rounds), "-a", str(args.seconds)]
        for p in policies:
            vm_args += ["-a", p]
        n = len(policies) or 12
        timeout = 600 + args.rounds * n * (args.seconds + 60)
        cmd = [str(REPO / "kernel" / "vm"), "-H", "-t", str(timeout), *vm_args, str(SCRIPT)]
        print("booting the VM:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout
        if proc.returncode != 0:
            print(log[-3000:], file=sys.stderr)
            print(f"bench_policy_reclaim: the VM run failed ({proc.returncode})",
                  file=sys.stderr)
            return 1
    table = summarise(parse(log))
    print(f"{'policy':>13} {'evict_folios':>13} {'all programs':>13} {'fio CPU/read':>13}"
          f" {'vs kernel':>10}   (per evicted page, x fifo; absolute ns under TCG)")
    for p in sorted(table, key=lambda p: table[p].get("hooks_vs_fifo", 0.0)):
        t = table[p]
        if p == KERNEL:
            print(f"{'(kernel) none':>13} {'-':>13} {'-':>13} "
                  f"{t['cpu_per_read_vs_fifo']:12.2f}x {t['cpu_per_read_vs_kernel']:9.2f}x   "
                  f"({t['cpu_us_per_read']:.0f} us)")
            continue
        print(f"{p:>13} {t['reclaim_vs_fifo']:12.2f}x {t['hooks_vs_fifo']:12.2f}x "
              f"{t['cpu_per_read_vs_fifo']:12.2f}x {t['cpu_per_read_vs_kernel']:9.2f}x   "
              f"({t['reclaim_ns_per_page']:.0f} / "
              f"{t['hooks_ns_per_page']:.0f} ns, {t['cpu_us_per_read']:.0f} us)")
    out = {"what": "fio randread 4 KiB, psync, readahead off, 64 MiB file, cgroup "
                   "memory.max 16 MiB, BPF statistics per policy program, qemu TCG",
           "rounds": args.rounds, "seconds_per_run": args.seconds,
           "host_load_average": os.getloadavg(), "policies": table}
    study_output.write(RESULTS / "bench_policy_reclaim", out, lambda png: plot(table, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
