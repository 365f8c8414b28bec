"""Every input the fuzzers (fuzz/run.py) crashed a reader with, and the
clear error (or the right result) each now gets.  The inputs are the
crash files themselves, byte for byte; a line says which target found it
and what it did before the fix."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot.models.traces import records
from cachepilot.models.traces.readers import Trace, TraceError

CACHEPILOT = Path(sys.executable).parent / "cachepilot"


def crash(tmp_path, hexdata: str, name="crash.bin") -> Path:
    p = tmp_path / name
    p.write_bytes(bytes.fromhex(hexdata))
    return p


# cpaccess: a zstd frame whose header names a dictionary; Trace() read the
# record header through the decompressor and let zstd's ZstdError through
CORRUPT_ZSTD_CPACCESS = ("28b52ffd4345535301000000200000005c8fc2f5285c8f02000000000000000000"
                         "00000000000000000000000007000000000000000000000001000000")
# zstd: a cpaccess file whose last frame is cut short ("the file ends
# inside a frame") while the header was being read
TRUNCATED_ZSTD_CPACCESS = (
    "0528b52ffd604009150c00240c43500428b52ffd600001ad0300e2860f16e0690e00000000627b"
    "efbdf7de7b6f29a594524a295357ae244f9023c70fe346419c183e08178207c041434345535301"
    "000000200000005c8fc2f5285c8f0200af00070017d002170300a70401b105e50006d4075a08b7"
    "0081f7e7eeda1b3b5b5fea2a3da1a3f3636e968b03180020d120d120d120519821b6b00b120d12"
    "0d120d120d120d120d120d120d120d120d120d120d120d92ee34a127d1201303600128b52ffd60"
    "0001b50300")[2:]      # the target's first byte picked the format
# records: read_records on a corrupt zstd file raised ZstdError
CORRUPT_ZSTD_RECORDS = "28b52ffd43410001000000200024ff00"
# cpaccess: a header with threshold 0 (rate 0); `cachepilot mrc` then died
# dividing by it
ZERO_THRESHOLD = "4350414343455353010000002000000000000000000000000000000000000000"


@pytest.mark.parametrize("hexdata", [CORRUPT_ZSTD_CPACCESS, TRUNCATED_ZSTD_CPACCESS])
def test_corrupt_zstd_under_a_cpaccess_header_is_a_trace_error(tmp_path, hexdata):
    path = crash(tmp_path, hexdata)
    with pytest.raises(TraceError, match="corrupt zstd data"):
        Trace(path, "cpaccess").read_all()
    with pytest.raises(TraceError, match="corrupt zstd data"):
        Trace(path).read_all()          # detected from the content


def test_read_records_of_corrupt_zstd_is_a_record_format_error(tmp_path):
    with pytest.raises(records.RecordFormatError, match="corrupt zstd data"):
        records.read_records(crash(tmp_path, CORRUPT_ZSTD_RECORDS))


def test_a_zero_threshold_is_refused(tmp_path):
    path = crash(tmp_path, ZERO_THRESHOLD, "zero.cpa")
    with pytest.raises(records.RecordFormatError, match="threshold 0"):
        records.read_records(path)
    with pytest.raises(TraceError, match="threshold 0"):
        Trace(path)
    # the command line says so in one line, without a traceback
    r = subprocess.run([CACHEPILOT, "mrc", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "threshold 0" in r.stderr and "Traceback" not in r.stderr, r.stderr


# csv (found while writing the fuzzer's reference parser, not by a crash):
# the overflow check mixed sectors and bytes and refused requests whose
# last byte fits in 64 bits
def test_csv_accepts_every_request_whose_bytes_fit_in_64_bits(tmp_path):
    lbn = 2**55 - 10                    # bytes 2^64 - 5120 .. 2^64 - 1025
    p = tmp_path / "edge.csv"
    p.write_text(f"1,0,28,4096,{lbn}\n")
    assert Trace(p, "csv").read_all().tolist() == [2**52 - 2, 2**52 - 1]
    p.write_text(f"1,0,28,4096,{2**55 - 1}\n")    # ends past 2^64
    with pytest.raises(TraceError, match="overflows 64 bits"):
        Trace(p, "csv").read_all()
    p.write_text(f"1,0,28,0,{2**55}\n")           # lbn * 512 alone overflows
    with pytest.raises(TraceError, match="overflows 64 bits"):
        Trace(p, "csv").read_all()


# lis / csv (found while writing the native target, then shown by hand): a
# line may stand for 2^20 pages, and the parser expanded a whole 8 MiB
# text block in one call -- an 8 KiB file of such lines asked for 5 GB
# and died in MemoryError.  Now a call stops near reader.CHUNK_KEYS keys.
def test_a_small_file_of_huge_requests_reads_in_bounded_memory(tmp_path):
    p = tmp_path / "huge.lis"
    lines = 160                     # 160 * 2^20 keys: 1.25 GiB as one array
    p.write_text("0 1048576 0 0\n" * lines)
    # the bound is 1 GiB of address space; under AddressSanitizer (make
    # sanitize), which reserves terabytes of it for its shadow, it is 1 GiB
    # of peak resident memory instead
    code = (
        "import resource, sys\n"
        "asan = 'libasan' in open('/proc/self/maps').read()\n"
        "if not asan:\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from cachepilot.models.traces.readers import Trace, CHUNK_KEYS\n"
        f"t = Trace({str(p)!r}, 'lis')\n"
        "n = big = 0\n"
        "for keys in t.chunks():\n"
        "    n, big = n + len(keys), max(big, len(keys))\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10\n"
        "assert not asan or peak < 1 << 30, f'peak resident {peak} bytes'\n"
        "print(n, big, t.requests, CHUNK_KEYS)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    n, big, requests, bound = map(int, r.stdout.split())
    assert n == lines << 20 and requests == lines
    assert big <= bound + (1 << 20)


def test_a_bad_line_after_a_split_block_is_named_by_its_own_number(tmp_path):
    from cachepilot.models.traces import readers
    p = tmp_path / "split.lis"
    big = readers.CHUNK_KEYS // (1 << 20) + 2       # lines past one call's bound
    p.write_text("0 1048576 0 0\n" * big + "5 1 0 0\n" + "5 x 0 0\n")
    with pytest.raises(TraceError, match=rf":{big + 2}: malformed lis line"):
        Trace(p, "lis").read_all()


@pytest.mark.parametrize("name", ["config", "report"])
def test_the_config_and_report_targets_pass_their_seeds_and_refuse_garbage(tmp_path, name):
    """Their seeds (the project's configs, reports of generated curves) go
    through the target; hostile bytes end in the target's own clear error,
    and a report whose curve lies keeps its report without its curves."""
    from fuzz.targets import TARGETS
    from cachepilot.protocol import cachepilot_pb2 as pb
    t = TARGETS[name]
    seeds = t.seeds()
    assert seeds
    for s in seeds:
        t.run(s, tmp_path / "in")
    if name == "config":
        hostile = [b"\x00tenants: [", b"\x01{}", b"\x01- 1\n- 2", b"\x00sampling: {rate: 7}",
                   b"\x01nodes: [{name: a, memory_bytes: -1}]",
                   b"\x01controller: {insecure: true, store: 'etcd://'}\n"
                   b"nodes: [{name: a, memory_bytes: 1G}]"]
    else:
        lying = pb.Curve(policy="lru", method="exact", rate=0.5, sizes_pages=[4, 2],
                         miss_ratio=[1.0, 0.5])
        hostile = [b"\xff\xff\xff", pb.ReportRequest(reports=[pb.TenantReport(
            tenant="a", miss_ratio=2.0)]).SerializeToString()]
        # the lying curve is refused, the rest of the tenant's report kept
        from cachepilot.protocol import wire
        rep = wire.report_from_pb(pb.TenantReport(tenant="a", curves=[lying]))
        assert rep.curves == [] and "not strictly increasing" in rep.refused
        t.run(pb.ReportRequest(reports=[pb.TenantReport(tenant="a", curves=[lying])])
              .SerializeToString(), tmp_path / "in")
    for h in hostile:
        with pytest.raises(t.expected):
            t.run(h, tmp_path / "in")


# config: the project's controller.yaml with one byte of a comment turned
# into 0x93 (not UTF-8); read_yaml let UnicodeDecodeError through
@pytest.mark.parametrize("command", [["run", "--config"], ["agent", "--config"],
                                     ["controller", "--config"]])
def test_a_config_that_is_not_utf8_is_a_clear_error(tmp_path, command):
    bad = tmp_path / "c.yaml"
    bad.write_bytes(b"# a controller \x93for real hosts\ncontroller: {}\n")
    r = subprocess.run([str(CACHEPILOT), *command, str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad}: not UTF-8 text (byte 15)" in r.stderr, r.stderr
