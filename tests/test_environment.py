"""The live tests skip only where the machine truly lacks something.

Many tests skip, naming the reason, where there is no root, no BPF or no
memory cgroup.  That must never hide a broken build or install on a host
that has all of those: here, when we are root on a kernel whose BTF has the
filemap tracepoints, the sampler `make test` built must load, and the tools
`make test` installs must be on the PATH.
"""
import os
import shutil
from pathlib import Path

import pytest

from cachepilot.agent.sampler import BTF, why_unavailable

TRACEPOINTS = (b"btf_trace_mm_filemap_get_pages", b"btf_trace_mm_filemap_add_to_page_cache",
               b"btf_trace_mm_filemap_delete_from_page_cache")


def _kernel_can_sample() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if not BTF.exists():
        return f"the kernel has no BTF ({BTF})"
    btf = BTF.read_bytes()
    missing = [t.decode() for t in TRACEPOINTS if t not in btf]
    if missing:
        return f"the kernel's BTF lacks {', '.join(missing)}"
    return None


def test_the_sampler_loads_where_the_kernel_can_sample():
    reason = _kernel_can_sample()
    if reason:
        pytest.skip(reason)
    assert why_unavailable() is None, \
        "root, BTF and the filemap tracepoints are all here, so the live tests must run"


@pytest.mark.parametrize("tool", ["fio", "db_bench", "clang", "bpftool"])
def test_the_tools_make_installs_are_there(tool):
    if os.geteuid() != 0:
        pytest.skip("not root: `make test` cannot have installed system packages")
    if not Path("/usr/bin/apt-get").exists():
        pytest.skip("not a Debian-family host: `make deps` installs nothing here")
    assert shutil.which(tool), f"{tool} is missing although `make test` installs it"

