"""The sampler loader under valgrind for one agent interval.

The agent's own Linux backend watches a scratch memory cgroup in which fio
reads a file at random, with its sampler child started through valgrind
(memcheck: invalid reads and writes, uses of uninitialised values, leaks).
The backend runs one interval as `cachepilot agent` does -- `slices` ticks,
each reading counters and sketches and draining sampled records, then a
collect -- and closes the sampler, which then detaches and exits.  Fails
unless memcheck counts 0 errors and 0 bytes definitely or indirectly lost
and the interval's report saw the reads.

    .venv/bin/python -m fuzz.valgrind_sampler [--interval 10] [--log FILE]

Needs root, the sampler built (make build), valgrind and fio.  Part of
`make sanitize`, not of `make test`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.agent import binaries
from cachepilot.agent.backends.linux import LinuxBackend
from cachepilot.agent.config import config_from_dict
from cachepilot.agent.sampler import Sampler, why_unavailable
from cachepilot.agent.testbed import (SCRATCH, V1_MEMORY, have, in_cgroup, make_file,
                                      scratch_cgroup, v1_memory_available, v2_memory_root)


def wrapper(loader: Path, log: Path, folder: Path) -> Path:
    """An executable that runs the loader under memcheck, logging to `log`."""
    script = folder / "sampler-under-valgrind"
    script.write_text(
        "#!/bin/sh\n"
        f"exec valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect "
        f"--errors-for-leak-kinds=definite,indirect --track-origins=yes "
        f"--log-file={log} {loader} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def summary(text: str) -> dict:
    def num(pattern):
        m = re.search(pattern, text)
        return int(m.group(1).replace(",", "")) if m else None
    return {"errors": num(r"ERROR SUMMARY: ([\d,]+) errors"),
            "definitely_lost": num(r"definitely lost: ([\d,]+) bytes"),
            "indirectly_lost": num(r"indirectly lost: ([\d,]+) bytes"),
            "in_use_at_exit": num(r"in use at exit: ([\d,]+) bytes"),
            "all_freed": "All heap blocks were freed" in text}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=10.0,
                    help="the agent interval, seconds (10, the agent's default)")
    ap.add_argument("--slices", type=int, default=32,
                    help="ticks an interval (32, the agent's default)")
    ap.add_argument("--log", type=Path, help="keep valgrind's log here")
    args = ap.parse_args()
    loader = binaries.sampler()
    why = why_unavailable() if loader else "the sampler is not built (make build)"
    root = V1_MEMORY if v1_memory_available() is None else v2_memory_root()
    for missing, what in ((why, why), (not have("valgrind"), "valgrind is not installed"),
                          (not have("fio"), "fio is not installed"),
                          (root is None, "no memory cgroup hierarchy")):
        if missing:
            print(f"valgrind_sampler: cannot run: {what}", file=sys.stderr)
            return 1
    folder = Path(tempfile.mkdtemp(prefix="cachepilot-valgrind-"))
    log = folder / "memcheck.log"
    data = make_file(SCRATCH / "valgrind-32m.dat", 32 << 20)
    try:
        with scratch_cgroup("cp_valgrind", root) as cg:
            fio = subprocess.Popen(in_cgroup(cg, [
                "fio", "--name=r", f"--filename={data}", "--rw=randread", "--bs=4k",
                "--time_based", f"--runtime={int(args.interval * 3 + 60)}",
                "--invalidate=0"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cfg = config_from_dict({
                "node_id": "valgrind", "roots": [str(root)], "interval_s": args.interval,
                "tenants": [{"name": "reader", "cgroup": str(cg)}], "policies": ["lru"],
                "sampling": {"rate": 0.01, "slices": args.slices}})
            started = time.monotonic()
            # valgrind loads the BPF programs some 50 times slower than native
            sampler = Sampler(loader=wrapper(loader, log, folder))
            backend = LinuxBackend(cfg, sampler=sampler)
            print(f"sampler under memcheck ready in {time.monotonic() - started:.1f} s; "
                  f"one {args.interval:g} s interval of {args.slices} slices")
            began = time.monotonic()
            for k in range(1, args.slices):
                time.sleep(max(0.0, began + k * args.interval / args.slices
                               - time.monotonic()))
                backend.tick()
            time.sleep(max(0.0, began + args.interval - time.monotonic()))
            reports = backend.collect()
            backend.close()
            fio.kill()
            fio.wait()
        rep = next(r for r in reports if r.tenant == "reader")
        print(f"report: {rep.accesses_per_s:,.0f} accesses/s, curves "
              f"{[c.policy for c in rep.curves]}, sampled records received "
              f"{sampler.records_received:,}")
        # the loader exits when its stdin closes; memcheck then writes the summary
        deadline = time.monotonic() + 120
        while "ERROR SUMMARY" not in log.read_text(errors="replace") and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        if args.log:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, args.log)
        s = summary(text)
        print(f"memcheck: {s['errors']} errors, definitely lost {s['definitely_lost']} B, "
              f"indirectly lost {s['indirectly_lost']} B, in use at exit "
              f"{s['in_use_at_exit']} B" + (" (all heap blocks freed)" if s["all_freed"] else ""))
        ok = (s["errors"] == 0 and not s["definitely_lost"] and not s["indirectly_lost"]
              and rep.accesses_per_s > 0 and sampler.records_received > 0)
        if not ok:
            print(text[-4000:], file=sys.stderr)
        return 0 if ok else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
