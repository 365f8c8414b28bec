"""Every shipped policy also builds as a BPF struct_ops object, from the
same source, through the same header.

The types come from the cache_ext kernel's build (kernel/out/build/vmlinux)
when it has them; until then from the running kernel's BTF plus a stand-in
declaring the cache_ext types (tests/policies/bpf_stub/vmlinux.h).  Loading needs the patched kernel and
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
CACHE_EXT_VMLINUX = ROOT / "kernel" / "out" / "build" / "vmlinux"


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


def btf_header(vmlinux: Path) -> str:
    return subprocess.run(["bpftool", "btf", "dump", "file", str(vmlinux),
                           "format", "c"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def include_dirs(tmp_path_factory):
    """The cache_ext kernel's own types when its build has them, else the
    running kernel's types plus the stand-in."""
    d = tmp_path_factory.mktemp("btf")
    if CACHE_EXT_VMLINUX.exists():
        try:
            text = btf_header(CACHE_EXT_VMLINUX)
        except subprocess.CalledProcessError:
            text = ""          # a kernel build in progress: use the stand-in
        if "struct cache_ext_ops {" in text:
            (d / "vmlinux.h").write_text(text)
            return [d]
    (d / "vmlinux_host.h").write_text(btf_header(KERNEL_BTF))
    return [d, STUB]


@pytest.mark.parametrize("src", POLICIES, ids=[p.name for p in POLICIES])
def test_policy_builds_for_bpf(src, include_dirs, tmp_path):
    obj = tmp_path / (src.stem + ".o")
    includes = [arg for d in include_dirs for arg in ("-I", str(d))]
    proc = subprocess.run(
        ["clang", "-target", "bpf", "-O2", "-g", "-Wall", "-Werror", *includes,
         "-I", str(ROOT / "bpf" / "include"), "-c", str(src), "-o", str(obj)],
        capture_output=True, text=True)
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
