"""What each cache_ext policy's hooks cost a cached read on this node.

A policy's miss-ratio curve says how often a tenant would miss under it,
not what the policy costs on the accesses that hit: every hit runs the
policy's `folio_accessed` hook (a BPF call, map lookups, list moves), and
the kernel's own policy runs none.  For a tenant whose hits are bound by
its CPU, that cost decides between two policies whose curves nearly agree
(a file cached whole, a hot set that fits), and no curve can show it.

So the agent measures it once, when it starts, on the node itself: a child
process in a scratch memory cgroup under the agent's first root reads
cached 4 KiB pages of a small file, first under no policy, then under each
policy in turn (alternating, the least of five rounds: a busy machine can
only make a round slower), and the difference in
its own CPU time per read is the policy's cost per hit in nanoseconds.
The agent puts it on each curve it reports (meta `hook_ns_per_access`);
the controller weighs it against the tenant's own CPU per access
(controller/engine/round.py, choose_policies).  Misses cost a policy more
(insertion, eviction; experiments/bench_policy_reclaim.py measures a read
that misses under each policy against the kernel's own), but a tenant
that misses often waits on its disk, where that CPU does not show; one
bound by its CPU while it misses is not weighed for it yet.

The file lives in `cache_ext.calibrate_dir`, which must be on a disk file
system (tmpfs pages are shared memory, which cache_ext does not track).
Anything that fails (no such folder, a policy the kernel refuses) leaves
that policy without a figure, and the controller scores it on its curve
alone, as before.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.agent.cache_ext import PolicyActuator, PolicyError
from cachepilot.agent.cgroups import cgroup_id

log = logging.getLogger("cachepilot.agent")

SCRATCH = "cachepilot-calibrate"
FILE_PAGES = 256            # 1 MiB: cached whole in any cgroup
READS = 2000                # timed reads per measurement
ROUNDS = 5                  # best of: other work on the machine only adds

# The child: moved into the scratch cgroup before it runs (preexec), it
# drops the file from the page cache, reads it once (so its pages are
# charged to the scratch cgroup, under the policy attached there), makes
# READS reads of cached pages untimed (a policy just attached is freshly
# compiled code: under emulation its first runs are translated, and
# measured right after the attach fifo, which has no hook on a hit, came
# out slower than s3fifo), then times READS more in its own CPU time.
_CHILD = r"""
import os, sys, time
path, reads = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
pages = size // 4096
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
for i in range(pages):
    os.pread(fd, 4096, i * 4096)
step = 97                     # coprime with the page count: every page in turn
offsets = [((i * step) % pages) * 4096 for i in range(reads)]
for off in offsets:           # untimed: code just loaded runs slow at first
    os.pread(fd, 4096, off)
t0 = time.thread_time_ns()
for off in offsets:
    os.pread(fd, 4096, off)
t1 = time.thread_time_ns()
print((t1 - t0) / reads)
"""


class CalibrationError(Exception):
    """The measurement could not be made; the message says why."""


@dataclass
class HookCosts:
    """Per policy, CPU nanoseconds its hooks add to one cached read (the
    kernel's own policy: none), and per policy why it has no figure."""
    ns_per_access: dict[str, float] = field(default_factory=dict)
    baseline_ns: float = 0.0            # a cached read under no policy
    failed: dict[str, str] = field(default_factory=dict)


def _enter(procs: Path):
    def run():
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    return run


def _read_cost(path: Path, procs: Path, reads: int) -> float:
    """One child's CPU nanoseconds per cached read in the scratch cgroup."""
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(reads)],
                             capture_output=True, text=True, timeout=120,
                             preexec_fn=_enter(procs))
    except (OSError, subprocess.SubprocessError) as err:
        raise CalibrationError(f"the read loop did not run: {err}") from None
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        raise CalibrationError(f"the read loop failed: {lines[-1]}")
    try:
        return float(out.stdout.strip())
    except ValueError:
        raise CalibrationError(f"the read loop printed {out.stdout.strip()!r}") from None


def measure(actuator: PolicyActuator, root: str | os.PathLike, policies: list[str],
            folder: str | os.PathLike, reads: int = READS,
            rounds: int = ROUNDS) -> HookCosts:
    """Each policy's CPU cost per cached read above the kernel's own, on
    this node.  Makes (and removes) the cgroup <root>/cachepilot-calibrate
    and the file <folder>/cachepilot-calibrate.dat.  Raises
    CalibrationError when nothing can be measured at all."""
    folder = Path(folder)
    scratch = Path(root) / SCRATCH
    data = folder / f"{SCRATCH}.dat"
    todo = [p for p in dict.fromkeys(policies) if p != actuator.default]
    costs = HookCosts()
    if not todo:
        return costs
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(data, "wb") as fh:
            fh.write(os.urandom(FILE_PAGES * 4096))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise CalibrationError(f"cannot write {data}: {err}") from None
    cgid = None
    try:
        try:
            scratch.mkdir(exist_ok=True)
        except OSError as err:
            raise CalibrationError(f"cannot make the cgroup {scratch}: {err}") from None
        procs = scratch / "cgroup.procs"
        cgid = cgroup_id(scratch)
        best = {p: float("inf") for p in [actuator.default] + todo}
        for _ in range(rounds):
            for p in [actuator.default] + todo:
                if p in costs.failed:
                    continue
                try:
                    actuator.apply(str(scratch), p, cgid)
                except PolicyError as err:
                    costs.failed[p] = str(err)
                    continue
                best[p] = min(best[p], _read_cost(data, procs, reads))
        try:
            actuator.apply(str(scratch), actuator.default, cgid)
        except PolicyError as err:
            log.warning("calibration: the scratch cgroup's policy stays: %s", err)
        costs.baseline_ns = best[actuator.default]
        for p in todo:
            if p not in costs.failed:
                costs.ns_per_access[p] = max(0.0, best[p] - costs.baseline_ns)
        return costs
    finally:
        try:
            data.unlink()
        except OSError:
            pass
        try:
            scratch.rmdir()
            if cgid is not None:
                actuator.forget(cgid)
        except (OSError, PolicyError):
            pass
