"""Trace readers: counts against independent figures, every format, zstd,
format detection, streaming across block boundaries, and clear errors."""
import csv

import numpy as np
import pytest
import zstandard

from cachepilot.models.traces import (Trace, TraceError, detect_format,
                                      open_trace, read_keys, records,
                                      write_oracle_general)
from cachepilot.models.traces import readers


def zst(src, dst):
    dst.write_bytes(zstandard.ZstdCompressor().compress(src.read_bytes()))
    return dst


# -- the reference traces -------------------------------------------------------
def test_oltp_matches_arc_paper_table_iii(oltp_lis):
    trace = open_trace(oltp_lis)
    assert (trace.format, trace.compressed) == ("lis", True)
    unique = set()
    for chunk in trace.chunks():
        unique.update(np.unique(chunk).tolist())
    # Megiddo & Modha, FAST'03, Table III: OLTP 914,145 requests, 186,880 pages
    assert trace.requests == 914_145
    assert len(unique) == 186_880
    # every OLTP request is one block, so accesses (page keys) = requests
    assert trace.accesses == 914_145


def test_cloudphysics_txt_counts_match_an_independent_read(cloudphysics_txt):
    tokens = cloudphysics_txt.read_bytes().split()
    keys = read_keys(cloudphysics_txt)
    assert keys.tolist() == [int(t) for t in tokens]
    assert len(np.unique(keys)) == 48_974        # traces/README.md
    # The README says 113,871 requests, which is `wc -l`: the last line has
    # no newline.  There are 113,872 keys; libcachesim reads as many.
    assert len(keys) == len(tokens) == 113_872


def test_cloudphysics_csv_expands_requests_into_4k_pages(cloudphysics_csv):
    expect = []
    with open(cloudphysics_csv, newline="") as f:
        rows = csv.reader(f)
        next(rows)                                  # header
        n_requests = 0
        for _version, _time, _op, size, lbn in rows:
            n_requests += 1
            start = int(lbn) * 512                  # lbn counts 512 B sectors
            end = start + int(size)                 # exclusive
            expect.extend(range(start // 4096, (end - 1) // 4096 + 1))
    trace = open_trace(cloudphysics_csv)
    keys = trace.read_all()
    assert trace.format == "csv"
    assert trace.requests == n_requests
    assert keys.tolist() == expect


def test_txt_and_csv_are_the_same_requests(cloudphysics_txt, cloudphysics_csv):
    # the CSV's first page of each request is the text trace's block * 512 / 4096
    txt = read_keys(cloudphysics_txt)
    with open(cloudphysics_csv) as f:
        lbns = [int(line.rsplit(",", 1)[1]) for line in list(f)[1:]]
    assert txt.tolist() == lbns


# -- every format, compressed or not --------------------------------------------
def test_lis_expands_block_ranges(tmp_path):
    p = tmp_path / "t.lis"
    p.write_text("10 3 0 0\n5 1 0 1\n\n  7 2 9 2  \n")
    trace = open_trace(p)
    assert trace.read_all().tolist() == [10, 11, 12, 5, 7, 8]
    assert (trace.requests, trace.accesses) == (3, 6)


@pytest.mark.parametrize("fmt,text,expect", [
    ("txt", "3\n1\n3\n", [3, 1, 3]),
    ("lis", "3 2 0 0\n1 1 0 1\n", [3, 4, 1]),
    ("csv", "version,time,op,size,lbn\n1,0,28,4096,8\n1,1,2a,8192,0\n",
     [1, 0, 1]),
])
def test_zstd_variant_reads_the_same(tmp_path, fmt, text, expect):
    plain = tmp_path / f"t.{fmt}"
    plain.write_text(text)
    packed = zst(plain, tmp_path / f"t.{fmt}.zst")
    assert read_keys(plain).tolist() == expect
    assert read_keys(packed).tolist() == expect
    assert open_trace(packed).compressed


def test_oracle_general_round_trip_and_libcachesim_agrees(tmp_path):
    lcs = pytest.importorskip("libcachesim")
    keys = np.random.default_rng(1).integers(0, 1 << 40, 5000, dtype=np.uint64)
    p = tmp_path / "t.oracleGeneral.bin"
    write_oracle_general(p, keys)
    assert detect_format(p) == "oracle"
    assert read_keys(p).tolist() == keys.tolist()
    theirs = [req.obj_id for req in lcs.TraceReader(
        str(p), lcs.TraceType.ORACLE_GENERAL_TRACE)]
    assert theirs[:len(keys)] == keys.tolist()
    packed = zst(p, tmp_path / "t.oracleGeneral.zst")
    assert read_keys(packed, "oracle").tolist() == keys.tolist()


def test_cpaccess_round_trip_keeps_accesses_and_tids(tmp_path):
    keys = np.arange(100, 110, dtype=np.uint64)
    ops = np.array([0, 1, 0, 2, 0, 0, 0, 1, 0, 0])
    recs = records.make_records(keys, tids=np.arange(10) + 500, cgroup_id=77)
    recs["op"] = ops
    p = tmp_path / "agent.cpa"
    thr = 1 << 60
    assert records.write_records(p, recs, threshold=thr) == 10
    trace = open_trace(p)
    assert trace.format == "cpaccess" and trace.threshold == thr
    assert trace.rate == pytest.approx(1 / 16)
    (k, t), = list(trace.chunks_with_tids())
    assert k.tolist() == keys[ops == 0].tolist()
    assert t.tolist() == (np.arange(10) + 500)[ops == 0].tolist()
    header, back = records.read_records(p)
    assert header.threshold == thr and back.tolist() == recs.tolist()
    assert (back["cgroup_id"] == 77).all()


def test_cpaccess_append_and_compressed(tmp_path):
    p = tmp_path / "a.cpa"
    records.write_records(p, records.make_records([1, 2]))
    with open(p, "ab") as f:
        records.write_records(f, records.make_records([3]), header=False)
    assert read_keys(p).tolist() == [1, 2, 3]
    assert read_keys(zst(p, tmp_path / "a.cpa.zst")).tolist() == [1, 2, 3]


def test_cpaccess_rejects_unknown_version_and_truncation(tmp_path):
    p = tmp_path / "v2.cpa"
    raw = bytearray(records.RecordHeader().to_bytes())
    raw[8:12] = (2).to_bytes(4, "little")
    p.write_bytes(bytes(raw) + bytes(32))
    with pytest.raises(TraceError, match="version 2 is not supported"):
        read_keys(p)
    q = tmp_path / "cut.cpa"
    records.write_records(q, records.make_records([1, 2, 3]))
    q.write_bytes(q.read_bytes()[:-5])
    with pytest.raises(TraceError, match="truncated record"):
        read_keys(q)


# -- detection, streaming, errors ------------------------------------------------
def test_format_detected_from_content_without_extension(tmp_path):
    samples = {"txt": "5\n6\n", "lis": "5 1 0 0\n", "csv": "1,0,28,512,8\n"}
    for fmt, text in samples.items():
        p = tmp_path / f"noext_{fmt}"
        p.write_text(text)
        assert detect_format(p) == fmt
        assert detect_format(zst(p, tmp_path / f"noext_{fmt}_z")) == fmt
    p = tmp_path / "agent.bin"
    records.write_records(p, records.make_records([1]))
    assert detect_format(p) == "cpaccess"


def test_format_override_and_unknown_format(tmp_path):
    p = tmp_path / "keys.dat"
    p.write_text("1 1 0 0\n")
    assert Trace(p, "lis").read_all().tolist() == [1]
    with pytest.raises(TraceError, match="unknown trace format 'bogus'; accepted: txt, csv"):
        Trace(p, "bogus")
    b = tmp_path / "blob.dat"
    b.write_bytes(b"\0\1\2" * 7)
    with pytest.raises(TraceError, match="use --format with one of"):
        Trace(b)


def test_streams_in_blocks_with_correct_line_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "TEXT_BLOCK", 64)      # many small blocks
    lines = [f"{i * 7} 2 0 {i}" for i in range(300)]
    p = tmp_path / "t.lis"
    p.write_text("\n".join(lines))                      # no final newline
    trace = open_trace(p)
    chunks = list(trace.chunks())
    assert len(chunks) > 10
    want = [k for i in range(300) for k in (i * 7, i * 7 + 1)]
    assert np.concatenate(chunks).tolist() == want
    lines[250] = "17 x 0 0"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"t\.lis:251: malformed lis line"):
        open_trace(p).read_all()


