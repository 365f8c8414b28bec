"""A cgroup's disk reads and read throttle (agent/cgroups.py read_bytes,
read_throttle_bps): on file trees laid out like v1's blkio and v2's io
files, and where the machine has them, on real v1 memory and blkio
cgroups with a file read from a disk."""
import os
import subprocess
from pathlib import Path

import pytest

from cachepilot.agent import cgroups

MiB = 1 << 20
V1_BLKIO = Path("/sys/fs/cgroup/blkio")


def v1_pair(tmp_path: Path, rel: str = "host/t") -> tuple[Path, Path]:
    """A memory cgroup and the directory of its blkio namesake (not made)."""
    mem = tmp_path / "memory" / rel
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    return mem, tmp_path / "blkio" / rel


def rwstat(**devices) -> str:
    """A blkio.throttle.io_service_bytes* file: devices maps "8:0" to
    (read, write); the kernel ends each device and the file with Total."""
    out, total = [], 0
    for dev, (r, w) in devices.items():
        out += [f"{dev} Read {r}", f"{dev} Write {w}", f"{dev} Sync {r + w}",
                f"{dev} Async 0", f"{dev} Discard 0", f"{dev} Total {r + w}"]
        total += r + w
    return "\n".join(out + [f"Total {total}"]) + "\n"


def test_v1_reads_sum_the_read_lines_of_the_blkio_namesake(tmp_path):
    mem, blk = v1_pair(tmp_path)
    assert cgroups.read_bytes(mem) is None                  # no blkio namesake
    blk.mkdir(parents=True)
    assert cgroups.read_bytes(mem) is None                  # no throttle files
    (blk / "blkio.throttle.io_service_bytes").write_text(rwstat(**{"8:0": (300, 50)}))
    assert cgroups.read_bytes(mem) == 300                   # the fallback
    (blk / "blkio.throttle.io_service_bytes_recursive").write_text(
        rwstat(**{"8:0": (4 * MiB, 999), "8:16": (1000, 0)}))
    # the recursive file wins; Write, Sync and both Total lines are not reads
    assert cgroups.read_bytes(mem) == 4 * MiB + 1000


def test_v1_a_file_that_lists_no_device_is_zero_only_where_the_kernel_counts(tmp_path):
    mem, blk = v1_pair(tmp_path)
    blk.mkdir(parents=True)
    (blk / "blkio.throttle.io_service_bytes_recursive").write_text("Total 0\n")
    # the kernel keeps v1 throttle counters only once a disk has a throttle
    # somewhere; until then the hierarchy's root lists no device either
    (tmp_path / "blkio" / "blkio.throttle.io_service_bytes").write_text("Total 0\n")
    assert cgroups.read_bytes(mem) is None
    (tmp_path / "blkio" / "blkio.throttle.io_service_bytes").write_text(
        rwstat(**{"8:0": (123, 4)}))
    assert cgroups.read_bytes(mem) == 0


def test_v2_reads_sum_rbytes_over_io_stat(tmp_path):
    cg = tmp_path / "web"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    assert cgroups.read_bytes(cg) is None                   # io controller off
    (cg / "io.stat").write_text("")
    assert cgroups.read_bytes(cg) == 0                      # on, nothing read yet
    (cg / "io.stat").write_text(
        "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n"
        "253:1 rbytes=1048576 wbytes=0 rios=4 wios=0 dbytes=0 dios=0\n")
    assert cgroups.read_bytes(cg) == 4096 + 1048576
    assert cgroups.read_bytes(tmp_path / "gone") is None


