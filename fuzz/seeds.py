"""Seed inputs for the fuzz targets, made at run time.

Small slices of the real traces in ../shared/traces (read from there, never
copied into the repository) and of generated traces, in every format the
readers take.  Each seed is a few KiB at most, so that libFuzzer mutates
structure rather than spends its time in bulk."""
from __future__ import annotations

import io
from functools import cache
from pathlib import Path

import numpy as np
import zstandard

from cachepilot.models import generators as gen
from cachepilot.models.traces import records
from cachepilot.models.traces.readers import ORACLE_DTYPE

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MAX_SEED = 4096


def _slices(lines: list[bytes], header: bytes = b"") -> list[bytes]:
    """A few runs of lines from the start, the middle and the end."""
    out = []
    n = len(lines)
    for start, count in ((0, 1), (0, 8), (0, 60), (n // 2, 20), (max(0, n - 10), 10)):
        body = b"\n".join(lines[start:start + count])
        out.append((header + body)[:MAX_SEED])
    # the last line without its newline, and one with CRLF endings
    out.append(header + b"\n".join(lines[:3]) + b"\n")
    out.append((header + b"\r\n".join(lines[:5]))[:MAX_SEED])
    return out


def _head_lines(path: Path, limit: int = 256 << 10) -> list[bytes]:
    with open(path, "rb") as raw:
        data = raw.read(limit)
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(
            open(path, "rb").read(limit)))
        data = reader.read(limit)
    return [line for line in data.split(b"\n")[:-1] if line.strip()]


@cache
def real_lines() -> dict[str, tuple[list[bytes], bytes]]:
    """format -> (lines, header) from the shared traces that are present."""
    found = {}
    for fmt, name in (("txt", "cloudphysics.txt"), ("csv", "cloudphysics.csv"),
                      ("lis", "OLTP.lis.zst")):
        path = SHARED_TRACES / name
        if path.exists():
            lines = _head_lines(path)
            header = b""
            if fmt == "csv" and lines and not lines[0][:1].isdigit():
                header, lines = lines[0] + b"\n", lines[1:]
            found[fmt] = (lines, header)
    return found


def generated_keys() -> list[np.ndarray]:
    return [gen.zipf(300, 1.0, seed=1).next(200), gen.loop(50).next(120),
            gen.scan(1000, seed=2).next(64), gen.uniform(1 << 40, seed=3).next(40)]


def text_seeds(fmt: str) -> list[bytes]:
    seeds = []
    if fmt in real_lines():
        lines, header = real_lines()[fmt]
        seeds += _slices(lines, header)
    for keys in generated_keys():
        if fmt == "txt":
            lines = [b"%d" % k for k in keys]
        elif fmt == "lis":
            lines = [b"%d %d 0 %d" % (k, 1 + k % 9, i) for i, k in enumerate(keys)]
        else:
            lines = [b"1,%d,28,%d,%d" % (i, 512 * (1 + k % 16), k * 8)
                     for i, k in enumerate(keys)]
        seeds.append(b"\n".join(lines)[:MAX_SEED])
    return seeds


def oracle_seeds() -> list[bytes]:
    out = []
    for keys in generated_keys() + [np.array([int(x) for x in text_seeds("txt")[1].split()
                                              if x.isdigit()], np.uint64)]:
        rec = np.zeros(min(len(keys), MAX_SEED // ORACLE_DTYPE.itemsize), ORACLE_DTYPE)
        rec["time"] = np.arange(len(rec))
        rec["obj_id"] = keys[:len(rec)]
        rec["obj_size"] = 4096
        rec["next_access_vtime"] = -1
        out.append(rec.tobytes())
    return out


def cpaccess_seeds() -> list[bytes]:
    out = []
    for i, keys in enumerate(generated_keys()):
        keys = keys[:80]
        recs = records.make_records(keys, cgroup_id=7, tids=np.arange(len(keys)) % 3,
                                    op=records.OP_ACCESS)
        recs["op"][::5] = records.OP_INSERT
        buf = io.BytesIO()
        threshold = records.THRESHOLD_ALL if i % 2 else records.THRESHOLD_ALL // 100
        records.write_records(buf, [recs, records.make_tally(len(keys) * 100, cgroup_id=7)],
                              threshold=threshold, flags=i % 2)
        out.append(buf.getvalue())
    out.append(records.RecordHeader().to_bytes())          # a header, no record
    return out


def seeds_of(fmt: str) -> list[bytes]:
    if fmt in ("txt", "csv", "lis"):
        return text_seeds(fmt)
    if fmt == "oracle":
        return oracle_seeds()
    if fmt == "cpaccess":
        return cpaccess_seeds()
    raise KeyError(fmt)


def zstd(data: bytes, frames: int = 1) -> bytes:
    """data as zstd, cut into `frames` frames (the readers take several)."""
    c = zstandard.ZstdCompressor(level=3)
    step = max(1, len(data) // frames)
    return b"".join(c.compress(data[i:i + step]) for i in range(0, len(data), step)) \
        or c.compress(b"")
