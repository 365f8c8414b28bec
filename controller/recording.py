"""A controller's rounds on disk, to be replayed through decide().

A recording is a folder holding one file, `recording.jsonl.zst`: JSON
lines, zstd-compressed, one frame per line so that a controller killed
mid-run leaves every line it wrote readable.  Lines, by "type":

    header   {"format": "cachepilot-recording", "version": 1, "created"}
    config   the engine's part of the configuration ("control", "nodes",
             "tenants"), written at the start and again whenever it
             changes (an SLO set through the admin API)
    restore  {"rounds", "records"}: engine records (engine/saved.py) the
             controller restored from its store, before any round
    round    {"round", "reports": {node: [report]}, "advisory",
              "recommend", "node_memory", "directives": {node: [[tenant,
              limit_bytes, policy, reason]]}}: one call of decide(), the
             round number it returned, and what it directed

A report is the protocol's TenantReport message (protocol/cachepilot.proto)
in base64, with "refused" beside it where the controller refused part of
it: exactly what decide() was given.  See docs/recording.md.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import zstandard

from cachepilot.core.errors import UserError

FORMAT, VERSION = "cachepilot-recording", 1
FILE = "recording.jsonl.zst"
ENGINE_SECTIONS = ("control", "nodes", "tenants")


def engine_config(config) -> dict:
    """The part of a Config that decide() reads, as JSON-able data."""
    return {k: v for k, v in config.model_dump(mode="json", exclude={"source"}).items()
            if k in ENGINE_SECTIONS}


def encode_report(r) -> dict:
    from cachepilot.protocol import wire
    out = {"pb": base64.b64encode(wire.report_to_pb(r).SerializeToString()).decode()}
    if r.refused:
        out["refused"] = r.refused
    return out


def decode_report(d: dict):
    from cachepilot.protocol import cachepilot_pb2 as pb
    from cachepilot.protocol import wire
    r = wire.report_from_pb(pb.TenantReport.FromString(base64.b64decode(d["pb"])))
    r.refused = d.get("refused", "")
    return r


class Recorder:
    """Writes a recording as the controller decides (service.Engine)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file = open(self.folder / FILE, "wb")
        except OSError as err:
            raise UserError(f"--record {folder}: cannot write there: "
                            f"{err.strerror or err}") from None
        self._z = zstandard.ZstdCompressor(level=10)
        self._lock = threading.Lock()
        self._config = None
        self._write({"type": "header", "format": FORMAT, "version": VERSION,
                     "created": time.time()})

    def _write(self, line: dict) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self._file.write(self._z.compress(data))
            self._file.flush()

    def config(self, config) -> None:
        """The engine's configuration, when it differs from the last written."""
        now = engine_config(config)
        if now != self._config:
            self._config = now
            self._write({"type": "config", **now})

    def restore(self, records: dict, rounds: int) -> None:
        self._write({"type": "restore", "rounds": rounds, "records": records})

    def round(self, number, reports, config, advisory, recommend, node_memory,
              directives) -> None:
        self.config(config)
        self._write({
            "type": "round", "round": number,
            "reports": {n: [encode_report(r) for r in rs] for n, rs in reports.items()},
            "advisory": sorted(advisory), "recommend": sorted(recommend),
            "node_memory": node_memory,
            "directives": {n: [[d.tenant, int(d.limit_bytes), d.policy, d.reason]
                               for d in ds] for n, ds in directives.items()}})

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


FEED = 1 << 16          # compressed bytes fed to the decompressor at a time


def _frames(raw: bytes, path) -> str:
    """The text of every whole frame; a last frame cut short (a controller
    killed while writing it) is left out, as its round never finished.
    Fed in pieces, so that what follows a frame (unused_data, copied at
    every frame's end) is at most a piece, not the rest of the file: a
    day's recording has tens of thousands of frames.  (models/traces'
    ZstdStream reads frames the same way but refuses a cut last frame,
    which a trace must not pass off as whole.)"""
    out, frame, d = [], [], zstandard.ZstdDecompressor()
    obj, view = d.decompressobj(), memoryview(raw)
    try:
        for at in range(0, len(raw), FEED):
            piece = view[at:at + FEED]
            while piece:
                frame.append(obj.decompress(piece))
                if not obj.eof:
                    break
                out += frame
                frame, piece, obj = [], obj.unused_data, d.decompressobj()
        return b"".join(out).decode()
    except (zstandard.ZstdError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a zstd-compressed recording ({err})") from None


def read(folder) -> list[dict]:
    """Every line of a recording, checked; UserError on anything else."""
    path = Path(folder)
    path = path / FILE if path.is_dir() else path
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"{folder}: cannot read a recording: {err.strerror or err}") from None
    text = _frames(raw, path)
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise UserError(f"{path}: line {n} is not JSON") from None
    head = lines[0] if lines else {}
    if head.get("type") != "header" or head.get("format") != FORMAT:
        raise UserError(f"{path}: not a cachepilot recording (no header line)")
    if head.get("version") != VERSION:
        raise UserError(f"{path}: recording format version {head.get('version')}; this "
                        f"cachepilot reads version {VERSION}")
    return lines
