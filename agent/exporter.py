"""`cachepilot exporter`: an application's own periodic statistics as a
Prometheus counter, for the agent's `prometheus` throughput source.

The agent's default throughput is page-cache accesses per second; what a
tenant cares about is its own work (RocksDB GETs, fio I/Os).  The exporter
runs the application as its child (in the exporter's cgroup: put the
exporter in the tenant's cgroup and the child inherits it), reads the
statistics the application prints anyway, and serves

    cachepilot_app_operations_total{name="NAME"}   operations so far (counter)
    cachepilot_app_up{name="NAME"}                 1 while the child runs

on http://ADDRESS:PORT/metrics.  The agent's PrometheusSource turns the
counter into operations per second.

Output that is not a statistic is passed through (_pump).  Each format is
one small pure parser plus a tiny accumulator:

  db_bench  RocksDB db_bench (7.8) with --stats_interval_seconds=N: the
            per-thread progress lines it writes to stderr.
  fio       fio (3.33) with --status-interval=N --output-format=json: the
            stream of JSON documents on stdout.
  lines     every line of the child's stdout is one operation.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from cachepilot.core.errors import UserError

FORMATS = ("db_bench", "fio", "lines")
METRIC = "cachepilot_app_operations"        # exposed as ..._total
UP_METRIC = "cachepilot_app_up"


# -- db_bench -----------------------------------------------------------------

# db_bench 7.8.3, --stats_interval_seconds=1 --threads=2, on stderr:
# 2026/11/22-23:24:31  ... thread 1: (336000,712000) ops and (335330.7,355457.4) ops/second in (1.001996,2.003053) seconds
_DB_BENCH_PROGRESS = re.compile(
    r"\.\.\. thread (\d+): \((\d+),(\d+)\) ops and "
    r"\(([^,()]*),([^,()]*)\) ops/second in \(([^,()]*),([^,()]*)\) seconds")


def parse_db_bench_line(line: str) -> tuple[int, int, int] | None:
    """(thread, interval_ops, cumulative_ops) of a db_bench progress line,
    or None for any other line.

    db_bench prints one such line per thread every stats interval; the
    cumulative figure counts the thread's operations since the start of the
    current benchmark, so it restarts at each benchmark of a
    `--benchmarks=a,b` run.  The first line of a thread in a benchmark is
    the one whose interval figure equals its cumulative one."""
    m = _DB_BENCH_PROGRESS.search(line)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# ... and its report at the end of each benchmark, on stdout:
# readrandom   :       5.515 micros/op 359048 ops/sec 11.141 seconds 4000000 operations;   39.7 MB/s (2000000 of 2000000 found)
_DB_BENCH_SUMMARY = re.compile(
    r"^(\S+)\s*:\s*\S+ micros/op \S+ ops/sec \S+ seconds (\d+) operations;")


def parse_db_bench_summary(line: str) -> tuple[str, int] | None:
    """(benchmark, operations of all its threads) of the line db_bench
    prints when a benchmark ends, or None for any other line.

    The progress lines miss what each thread did after its last one (up to
    a stats interval's worth); this line has the exact total."""
    m = _DB_BENCH_SUMMARY.match(line)
    if m is None:
        return None
    return m.group(1), int(m.group(2))


class DbBenchCounter:
    """Operations so far: the totals of the benchmarks that have ended
    (their reports), plus the progress of the one under way: the sum over
    threads of each thread's latest cumulative count.

    A report replaces the progress of its benchmark, which lags by what
    each thread did after its last progress line (up to a stats interval's
    worth), so at the end the counter is db_bench's own total.  db_bench
    flushes its stdout after each report, so the report arrives before the
    next benchmark's progress lines (measured with 7.8.3 on a pipe).  A
    thread's new benchmark without a report in between (a thread's first
    line is the one whose interval figure equals its cumulative one) keeps
    that thread's earlier count."""

    def __init__(self):
        self.banked = 0                 # threads' earlier benchmarks, unreported
        self.current: dict[int, int] = {}
        self.reported = 0               # totals of the ended benchmarks

    def feed(self, line: str) -> list[str]:
        """Take one line; returns it back (to pass it through) unless it
        was a progress line."""
        parsed = parse_db_bench_line(line)
        if parsed is None:
            summary = parse_db_bench_summary(line)
            if summary is not None:
                self.reported += summary[1]
                self.banked, self.current = 0, {}
            return [line]
        thread, interval, cumulative = parsed
        if interval == cumulative or cumulative < self.current.get(thread, 0):
            # this thread started a new benchmark: keep its last one's count
            self.banked += self.current.pop(thread, 0)
        self.current[thread] = cumulative
        return []

    @property
    def total(self) -> int:
        return self.reported + self.banked + sum(self.current.values())


# -- fio ----------------------------------------------------------------------

def fio_job_ios(doc: dict) -> dict[tuple[str, int], int]:
    """I/Os per job of one fio JSON document: {(jobname, k):
    read.total_ios + write.total_ios}, k counting the jobs of that name.

    fio (--status-interval with --output-format=json) prints a whole
    document every interval; each job's figures in it are cumulative since
    the job started, and a job that has finished (stonewall) keeps its
    final figures in the later documents.  Several jobs may share a name
    (numjobs=N), hence k.  Trim and sync operations are not counted."""
    out: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    for job in doc.get("jobs") or ():
        if not isinstance(job, dict):
            continue
        name = str(job.get("jobname", ""))
        k = seen[name] = seen.get(name, -1) + 1
        ios = 0
        for direction in ("read", "write"):
            part = job.get(direction)
            if isinstance(part, dict):
                value = part.get("total_ios", 0)
                if isinstance(value, (int, float)) and value > 0:
                    ios += int(value)
        out[(name, k)] = ios
    return out


class JsonStream:
    """Splits a text stream into the JSON documents in it.

    Lines between documents are returned as `other`; inside a document,
    lines accumulate until a line that closes it at the left margin (fio
    pretty-prints, so only a document's own closing brace is there), and
    then json.JSONDecoder.raw_decode parses the buffer (a one-line document
    works too).  A buffer that does not parse keeps growing until it does
    or exceeds `limit` characters, when it is given back as `other`.
    Each document comes with its text as printed."""

    def __init__(self, limit: int = 64 << 20):
        self.limit = limit
        self._buf: list[str] = []
        self._size = 0
        self._decoder = json.JSONDecoder()

    def feed(self, line: str) -> tuple[list[tuple[dict, str]], list[str]]:
        """([(document, its text)] completed by this line, text that is no
        JSON)."""
        if not self._buf:
            if not line.startswith("{"):
                return [], [line]
        self._buf.append(line)
        self._size += len(line)
        stripped = line.rstrip()
        if not (stripped.endswith("}") and not line[:1].isspace()):
            if self._size > self.limit:
                return [], self._flush()
            return [], []
        text = "".join(self._buf)
        try:
            doc, end = self._decoder.raw_decode(text)
        except json.JSONDecodeError:
            if self._size > self.limit:
                return [], self._flush()
            return [], []
        self._buf, self._size = [], 0
        rest = text[end:]
        other = [rest] if rest.strip() else []
        if not isinstance(doc, dict):
            return [], [text]
        return [(doc, text[:end])], other

    def _flush(self) -> list[str]:
        lines, self._buf, self._size = self._buf, [], 0
        return lines


class FioCounter:
    """Total I/Os over all jobs of a fio run, from its status documents;
    each job's count never goes down, and a job missing from a document
    keeps the count it had."""

    def __init__(self):
        self.jobs: dict[tuple[str, int], int] = {}
        self.stream = JsonStream()
        self.last_doc: str | None = None    # fio's final report, at the end

    def feed(self, line: str) -> list[str]:
        """Take one line; returns what is no JSON document."""
        docs, other = self.stream.feed(line)
        for doc, text in docs:
            for key, ios in fio_job_ios(doc).items():
                self.jobs[key] = max(ios, self.jobs.get(key, 0))
            self.last_doc = text
        return other

    @property
    def total(self) -> int:
        return sum(self.jobs.values())


# -- lines --------------------------------------------------------------------

class LinesCounter:
    """One operation per line, for a command that prints a line per unit of
    work (a shell loop that echoes after each pass)."""

    def __init__(self):
        self.total = 0

    def feed(self, line: str) -> list[str]:
        self.total += 1
        return []


# -- the exporter ---------------------------------------------------------------

class AppState:
    """What /metrics shows: the counter (never decreasing) and whether the
    child runs."""

    def __init__(self, name: str, fmt: str):
        self.name = name
        self.format = fmt
        self.lock = threading.Lock()
        self.counter = {"db_bench": DbBenchCounter, "fio": FioCounter,
                        "lines": LinesCounter}[fmt]()
        self.total = 0
        self.up = False

    def feed(self, line: str, stream: str) -> list[str]:
        """Take one line of the child's `stream` ("stdout" or "stderr");
        returns the text to pass through (none for a statistic).  db_bench
        writes its progress to stderr and its reports to stdout; fio its
        JSON and `lines` commands their lines to stdout, and their stderr
        is only passed through."""
        if stream != "stdout" and self.format != "db_bench":
            return [line]
        with self.lock:
            other = self.counter.feed(line)
            self.total = max(self.total, self.counter.total)
        return other

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with self.lock:
            total, up = self.total, self.up
        c = CounterMetricFamily(METRIC, "operations the application has reported so far",
                                labels=["name"])
        c.add_metric([self.name], float(total))
        g = GaugeMetricFamily(UP_METRIC, "1 while the application runs", labels=["name"])
        g.add_metric([self.name], 1.0 if up else 0.0)
        return [c, g]


def _pump(pipe, state: AppState, stream: str, out):
    """Read the child's pipe line by line until EOF; pass what is no
    statistic through to `out` (a binary stream): the child's stdout to the
    exporter's stdout, its stderr to the exporter's stderr, so the
    application's final report is not lost (for fio, the last JSON document
    -- its final report -- is written to stdout when fio exits:
    run_exporter)."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        other = state.feed(line, stream)
        if not other:
            continue
        data = raw if other == [line] else "".join(other).encode("utf-8", "replace")
        try:
            out.write(data)
            out.flush()
        except (OSError, ValueError):
            pass
    pipe.close()


def _child_hook(procs_fd: int | None = None):
    """A pre-exec hook that has the child get SIGTERM when the exporter
    dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG), and, given the
    open cgroup.procs of a cgroup, moves the child into it: the application
    is the tenant, not the exporter's own interpreter, whose memory would
    otherwise count against the tenant's limit.  Looked up here, in the
    parent: the hook itself only calls."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def hook():
        if prctl is not None:
            prctl(1, int(signal.SIGTERM), 0, 0, 0)      # PR_SET_PDEATHSIG = 1
        if procs_fd is not None:
            os.write(procs_fd, b"0")    # "0": the writing process itself
    return hook


