"""Memory cgroups on a real host, v1 and v2 alike: find them, read their
stats, and set their limits under DESIGN.md's safety rules.

Every function takes the cgroup's directory path, so tests can point them at
a plain file tree laid out like a cgroup (tests/test_cgroups*.py do).

    v1  memory.limit_in_bytes, memory.usage_in_bytes, memory.stat
        (cache, rss, total_*, workingset_refault_file, pgpgin)
    v2  memory.max, memory.high, memory.current, memory.stat
        (file, anon, workingset_refault_file)

and beside them, per cgroup, CPU time (v1 cpuacct, v2 cpu.stat) and disk
reads (v1 blkio.throttle.*, v2 io.stat, io.max).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from cachepilot.models.mrc import PAGE_SIZE

# A v1 limit at or above this is "no limit" (PAGE_COUNTER_MAX pages rounded).
V1_UNLIMITED = 1 << 62


class CgroupError(Exception):
    """A cgroup file could not be read or written; message names it."""


class CgroupGone(CgroupError):
    """The cgroup directory no longer exists."""


def version_of(path) -> int:
    """1 or 2 for a memory cgroup directory; raises CgroupError otherwise."""
    p = Path(path)
    if not p.is_dir():
        raise CgroupGone(f"{p} is not a cgroup directory (it does not exist)")
    if (p / "memory.limit_in_bytes").exists():
        return 1
    if (p / "memory.max").exists() or (p / "memory.current").exists():
        return 2
    if (p / "cgroup.controllers").exists():
        raise CgroupError(f"{p} is a cgroup v2 directory without the memory "
                          "controller (enable it in the parent's cgroup.subtree_control)")
    raise CgroupError(f"{p} is not a memory cgroup (no memory.limit_in_bytes "
                      "or memory.max)")


def memory_hierarchy() -> tuple[Path, int] | None:
    """Where this host's memory controller is: (/sys/fs/cgroup/memory, 1)
    on v1, (/sys/fs/cgroup, 2) on v2, None when there is none."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    try:
        if "memory" in (v2 / "cgroup.controllers").read_text().split():
            return v2, 2
    except OSError:
        pass
    return None


