"""The mapped file pages a cgroup's processes actually use.

A cgroup is charged for the file pages its processes map: executables,
libraries, mmap'ed files.  An unlimited cgroup keeps every one of them, but
under a limit reclaim takes the ones nobody touches and keeps the ones in
use, so counting all of them as a fixed cost overstates what a limit must
hold.  A fio process maps some 20 MiB of libraries and runs out of a few
hundred KiB of them.

The kernel can tell which mapped pages were touched in a window: writing
3 to /proc/PID/clear_refs clears the referenced state of that process's
file-backed mapped pages, and /proc/PID/smaps then counts, per mapping, the
pages referenced since (`Referenced:`).  That is the set reclaim protects.
Only the one-shot profile uses this: clearing referenced bits every
interval would blunt the kernel's own aging of a tenant's mapped pages.
"""
from __future__ import annotations

import os
from pathlib import Path

# mappings of shared memory are charged as shmem, which is counted apart
_SHMEM_PREFIXES = ("/dev/shm/", "/memfd:", "/SYSV", "/dev/zero")


def cgroup_pids(path) -> list[int]:
    """Every process in the cgroup and its descendants."""
    pids: list[int] = []
    for d, _, _ in os.walk(path):
        try:
            text = Path(d, "cgroup.procs").read_text()
        except OSError:
            continue
        pids.extend(int(x) for x in text.split() if x.isdigit())
    return pids


def clear_referenced(path) -> int:
    """Start a window: clear the referenced state of the file-mapped pages
    of every process in the cgroup.  Returns how many processes it reached
    (a process that exits meanwhile is skipped)."""
    done = 0
    for pid in cgroup_pids(path):
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("3")
            done += 1
        except OSError:
            pass
    return done


def parse_smaps(text: str) -> dict[tuple, int]:
    """Referenced bytes per file-backed mapping of one smaps file, keyed by
    (device, inode, file offset, length) so that a library mapped by two
    processes of the cgroup is not counted twice."""
    out: dict[tuple, int] = {}
    key = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if not head:
            continue
        if "-" in head[0] and len(head) >= 5 and head[0][0] in "0123456789abcdef" \
                and not head[0].endswith(":"):
            key = None
            name = head[5].strip() if len(head) > 5 else ""
            try:
                inode = int(head[4])
                start, end = (int(x, 16) for x in head[0].split("-"))
                offset = int(head[2], 16)
            except ValueError:
                continue
            if inode and name.startswith("/") and not name.startswith(_SHMEM_PREFIXES):
                key = (head[3], inode, offset, end - start)
        elif key is not None and head[0] == "Referenced:" and len(head) >= 2:
            try:
                kib = int(head[1])
            except ValueError:
                continue
            out[key] = max(out.get(key, 0), kib * 1024)
    return out


def referenced_in(smaps_texts) -> int:
    """Referenced bytes of the file mappings in several processes' smaps,
    a mapping two of them share counted once (the larger of its counts)."""
    total: dict[tuple, int] = {}
    for text in smaps_texts:
        for key, b in parse_smaps(text).items():
            total[key] = max(total.get(key, 0), b)
    return sum(total.values())


def referenced_bytes(path) -> int:
    """Bytes of file-mapped pages the cgroup's processes referenced since
    the last clear_referenced(), each mapping counted once."""
    def texts():
        for pid in cgroup_pids(path):
            try:
                yield Path(f"/proc/{pid}/smaps").read_text()
            except OSError:
                continue            # the process exited meanwhile
    return referenced_in(texts())