def _open_cgroup(path: str) -> int:
    """An fd on the cgroup's cgroup.procs (v1 and v2 alike), opened before
    the child starts so a missing or foreign cgroup is a clear error."""
    procs = os.path.join(path, "cgroup.procs")
    if not os.path.isdir(path) or not os.path.exists(procs):
        raise UserError(f"--cgroup {path}: not a cgroup directory")
    try:
        return os.open(procs, os.O_WRONLY)
    except OSError as err:
        raise UserError(f"--cgroup {path}: cannot join it: {err.strerror}") from None


def _serve(state: AppState, address: str, port: int):
    """Bind the /metrics server (raises OSError when the port is taken);
    serving starts with `.serve_forever` on a thread."""
    from http.server import ThreadingHTTPServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import MetricsHandler

    registry = CollectorRegistry(auto_describe=False)
    registry.register(state)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        if ":" in address:
            import socket
            address_family = socket.AF_INET6

    class Handler(MetricsHandler.factory(registry)):
        def log_message(self, *args):       # no line per scrape
            pass

    return Server((address, port), Handler)


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128+N when killed by
    signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run_exporter(args) -> int:
    command = list(args.child or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("no command to run: give it after `--`, e.g. "
                        "cachepilot exporter --port 9201 --format fio -- fio job.fio "
                        "--status-interval=1 --output-format=json")
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: must be 1..65535")
    if args.linger < 0:
        raise UserError("--linger must be >= 0")
    name = args.name or os.path.basename(command[0])
    state = AppState(name, args.format)
    try:
        server = _serve(state, args.address, args.port)
    except OSError as err:
        raise UserError(f"cannot serve metrics on {args.address}:{args.port}: "
                        f"{err.strerror or err}") from None
    try:
        procs_fd = _open_cgroup(args.cgroup) if args.cgroup else None
    except UserError:
        server.server_close()
        raise
    # No thread runs yet, so the pre-exec hook is safe.
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True,
                                 preexec_fn=_child_hook(procs_fd),
                                 pass_fds=() if procs_fd is None else (procs_fd,))
    except (OSError, subprocess.SubprocessError) as err:
        server.server_close()
        raise UserError(f"cannot run {command[0]!r}: "
                        f"{getattr(err, 'strerror', None) or err}") from None
    finally:
        if procs_fd is not None:
            os.close(procs_fd)
    state.up = True
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()
        try:
            os.killpg(child.pid, signum if signum == signal.SIGTERM else signal.SIGTERM)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                               name="exporter-http", daemon=True)
    serving.start()
    print(f"cachepilot exporter: {name} ({args.format}) on "
          f"http://{args.address}:{args.port}/metrics, pid {child.pid}",
          file=sys.stderr, flush=True)
    readers = [threading.Thread(target=_pump, name=f"exporter-{stream}", daemon=True,
                                args=(pipe, state, stream, out))
               for pipe, stream, out in ((child.stdout, "stdout", sys.stdout.buffer),
                                         (child.stderr, "stderr", sys.stderr.buffer))]
    for t in readers:
        t.start()
    try:
        while True:
            try:
                child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop.is_set():
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(child.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    child.wait()
                break
        # The rest of the output (a grandchild may hold the pipes open:
        # wait only a little for it).
        deadline = time.monotonic() + 2.0
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
        with state.lock:
            state.up = False
            final = getattr(state.counter, "last_doc", None)
        if final is not None:
            try:
                sys.stdout.write(final + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
        if args.linger > 0 and not stop.is_set():
            stop.wait(args.linger)
    finally:
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        server.shutdown()
        server.server_close()
        for s, h in old.items():
            signal.signal(s, h)
    status = exit_status(child.returncode)
    print(f"cachepilot exporter: {name} exited with status {status} after "
          f"{state.total} operations", file=sys.stderr, flush=True)
    return status


def register(sub):
    import argparse

    p = sub.add_parser(
        "exporter", help="serve an application's own statistics as a Prometheus counter",
        description="Run COMMAND, parse the statistics it prints and serve "
                    "cachepilot_app_operations_total{name=NAME} and cachepilot_app_up "
                    "on /metrics, for the agent's prometheus throughput source.",
        epilog="formats: db_bench = RocksDB db_bench with --stats_interval_seconds=N "
               "(per-thread progress lines); fio = fio with --status-interval=N "
               "--output-format=json; lines = one operation per line of stdout.  "
               "Exits with COMMAND's exit status.")
    p.add_argument("--port", type=int, required=True, help="port of /metrics")
    p.add_argument("--address", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--format", choices=FORMATS, default="lines",
                   help="what COMMAND prints (lines)")
    p.add_argument("--name", help="the name label (COMMAND's base name)")
    p.add_argument("--cgroup", metavar="DIR",
                   help="run COMMAND in this cgroup (v1 or v2); the exporter "
                        "itself stays where it is")
    p.add_argument("--linger", type=float, default=0.0, metavar="SECONDS",
                   help="keep serving this long after COMMAND exits (0)")
    p.add_argument("child", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS",
                   help="the application to run")
    p.set_defaults(func=run_exporter)
