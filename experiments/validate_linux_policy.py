#!/usr/bin/env python3
"""The `linux` policy model against the real kernel, on the same trace.

A small C reader replays a known page trace (Zipf over a 128 MiB file, and
Zipf interrupted by sequential scans; one 4 KiB pread per access, readahead
off) inside a cgroup-v1 memory cgroup at
several limits.  The kernel's miss ratio over the measured half comes from
its own counters (memory.stat pgpgin: pages charged to the cgroup, i.e.
page-cache insertions, read by the reader itself around that half).  The
same trace then runs through the simulator -- `linux`, `lru`, `fifo`, `mru`
-- at the page-cache size the kernel actually held (memory.stat cache).

Needs root, the cgroup-v1 memory controller and a C compiler; the host
kernel must use the classic active/inactive LRU (no MGLRU) for `linux` to
be the right model.  Writes experiments/results/validate_linux_policy.json
and .png.

    .venv/bin/python experiments/validate_linux_policy.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cachepilot.agent import cgroups, damon
from cachepilot.agent.testbed import (SCRATCH, drop_file_cache, exclusive, in_cgroup,
                                      make_file, scratch_cgroup, v1_memory_available)
from cachepilot.models import runtime
from cachepilot.models.mrc import PAGE_SIZE

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FILE_SIZE = 128 << 20
LIMITS_MB = (24, 48, 72, 96)
WARM, MEASURED = 200_000, 200_000
SKEW = 0.9
POLICIES = ("linux", "lru", "fifo", "mru")

READER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* pgpgin and cache of the cgroup, from its memory.stat */
static void stat_of(const char *path, unsigned long long *pgpgin,
		    unsigned long long *cache)
{
	char key[64];
	unsigned long long v;
	FILE *f = fopen(path, "r");

	if (!f)
		exit(3);
	while (fscanf(f, "%63s %llu", key, &v) == 2) {
		if (!strcmp(key, "pgpgin"))
			*pgpgin = v;
		else if (!strcmp(key, "cache"))
			*cache = v;
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	unsigned long long p0 = 0, p1 = 0, c0 = 0, c1 = 0;
	size_t n, warm = strtoull(argv[3], NULL, 10), cap = 1 << 20, i;
	uint32_t *idx = malloc(cap * sizeof(*idx));
	char buf[4096];
	int fd;

	n = 0;
	while ((i = fread(idx + n, sizeof(*idx), cap - n, stdin)) > 0) {
		n += i;
		if (n == cap) {
			cap *= 2;
			idx = realloc(idx, cap * sizeof(*idx));
		}
	}
	fd = open(argv[1], O_RDONLY);
	if (fd < 0)
		return 2;
	posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	for (i = 0; i < n; i++) {
		if (i == warm)
			stat_of(argv[2], &p0, &c0);
		if (pread(fd, buf, sizeof(buf), (off_t)idx[i] * 4096) != 4096)
			return 4;
	}
	stat_of(argv[2], &p1, &c1);
	printf("%llu %llu %llu %llu %zu\n", p0, p1, c0, c1, n - warm);
	return 0;
}
"""


def zipf_trace(pages: int, n: int, skew: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pages + 1) ** skew
    ranks = rng.choice(pages, size=n, p=weights / weights.sum())
    return rng.permutation(pages)[ranks].astype(np.uint32)


def zipf_scan_trace(pages: int, n: int, skew: float, seed: int) -> np.ndarray:
    """Zipf over the first 3/4 of the file, interrupted every 20,000
    accesses by a one-pass sequential scan of 4,096 pages of the last
    quarter (a backup or a report): where LRU and the kernel differ."""
    hot = pages * 3 // 4
    z = zipf_trace(hot, n, skew, seed)
    out, pos, scan_at = [], 0, hot
    while sum(len(x) for x in out) < n:
        out.append(z[pos:pos + 20_000])
        pos += 20_000
        out.append(np.arange(scan_at, scan_at + 4096, dtype=np.uint32))
        scan_at = hot + (scan_at - hot + 4096) % (pages - hot)
    return np.concatenate(out)[:n]


