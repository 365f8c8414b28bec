"""The fuzz targets: one small function each.

A target takes the fuzzer's bytes and feeds them to one reader the way a
user's file reaches it.  It may end in the reader's own clear error (the
`expected` exceptions: what the command line prints as a one-line error);
anything else -- another exception, a wrong result, a hang, a blow-up of
memory -- is a crash that libFuzzer saves and fuzz/run.py reports.

Adding a target is one function:

    @target("name", seeds=lambda: [b"...", ...], expected=(SomeError,))
    def fuzz_name(data: bytes, scratch: Path) -> None:
        ...

Seeds come from fuzz/seeds.py (slices of ../shared/traces and generated
traces, made at run time).  The native text parser (models/native/mrc/
parse.c) has its own libFuzzer target in C, fuzz/parse_fuzz.c; the text
targets here reach it too, through the Python extension.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from google.protobuf.message import DecodeError

from cachepilot.agent.config import load_config as agent_config
from cachepilot.controller.config import load_config as controller_config
from cachepilot.core.errors import UserError
from cachepilot.protocol import wire
from cachepilot.models.traces import records
from cachepilot.models.traces.readers import ZSTD_MAGIC, Trace
from fuzz import seeds as S


@dataclass
class Target:
    name: str
    run: Callable[[bytes, Path], None]
    seeds: Callable[[], list[bytes]]
    expected: tuple[type[BaseException], ...]


TARGETS: dict[str, Target] = {}


def target(name: str, seeds: Callable[[], list[bytes]],
           expected: tuple[type[BaseException], ...] = (UserError,)):
    def register(fn):
        TARGETS[name] = Target(name, fn, seeds, expected)
        return fn
    return register


def write(scratch: Path, data: bytes, suffix: str = "") -> Path:
    path = scratch.with_name(scratch.name + suffix)
    path.write_bytes(data)
    return path


# -- a reference for the text formats: slow, obvious, Python ----------------------

_UINT = re.compile(rb"[0-9]+")
_HEX = re.compile(rb"[0-9a-fA-F]+")
_BLANK = b" \t\r"
U64 = (1 << 64) - 1


REFERENCE_KEYS = 1 << 16


def reference_text_keys(data: bytes, fmt: str):
    """The keys a text trace stands for, None when a line is malformed, or
    ... (Ellipsis) when they would be more than REFERENCE_KEYS: the formats
    as models/traces/readers.py documents them."""
    keys = []
    for number, line in enumerate(data.split(b"\n")):
        body = line.strip(_BLANK)
        if not body:
            continue
        if fmt == "csv":
            if number == 0 and not body[:1].isdigit():
                continue            # the header line
            fields = [f.strip(_BLANK) for f in body.split(b",")]
            if len(fields) != 5 or not all(
                    (_HEX if i == 2 else _UINT).fullmatch(f) for i, f in enumerate(fields)):
                return None
            v = [int(f, 16 if i == 2 else 10) for i, f in enumerate(fields)]
            if any(x > U64 for x in v):
                return None
            size, lbn = v[3], v[4]
            if size > (1 << 20) * 4096 or lbn * 512 + size > U64:
                return None
            if size:
                lo = lbn * 512
                if len(keys) + size // 4096 + 2 > REFERENCE_KEYS:
                    return ...
                keys += range(lo // 4096, (lo + size - 1) // 4096 + 1)
        else:
            fields = re.split(rb"[ \t\r]+", body)
            want = 1 if fmt == "txt" else 4
            if len(fields) != want or not all(_UINT.fullmatch(f) for f in fields):
                return None
            v = [int(f) for f in fields]
            if any(x > U64 for x in v):
                return None
            if fmt == "txt":
                keys.append(v[0])
            else:
                if not 1 <= v[1] <= 1 << 20 or v[0] + v[1] > U64:
                    return None
                if len(keys) + v[1] > REFERENCE_KEYS:
                    return ...
                keys += range(v[0], v[0] + v[1])
    return keys


def _text_target(fmt: str):
    def run(data: bytes, scratch: Path) -> None:
        # a file that starts with zstd's magic is read as zstd (fuzz_zstd's)
        want = ... if data.startswith(ZSTD_MAGIC) else reference_text_keys(data, fmt)
        try:
            got = Trace(write(scratch, data), fmt).read_all()
        except UserError:
            if want is not ... and want is not None:
                raise AssertionError(f"{fmt}: a valid trace was refused") from None
            raise
        if want is None:
            raise AssertionError(f"{fmt}: a malformed trace was read")
        if want is not ...:
            assert got.tolist() == want, f"{fmt}: keys differ from the reference"
    run.__name__ = f"fuzz_{fmt}"
    return run


for _fmt in ("txt", "csv", "lis"):
    target(_fmt, seeds=lambda f=_fmt: S.seeds_of(f))(_text_target(_fmt))


def _read_binary(data: bytes, scratch: Path, fmt: str):
    """Read `data` as a binary trace of `fmt`: (the trace, its keys, whether
    the bytes are zstd-compressed, whose sizes say nothing of the records)."""
    t = Trace(write(scratch, data), fmt)
    return t, t.read_all(), data.startswith(ZSTD_MAGIC)


@target("oracle", seeds=S.oracle_seeds)
def fuzz_oracle(data: bytes, scratch: Path) -> None:
    t, keys, packed = _read_binary(data, scratch, "oracle")
    if packed:
        return
    assert len(data) % 24 == 0 and len(keys) == len(data) // 24 == t.requests


@target("cpaccess", seeds=S.cpaccess_seeds)
def fuzz_cpaccess(data: bytes, scratch: Path) -> None:
    t, keys, packed = _read_binary(data, scratch, "cpaccess")
    if packed:
        return
    body = np.frombuffer(data[32:], records.RECORD_DTYPE)
    assert len(keys) == t.requests == int((body["op"] == records.OP_ACCESS).sum())
    assert 0 < t.rate <= 1


@target("records", seeds=S.cpaccess_seeds, expected=(records.RecordFormatError,))
def fuzz_records(data: bytes, scratch: Path) -> None:
    """The record API (records.read_records), as the agent's files and
    tests use it: a RecordFormatError or the records."""
    header, recs = records.read_records(write(scratch, data))
    assert header.version == records.VERSION and recs.dtype == records.RECORD_DTYPE
    if data.startswith(ZSTD_MAGIC):
        return
    assert len(recs) == (len(data) - records.HEADER_SIZE) // records.RECORD_SIZE


_SUFFIXES = ("", ".txt", ".csv", ".lis", ".oracleGeneral", ".cpa", ".bin", ".txt.zst")
_FORMATS = (None, "txt", "csv", "lis", "oracle", "cpaccess")


def _detect_seeds() -> list[bytes]:
    out = []
    for i, suffix in enumerate(_SUFFIXES):
        for fmt in ("txt", "csv", "lis", "oracle", "cpaccess"):
            for seed in S.seeds_of(fmt)[:2]:
                out.append(bytes([i]) + (S.zstd(seed) if suffix.endswith(".zst") else seed))
    return out


@target("detect", seeds=_detect_seeds)
def fuzz_detect(data: bytes, scratch: Path) -> None:
    """Format detection (content first, then the file name) and the read
    that follows, as `cachepilot mrc FILE` does without --format."""
    if not data:
        return
    suffix = _SUFFIXES[data[0] % len(_SUFFIXES)]
    t = Trace(write(scratch, data[1:], suffix))
    t.read_all()


def _zstd_seeds() -> list[bytes]:
    out = []
    for i, fmt in enumerate(_FORMATS):
        for seed in S.seeds_of(fmt or "txt")[:3]:
            out.append(bytes([i]) + S.zstd(seed, frames=1 + len(out) % 3))
    return out


@target("zstd", seeds=_zstd_seeds)
def fuzz_zstd(data: bytes, scratch: Path) -> None:
    """zstd-compressed traces of every format: frames, truncation, corrupt
    blocks (the first byte picks the format; None detects it)."""
    if not data:
        return
    fmt = _FORMATS[data[0] % len(_FORMATS)]
    Trace(write(scratch, data[1:], ".zst"), fmt).read_all()


_CONFIG_LOADERS = ("agent", "controller")


@target("config", seeds=S.config_seeds)
def fuzz_config(data: bytes, scratch: Path) -> None:
    """A YAML config as `cachepilot agent|controller|run --config` reads it
    (the first byte picks the loader): the config or a UserError naming
    the file and key."""
    if not data:
        return
    which = _CONFIG_LOADERS[data[0] % len(_CONFIG_LOADERS)]
    path = write(scratch, data[1:], ".yaml")
    (agent_config if which == "agent" else controller_config)(path)


@target("report", seeds=S.report_seeds, expected=(wire.WireError, DecodeError))
def fuzz_report(data: bytes, scratch: Path) -> None:
    """A ReportRequest's bytes as the controller's gRPC server receives
    them, through report_from_pb and apply_result_from_pb: the objects, or
    a protobuf DecodeError or WireError; a tenant whose curves are
    malformed keeps its report without them.  A report that decodes
    encodes back to the same message."""
    from cachepilot.protocol import cachepilot_pb2 as pb
    msg = pb.ReportRequest.FromString(data)
    for r in msg.reports:
        rep = wire.report_from_pb(r)
        # a malformed curve refuses that tenant's curves, not the report
        assert not (rep.refused and rep.curves), "refused curves were kept"
        again = wire.report_from_pb(wire.report_to_pb(rep))
        assert again.tenant == rep.tenant and len(again.curves) == len(rep.curves)
        for a, b in zip(rep.curves, again.curves):
            assert np.array_equal(a.sizes, b.sizes)
            assert np.array_equal(a.miss_ratio, b.miss_ratio)
    for a in msg.applied:
        wire.apply_result_from_pb(a)
