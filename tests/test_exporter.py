"""`cachepilot exporter`: the parsers on real captured output of db_bench
7.8.3 and fio 3.33, and the exporter end to end (real fio, a shell loop),
scraped over HTTP and read by the agent's PrometheusSource."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from cachepilot.agent.exporter import (DbBenchCounter, FioCounter, JsonStream,
                                       LinesCounter, exit_status, fio_job_ios,
                                       parse_db_bench_line, parse_db_bench_summary)

# -- captured output ------------------------------------------------------------

# db_bench 7.8.3 --use_existing_db=1 --benchmarks=readrandom --num=100000
# --reads=2000000 --threads=2 --stats_interval_seconds=1 (stderr, then stdout)
DB_BENCH_READRANDOM = """\
RocksDB:    version 7.8.3
Date:       Sun Nov 22 23:24:29 2026
CPU:        2 * AMD EPYC
CPUCache:   1024 KB
2026/11/22-23:24:30  ... thread 0: (345000,345000) ops and (344800.7,344800.7) ops/second in (1.000578,1.000578) seconds
2026/11/22-23:24:30  ... thread 1: (376000,376000) ops and (375603.0,375603.0) ops/second in (1.001057,1.001057) seconds
2026/11/22-23:24:31  ... thread 1: (336000,712000) ops and (335330.7,355457.4) ops/second in (1.001996,2.003053) seconds
2026/11/22-23:24:31  ... thread 0: (401000,746000) ops and (398421.0,371689.6) ops/second in (1.006473,2.007051) seconds
2026/11/22-23:24:39  ... thread 1: (100000,1836000) ops and (98925.3,182760.7) ops/second in (1.010864,10.045922) seconds
2026/11/22-23:24:39  ... thread 0: (100000,1916000) ops and (99642.9,190269.0) ops/second in (1.003584,10.069953) seconds
2026/11/22-23:24:40  ... thread 1: (138000,1974000) ops and (137816.6,178687.0) ops/second in (1.001331,11.047253) seconds
------------------------------------------------
DB path: [/tmp/xdb]
readrandom   :       5.515 micros/op 359048 ops/sec 11.141 seconds 4000000 operations;   39.7 MB/s (2000000 of 2000000 found)
""".splitlines(keepends=True)

# --benchmarks=readrandom,seekrandom,readrandom --reads=150000 --threads=2,
# both pipes read as they came (the exporter reads them the same way): each
# report arrives before the next benchmark's progress lines
DB_BENCH_THREE = """\
2026/11/22-23:29:54  ... thread 1: (103000,103000) ops and (102707.5,102707.5) ops/second in (1.002848,1.002848) seconds
2026/11/22-23:29:54  ... thread 0: (140000,140000) ops and (139346.9,139346.9) ops/second in (1.004687,1.004687) seconds
readrandom   :       7.584 micros/op 243160 ops/sec 1.234 seconds 300000 operations;   26.9 MB/s (150000 of 150000 found)
2026/11/22-23:29:55  ... thread 0: (106000,106000) ops and (105920.1,105920.1) ops/second in (1.000754,1.000754) seconds
2026/11/22-23:29:55  ... thread 1: (100000,100000) ops and (99834.9,99834.9) ops/second in (1.001654,1.001654) seconds
seekrandom   :       9.528 micros/op 208448 ops/sec 1.439 seconds 300000 operations; (150000 of 150000 found)
2026/11/22-23:29:56  ... thread 0: (149000,149000) ops and (148499.3,148499.3) ops/second in (1.003372,1.003372) seconds
2026/11/22-23:29:56  ... thread 1: (141000,141000) ops and (140038.8,140038.8) ops/second in (1.006864,1.006864) seconds
readrandom   :       6.838 micros/op 286194 ops/sec 1.048 seconds 300000 operations;   31.7 MB/s (150000 of 150000 found)
""".splitlines(keepends=True)

# fio 3.33, two jobs run one after the other (stonewall), --status-interval=1
# --output-format=json: the third status document (trimmed to the figures
# read here; fio's own layout)
FIO_DOC = """\
{
  "fio version" : "fio-3.33",
  "timestamp" : 1795389930,
  "time" : "Sun Nov 22 23:25:30 2026",
  "jobs" : [
    {
      "jobname" : "a",
      "groupid" : 0,
      "error" : 0,
      "elapsed" : 4,
      "read" : {
        "io_bytes" : 125702144,
        "io_kbytes" : 122756,
        "iops" : 15336.831584,
        "runtime" : 2001,
        "total_ios" : 30689,
        "short_ios" : 0,
        "drop_ios" : 0
      },
      "write" : {
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0
      },
      "sync" : {
        "total_ios" : 0
      }
    },
    {
      "jobname" : "b",
      "groupid" : 1,
      "error" : 0,
      "elapsed" : 4,
      "read" : {
        "io_bytes" : 0,
        "total_ios" : 0
      },
      "write" : {
        "io_bytes" : 644644864,
        "io_kbytes" : 629536,
        "iops" : 236657.777778,
        "runtime" : 675,
        "total_ios" : 159744,
        "short_ios" : 0,
        "drop_ios" : 0
      },
      "sync" : {
        "total_ios" : 0
      }
    }
  ]
}
"""


def fio_doc(a_reads: int, b_writes: int, jobs=("a", "b")) -> str:
    """FIO_DOC with other counts (the status documents of the same run had
    a=12681,b=0; 28512,0; 30689,159744; 30689,540672; final 30689,618497)."""
    doc = json.loads(FIO_DOC)
    doc["jobs"][0]["read"]["total_ios"] = a_reads
    doc["jobs"][1]["write"]["total_ios"] = b_writes
    doc["jobs"] = [j for j in doc["jobs"] if j["jobname"] in jobs]
    return json.dumps(doc, indent=2, separators=(",", " : ")) + "\n"


# -- db_bench -------------------------------------------------------------------

def test_db_bench_progress_line():
    assert parse_db_bench_line(DB_BENCH_READRANDOM[6]) == (1, 336000, 712000)
    assert parse_db_bench_line(DB_BENCH_READRANDOM[4]) == (0, 345000, 345000)
    for other in (DB_BENCH_READRANDOM[0], DB_BENCH_READRANDOM[-1], "", "\n",
                  "DB path: [/tmp/xdb]\n"):
        assert parse_db_bench_line(other) is None


def test_db_bench_summary_line():
    assert parse_db_bench_summary(DB_BENCH_READRANDOM[-1]) == ("readrandom", 4000000)
    assert parse_db_bench_summary(DB_BENCH_THREE[5]) == ("seekrandom", 300000)
    assert parse_db_bench_summary(
        "readseq      :       0.473 micros/op 1924001 ops/sec 0.052 seconds "
        "100000 operations;  212.8 MB/s\n") == ("readseq", 100000)
    assert parse_db_bench_summary(DB_BENCH_READRANDOM[5]) is None
    assert parse_db_bench_summary("Keys:       16 bytes each\n") is None


def test_db_bench_counter_sums_threads_and_takes_the_report():
    c = DbBenchCounter()
    seen, passed = [], []
    for line in DB_BENCH_READRANDOM:
        passed += c.feed(line)
        seen.append(c.total)
    assert seen == sorted(seen)                     # never decreases
    assert seen[4:6] == [345000, 345000 + 376000]
    assert seen[-4] == 1916000 + 1974000            # latest cumulative per thread
    assert seen[-1] == 4000000                      # the benchmark's own total
    # everything but the progress lines is passed through (the report too)
    assert passed == [l for l in DB_BENCH_READRANDOM if "... thread" not in l]


def test_db_bench_counter_over_several_benchmarks():
    c = DbBenchCounter()
    totals = []
    for line in DB_BENCH_THREE:
        c.feed(line)
        totals.append(c.total)
    assert totals == [103000, 243000, 300000, 406000, 506000, 600000,
                      749000, 890000, 900000]


def test_db_bench_thread_restart_without_report_keeps_its_count():
    c = DbBenchCounter()
    c.feed("2026/11/22-23:24:30  ... thread 0: (345000,345000) ops and (1.0,1.0) "
           "ops/second in (1.0,1.0) seconds\n")
    c.feed("2026/11/22-23:24:31  ... thread 0: (5000,5000) ops and (1.0,1.0) "
           "ops/second in (1.0,1.0) seconds\n")
    assert c.total == 350000


# -- fio ------------------------------------------------------------------------

def test_fio_job_ios():
    assert fio_job_ios(json.loads(FIO_DOC)) == {("a", 0): 30689, ("b", 0): 159744}
    assert fio_job_ios({}) == {}
    assert fio_job_ios({"jobs": [{"jobname": "x", "read": {"total_ios": 7},
                                  "trim": {"total_ios": 100}, "sync": {"total_ios": 9}}]}) \
        == {("x", 0): 7}
    two = {"jobs": [{"jobname": "t", "read": {"total_ios": 5}},
                    {"jobname": "t", "write": {"total_ios": 6}}]}     # numjobs=2
    assert fio_job_ios(two) == {("t", 0): 5, ("t", 1): 6}


def test_json_stream_splits_documents_and_passes_other_text():
    s = JsonStream()
    text = ("fio: note: a warning\n" + FIO_DOC + fio_doc(1, 2) +
            json.dumps({"jobs": []}) + "\n" + "trailing words\n")
    docs, other = [], []
    for line in text.splitlines(keepends=True):
        d, o = s.feed(line)
        docs += d
        other += o
    assert [fio_job_ios(d) for d, _ in docs] == [
        {("a", 0): 30689, ("b", 0): 159744}, {("a", 0): 1, ("b", 0): 2}, {}]
    assert docs[0][1] == FIO_DOC.rstrip("\n")       # the text as fio printed it
    assert other == ["fio: note: a warning\n", "trailing words\n"]


def test_json_stream_gives_back_what_never_parses():
    s = JsonStream(limit=100)
    out = []
    for line in ["{\n", '  "a" : [1,\n', "}\n"] + ["  x\n"] * 30:
        out += s.feed(line)[1]
    assert "".join(out).startswith('{\n  "a" : [1,\n}\n')


def test_fio_counter_keeps_counting_across_stonewalled_jobs():
    c = FioCounter()
    totals = []
    for a, b in ((12681, 0), (28512, 0), (30689, 159744), (30689, 540672), (30689, 618497)):
        for line in fio_doc(a, b).splitlines(keepends=True):
            assert c.feed(line) == []
        totals.append(c.total)
    assert totals == [12681, 28512, 190433, 571361, 649186]
    # a job missing from a later document keeps its count
    for line in fio_doc(0, 700000, jobs=("b",)).splitlines(keepends=True):
        c.feed(line)
    assert c.total == 30689 + 700000
    assert json.loads(c.last_doc)["jobs"][0]["jobname"] == "b"


def test_lines_counter_and_exit_status():
    c = LinesCounter()
    for line in ["pass\n", "pass\n", "\n"]:
        assert c.feed(line) == []
    assert c.total == 3
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-signal.SIGTERM) == 143


# -- end to end -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exporter(port, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "cachepilot", "exporter",
                             "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def scrape(port) -> dict[str, float]:
    """{'ops': counter, 'up': gauge} from /metrics, or {} if not serving."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for key, name in (("ops", "cachepilot_app_operations_total"), ("up", "cachepilot_app_up")):
        m = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
        if m:
            out[key] = float(m.group(1))
    return out


