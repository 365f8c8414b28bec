"""What each cache_ext policy's hooks cost a cached read on this node.

A policy's miss-ratio curve says how often a tenant would miss under it,
not what the policy costs on the accesses that hit: every hit runs the
policy's `folio_accessed` hook (a BPF call, map lookups, list moves), and
the kernel's own policy runs none.  For a tenant whose hits are bound by
its CPU, that cost decides between two policies whose curves nearly agree
(a file cached whole, a hot set that fits), and no curve can show it.  A
read that misses costs a policy more: its insertion hook, and once the
cache is full its eviction, both in the reading thread before the read
returns.

So the agent measures both once, when it starts, on the node itself
(`measure` says how), and puts them on each curve it reports (meta
`hook_ns_per_access` and `hook_ns_per_miss`).  The controller weighs the
first against the tenant's own CPU per access and adds the second to every
miss of the tenant's model (controller/engine/round.py, choose_policies).
A policy that could not be measured has no figure, and the controller
scores it on its curve alone.
"""
from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.agent.cache_ext import PolicyActuator, PolicyError
from cachepilot.agent import cgroups
from cachepilot.agent.cgroups import cgroup_id

log = logging.getLogger("cachepilot.agent")

SCRATCH = "cachepilot-calibrate"
FILE_PAGES = 256            # 1 MiB: cached whole in any cgroup
READS = 2000                # timed reads per measurement
ROUNDS = 5                  # best of: other work on the machine only adds
# the misses: a file read once, page by page, in a cgroup with room for
# MISS_ROOM_PAGES of it; the first MISS_WARM reads fill the room (and run
# the policy's fresh code), the next MISS_READS are timed, every one a miss
# that evicts.  Fewer rounds: each read waits on the disk.
MISS_ROOM_PAGES = 512
MISS_WARM = MISS_ROOM_PAGES + 256
MISS_READS = 1000
MISS_FILE_PAGES = 2048      # 8 MiB: more pages than the reads, so none is read twice
MISS_ROUNDS = 3

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


# The miss child: read-ahead off and the file dropped from the cache, it
# says it is ready (its own memory in place) and waits while the agent sets
# the scratch cgroup's limit to what it uses besides page cache plus the
# room; then reads each page at most once, in a stride coprime with the
# page count, and times the reads after the warm ones.
_MISS_CHILD = r"""
import os, sys, time
path, warm, reads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
pages = os.fstat(fd).st_size // 4096
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
offsets = [((i * 97) % pages) * 4096 for i in range(warm + reads)]
print("ready", flush=True)
sys.stdin.readline()
for off in offsets[:warm]:
    os.pread(fd, 4096, off)
t0 = time.thread_time_ns()
for off in offsets[warm:]:
    os.pread(fd, 4096, off)
t1 = time.thread_time_ns()
print((t1 - t0) / reads, flush=True)
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
    ns_per_miss: dict[str, float] = field(default_factory=dict)
    miss_baseline_ns: float = 0.0       # a read that misses under no policy
    miss_failed: dict[str, str] = field(default_factory=dict)


def _enter(procs: Path):
    def run():
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    return run


def _child_result(loop: str, returncode: int, stdout: str, stderr: str) -> float:
    """What a measuring child printed, its CPU nanoseconds per read; a
    CalibrationError naming the `loop` where it failed or printed no number."""
    if returncode != 0:
        lines = stderr.strip().splitlines() or [f"exit status {returncode}"]
        raise CalibrationError(f"the {loop} failed: {lines[-1]}")
    try:
        return float(stdout.strip())
    except ValueError:
        raise CalibrationError(f"the {loop} printed {stdout.strip()!r}") from None


def _read_cost(path: Path, procs: Path, reads: int) -> float:
    """One child's CPU nanoseconds per cached read in the scratch cgroup."""
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(reads)],
                             capture_output=True, text=True, timeout=120,
                             preexec_fn=_enter(procs))
    except (OSError, subprocess.SubprocessError) as err:
        raise CalibrationError(f"the read loop did not run: {err}") from None
    return _child_result("read loop", out.returncode, out.stdout, out.stderr)


