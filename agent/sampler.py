"""The eBPF access sampler, seen from Python.

The sampler loader (built from bpf/sampler.c and bpf/sampler.bpf.c; found by
agent/binaries.py, in the package or the checkout's bpf/out) loads the
tp_btf programs and runs as our child process: it takes text commands on
stdin and streams binary frames on stdout (the frame layout is described at
the top of bpf/sampler.c).  A reader thread sorts the frames: frames of
sampled access records pile up until the agent drains them (split by
cgroup then, in one go), counter snapshots answer `counters()`,
distinct-page sketches answer `sketches()`.

Nothing here is on the kernel's hot path; the kernel side only bumps
per-CPU counters and, for sampled keys, writes a 32-byte record.
"""
from __future__ import annotations

import os
import struct
import subprocess
import threading
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

# The one definition of the record layout (models/record_format.md) and of
# the SHARDS threshold of a rate (the curve builders sample with the same).
from cachepilot.models.shards import rate_threshold as threshold_for_rate  # noqa: F401
from cachepilot.models.shards import threshold_rate as rate_for_threshold  # noqa: F401
from cachepilot.agent import binaries
from cachepilot.models import hll
# a record's op: a page read, a page the read brought in (models/record_format.md)
from cachepilot.models.traces.records import OP_ACCESS, OP_INSERT, RECORD_DTYPE  # noqa: F401

LOADER = binaries.bpf_dir() / "sampler"
BTF = Path("/sys/kernel/btf/vmlinux")

FRAME_RECORDS, FRAME_COUNTERS, FRAME_MESSAGE, FRAME_SKETCHES = 1, 2, 3, 4
_FRAME = struct.Struct("<II")

MASK64 = (1 << 64) - 1
HASH_SEED = 0x9E3779B97F4A7C15


def cp_hash64(x: int) -> int:
    """Python copy of bpf/include/cachepilot_hash.h's cp_hash64 (tests pin
    both against the same vectors)."""
    x = (x + HASH_SEED) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def kernel_dev(st_dev: int) -> int:
    """The kernel's dev_t (what super_block.s_dev holds) of a stat st_dev."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def page_key(path_or_stat, index: int) -> int:
    """Page key the sampler gives page `index` of a file: cp_page_key(dev,
    ino, index) with the kernel's device number."""
    st = os.stat(path_or_stat) if not isinstance(path_or_stat, os.stat_result) \
        else path_or_stat
    return cp_hash64(cp_hash64(kernel_dev(st.st_dev)) ^ st.st_ino) ^ index


@dataclass
class Counters:
    """One watched cgroup's counters, summed over CPUs (pages, not events)."""
    accesses: int = 0
    inserts: int = 0
    removals: int = 0
    sampled: int = 0
    drops: int = 0
    access_events: int = 0
    insert_events: int = 0
    removal_events: int = 0
    sampled_inserts: int = 0     # insert records handed over (pages)
    insert_drops: int = 0        # ... and lost to a full ring buffer

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(*(getattr(self, f.name) - getattr(other, f.name)
                          for f in fields(self)))

    def __add__(self, other: "Counters") -> "Counters":
        return Counters(*(getattr(self, f.name) + getattr(other, f.name)
                          for f in fields(self)))


_NCOUNTERS = len(fields(Counters))
_ENTRY = struct.Struct(f"<QQ{_NCOUNTERS}Q")


def access_batch(recs, t0_ns: int, t1_ns: int, accesses: int):
    """The access records of one tick, in time order: (keys, tids,
    positions).  The kernel counts every page read but orders none, so a
    record's position among the tick's `accesses` is interpolated from its
    time between the tick's start and end, then nudged to be strictly
    increasing (records the same instant mapped to one position -- a page
    read twice in a row -- land on neighbouring ones).  MRU's chain model
    (models/mruchain.py) needs positions only to the width of its bins,
    hundreds of accesses at R = 0.01."""
    if recs is None or len(recs) == 0:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, np.uint64), np.zeros(0, np.uint32), empty
    acc = recs[recs["op"] == OP_ACCESS]
    acc = acc[np.argsort(acc["time_ns"], kind="stable")]
    m = len(acc)
    total = max(int(accesses), m)
    span = max(1, int(t1_ns) - int(t0_ns))
    frac = (acc["time_ns"].astype(np.float64) - float(t0_ns)) / span
    pos = np.clip(np.floor(frac * total), 0, total - 1).astype(np.int64)
    i = np.arange(m, dtype=np.int64)
    pos = np.maximum.accumulate(pos - i) + i
    pos = np.minimum(pos, total - m + i)
    return acc["key"], acc["tid"], pos


