"""The mapped file pages a cgroup's processes use (agent/mapped.py): the
smaps parser on text laid out like the kernel's, and on a real cgroup a
process that maps a file whole, then touches a part of it."""
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from cachepilot.agent import cgroups, mapped
from cachepilot.agent.testbed import (SCRATCH, drop_file_cache, in_cgroup, make_file,
                                      scratch_cgroup, v1_memory_available)

MiB = 1 << 20

SMAPS = """\
55d0e8a4a000-55d0e8a4c000 r-xp 00001000 fe:01 1234                       /usr/bin/fio
Size:                  8 kB
Referenced:            8 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
7f0000000000-7f0000400000 r--p 00000000 fe:01 99                         /usr/lib/libbig.so
Size:               4096 kB
Referenced:          120 kB
7f1000000000-7f1000100000 rw-s 00000000 00:01 7                          /SYSV00000000 (deleted)
Size:               1024 kB
Referenced:         1024 kB
7f2000000000-7f2000100000 rw-p 00000000 00:00 0
Size:               1024 kB
Referenced:         1024 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Referenced:          132 kB
"""


def test_smaps_counts_file_mappings_only():
    got = mapped.parse_smaps(SMAPS)
    # anonymous memory, the stack and SysV shared memory are counted apart
    assert sorted(got.values()) == [8 * 1024, 120 * 1024]
    assert ("fe:01", 99, 0, 4 * MiB) in got


def test_smaps_of_a_library_mapped_twice_counts_once():
    # two processes of one cgroup mapping the same pages count them once,
    # at the larger of their counts; a mapping of another file adds
    other = SMAPS.replace("fe:01 99 ", "fe:01 98 ").replace("120 kB", "40 kB")
    assert mapped.referenced_in([SMAPS]) == (8 + 120) * 1024
    assert mapped.referenced_in([SMAPS, SMAPS.replace("120 kB", "200 kB")]) == \
        (8 + 200) * 1024
    assert mapped.referenced_in([SMAPS, other]) == (8 + 120 + 40) * 1024
    assert mapped.referenced_in([]) == 0


def test_smaps_junk_is_skipped():
    assert mapped.parse_smaps("") == {}
    assert mapped.parse_smaps("zz-yy r--p 0 fe:01 x /a\nReferenced: q kB\n") == {}
    assert mapped.parse_smaps("Referenced: 4 kB\n") == {}
    assert mapped.parse_smaps("7f00-7f10 r--p 0 fe:01 5 /a\nReferenced: q kB\n") == {}


TOUCH = r"""
import mmap, os, sys, time
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
n = len(m)
for i in range(0, n, 4096):          # the whole file mapped and touched once
    m[i]
print("mapped", flush=True)
sys.stdin.readline()                 # the window starts
part = int(sys.argv[2])
for _ in range(20):
    for i in range(0, part, 4096):
        m[i]
    time.sleep(0.05)
print("touched", flush=True)
sys.stdin.readline()                 # again, under a limit
for _ in range(20):
    for i in range(0, part, 4096):
        m[i]
    time.sleep(0.05)
print("again", flush=True)
sys.stdin.readline()
"""