def _miss_cost(path: Path, scratch: Path, warm: int, reads: int, room_pages: int,
               timeout: float = 120.0) -> float:
    """One child's CPU nanoseconds per read that misses (and, past the
    room, evicts) in the scratch cgroup, held to what it uses besides page
    cache plus `room_pages` while it reads; the limit is lifted after."""
    try:
        child = subprocess.Popen([sys.executable, "-c", _MISS_CHILD, str(path), str(warm),
                                  str(reads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 preexec_fn=_enter(scratch / "cgroup.procs"))
    except OSError as err:
        raise CalibrationError(f"the miss loop did not run: {err}") from None
    try:
        ready, _, _ = select.select([child.stdout], [], [], timeout)
        if not ready or child.stdout.readline().strip() != "ready":
            child.kill()
            _, err = child.communicate()
            lines = err.strip().splitlines() or ["it did not say it was ready"]
            raise CalibrationError(f"the miss loop did not start: {lines[-1]}")
        try:
            held = cgroups.read_stats(scratch).nonfile_bytes + room_pages * 4096
            cgroups.write_limit(scratch, held)
        except cgroups.CgroupError as err:
            raise CalibrationError(f"the scratch cgroup cannot be held to its room: "
                                   f"{err}") from None
        out, err = child.communicate("go\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"the miss loop took over {timeout:.0f} s") from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        try:
            cgroups.write_limit(scratch, 0)
        except cgroups.CgroupError:
            pass
    return _child_result("miss loop", child.returncode, out, err)


def measure(actuator: PolicyActuator, root: str | os.PathLike, policies: list[str],
            folder: str | os.PathLike, reads: int = READS, rounds: int = ROUNDS,
            miss_reads: int = MISS_READS, miss_rounds: int = MISS_ROUNDS) -> HookCosts:
    """Each policy's CPU cost per cached read, and per read that misses,
    above the kernel's own, on this node.  Makes (and removes) the cgroup
    <root>/cachepilot-calibrate and the files <folder>/cachepilot-calibrate
    {.dat,-miss.dat}.  Raises CalibrationError when nothing can be measured
    at all; a miss loop that fails leaves the misses without figures (the
    reason in `miss_failed`), the hits' figures standing.

    Hits: a child process in the scratch memory cgroup (the agent passes
    its first root) reads cached 4 KiB pages of a small file, first under
    no policy, then under each policy in turn (alternating, the least of
    `rounds`: a busy machine can only make a round slower), and the
    difference in its own CPU time per read is the policy's cost per hit
    in nanoseconds.

    Misses: a child in the scratch cgroup, held to what it uses besides
    page cache plus MISS_ROOM_PAGES, reads pages of a larger file that it
    has never read (every read a miss, and after the first MISS_ROOM_PAGES
    every miss an eviction; read-ahead off), and the difference in its CPU
    time per read is the policy's cost per miss.  Against a disk's
    milliseconds it counts for little; against a fast disk's microseconds
    it decides.  (experiments/bench_policy_reclaim.py measures a missed
    read under each policy against the kernel's own.)

    `folder` is `cache_ext.calibrate_dir`, which must be on a disk file
    system (tmpfs pages are shared memory, which cache_ext does not track).
    Anything that fails for one policy (a policy the kernel refuses) leaves
    that policy without a figure (`failed`, `miss_failed`)."""
    folder = Path(folder)
    scratch = Path(root) / SCRATCH
    data, miss_data = folder / f"{SCRATCH}.dat", folder / f"{SCRATCH}-miss.dat"
    todo = [p for p in dict.fromkeys(policies) if p != actuator.default]
    costs = HookCosts()
    if not todo:
        return costs
    target = folder             # what could not be written, named in the error
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for target, pages in ((data, FILE_PAGES), (miss_data, MISS_FILE_PAGES)):
            with open(target, "wb") as fh:
                fh.write(os.urandom(pages * 4096))
                fh.flush()
                os.fsync(fh.fileno())
    except OSError as err:
        raise CalibrationError(f"cannot write {target}: {err}") from None
    cgid = None
    try:
        try:
            scratch.mkdir(exist_ok=True)
        except OSError as err:
            raise CalibrationError(f"cannot make the cgroup {scratch}: {err}") from None
        procs = scratch / "cgroup.procs"
        cgid = cgroup_id(scratch)
        order = [actuator.default] + todo

        def best_of(n, cost, failed):
            # each policy in turn, n times, the least of each kept; a policy
            # the kernel refuses (or whose loop fails) is left out after
            best = {p: float("inf") for p in order}
            for _ in range(n):
                for p in order:
                    if p in costs.failed or p in failed:
                        continue
                    try:
                        actuator.apply(str(scratch), p, cgid)
                        best[p] = min(best[p], cost())
                    except (PolicyError, CalibrationError) as err:
                        failed[p] = str(err)
            return best

        best = best_of(rounds, lambda: _read_cost(data, procs, reads), costs.failed)
        if actuator.default in costs.failed:
            raise CalibrationError(f"no read under the kernel's own policy: "
                                   f"{costs.failed[actuator.default]}")
        costs.baseline_ns = best[actuator.default]
        for p in todo:
            if p not in costs.failed:
                costs.ns_per_access[p] = max(0.0, best[p] - costs.baseline_ns)
        if miss_rounds > 0:
            best = best_of(miss_rounds, lambda: _miss_cost(
                miss_data, scratch, MISS_WARM, miss_reads, MISS_ROOM_PAGES), costs.miss_failed)
            if actuator.default in costs.miss_failed:
                why = costs.miss_failed.pop(actuator.default)
                for p in todo:
                    costs.miss_failed.setdefault(p, f"no miss under the kernel's own: {why}")
            else:
                costs.miss_baseline_ns = best[actuator.default]
                for p in todo:
                    if p not in costs.failed and p not in costs.miss_failed:
                        costs.ns_per_miss[p] = max(0.0, best[p] - costs.miss_baseline_ns)
        try:
            actuator.apply(str(scratch), actuator.default, cgid)
        except PolicyError as err:
            log.warning("calibration: the scratch cgroup's policy stays: %s", err)
        return costs
    finally:
        for path in (data, miss_data):
            try:
                path.unlink()
            except OSError:
                pass
        try:
            scratch.rmdir()
            if cgid is not None:
                actuator.forget(cgid)
        except (OSError, PolicyError):
            pass
