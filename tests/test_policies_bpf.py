"""Every policy of the library, the template and the test policies compile
with clang -target bpf through bpf/Makefile (the one build every policy
object comes from) into an object with its struct_ops map and one program
per callback.  The types are the cache_ext kernel's (the running kernel's
if it has cache_ext, else the patched tree's from kernel/build) or, where
neither exists, the running kernel's plus the contract's
(bpf/include/cache_ext_types.h): those objects compile but load nowhere.
Loading them on a memory-limited cgroup needs the cache_ext kernel: the VM
tests under kernel/tests do that."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cachepilot.models import policy_cli

REPO = Path(__file__).resolve().parents[1]
POLICIES = sorted((REPO / "bpf" / "policies").glob("*.bpf.c"))
TEST_POLICIES = sorted((REPO / "tests" / "policies").glob("*.bpf.c"))
TEMPLATE = REPO / "bpf" / "policies" / "template" / "policy.bpf.c"
OUT = REPO / "bpf" / "out"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("clang", "bpftool", "make", "llvm-readelf")),
    reason="clang, bpftool, make and llvm-readelf are needed to build BPF objects")


@pytest.fixture(scope="module")
def built():
    """`make -C bpf policies test-policies`, as make build and kernel/build run it."""
    proc = subprocess.run(["make", "-s", "-C", str(REPO / "bpf"), "policies",
                           "test-policies"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return policy_cli.bpf_types()


def test_the_library_is_all_there():
    names = {p.name.replace(".bpf.c", "") for p in POLICIES}
    assert {"fifo", "lru", "mru", "linux", "lfu", "s3fifo", "lhd", "mglru",
            "hyperbolic", "get_scan", "admit_filter"} <= names


def check_object(src: Path, obj: Path):
    sections = subprocess.run(["llvm-readelf", "-S", str(obj)], capture_output=True,
                              text=True, check=True).stdout
    assert ".struct_ops.link" in sections
    assert "license" in sections
    text = src.read_text()
    if "CP_HASH_MAP(" in text:
        assert ".maps" in sections
    # one struct_ops program per callback the ops table names
    ops = re.search(r"CP_POLICY\((\w+),(.*?)\);", text, re.S)
    assert ops, "no CP_POLICY table"
    callbacks = re.findall(r"\.\w+\s*=\s*\(void \*\)(\w+)", ops.group(2))
    assert callbacks
    for fn in callbacks:
        assert re.search(rf"struct_ops(\.s)?/{fn}\b", sections), fn
    btf = subprocess.run(["bpftool", "btf", "dump", "file", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    assert f"VAR '{ops.group(1)}_ops'" in btf
    # the contract's structs are complete in the object's BTF, or libbpf
    # refuses the kfunc prototypes on the cache_ext kernel
    for struct in ("folio", "cache_ext_list_node", "cache_ext_eviction_ctx"):
        assert re.search(rf"STRUCT '{struct}' size=[1-9]", btf), struct


@pytest.mark.parametrize("source", POLICIES, ids=lambda p: p.name)
def test_library_policy_object(source, built):
    check_object(source, OUT / "policies" / source.name.replace(".bpf.c", ".bpf.o"))


@pytest.mark.parametrize("source", TEST_POLICIES, ids=lambda p: p.name)
def test_test_policy_object(source, built):
    check_object(source, OUT / "test-policies" / source.name.replace(".bpf.c", ".bpf.o"))


def test_the_template_compiles_through_the_same_recipe(built, tmp_path):
    obj = policy_cli.compile_bpf(TEMPLATE, tmp_path / "p.bpf.o")
    check_object(TEMPLATE, obj)


def test_a_broken_policy_is_refused_with_one_line(built, tmp_path):
    bad = tmp_path / "bad.bpf.c"
    bad.write_text('#include "cache_ext_policy.h"\nint x = undeclared;\n')
    with pytest.raises(policy_cli.UserError) as err:
        policy_cli.compile_bpf(bad, tmp_path / "bad.o")
    assert "does not compile for BPF" in str(err.value)
    assert "undeclared" in str(err.value)
    assert "\n" not in str(err.value)


def test_types_say_where_they_came_from(built):
    text = (OUT / "policies" / "vmlinux.h").read_text()
    assert "struct cache_ext_ops {" in text
    if built.startswith("stand-in"):
        assert text.startswith("/* stand-in")
    else:
        assert "kernel" in built
