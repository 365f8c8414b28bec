"""Real workloads in scratch memory cgroups, for the agent's tests and
benchmarks: make a data file, drop its pages, run fio (or any command) as a
member of a cgroup, read the kernel's own counters around it.

Only tests and experiments use this module; the agent never does.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from cachepilot.agent import cgroups

V1_MEMORY = Path("/sys/fs/cgroup/memory")
SCRATCH = Path("/var/tmp/cachepilot-testbed")


def v1_memory_available() -> str | None:
    """None when we can make v1 memory cgroups, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not (V1_MEMORY / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {V1_MEMORY}"
    return None


def v2_memory_root() -> Path | None:
    """A cgroup2 directory whose children can have the memory controller."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            root = Path(parts[1])
            ctrls = (root / "cgroup.controllers").read_text().split() \
                if (root / "cgroup.controllers").exists() else []
            if "memory" in ctrls:
                return root
    return None


@contextmanager
def scratch_cgroup(name: str, root: Path = V1_MEMORY):
    """A fresh memory cgroup that is removed afterwards (its pages are
    reparented by the kernel).  The name gets our pid, so two test runs on
    one host never share a cgroup."""
    path = root / f"{name}_{os.getpid()}"
    if path.exists():
        remove_cgroup(path)
    path.mkdir()
    try:
        yield path
    finally:
        remove_cgroup(path)


def remove_cgroup(path: Path):
    for _ in range(50):
        procs = (path / "cgroup.procs").read_text().split() \
            if (path / "cgroup.procs").exists() else []
        for pid in procs:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()


def make_file(path: Path, size: int) -> Path:
    """A file of random bytes (kept between runs when its size is right)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size == size:
        return path
    with exclusive(path.with_suffix(".lock")):
        if path.exists() and path.stat().st_size == size:
            return path
        return _write_random(path, size)


def _write_random(path: Path, size: int) -> Path:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        chunk = os.urandom(1 << 20)
        for i in range(size >> 20):
            # vary the chunks cheaply so nothing can dedupe them
            f.write(i.to_bytes(8, "little") + chunk[8:])
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    return path


@contextmanager
def exclusive(lock_path: Path):
    """Hold an exclusive lock file (builds of shared test data)."""
    import fcntl
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def drop_file_cache(*paths):
    """Evict the files' pages (written back first so every page can go), so
    the files start cold.  fadvise(DONTNEED) adds no shadow entries (only
    reclaim does); those earlier reclaim left stay, as nothing short of
    truncation clears them.  Other files are untouched: in particular the
    pages of the programs a test runs stay cached where they were charged
    (see warm_program)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_program(argv: list[str]) -> None:
    """Run argv once in the caller's own cgroup, so the program's binary and
    libraries are cached and charged there before it runs in a test cgroup.
    A page is charged to the cgroup that first brings it in; without this,
    the program's code would be charged to the test cgroup, reclaimed under
    its limit and faulted back in: misses of code, not of the data whose
    curve is being checked (with fio and a 64 MiB limit, about 0.03 of the
    measured miss ratio)."""
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {res.stderr.strip()[-500:]}")


def in_cgroup(cgroup: Path, argv: list[str]) -> list[str]:
    """argv wrapped so the process joins the cgroup before it execs."""
    return ["sh", "-c", f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))} && exec "
            + " ".join(shlex.quote(a) for a in argv)]


def _fio_randread_argv(filename: Path, ios: int, distribution: str, seed: int, jobs: int,
                       size: int | None, extra) -> list[str]:
    size = size or filename.stat().st_size
    return ["fio", "--name=cp", f"--filename={filename}", f"--size={size}",
            "--rw=randread", "--bs=4k", "--ioengine=psync", "--fadvise_hint=random",
            "--invalidate=0", "--norandommap", f"--random_distribution={distribution}",
            # fio ignores randseed while randrepeat is on (its default): every
            # run would replay the same offsets
            "--randrepeat=0", f"--randseed={seed}",
            f"--io_size={ios * 4096}", f"--numjobs={jobs}",
            "--thread", "--group_reporting", "--output-format=json", *extra]


def _fio_result(returncode: int, stdout: str, stderr: str) -> dict:
    if returncode != 0:
        raise RuntimeError(f"fio failed: {stderr.strip()[-500:]}")
    out = json.loads(stdout[stdout.index("{"):])
    job = out["jobs"][0]
    return {"ios": int(job["read"]["total_ios"]), "json": out}


def fio_randread(cgroup: Path, filename: Path, ios: int, *, distribution: str = "random",
                 seed: int = 1, jobs: int = 1, size: int | None = None,
                 extra: list[str] = ()) -> dict:
    """Buffered 4 KiB random reads (psync, fadvise random, the cache kept
    across runs); returns {'ios': issued reads, 'json': fio's report}."""
    argv = _fio_randread_argv(filename, ios, distribution, seed, jobs, size, extra)
    res = subprocess.run(in_cgroup(cgroup, argv), capture_output=True, text=True)
    return _fio_result(res.returncode, res.stdout, res.stderr)


def fio_randread_with_mark(cgroup: Path, filename: Path, ios: int, mark_at: int, mark,
                           *, distribution: str = "random", seed: int = 1,
                           poll_s: float = 0.002) -> dict:
    """fio_randread of `ios` reads by one job that calls mark() once fio has
    issued `mark_at` of them (read syscalls of the fio process, polled), so a
    caller can measure the second part of one run.  Splitting a run in two
    fio runs instead would not do: fio draws a new zipf hot set per seed, so
    two runs are a phase change.  Returns fio_randread's dict plus
    'reads_at_mark' (the reads issued when mark() was called)."""
    argv = _fio_randread_argv(filename, ios, distribution, seed, 1, None, ())
    proc = subprocess.Popen(in_cgroup(cgroup, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    io_file = Path(f"/proc/{proc.pid}/io")
    at_mark = None
    try:
        while at_mark is None and proc.poll() is None:
            try:
                syscr = int(next(line for line in io_file.read_text().splitlines()
                                 if line.startswith("syscr:")).split()[1])
            except (OSError, StopIteration, ValueError):
                syscr = 0           # not yet exec'd into fio, or just exited
            if syscr >= mark_at:
                mark()
                at_mark = syscr
            else:
                time.sleep(poll_s)
        stdout, stderr = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if at_mark is None:
        raise RuntimeError(f"fio ended before issuing {mark_at} reads")
    res = _fio_result(proc.returncode, stdout, stderr)
    res["reads_at_mark"] = at_mark
    return res


def warm_fio(distribution: str = "random") -> None:
    """warm_program for fio: a short job of the same kind on a small file of
    its own (the test's data file stays cold)."""
    small = make_file(SCRATCH / "fio-warm-4m.dat", 4 << 20)
    warm_program(_fio_randread_argv(small, 2_000, distribution, 1, 1, None, ()))


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