def wait_for(port, cond, timeout=30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = scrape(port)
        if m and cond(m):
            return m
        time.sleep(0.05)
    raise AssertionError(f"timed out; last scrape {scrape(port)}")


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_end_to_end(tmp_path):
    port = free_port()
    p = exporter(port, "--format", "fio", "--name", "fiojob", "--linger", "5", "--",
                 "fio", "--name=t", f"--filename={tmp_path / 'f'}", "--size=16m",
                 "--rw=randread", "--bs=4k", "--time_based", "--runtime=4",
                 "--status-interval=1", "--output-format=json")
    try:
        first = wait_for(port, lambda m: m["ops"] > 0)
        assert first["up"] == 1
        second = wait_for(port, lambda m: m["ops"] > first["ops"])
        final = wait_for(port, lambda m: m["up"] == 0)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err.decode()
    report = json.loads(out)        # fio's final report, on stdout
    ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in report["jobs"])
    assert first["ops"] < second["ops"] <= final["ops"]
    assert final["ops"] == pytest.approx(ios, rel=0.01)


def test_lines_end_to_end():
    port = free_port()
    p = exporter(port, "--linger", "5", "--",
                 "sh", "-c", "for i in 1 2 3; do echo pass; sleep 0.2; done")
    try:
        running = wait_for(port, lambda m: m["ops"] >= 1)
        final = wait_for(port, lambda m: m["up"] == 0)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert running["ops"] <= 3 and final["ops"] == 3
    assert p.returncode == 0
    assert time.monotonic() - t0 > 3            # it lingered
    assert out == b""                           # the counted lines are consumed
    assert b"sh exited with status 0 after 3 operations" in err


