"""Every policy of the library, and the template, compiles with
clang -target bpf against the cache_ext kernel's types (the patched
kernel's vmlinux.h when kernel/build has run, else the running kernel's BTF
plus the contract's cache_ext types) into an object with its struct_ops map.
Loading them on a memory-limited cgroup needs the cache_ext kernel: the VM
tests under kernel/tests do that."""
import shutil
from pathlib import Path

import pytest

from cachepilot.models import policy_cli

REPO = Path(__file__).resolve().parents[1]
POLICIES = sorted((REPO / "bpf" / "policies").glob("*.bpf.c"))
TEMPLATE = REPO / "bpf" / "policies" / "template" / "policy.bpf.c"

pytestmark = pytest.mark.skipif(
    not shutil.which("clang") or not shutil.which("bpftool"),
    reason="clang and bpftool are needed to build BPF objects")


@pytest.fixture(scope="module")
def vmlinux():
    path, desc = policy_cli.vmlinux_for_bpf()
    return path


def test_the_library_is_all_there():
    names = {p.name.replace(".bpf.c", "") for p in POLICIES}
    assert {"fifo", "lru", "mru", "linux", "lfu", "s3fifo", "lhd", "mglru",
            "hyperbolic", "get_scan", "admit_filter"} <= names


@pytest.mark.parametrize("source", POLICIES + [TEMPLATE],
                         ids=lambda p: p.name)
def test_policy_compiles_for_bpf(source, vmlinux, tmp_path):
    obj = policy_cli.compile_bpf(source, vmlinux, tmp_path / "p.bpf.o")
    sections = policy_cli.elf_sections(obj)
    assert ".struct_ops.link" in sections
    assert "license" in sections
    assert any(s.startswith("struct_ops/") for s in sections)
    if "CP_HASH_MAP(" in source.read_text():
        assert ".maps" in sections


def test_a_broken_policy_is_refused_with_one_line(vmlinux, tmp_path):
    bad = tmp_path / "bad.bpf.c"
    bad.write_text('#include "cache_ext_policy.h"\nint x = undeclared;\n')
    with pytest.raises(policy_cli.UserError) as err:
        policy_cli.compile_bpf(bad, vmlinux, tmp_path / "bad.o")
    assert "does not compile for BPF" in str(err.value)
    assert "\n" not in str(err.value)


def test_standin_declares_the_contract_types(vmlinux):
    text = vmlinux.read_text()
    if "stand-in" in text[:200]:
        for name in ("struct cache_ext_eviction_ctx {",
                     "struct cache_ext_admit_ctx {",
                     "struct cache_ext_ops {"):
            assert name in text
        assert (vmlinux.parent / "vmlinux_host.h").is_file()
    else:
        assert "struct cache_ext_ops {" in text