def cgroup_id(path) -> int:
    """The id the kernel gives the cgroup (its kernfs id), which is the
    inode number of its directory in v1 and v2 alike; the sampler keys its
    maps by it."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        raise CgroupGone(f"{path} does not exist") from None


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except FileNotFoundError:
        if not p.parent.is_dir():
            raise CgroupGone(f"{p.parent} no longer exists") from None
        raise CgroupError(f"{p} is missing") from None
    except OSError as err:
        raise CgroupError(f"cannot read {p}: {err.strerror or err}") from None


def read_kv(p: Path) -> dict[str, int]:
    out = {}
    for line in _read(p).splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _read_limit(p: Path) -> int:
    text = _read(p).strip()
    if text == "max":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise CgroupError(f"{p} holds {text!r}, not a number") from None
    return 0 if value >= V1_UNLIMITED else value


@dataclass
class CgroupStats:
    """One reading of a memory cgroup; bytes, counters are cumulative."""
    version: int
    limit_bytes: int            # the limit in force (0 = none)
    high_bytes: int             # v2 memory.high (0 = none; v1: 0)
    usage_bytes: int
    file_bytes: int             # page cache charged to the cgroup
    anon_bytes: int
    refaults: int               # workingset_refault_file (cumulative)
    pgpgin: int                 # v1: charge events; v2: 0 (not exported)
    shmem_bytes: int = 0        # tmpfs / shared memory, counted in file_bytes
    mapped_file_bytes: int = 0  # page cache mapped into processes, in file_bytes

    @property
    def sampled_cache_bytes(self) -> int:
        """The page cache the read-path sampler sees: file pages that are
        neither shared memory nor mapped."""
        return max(0, self.file_bytes - self.shmem_bytes - self.mapped_file_bytes)

    @property
    def nonfile_bytes(self) -> int:
        """Memory charged to the cgroup outside the page cache that the
        sampler sees (pages read through read(2)): anonymous and kernel
        memory (both in usage), shared memory (which v1 and v2 count as
        cache but no reclaim of the file cache frees without swap) and
        mapped file pages (executables, libraries, mmap'ed files: faults do
        not pass the read-path tracepoints, and reclaim protects pages in
        use).  A limit leaves this much less room for the sampled cache."""
        return max(self.anon_bytes, self.usage_bytes - self.sampled_cache_bytes)

    @property
    def unmapped_nonfile_bytes(self) -> int:
        """nonfile_bytes without the mapped file pages: what stays charged
        under any limit (anonymous, kernel and shared memory), whereas
        reclaim takes the mapped pages no process touches."""
        return max(self.anon_bytes, self.nonfile_bytes - self.mapped_file_bytes)

    @property
    def effective_limit_bytes(self) -> int:
        limits = [v for v in (self.limit_bytes, self.high_bytes) if v]
        return min(limits) if limits else 0


def read_stats(path) -> CgroupStats:
    p = Path(path)
    version = version_of(p)
    stat = read_kv(p / "memory.stat")
    if version == 1:
        # total_* include the descendants, which is what a limit constrains
        def get(key):
            return stat.get("total_" + key, stat.get(key, 0))
        return CgroupStats(
            version=1,
            limit_bytes=_read_limit(p / "memory.limit_in_bytes"),
            high_bytes=0,
            usage_bytes=int(_read(p / "memory.usage_in_bytes").strip() or 0),
            file_bytes=get("cache"),
            anon_bytes=get("rss"),
            refaults=get("workingset_refault_file") or get("workingset_refault"),
            pgpgin=get("pgpgin"),
            shmem_bytes=get("shmem"),
            mapped_file_bytes=get("mapped_file"))
    return CgroupStats(
        version=2,
        limit_bytes=_read_limit(p / "memory.max"),
        high_bytes=_read_limit(p / "memory.high") if (p / "memory.high").exists() else 0,
        usage_bytes=int(_read(p / "memory.current").strip() or 0),
        file_bytes=stat.get("file", 0),
        anon_bytes=stat.get("anon", 0),
        refaults=stat.get("workingset_refault_file", stat.get("workingset_refault", 0)),
        pgpgin=0,
        shmem_bytes=stat.get("shmem", 0),
        mapped_file_bytes=stat.get("file_mapped", 0))


def cpu_usage_us(path) -> int | None:
    """CPU time the cgroup's tasks have used, in microseconds, cumulative;
    None where it cannot be read.  v2: cpu.stat's usage_usec (there in
    every cgroup, with or without the cpu controller).  v1: the memory
    cgroup's namesake in the cpuacct hierarchy (cpuacct.usage, in ns),
    when one exists at the same relative path."""
    p = Path(path)
    try:
        if (p / "cpu.stat").exists() and not (p / "memory.limit_in_bytes").exists():
            return read_kv(p / "cpu.stat").get("usage_usec")
        parts = p.resolve().parts
        if "memory" not in parts:
            return None
        i = parts.index("memory")
        for name in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu"):
            q = Path(*parts[:i], name, *parts[i + 1:]) / "cpuacct.usage"
            if q.exists():
                return int(_read(q).strip() or 0) // 1000
    except (CgroupError, OSError, ValueError):
        return None
    return None


def _blkio_namesake(p: Path) -> tuple[Path, Path] | None:
    """(blkio hierarchy root, directory) of a v1 memory cgroup's namesake:
    the same relative path in the blkio hierarchy, when it exists."""
    parts = p.resolve().parts
    if "memory" not in parts:
        return None
    i = parts.index("memory")
    root = Path(*parts[:i], "blkio")
    d = root.joinpath(*parts[i + 1:])
    return (root, d) if d.is_dir() else None


def _v1_reads(p: Path) -> tuple[int, bool]:
    """The sum of a blkio.throttle.io_service_bytes* file's Read lines, and
    whether it lists any device at all."""
    total, devices = 0, False
    for line in _read(p).splitlines():
        parts = line.split()
        if len(parts) == 3:
            devices = True
            if parts[1] == "Read":
                total += int(parts[2])
    return total, devices


def read_bytes(path) -> int | None:
    """Bytes the cgroup's tasks have read from block devices, cumulative:
    what its misses ask of the disk.  None where no I/O accounting reaches
    it.  v2: io.stat's rbytes.  v1: the blkio namesake's throttle counters,
    which the kernel keeps only once some cgroup has a throttle on a disk."""
    p = Path(path)
    try:
        if not (p / "memory.limit_in_bytes").exists():
            if not (p / "io.stat").exists():
                return None
            return sum(int(f[len("rbytes="):]) for line in _read(p / "io.stat").splitlines()
                       for f in line.split()[1:] if f.startswith("rbytes="))
        where = _blkio_namesake(p)
        if where is None:
            return None
        root, d = where
        for name in ("blkio.throttle.io_service_bytes_recursive",
                     "blkio.throttle.io_service_bytes"):
            if (d / name).exists():
                total, devices = _v1_reads(d / name)
                if devices:
                    return total
                # no device yet: counted (0) if the kernel counts for any disk
                return 0 if _v1_reads(root / "blkio.throttle.io_service_bytes")[1] else None
    except (CgroupError, OSError, ValueError):
        return None
    return None


def read_throttle_bps(path) -> int | None:
    """The smallest read throttle, bytes per second, set on the cgroup
    itself (v1: blkio.throttle.read_bps_device of its blkio namesake; v2:
    io.max rbps), or None: a disk bandwidth an emulated host declares."""
    p = Path(path)
    try:
        if (p / "memory.limit_in_bytes").exists():
            where = _blkio_namesake(p)
            if where is None:
                return None
            text = _read(where[1] / "blkio.throttle.read_bps_device")
            found = [int(line.split()[1]) for line in text.splitlines()
                     if len(line.split()) == 2]
        elif (p / "io.max").exists():
            found = [int(f[len("rbps="):]) for line in _read(p / "io.max").splitlines()
                     for f in line.split()[1:] if f.startswith("rbps=") and f != "rbps=max"]
        else:
            return None
    except (CgroupError, OSError, ValueError):
        return None
    found = [v for v in found if v > 0]
    return min(found) if found else None


def limit_file(path, knob: str = "max") -> Path:
    """The file that holds the limit: v1 memory.limit_in_bytes; v2 memory.max
    or memory.high (knob)."""
    p = Path(path)
    if version_of(p) == 1:
        return p / "memory.limit_in_bytes"
    if knob not in ("max", "high"):
        raise CgroupError(f"cgroup v2 limit knob must be 'max' or 'high', not {knob!r}")
    return p / f"memory.{knob}"


def read_limit(path, knob: str = "max") -> int:
    """The limit in force (0 = none), from limit_file."""
    return _read_limit(limit_file(path, knob))


def write_limit(path, limit_bytes: int, knob: str = "max") -> int:
    """Write a limit (0 = remove it) and return what the kernel holds after
    (it rounds to pages; v1 refuses a limit below usage it cannot reclaim)."""
    f = limit_file(path, knob)
    version = version_of(path)
    if limit_bytes <= 0:
        text = "max" if version == 2 else "-1"
    else:
        text = str(int(limit_bytes))
    try:
        with open(f, "w") as fh:
            fh.write(text)
    except FileNotFoundError:
        raise CgroupGone(f"{Path(path)} no longer exists") from None
    except OSError as err:
        raise CgroupError(f"the kernel refused {text} for {f}: "
                          f"{err.strerror or err}") from None
    return _read_limit(f)


# -- where the agent may look and touch --------------------------------------

def is_under(path, roots) -> bool:
    real = os.path.realpath(path)
    for root in roots:
        r = os.path.realpath(root)
        if real == r or real.startswith(r.rstrip("/") + "/"):
            return True
    return False


def expand(patterns, roots) -> list[str]:
    """The cgroup directories the patterns name: absolute paths or globs, or
    paths relative to each root; only directories under a root are kept."""
    found = []
    for pattern in patterns:
        cands = [pattern] if os.path.isabs(pattern) else \
            [os.path.join(r, pattern) for r in roots]
        for cand in cands:
            for hit in sorted(glob.glob(cand)):
                if os.path.isdir(hit) and is_under(hit, roots) and hit not in found:
                    found.append(os.path.normpath(hit))
    return found


# -- the safety rules -------------------------------------------------------

@dataclass
class SafetyRules:
    """DESIGN.md "Safety rules": never below the floor, never below anonymous
    memory plus a margin, at most max_step per interval."""
    floor_bytes: int = 64 << 20
    anon_margin_bytes: int = 32 << 20
    anon_margin_ratio: float = 0.1      # margin is max(bytes, ratio * anon)
    max_step_bytes: int = 1 << 30       # per cgroup per interval (0 = no cap)


@dataclass
class LimitDecision:
    requested: int
    limit: int          # what to write (0 = no limit)
    clamped: bool
    reason: str


def safe_limit(requested: int, current_limit: int, anon_bytes: int,
               rules: SafetyRules, floor_bytes: int | None = None,
               ceiling_bytes: int = 0, node_memory: int = 0,
               usage_bytes: int = 0) -> LimitDecision:
    """The limit the rules allow for a requested one, and why it differs.
    Without a current limit, a cut is measured from current usage: going
    from "no limit" straight to a small one is as abrupt as any cut."""
    floor = rules.floor_bytes if floor_bytes is None else floor_bytes
    reasons = []
    limit = int(requested)
    if limit <= 0:
        # "no limit" is a step to node memory; allowed only if no step cap
        if rules.max_step_bytes and current_limit and node_memory:
            limit = node_memory
        else:
            return LimitDecision(requested, 0, False, "limit removed")
    anon_floor = anon_bytes + max(rules.anon_margin_bytes,
                                  int(rules.anon_margin_ratio * anon_bytes))
    if limit < floor:
        reasons.append(f"raised to the floor {floor >> 20} MiB")
        limit = floor
    if limit < anon_floor:
        reasons.append(f"raised to anonymous memory plus margin {anon_floor >> 20} MiB")
        limit = anon_floor
    if ceiling_bytes and limit > ceiling_bytes:
        reasons.append(f"lowered to the ceiling {ceiling_bytes >> 20} MiB")
        limit = max(ceiling_bytes, anon_floor)
    base = current_limit or usage_bytes
    if rules.max_step_bytes and base:
        lo = base - rules.max_step_bytes
        hi = current_limit + rules.max_step_bytes if current_limit else 0
        if limit < lo:
            reasons.append(f"step capped at {rules.max_step_bytes >> 20} MiB")
            limit = lo
        elif hi and limit > hi:
            reasons.append(f"step capped at {rules.max_step_bytes >> 20} MiB")
            limit = hi
    if limit < max(floor, anon_floor):
        # the OOM guard outranks the step cap
        limit = max(floor, anon_floor)
    limit = (limit + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
    return LimitDecision(requested, limit, bool(reasons),
                         "; ".join(reasons) or "within the safety rules")