def test_prometheus_source_reads_a_positive_rate():
    from cachepilot.agent.config import PrometheusThroughput
    from cachepilot.agent.throughput import PrometheusSource

    port = free_port()
    p = exporter(port, "--name", "loop", "--",
                 "sh", "-c", "for i in $(seq 100); do echo pass; sleep 0.05; done")
    try:
        wait_for(port, lambda m: m["ops"] > 0)
        spec = PrometheusThroughput(source="prometheus",
                                    url=f"http://127.0.0.1:{port}/metrics",
                                    metric="cachepilot_app_operations",
                                    labels={"name": "loop"})
        src = PrometheusSource(spec)
        assert src.read(time.monotonic()) is None   # first read: no rate yet (not 0)
        time.sleep(1.0)
        rate = src.read(time.monotonic())
        assert 5 < rate < 40                        # ~ one line per 0.05 s + sh
        other = PrometheusSource(spec.model_copy(update={"labels": {"name": "x"}}))
        other.read(0.0)
        assert other.read(1.0) is None and "no sample" in other.error   # no such series
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)


def test_sigterm_ends_the_child_and_its_exit_status_is_kept():
    port = free_port()
    p = exporter(port, "--", "sh", "-c", "echo child $$ >&2; exec sleep 60")
    try:
        line = b""
        while b"child" not in line:
            line = p.stderr.readline()
            assert line, "exporter ended early"
        pid = int(line.split()[1])
        wait_for(port, lambda m: m["up"] == 1)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    q = exporter(free_port(), "--", "sh", "-c", "exit 3")
    q.communicate(timeout=30)
    assert q.returncode == 3