WORKLOADS = {"zipf": zipf_trace, "zipf+scan": zipf_scan_trace}


def build_reader(tmp: Path) -> Path:
    src, exe = tmp / "reader.c", tmp / "reader"
    src.write_text(READER_C)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def kernel_run(reader, cg, data, trace) -> dict:
    drop_file_cache(data)
    proc = subprocess.run(
        in_cgroup(cg, [str(reader), str(data), str(cg / "memory.stat"), str(WARM)]),
        input=trace.tobytes(), capture_output=True, check=True)
    p0, p1, c0, c1, n = (int(x) for x in proc.stdout.split())
    return {"miss_ratio": (p1 - p0) / n, "cache_pages": (c0 + c1) // 2 // PAGE_SIZE}


def main() -> int:
    why = v1_memory_available()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    mglru = Path("/sys/kernel/mm/lru_gen/enabled")
    if mglru.exists() and mglru.read_text().strip() not in ("0x0000", "0"):
        print("note: MGLRU is enabled on this host; `linux` models the "
              "classic LRU", file=sys.stderr)
    data = make_file(SCRATCH / "cp-validate-linux-128m.dat", FILE_SIZE)
    pages = FILE_SIZE // PAGE_SIZE
    report = {"file_pages": pages, "warm": WARM, "measured": MEASURED,
              "zipf_skew": SKEW, "kernel": os.uname().release, "workloads": {}}
    # the host's DAMON pageout, if any, would reclaim below the limits
    with tempfile.TemporaryDirectory() as tmp, damon.paused(), \
            exclusive(SCRATCH / "cp-validate-linux.lock"), \
            scratch_cgroup("cp_validate_linux") as cg:
        reader = build_reader(Path(tmp))
        for name, make_trace in WORKLOADS.items():
            print(f"{name}:")
            rows = []
            for limit_mb in LIMITS_MB:
                trace = make_trace(pages, WARM + MEASURED, SKEW, seed=limit_mb)
                cgroups.write_limit(cg, limit_mb << 20)
                t = time.perf_counter()
                real = kernel_run(reader, cg, data, trace)
                seconds = time.perf_counter() - t
                keys = trace.astype(np.uint64)
                sim = {}
                for policy in POLICIES:
                    cache = runtime.Cache(policy, real["cache_pages"])
                    cache.access(keys[:WARM])
                    sim[policy] = cache.access(keys[WARM:]) / MEASURED
                rows.append({"limit_mb": limit_mb, "cache_pages": real["cache_pages"],
                             "kernel": real["miss_ratio"], "sim": sim,
                             "kernel_seconds": seconds})
                print(f"  limit {limit_mb:3d} MiB  cache {real['cache_pages']:6d} pages  "
                      f"kernel {real['miss_ratio']:.4f}  " +
                      "  ".join(f"{p} {sim[p]:.4f} ({sim[p] - real['miss_ratio']:+.4f})"
                                for p in POLICIES), flush=True)
            mae = {p: float(np.mean([abs(r["sim"][p] - r["kernel"]) for r in rows]))
                   for p in POLICIES}
            print("  mean |sim - kernel|: " +
                  ", ".join(f"{p} {mae[p]:.4f}" for p in POLICIES))
            report["workloads"][name] = {"rows": rows, "mae_vs_kernel": mae}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "validate_linux_policy.json").write_text(json.dumps(report, indent=1))
    plot(report["workloads"], RESULTS / "validate_linux_policy.png")
    return 0


def plot(workloads, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4),
                             squeeze=False)
    for ax, (name, w) in zip(axes[0], workloads.items()):
        rows = w["rows"]
        x = [r["cache_pages"] for r in rows]
        ax.plot(x, [r["kernel"] for r in rows], "ko-", lw=2, label="kernel (pgpgin)")
        for p in POLICIES:
            ax.plot(x, [r["sim"][p] for r in rows], "--o",
                    label=f"sim {p} (MAE {w['mae_vs_kernel'][p]:.3f})")
        ax.set_xlabel("page cache held by the cgroup (pages)")
        ax.set_ylabel("miss ratio")
        ax.set_title(f"{name}: kernel vs simulated policies, same trace", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