@contextmanager
def mapper(name):
    """A process in a fresh cgroup that has mapped a 32 MiB file and
    touched all of it, and waits to touch its first 4 MiB: (cgroup, proc)."""
    data = make_file(SCRATCH / "mapped-32m.dat", 32 * MiB)
    drop_file_cache(data)            # so that this cgroup brings every page in
    with scratch_cgroup(name) as cg:
        p = subprocess.Popen(in_cgroup(cg, [sys.executable, "-c", TOUCH, str(data),
                                            str(4 * MiB)]),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "mapped"
            yield cg, p
        finally:
            p.kill()
            p.wait()


@pytest.mark.skipif(v1_memory_available() is not None,
                    reason=str(v1_memory_available()))
def test_a_process_that_maps_32_mib_and_uses_4_is_charged_4_under_a_limit():
    with mapper("mapped") as (cg, p):
        before = cgroups.read_stats(cg)
        # every page was brought in by this cgroup and is mapped by it
        assert before.mapped_file_bytes >= 30 * MiB
        assert before.nonfile_bytes - before.unmapped_nonfile_bytes >= 30 * MiB
        assert mapped.clear_referenced(cg) == 1
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "touched"
        used = mapped.referenced_bytes(cg)
        print(f"mapped {before.mapped_file_bytes / MiB:.1f} MiB, in use "
              f"{used / MiB:.1f} MiB")
        # the 4 MiB it touched, and the interpreter's own code besides
        # (a few MiB of python3.11 and its libraries), not the 32 MiB
        assert 4 * MiB <= used <= 4 * MiB + 12 * MiB
        # and a limit proves it: squeezed to what it holds apart from the
        # mapped file plus those pages, reclaim gives up 20 of the 28 unused
        # MiB of mapped pages, and the process then works through its part
        # again without reading it back in (a limit 4 MiB lower, with 2 MiB
        # of room for mapped pages instead, read 90 MiB back in)
        floor = cgroups.read_stats(cg).unmapped_nonfile_bytes + used + MiB
        (cg / "memory.limit_in_bytes").write_text(str(floor))
        squeezed = cgroups.read_stats(cg)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "again"
        after = cgroups.read_stats(cg)
        print(f"under a {floor / MiB:.1f} MiB limit: mapped "
              f"{squeezed.mapped_file_bytes / MiB:.1f} MiB, read back in "
              f"{(after.pgpgin - squeezed.pgpgin) * 4 / 1024:.2f} MiB")
        assert squeezed.mapped_file_bytes <= before.mapped_file_bytes - 20 * MiB
        assert (after.pgpgin - squeezed.pgpgin) * 4096 <= MiB // 2


def _sampler_reason():
    from cachepilot.agent.sampler import why_unavailable
    return v1_memory_available() or why_unavailable()


@pytest.mark.skipif(_sampler_reason() is not None, reason=str(_sampler_reason()))
def test_the_profiles_offset_counts_the_mapped_pages_in_use_not_all_mapped():
    # `cachepilot profile` of a process that maps 32 MiB and runs out of 4:
    # the curve's offset holds the 4 (and the interpreter's own pages), the
    # band's high edge all 32, its low edge neither
    from cachepilot.agent.profile import profile_cgroup
    with mapper("mapped-profile") as (cg, p):
        out = {}
        t = threading.Thread(target=lambda: out.setdefault(
            "p", profile_cgroup(str(cg), 2.0, policies=("lru",), max_pages=16384)))
        t.start()
        time.sleep(0.3)         # the profile has cleared the referenced bits
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "touched"
        t.join()
        prof = out["p"]
        st = prof.stats
        print(f"offset {prof.offset_bytes / MiB:.1f} MiB, floor "
              f"{prof.floor_bytes / MiB:.1f}, all {prof.nonfile_peak_bytes / MiB:.1f}, "
              f"mapped in use {prof.mapped_referenced_bytes / MiB:.1f}")
        assert st.mapped_file_bytes >= 30 * MiB
        assert prof.nonfile_peak_bytes >= st.unmapped_nonfile_bytes + 30 * MiB
        assert st.unmapped_nonfile_bytes + 4 * MiB <= prof.offset_bytes \
            <= st.unmapped_nonfile_bytes + 16 * MiB
        assert prof.floor_bytes <= st.anon_bytes + st.shmem_bytes + MiB
        assert prof.floor_bytes <= prof.offset_bytes <= prof.nonfile_peak_bytes
        meta = {c.policy: c.meta["anon_offset_pages"] for c in prof.limit_curves}
        assert meta["lru"] == prof.offset_bytes // 4096
        assert prof.band_high[0].meta["anon_offset_pages"] == \
            prof.nonfile_peak_bytes // 4096
        js = prof.to_json()
        assert js["nonfile"]["offset_bytes"] == prof.offset_bytes
        assert len(js["band"]["low"]) == len(js["band"]["high"]) == 1