def one_error_line(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "cachepilot", "exporter", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_bad_inputs_give_one_clear_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        line = one_error_line("--port", str(busy), "--", "true")
    assert f"cannot serve metrics on 127.0.0.1:{busy}" in line
    assert "cannot run '/nonexistent/cmd'" in one_error_line(
        "--port", str(free_port()), "--", "/nonexistent/cmd")
    assert "no command to run" in one_error_line("--port", str(free_port()))
    assert "no command to run" in one_error_line("--port", str(free_port()), "--")
    assert "--linger" in one_error_line("--port", str(free_port()), "--linger", "-1",
                                        "--", "true")
    assert "not a cgroup directory" in one_error_line(
        "--port", str(free_port()), "--cgroup", "/nonexistent", "--", "true")


V1_MEMORY = "/sys/fs/cgroup/memory"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(f"{V1_MEMORY}/cgroup.procs"),
                    reason="needs root and a cgroup v1 memory hierarchy")
def test_only_the_application_joins_the_cgroup(tmp_path):
    """--cgroup puts COMMAND in the tenant's cgroup and leaves the exporter
    (a Python interpreter, tens of MiB) out of the tenant's limit."""
    cg = f"{V1_MEMORY}/cachepilot-test-exporter-{os.getpid()}"
    os.mkdir(cg)
    seen = tmp_path / "cgroup"
    try:
        p = exporter(free_port(), "--cgroup", cg, "--", "sh", "-c",
                     f"cat /proc/self/cgroup > {seen}; cat {cg}/cgroup.procs >> {seen}")
        assert p.wait(timeout=30) == 0
        text = seen.read_text()
        assert f"memory:/{os.path.basename(cg)}" in text
        member_pids = {int(x) for x in text.split() if x.isdigit()}
        assert p.pid not in member_pids
    finally:
        os.rmdir(cg)
