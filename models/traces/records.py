"""cachepilot's sampled-access record format ("CPACCESS", version 1).

The agent writes the page-cache accesses its BPF sampler keeps into files of
this format; `cachepilot mrc` and the MRC builder read them back.  The
layout is documented in models/record_format.md; this module is its one
implementation.  Everything is little-endian.

    header (32 bytes):  magic "CPACCESS" | u32 version | u32 record_size
                        | u64 threshold | u64 flags
    record (32 bytes):  u64 key | u64 time_ns | u64 cgroup_id | u32 tid
                        | u16 op | u16 folio_order
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np
import zstandard

MAGIC = b"CPACCESS"
VERSION = 1
HEADER_SIZE = 32
RECORD_SIZE = 32
THRESHOLD_ALL = 0xFFFF_FFFF_FFFF_FFFF   # every key sampled (rate 1)

OP_ACCESS = 0
OP_INSERT = 1
OP_REMOVE = 2
# A tally record carries no page: its `key` is the number of accesses (sampled
# or not) the sampler counted for `cgroup_id` since the previous tally.  It
# lets a reader of a sampled file know the unsampled total (SHARDS_adj).
OP_TALLY = 3
OP_NAMES = {OP_ACCESS: "access", OP_INSERT: "insert", OP_REMOVE: "remove",
            OP_TALLY: "tally"}

# Header flags.  Unknown flag bits are reserved: writers set them to 0 and
# readers ignore them, so a later version can add meaning without breaking
# version-1 readers.
FLAG_KEYS_ARE_PAGE_KEYS = 1 << 0   # keys are cp_page_key(dev, ino, index)

HEADER_DTYPE = np.dtype([("magic", "S8"), ("version", "<u4"),
                         ("record_size", "<u4"), ("threshold", "<u8"),
                         ("flags", "<u8")])
RECORD_DTYPE = np.dtype([("key", "<u8"), ("time_ns", "<u8"),
                         ("cgroup_id", "<u8"), ("tid", "<u4"),
                         ("op", "<u2"), ("folio_order", "<u2")])
assert HEADER_DTYPE.itemsize == HEADER_SIZE and RECORD_DTYPE.itemsize == RECORD_SIZE


class RecordFormatError(ValueError):
    """The bytes are not a readable CPACCESS stream (message says why)."""


@dataclass(frozen=True)
class RecordHeader:
    version: int = VERSION
    record_size: int = RECORD_SIZE
    threshold: int = THRESHOLD_ALL
    flags: int = 0

    @property
    def rate(self) -> float:
        """Sampling rate the threshold stands for (threshold / 2^64)."""
        return 1.0 if self.threshold == THRESHOLD_ALL else self.threshold / 2.0**64

    def to_bytes(self) -> bytes:
        h = np.zeros(1, HEADER_DTYPE)
        h["magic"], h["version"], h["record_size"] = MAGIC, self.version, self.record_size
        h["threshold"], h["flags"] = self.threshold, self.flags
        return h.tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "RecordHeader":
        if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
            raise RecordFormatError("not a cachepilot access-record file "
                                    "(missing the CPACCESS magic)")
        h = np.frombuffer(raw[:HEADER_SIZE], HEADER_DTYPE)[0]
        version, record_size = int(h["version"]), int(h["record_size"])
        if version != VERSION:
            raise RecordFormatError(
                f"access-record version {version} is not supported "
                f"(this build reads version {VERSION})")
        if record_size != RECORD_SIZE:
            raise RecordFormatError(
                f"access-record size {record_size} does not match version "
                f"{VERSION}'s {RECORD_SIZE} bytes")
        threshold = int(h["threshold"])
        if threshold == 0:
            # no key hashes below 0: such a file cannot hold a sample, and
            # its rate (0) would scale every count by infinity
            raise RecordFormatError("access-record threshold 0 keeps no key "
                                    "(a sampling rate of 0)")
        return cls(version, record_size, threshold, int(h["flags"]))


def make_records(keys, *, time_ns=None, cgroup_id=0, tids=None,
                 op=OP_ACCESS, folio_order=0) -> np.ndarray:
    """A structured array of records; scalars broadcast over the keys."""
    keys = np.asarray(keys, dtype=np.uint64)
    rec = np.zeros(len(keys), RECORD_DTYPE)
    rec["key"] = keys
    rec["time_ns"] = np.arange(len(keys), dtype=np.uint64) if time_ns is None else time_ns
    rec["cgroup_id"] = cgroup_id
    rec["tid"] = 0 if tids is None else tids
    rec["op"] = op
    rec["folio_order"] = folio_order
    return rec


def make_tally(accesses: int, *, time_ns: int = 0, cgroup_id: int = 0) -> np.ndarray:
    """One tally record: `accesses` counted since the previous tally."""
    return make_records([accesses], time_ns=time_ns, cgroup_id=cgroup_id, op=OP_TALLY)


def write_header(out: BinaryIO, threshold: int = THRESHOLD_ALL, flags: int = 0) -> None:
    out.write(RecordHeader(threshold=threshold, flags=flags).to_bytes())


def write_records(dest, records, *, threshold: int = THRESHOLD_ALL,
                  flags: int = 0, header: bool = True) -> int:
    """Write records (a RECORD_DTYPE array, or an iterable of them) to a path
    or binary file object.  With header=False the records are appended to a
    stream whose header was written before.  Returns records written."""
    if isinstance(dest, (str, os.PathLike)):
        with open(dest, "wb") as out:
            return write_records(out, records, threshold=threshold,
                                 flags=flags, header=header)
    if header:
        write_header(dest, threshold, flags)
    batches = [records] if isinstance(records, np.ndarray) else records
    n = 0
    for batch in batches:
        batch = np.asarray(batch)
        if batch.dtype != RECORD_DTYPE:
            raise TypeError("records must use RECORD_DTYPE (see make_records)")
        dest.write(batch.astype(RECORD_DTYPE, copy=False).tobytes())
        n += len(batch)
    return n


def read_header(src: BinaryIO) -> RecordHeader:
    return RecordHeader.from_bytes(src.read(HEADER_SIZE))


def iter_records(src: BinaryIO, chunk_records: int = 1 << 18,
                 name: str = "<stream>") -> Iterator[np.ndarray]:
    """Yield record arrays from a stream positioned after the header.  A
    truncated trailing record is an error, not silently dropped."""
    while True:
        raw = _read_full(src, chunk_records * RECORD_SIZE)
        if not raw:
            return
        whole = len(raw) // RECORD_SIZE
        if whole * RECORD_SIZE != len(raw):
            raise RecordFormatError(
                f"{name}: truncated record at the end "
                f"({len(raw) - whole * RECORD_SIZE} stray bytes)")
        yield np.frombuffer(raw, RECORD_DTYPE)


def read_records(path) -> tuple[RecordHeader, np.ndarray]:
    """Whole file into memory (small files and tests).  A zstd file that
    does not decompress is a RecordFormatError too."""
    from cachepilot.models.traces.readers import open_binary
    try:
        with open_binary(path) as src:
            header = read_header(src)
            parts = list(iter_records(src, name=str(path)))
    except zstandard.ZstdError as err:
        raise RecordFormatError(f"{path}: corrupt zstd data ({err})") from None
    recs = np.concatenate(parts) if parts else np.zeros(0, RECORD_DTYPE)
    return header, recs


def _read_full(src: BinaryIO, n: int) -> bytes:
    """read() until n bytes or EOF (decompressing streams return short reads)."""
    parts, got = [], 0
    while got < n:
        b = src.read(n - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts) if len(parts) != 1 else parts[0]


__all__ = ["MAGIC", "VERSION", "HEADER_SIZE", "RECORD_SIZE", "THRESHOLD_ALL",
           "OP_ACCESS", "OP_INSERT", "OP_REMOVE", "OP_TALLY", "FLAG_KEYS_ARE_PAGE_KEYS",
           "RECORD_DTYPE", "HEADER_DTYPE", "RecordHeader", "RecordFormatError",
           "make_records", "write_header", "write_records", "read_header",
           "iter_records", "read_records"]