class SamplerUnavailable(Exception):
    """The sampler cannot run here; the message names what is missing."""


def _by_cgroup(recs: np.ndarray) -> dict[int, np.ndarray]:
    """Records split by cgroup id, each cgroup's in their order."""
    if not len(recs):
        return {}
    cg = recs["cgroup_id"]
    order = np.argsort(cg, kind="stable")
    ids = cg[order]
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return {int(cg[g[0]]): recs[g] for g in np.split(order, cuts)}


def why_unavailable(loader: Path = LOADER) -> str | None:
    """None when the sampler can run, else what is missing, in one line."""
    if os.geteuid() != 0:
        return "not running as root (BPF needs CAP_BPF and CAP_PERFMON)"
    if not BTF.exists():
        return f"the kernel has no BTF ({BTF} is missing)"
    if not loader.exists():
        return f"the sampler is not built ({loader} is missing; run `make -C bpf`)"
    try:
        res = subprocess.run([str(loader), "--check"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the sampler does not start: {err}"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the BPF sampler cannot load here: {last}"
    return None


class Sampler:
    """A running sampler child process."""

    def __init__(self, loader: Path = LOADER, ring_bytes: int = 1 << 22,
                 empty: bool = False, copies: int = 1):
        """empty=True attaches empty programs instead (nothing is counted):
        the overhead benchmark's floor.  copies > 1 attaches the access
        program that many times (benchmarks only: every copy counts)."""
        if not Path(loader).exists():
            raise SamplerUnavailable(f"the sampler is not built ({loader} is missing)")
        self._proc = subprocess.Popen(
            [str(loader), "--ring-bytes", str(ring_bytes), *(["--empty"] if empty else []),
             *(["--copies", str(copies)] if copies != 1 else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0)
        self._lock = threading.Condition()
        self._frames: list[bytes] = []     # record frames not drained yet
        self._messages: list[str] = []
        self._counters: list[tuple[int, dict[int, tuple[int, Counters]]]] = []
        self._sketches: list[dict[int, np.ndarray]] = []
        self._closed = False
        self.records_received = 0
        self._reader = threading.Thread(target=self._read_frames, daemon=True,
                                        name="sampler-reader")
        self._reader.start()
        msg = self._wait_message(("ready",), timeout=60)
        if msg is None:
            err = self._stderr_tail()
            self.close()
            raise SamplerUnavailable(f"the BPF sampler did not start: {err}")

    # -- the reader thread -------------------------------------------------
    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        out = self._proc.stdout
        while len(buf) < n:
            try:
                chunk = out.read(n - len(buf))
            except ValueError:      # closed by close() while we waited
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _read_frames(self):
        while True:
            head = self._read_exact(_FRAME.size)
            if head is None:
                break
            kind, length = _FRAME.unpack(head)
            payload = self._read_exact(length) if length else b""
            if payload is None:
                break
            if kind == FRAME_RECORDS:
                # kept as they came: drain() sorts them by cgroup in one go
                # (per frame, the numpy calls on a handful of records cost
                # the agent more than the records did)
                with self._lock:
                    self.records_received += len(payload) // RECORD_DTYPE.itemsize
                    self._frames.append(payload)
            elif kind == FRAME_COUNTERS:
                now = struct.unpack_from("<Q", payload)[0]
                snap = {}
                for off in range(8, len(payload), _ENTRY.size):
                    vals = _ENTRY.unpack_from(payload, off)
                    snap[vals[0]] = (vals[1], Counters(*vals[2:]))
                with self._lock:
                    self._counters.append((now, snap))
                    self._lock.notify_all()
            elif kind == FRAME_SKETCHES:
                step = 8 + hll.REGISTERS
                sketches = {}
                for off in range(0, len(payload) - step + 1, step):
                    cg = struct.unpack_from("<Q", payload, off)[0]
                    sketches[cg] = np.frombuffer(payload, np.uint8, hll.REGISTERS,
                                                 off + 8).copy()
                with self._lock:
                    self._sketches.append(sketches)
                    self._lock.notify_all()
            elif kind == FRAME_MESSAGE:
                with self._lock:
                    self._messages.append(payload.decode(errors="replace"))
                    self._lock.notify_all()
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _wait_message(self, prefixes, timeout=10.0) -> str | None:
        with self._lock:
            def found():
                for i, m in enumerate(self._messages):
                    if m.startswith(prefixes):
                        return self._messages.pop(i)
                return None
            msg = found()
            while msg is None and not self._closed:
                if not self._lock.wait(timeout):
                    break
                msg = found()
            return msg

    def _stderr_tail(self) -> str:
        try:
            self._proc.wait(timeout=5)
            text = self._proc.stderr.read().decode(errors="replace").strip()
        except Exception:   # noqa: BLE001 - only for the message
            text = ""
        return (text.splitlines() or ["exited without a message"])[-1]

    def _command(self, line: str, expect: tuple[str, ...] | None):
        if self._closed or self._proc.poll() is not None:
            raise SamplerUnavailable(f"the sampler exited: {self._stderr_tail()}")
        try:
            self._proc.stdin.write((line + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise SamplerUnavailable(f"the sampler exited: {err}") from None
        if expect is None:
            return None
        msg = self._wait_message(expect)
        if msg is None:
            raise SamplerUnavailable(f"the sampler did not answer {line.split()[0]!r}")
        if msg.startswith("error"):
            raise SamplerUnavailable(f"sampler: {msg}")
        return msg

    # -- the API -----------------------------------------------------------
    def watch(self, cgroup_id: int, threshold: int):
        """Start watching a memory cgroup (or change its threshold; its
        counters carry on).  threshold 0 counts without sampling."""
        self._command(f"watch {int(cgroup_id)} {int(threshold)}",
                      (f"ok watch {int(cgroup_id)}", f"error watch {int(cgroup_id)}"))

    def unwatch(self, cgroup_id: int):
        self._command(f"unwatch {int(cgroup_id)}",
                      (f"ok unwatch {int(cgroup_id)}", f"error unwatch {int(cgroup_id)}"))
        self.drain(cgroup_id)

    def pause(self):
        """Stop draining the ring buffer (records beyond its size are dropped
        and counted by the kernel side)."""
        self._command("pause", ("ok pause",))

    def resume(self):
        self._command("resume", ("ok resume",))

    def _ask(self, command: str, answers: list, timeout: float):
        """Send a command whose answer is a frame the reader appends to
        `answers`, and wait for it."""
        with self._lock:
            answers.clear()
        self._command(command, None)
        with self._lock:
            while not answers and not self._closed:
                if not self._lock.wait(timeout):
                    break
            if not answers:
                raise SamplerUnavailable(f"the sampler did not answer '{command}'")
            return answers.pop(0)

    def counters(self, timeout: float = 10.0) -> tuple[int, dict[int, tuple[int, Counters]]]:
        """(monotonic ns, {cgroup id: (threshold, Counters)}).  Every record
        those counters count as sampled has been received when this returns."""
        return self._ask("counters", self._counters, timeout)

    def sketches(self, timeout: float = 10.0) -> dict[int, np.ndarray]:
        """{cgroup id: HyperLogLog registers of every page it read since the
        last call} (models/hll.py); the kernel starts new sketches."""
        return self._ask("sketches", self._sketches, timeout)

    def drain(self, cgroup_id: int | None = None) -> dict[int, np.ndarray]:
        """Records received so far, per cgroup id (each in the order they
        came), and forget them; with `cgroup_id`, that cgroup's alone (an
        empty array when it has none), the others kept."""
        with self._lock:
            frames, self._frames = self._frames, []
        by_cgroup = _by_cgroup(np.frombuffer(b"".join(frames), RECORD_DTYPE))
        if cgroup_id is None:
            return by_cgroup
        mine = by_cgroup.pop(int(cgroup_id), np.zeros(0, RECORD_DTYPE))
        if by_cgroup:
            rest = b"".join(r.tobytes() for r in by_cgroup.values())
            with self._lock:
                self._frames.insert(0, rest)
        return {int(cgroup_id): mine}

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def close(self):
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(b"quit\n")
                self._proc.stdin.flush()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        # the loader is gone: its stdout ends and the reader stops by itself
        self._reader.join(timeout=5)
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