def test_read_throttle_is_the_smallest_rate_set_on_the_cgroup_itself(tmp_path):
    mem, blk = v1_pair(tmp_path, "host")
    assert cgroups.read_throttle_bps(mem) is None           # no blkio namesake
    blk.mkdir(parents=True)
    assert cgroups.read_throttle_bps(mem) is None           # no throttle file
    (blk / "blkio.throttle.read_bps_device").write_text("")
    assert cgroups.read_throttle_bps(mem) is None           # nothing set
    (blk / "blkio.throttle.read_bps_device").write_text("8:0 2097152\n8:16 1048576\n")
    assert cgroups.read_throttle_bps(mem) == 1048576
    v2 = tmp_path / "v2host"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    assert cgroups.read_throttle_bps(v2) is None            # no io.max
    (v2 / "io.max").write_text("8:0 rbps=max wbps=1000 riops=max wiops=max\n")
    assert cgroups.read_throttle_bps(v2) is None            # reads not throttled
    (v2 / "io.max").write_text("8:0 rbps=max wbps=1000 riops=max wiops=max\n"
                               "8:16 rbps=67108864 wbps=max riops=8000 wiops=max\n")
    assert cgroups.read_throttle_bps(v2) == 64 * MiB


# -- on this machine's cgroup v1 ------------------------------------------------

def whole_disk(st_dev: int) -> str | None:
    """MAJ:MIN of the whole disk a file system lives on (its partition's
    parent), or None where it is on no block device (tmpfs, overlay)."""
    node = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}")
    if os.major(st_dev) == 0 or not node.exists():
        return None
    if (node / "partition").exists():
        node = node.resolve().parent
    return (node / "dev").read_text().strip()


def _why_no_v1_blkio() -> str | None:
    from cachepilot.agent.testbed import v1_memory_available
    why = v1_memory_available()
    if why:
        return why
    if not (V1_BLKIO / "blkio.throttle.io_service_bytes").exists():
        return f"no cgroup v1 blkio hierarchy at {V1_BLKIO}"
    return None


def test_real_v1_reads_are_counted_and_the_parents_throttle_is_read():
    from cachepilot.agent.testbed import SCRATCH, drop_file_cache, make_file, scratch_cgroup
    why = _why_no_v1_blkio()
    if why:
        pytest.skip(why)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    disk = whole_disk(os.stat(SCRATCH).st_dev)
    if disk is None:
        pytest.skip(f"{SCRATCH} is on no block device (tmpfs or overlay): "
                    "its reads never reach a disk")
    data = make_file(SCRATCH / "io-8m.dat", 8 * MiB)
    with scratch_cgroup("cp_io") as parent:
        blk_parent = V1_BLKIO / parent.name
        blk_parent.mkdir()
        try:
            _read_and_measure(parent, blk_parent, disk, data, drop_file_cache)
        finally:
            for d in (blk_parent / "t", blk_parent, parent / "t"):
                if d.exists():
                    d.rmdir()


def _read_and_measure(parent: Path, blk_parent: Path, disk: str, data: Path, drop) -> None:
    from cachepilot.agent.backends.linux import LinuxBackend
    from cachepilot.agent.config import config_from_dict
    (parent / "t").mkdir()
    (blk_parent / "t").mkdir()
    child = parent / "t"
    counting = "Read" in (V1_BLKIO / "blkio.throttle.io_service_bytes").read_text()
    if not counting:
        # no disk has had a throttle since boot: the kernel counts nothing
        assert cgroups.read_bytes(child) is None
    # A throttle on the disk makes the kernel count (for good, on this
    # disk); on v1 it binds the parent's own tasks only, not the child's.
    bps = 512 * MiB
    (blk_parent / "blkio.throttle.read_bps_device").write_text(f"{disk} {bps}")
    assert cgroups.read_throttle_bps(parent) == bps
    backend = LinuxBackend(config_from_dict({"roots": [str(parent)], "cgroups": ["t"],
                                             "memory": "1GiB"}), start_sampler=False)
    assert backend.info().disk_read_bytes_per_s == bps
    assert cgroups.read_bytes(child) == 0
    backend.collect()
    drop(data)
    before = cgroups.read_bytes(child)
    subprocess.run(["sh", "-c", f"echo $$ > {child}/cgroup.procs && "
                    f"echo $$ > {blk_parent}/t/cgroup.procs && exec cat {data} > /dev/null"],
                   check=True)
    grown = cgroups.read_bytes(child) - before
    size = data.stat().st_size
    print(f"read {grown} bytes from {disk} for a {size}-byte file ({grown / size:.3f}x)")
    assert size <= grown <= 1.5 * size
    (r,) = backend.collect()
    assert r.read_bytes_per_s * r.interval_s == pytest.approx(grown, rel=0.01)
