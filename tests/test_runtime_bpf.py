"""Every shipped policy also builds as a BPF struct_ops object, from the
same source, through the same header.

Until the cache_ext kernel's vmlinux.h exists, the types come from the
running kernel's BTF plus a stand-in declaring the cache_ext types
(tests/policies/bpf_stub/vmlinux.h).  Loading needs the patched kernel and
is the kernel tests' business; this checks the BPF side compiles and has
the struct_ops map and one program per callback."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
POLICIES = sorted((ROOT / "bpf" / "policies").glob("*.bpf.c"))
STUB = Path(__file__).resolve().parent / "policies" / "bpf_stub"
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")


def missing():
    for tool in ("clang", "bpftool", "llvm-readelf"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    if not KERNEL_BTF.exists():
        return "kernel has no BTF (/sys/kernel/btf/vmlinux)"
    if not Path("/usr/include/bpf/bpf_helpers.h").exists():
        return "libbpf headers not installed"
    return None


pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def host_types(tmp_path_factory):
    d = tmp_path_factory.mktemp("btf")
    with open(d / "vmlinux_host.h", "w") as out:
        subprocess.run(["bpftool", "btf", "dump", "file", str(KERNEL_BTF),
                        "format", "c"], stdout=out, check=True)
    return d


@pytest.mark.parametrize("src", POLICIES, ids=[p.name for p in POLICIES])
def test_policy_builds_for_bpf(src, host_types, tmp_path):
    obj = tmp_path / (src.stem + ".o")
    proc = subprocess.run(
        ["clang", "-target", "bpf", "-O2", "-g", "-Wall", "-Werror",
         "-I", str(host_types), "-I", str(STUB), "-I", str(ROOT / "bpf" / "include"),
         "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sections = subprocess.run(["llvm-readelf", "-S", str(obj)],
                              capture_output=True, text=True, check=True).stdout
    assert ".struct_ops.link" in sections
    # one struct_ops program per callback the ops table names
    text = src.read_text()
    ops = re.search(r"CP_POLICY\((\w+),(.*?)\);", text, re.S)
    assert ops, "no CP_POLICY table"
    callbacks = re.findall(r"\.\w+\s*=\s*\(void \*\)(\w+)", ops.group(2))
    assert callbacks
    for fn in callbacks:
        assert re.search(rf"struct_ops(\.s)?/{fn}\b", sections), fn
    btf = subprocess.run(["bpftool", "btf", "dump", "file", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    assert f"VAR '{ops.group(1)}_ops'" in btf
