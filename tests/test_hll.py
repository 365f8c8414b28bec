"""The distinct-key sketch (models/hll.py, bpf/include/cachepilot_hll.h)."""
import numpy as np
import pytest

from cachepilot.models import hll
from cachepilot.models.shards import Shards, hash64

MASK = (1 << 64) - 1


def reference_registers(keys) -> np.ndarray:
    """The register update written out in plain Python from the header's
    description: remix the key's cp_hash64, index = top BITS bits, rank =
    1 + leading zeros of the rest, capped at 65 - BITS."""
    regs = np.zeros(hll.REGISTERS, np.uint8)
    for h in hash64(np.asarray(keys, np.uint64)).tolist():
        m = ((h ^ (h >> 32)) * 0xd6e8feb86659fd93) & MASK
        m ^= m >> 29
        index = m >> (64 - hll.BITS)
        rest = (m << hll.BITS) & MASK
        rank = min(64 - rest.bit_length(), 64 - hll.BITS) + 1
        regs[index] = max(regs[index], rank)
    return regs


def test_native_registers_match_the_written_out_update():
    keys = np.arange(5000, dtype=np.uint64) * 7919 + 3
    regs = hll.empty()
    hll.add(regs, keys)
    assert np.array_equal(regs, reference_registers(keys))
    assert int(regs.max()) <= 65 - hll.BITS


@pytest.mark.parametrize("n", [1, 10, 300, 5_000, 60_000, 400_000])
def test_counts_within_four_standard_errors(n):
    rng = np.random.default_rng(n)
    errs = []
    for _ in range(4):
        keys = rng.integers(0, 2**63, n, dtype=np.uint64)
        keys = np.concatenate([keys, keys[: n // 2]])     # repeats do not count
        errs.append(hll.count(keys) / n - 1.0)
    bound = 4 * 1.04 / np.sqrt(hll.REGISTERS)
    assert max(abs(e) for e in errs) <= max(bound, 1.0 / n)
    assert abs(np.mean(errs)) <= bound / 2                 # no bias to speak of


def test_empty_sketch_counts_zero_and_merge_is_the_union():
    assert hll.estimate(hll.empty()) == 0.0
    a_keys = np.arange(0, 30_000, dtype=np.uint64)
    b_keys = np.arange(20_000, 50_000, dtype=np.uint64)
    a, b, both = hll.empty(), hll.empty(), hll.empty()
    hll.add(a, a_keys)
    hll.add(b, b_keys)
    hll.add(both, np.concatenate([a_keys, b_keys]))
    assert np.array_equal(hll.merge(a, b), both)
    assert np.array_equal(hll.merge(a.tobytes(), b), both)      # bytes work too
    assert hll.estimate(both) == pytest.approx(50_000, rel=0.06)


def test_bad_sketches_are_refused():
    with pytest.raises(ValueError, match="registers"):
        hll.estimate(np.zeros(100, np.uint8))
    bad = hll.empty()
    bad[3] = 65 - hll.BITS + 1
    with pytest.raises(ValueError, match="largest rank"):
        hll.estimate(bad)
    with pytest.raises(ValueError, match="writable"):
        hll.add(hll.empty().astype(np.int64), [1, 2])
    from cachepilot.models import _mrc
    with pytest.raises(ValueError, match="registers"):
        _mrc.hll_add(np.arange(3, dtype=np.uint64), bytearray(100))


def test_shards_sketch_counts_every_reference_and_restarts_with_the_window():
    rng = np.random.default_rng(2)
    first = rng.integers(0, 2**63, 80_000, dtype=np.uint64)
    engine = Shards(rate=0.01)
    engine.feed(first)
    # the sketch sees every key, the sample about 1 % of them
    assert engine.window_unique() == pytest.approx(80_000, rel=0.06)
    assert engine.sampled_keys < 1_500
    ref = hll.empty()
    hll.add(ref, first)
    assert np.array_equal(engine.sketch(), ref)
    engine.take_histogram(reset=True)
    assert engine.window_unique() == 0.0
    engine.feed(first[:20_000])
    assert engine.window_unique() == pytest.approx(20_000, rel=0.06)
    # exact mode keeps no sketch
    from cachepilot.models import _mrc
    assert _mrc.StackDist(exact=True).hll() == b""


def test_the_bpf_build_of_the_update_gives_the_same_registers(tmp_path):
    # The BPF build of the header counts leading zeros without a builtin;
    # compile that branch on the host and compare it with the native core.
    import shutil
    import subprocess
    from pathlib import Path
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on this host")
    include = Path(__file__).resolve().parents[1] / "bpf" / "include"
    src = tmp_path / "hll_bpf.c"
    src.write_text(
        "#include <stdio.h>\n"
        "typedef unsigned long long __u64;\n"
        "#define __BPF__ 1\n"
        '#include "cachepilot_hll.h"\n'
        "static unsigned char regs[CP_HLL_REGS];\n"
        "int main(void) {\n"
        "  for (__u64 k = 0; k < 5000; k++)\n"
        "    cp_hll_add(regs, cp_hash64(k * 7919 + 3), CP_HLL_BITS);\n"
        "  fwrite(regs, 1, sizeof(regs), stdout);\n"
        "  return 0;\n}\n")
    exe = tmp_path / "hll_bpf"
    subprocess.run([cc, "-O1", "-I", str(include), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True).stdout
    regs = hll.empty()
    hll.add(regs, np.arange(5000, dtype=np.uint64) * 7919 + 3)
    assert np.frombuffer(out, np.uint8).tolist() == regs.tolist()
