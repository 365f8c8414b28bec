"""The host's DAMON proactive reclaim, seen from cachepilot.

A kdamond running a `pageout` scheme (DAMON sysfs admin interface) reclaims
memory that looks cold to it, in physical-address regions of tens of MiB,
whatever cgroup the pages are charged to and however far that cgroup is
below its limit.  A region is judged by a few sampled pages, so a tenant's
hot cached pages that sit in a mostly idle region are paged out with it.
Curves model the misses a memory limit causes; these come on top, so the
agent warns when it sees such a scheme, and measurements that compare a
curve with the kernel (tests, experiments) pause it while they run.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

ADMIN = Path("/sys/kernel/mm/damon/admin/kdamonds")

log = logging.getLogger("cachepilot.agent")


def _read(path: Path) -> str:
    return path.read_text().strip()


def pageout_kdamonds(admin: Path = ADMIN) -> list[Path]:
    """The running kdamonds that have a `pageout` scheme (empty when the
    kernel has no DAMON sysfs interface or it cannot be read)."""
    try:
        count = int(_read(admin / "nr_kdamonds"))
    except (OSError, ValueError):
        return []
    found = []
    for i in range(count):
        kd = admin / str(i)
        try:
            if _read(kd / "state") != "on":
                continue
            actions = [_read(p) for p in kd.glob("contexts/*/schemes/*/action")]
        except OSError:
            continue
        if "pageout" in actions:
            found.append(kd)
    return found


def describe(kdamonds: list[Path]) -> str:
    return ", ".join(f"kdamond {kd.name}" for kd in kdamonds)


def paged_out_bytes(kdamonds: list[Path]) -> int | None:
    """Bytes the kdamonds' pageout schemes have reclaimed so far (their
    stats are refreshed first; needs root).  None when unreadable."""
    total = 0
    try:
        for kd in kdamonds:
            (kd / "state").write_text("update_schemes_stats\n")
            for scheme in kd.glob("contexts/*/schemes/*"):
                if (scheme / "action").is_file() and _read(scheme / "action") == "pageout":
                    total += int(_read(scheme / "stats" / "sz_applied"))
    except (OSError, ValueError):
        return None
    return total


@contextmanager
def paused(admin: Path = ADMIN):
    """Stop the host's paging-out kdamonds for the duration and start them
    again afterwards (their settings stay in sysfs; monitoring restarts
    from scratch).  Yields the kdamonds it stopped; one it cannot stop
    (not root) is logged and left running."""
    stopped = []
    try:
        for kd in pageout_kdamonds(admin):
            try:
                (kd / "state").write_text("off\n")
                stopped.append(kd)
            except OSError as err:
                log.warning("could not pause DAMON %s: %s", kd, err)
        yield stopped
    finally:
        for kd in stopped:
            try:
                (kd / "state").write_text("on\n")
            except OSError as err:
                log.error("could not restart DAMON %s: %s (write 'on' to %s)",
                          kd, err, kd / "state")