@pytest.mark.parametrize("fmt,text,line,why", [
    ("txt", "1\n2\nabc\n", 3, "not an unsigned decimal"),
    ("txt", "1\n2 3\n", 2, "too many fields"),
    ("txt", "99999999999999999999999\n", 1, "not an unsigned decimal"),
    ("lis", "1 1 0 0\n1 0 0 0\n", 2, "block count"),
    ("lis", "1 1 0\n", 1, "too few fields"),
    ("csv", "version,time,op,size,lbn\n1,0,2a,512\n", 2, "5 comma-separated"),
    ("csv", "1,0,zz,512,1\n", 1, "hexadecimal opcode"),
])
def test_malformed_line_names_file_and_line(tmp_path, fmt, text, line, why):
    p = tmp_path / f"bad.{fmt}"
    p.write_text(text)
    with pytest.raises(TraceError) as err:
        read_keys(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}:{line}: malformed {fmt} line") and why in msg
    assert "\n" not in msg


def test_empty_and_missing_traces(tmp_path):
    e = tmp_path / "empty.txt"
    e.write_text("")
    trace = open_trace(e)
    assert trace.read_all().size == 0 and trace.requests == 0
    with pytest.raises(TraceError, match="no such trace file"):
        open_trace(tmp_path / "absent.txt")


def test_cpaccess_tally_records_count_but_are_not_accesses(tmp_path):
    p = tmp_path / "tally.cpa"
    parts = [records.make_records([5, 6]), records.make_tally(1000),
             records.make_records([7]), records.make_tally(234)]
    records.write_records(p, parts, threshold=1 << 50)
    trace = open_trace(p)
    assert trace.read_all().tolist() == [5, 6, 7]
    assert trace.requests == 3 and trace.tallied == 1234


def test_corrupt_zstd_is_a_clear_error(tmp_path):
    good = tmp_path / "k.txt"
    good.write_text("\n".join(str(i) for i in range(200000)) + "\n")
    packed = zst(good, tmp_path / "k.txt.zst").read_bytes()
    bad = tmp_path / "bad.txt.zst"
    bad.write_bytes(packed[: len(packed) // 2] + b"\xff" * 64)
    with pytest.raises(TraceError, match=r"bad\.txt\.zst: corrupt zstd data"):
        read_keys(bad)


def test_concatenated_zstd_frames_read_as_one_stream(tmp_path):
    c = zstandard.ZstdCompressor()
    p = tmp_path / "two.txt.zst"
    p.write_bytes(c.compress(b"1\n2\n") + c.compress(b"3\n4\n"))
    assert read_keys(p).tolist() == [1, 2, 3, 4]
