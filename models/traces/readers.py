"""Streaming trace readers.

A trace is read in chunks of page keys (numpy uint64 arrays); no reader ever
turns a whole trace into a Python list.  Formats:

  txt       one decimal key per line (a page / block number)
  csv       CloudPhysics / libCacheSim CSV `version,time,op,size,lbn`:
            `lbn` counts 512-byte sectors, `size` bytes; a request becomes
            every 4 KiB page it covers (page = lbn*512 // 4096 ...)
  lis       ARC traces `start_block num_blocks ignored request_no`: a
            request becomes num_blocks page keys start_block, start_block+1...
  oracle    libCacheSim oracleGeneral binary, 24-byte records
            {u32 time; u64 obj_id; u32 obj_size; i64 next_access_vtime};
            one key (obj_id) per request
  cpaccess  cachepilot's sampled-access records (models/record_format.md);
            only op = access records are requests

Any of them may be zstd-compressed.  Counting: `requests` is the number of
trace records (text lines, binary records); `accesses` is the number of page
keys they expand to, which is what miss ratios are computed over.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import zstandard

from cachepilot.core.errors import UserError
from cachepilot.models import _mrc
from cachepilot.models.traces import records

FORMATS = ("txt", "csv", "lis", "oracle", "cpaccess")
FORMAT_ALIASES = {"text": "txt", "plain": "txt", "arc": "lis",
                  "oraclegeneral": "oracle", "cloudphysics": "csv",
                  "cpa": "cpaccess", "records": "cpaccess"}
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ORACLE_DTYPE = np.dtype([("time", "<u4"), ("obj_id", "<u8"),
                         ("obj_size", "<u4"), ("next_access_vtime", "<i8")])
assert ORACLE_DTYPE.itemsize == 24

_TEXT_CODES = {"txt": _mrc.FMT_TXT, "lis": _mrc.FMT_LIS, "csv": _mrc.FMT_CSV}
_EXTENSIONS = {".txt": "txt", ".csv": "csv", ".lis": "lis",
               ".oraclegeneral": "oracle", ".cpa": "cpaccess",
               ".cpaccess": "cpaccess"}
TEXT_BLOCK = 8 << 20          # bytes of text read at a time
CHUNK_KEYS = 1 << 22          # keys one native parse call may return (32 MiB)
BINARY_CHUNK = 1 << 20        # records per chunk


class TraceError(UserError):
    """A trace that cannot be read; the message names the file (and line)."""


def formats_help() -> str:
    return ", ".join(FORMATS) + " (any of them zstd-compressed)"


def normalise_format(name: str | None) -> str | None:
    if name is None:
        return None
    key = name.strip().lower()
    key = FORMAT_ALIASES.get(key, key)
    if key not in FORMATS:
        raise TraceError(f"unknown trace format {name!r}; accepted: {formats_help()}")
    return key


class ZstdStream:
    """A read-only stream of zstd-compressed data, frame after frame, that
    notices a truncated last frame (python-zstandard's stream_reader just
    stops there, which would pass half a trace off as a whole one)."""

    RAW_BLOCK = 1 << 20

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._d = self._dctx.decompressobj()
        self._in_frame = False
        self._buf = bytearray()
        self._eof = False

    def _fill(self):
        data = self.raw.read(self.RAW_BLOCK)
        if not data:
            if self._in_frame:
                raise zstandard.ZstdError("the file ends inside a frame (truncated)")
            self._eof = True
            return
        while data:
            self._in_frame = True
            self._buf += self._d.decompress(data)
            data = b""
            if self._d.eof:
                # a frame ended; what follows is the next frame
                data = self._d.unused_data
                self._d = self._dctx.decompressobj()
                self._in_frame = False

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            self._fill()
        if n < 0 or n >= len(self._buf):
            out, self._buf = bytes(self._buf), bytearray()
        else:
            out = bytes(self._buf[:n])
            del self._buf[:n]
        return out

    def close(self):
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_binary(path, raw_sink: list | None = None) -> BinaryIO:
    """The file's bytes, decompressed on the fly when it is zstd.  The raw
    file object is appended to raw_sink (for progress: its tell())."""
    f = open(path, "rb")
    if raw_sink is not None:
        raw_sink.append(f)
    if f.read(4) == ZSTD_MAGIC:
        f.seek(0)
        return ZstdStream(f)
    f.seek(0)
    return f


def _is_zstd(path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == ZSTD_MAGIC


def detect_format(path) -> str:
    """Format from the content first (magic bytes, text shape), the file
    extension second.  Raises TraceError listing the accepted formats."""
    path = Path(path)
    try:
        with open_binary(path) as src:
            head = src.read(64 << 10)
    except zstandard.ZstdError as err:
        raise TraceError(f"{path}: corrupt zstd data ({err})") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None
    if head.startswith(records.MAGIC):
        return "cpaccess"
    name = path.name.lower()
    if name.endswith(".zst"):
        name = name[:-4]
    ext = Path(name).suffix
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if "oraclegeneral" in name:
        return "oracle"
    if not head:
        raise TraceError(f"{path}: the trace is empty")
    if b"\0" in head:
        raise TraceError(f"{path}: cannot tell the trace format from its content; "
                         f"use --format with one of: {formats_help()}")
    for line in head.split(b"\n")[:50]:
        fields = line.strip()
        if not fields:
            continue
        if b"," in fields:
            return "csv"
        n = len(fields.split())
        if n == 1:
            return "txt"
        if n == 4:
            return "lis"
        break
    raise TraceError(f"{path}: cannot tell the trace format from its content; "
                     f"use --format with one of: {formats_help()}")


class Trace:
    """One trace file, read as a stream of page-key chunks.

    `requests` and `accesses` count what has been read so far (they are
    complete after one full pass); `threshold` is the sampling threshold the
    file was written under (2^64-1 except for sampled cpaccess files)."""

    def __init__(self, path, format: str | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise TraceError(f"{self.path}: no such trace file")
        self.format = normalise_format(format) or detect_format(self.path)
        try:
            self.compressed = _is_zstd(self.path)
        except OSError as err:
            raise TraceError(f"{self.path}: cannot read: {err.strerror or err}") from None
        self.threshold = records.THRESHOLD_ALL
        self.requests = 0
        self.accesses = 0
        self.tallied = None       # cpaccess: accesses the tally records count
        self.size_bytes = self.path.stat().st_size
        self._raw = []
        if self.format == "cpaccess":
            try:
                with open_binary(self.path) as src:
                    self.threshold = self._cpaccess_header(src).threshold
            except OSError as err:
                raise TraceError(f"{self.path}: cannot read: {err.strerror or err}") from None

    @property
    def bytes_read(self) -> int:
        """Bytes of the (compressed) file consumed so far, for progress."""
        try:
            return self._raw[-1].tell() if self._raw else 0
        except (ValueError, OSError):     # closed: the pass is over
            return self.size_bytes

    @property
    def rate(self) -> float:
        return 1.0 if self.threshold == records.THRESHOLD_ALL else self.threshold / 2.0**64

    def chunks(self) -> Iterator[np.ndarray]:
        """Page keys, chunk by chunk (uint64 arrays)."""
        for keys, _ in self.chunks_with_tids():
            yield keys

    def chunks_with_tids(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """(keys, tids) chunks; tids is None for formats without threads."""
        self.requests = self.accesses = 0
        self.tallied = None
        self._raw = []
        if self.format in _TEXT_CODES:
            source = self._text_chunks()
        elif self.format == "oracle":
            source = self._oracle_chunks()
        else:
            source = self._cpaccess_chunks()
        try:
            for keys, tids in source:
                self.accesses += len(keys)
                if len(keys):
                    yield keys, tids
        except zstandard.ZstdError as err:
            raise TraceError(f"{self.path}: corrupt zstd data ({err})") from None
        except OSError as err:
            raise TraceError(f"{self.path}: cannot read: {err.strerror or err}") from None

    def read_all(self) -> np.ndarray:
        """Every key in one array (for tests and small traces)."""
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.zeros(0, np.uint64)

    # -- formats -------------------------------------------------------------
    def _text_chunks(self):
        code = _TEXT_CODES[self.format]
        line_base = 0         # lines before the current block
        carry = b""
        with open_binary(self.path, self._raw) as src:
            while True:
                block = src.read(TEXT_BLOCK)
                data = carry + block
                if not block:
                    if not data:
                        return
                    cut = len(data)      # last line without its newline
                else:
                    cut = data.rfind(b"\n") + 1
                    if cut == 0:
                        carry = data
                        continue
                view = memoryview(data)
                done = 0
                while done < cut:
                    # at most CHUNK_KEYS (+ one request's) keys a call: a
                    # line may stand for 2^20 pages
                    raw, requests, lines, bad, err, used = _mrc.parse_text(
                        view[done:cut], code, line_base == 0, CHUNK_KEYS)
                    if bad:
                        self._bad_line(data[done:cut], bad, line_base + bad, err)
                    self.requests += requests
                    line_base += lines
                    done += used
                    yield np.frombuffer(raw, np.uint64), None
                view.release()
                carry = data[cut:]
                if not block:
                    return

    def _bad_line(self, data: bytes, index: int, line_no: int, err: str):
        lines = data.split(b"\n")
        text = lines[index - 1].decode("utf-8", "replace").strip() if index <= len(lines) else ""
        if len(text) > 60:
            text = text[:57] + "..."
        raise TraceError(f"{self.path}:{line_no}: malformed {self.format} line "
                         f"({err}): {text!r}")

    def _oracle_chunks(self):
        size = ORACLE_DTYPE.itemsize
        with open_binary(self.path, self._raw) as src:
            while True:
                raw = records._read_full(src, BINARY_CHUNK * size)
                if not raw:
                    return
                if len(raw) % size:
                    raise TraceError(
                        f"{self.path}: not an oracleGeneral trace (size is not a "
                        f"multiple of {size}-byte records; "
                        f"{self.requests + len(raw) // size} whole records)")
                recs = np.frombuffer(raw, ORACLE_DTYPE)
                self.requests += len(recs)
                yield recs["obj_id"].copy(), None

    def _cpaccess_header(self, src):
        try:
            return records.read_header(src)
        except records.RecordFormatError as err:
            raise TraceError(f"{self.path}: {err}") from None
        except zstandard.ZstdError as err:
            raise TraceError(f"{self.path}: corrupt zstd data ({err})") from None

    def _cpaccess_chunks(self):
        with open_binary(self.path, self._raw) as src:
            self._cpaccess_header(src)
            try:
                for recs in records.iter_records(src, name=str(self.path)):
                    tally = recs["key"][recs["op"] == records.OP_TALLY]
                    if len(tally):
                        self.tallied = (self.tallied or 0) + int(tally.sum())
                    acc = recs[recs["op"] == records.OP_ACCESS]
                    self.requests += len(acc)
                    yield acc["key"].copy(), acc["tid"].astype(np.uint32)
            except records.RecordFormatError as err:
                raise TraceError(str(err)) from None


def open_trace(path, format: str | None = None) -> Trace:
    return Trace(path, format)


def read_keys(path, format: str | None = None) -> np.ndarray:
    return Trace(path, format).read_all()


def write_oracle_general(path, keys, obj_size: int = 1) -> None:
    """Write keys as a libCacheSim oracleGeneral trace (for cross-checks
    with libCacheSim; next_access_vtime is left at -1 'unknown')."""
    keys = np.asarray(keys, dtype=np.uint64)
    rec = np.zeros(len(keys), ORACLE_DTYPE)
    rec["time"] = np.arange(len(keys), dtype=np.uint64).astype(np.uint32)
    rec["obj_id"] = keys
    rec["obj_size"] = obj_size
    rec["next_access_vtime"] = -1
    with open(os.fspath(path), "wb") as out:
        out.write(rec.tobytes())
