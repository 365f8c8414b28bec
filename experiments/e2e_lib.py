"""The machinery of the end-to-end runs (experiments/e2e_host.py on this
host, experiments/e2e_vm.py in the cache_ext VM): cgroups v1 or v2, the four
real tenants behind `cachepilot exporter`, the controller and the agent as
separate processes (gRPC with TLS and a token on loopback), one run of a
configuration, and the plot.

A configuration is what decides limits and policies:
    default_equal   the budget split equally, the kernel's own policy
    limits_only     the controller and the agent, the kernel's own policy only
    autopilot       the controller and the agent, every allowed policy
    best_static     a fixed (policy, limit) per tenant, set once
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cachepilot.agent import cgroups, threads
from cachepilot.agent.cache_ext import POLICYCTL, running_policy

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
CLI = [sys.executable, "-m", "cachepilot"]
MiB = 1 << 20
CONTROLLED = ("limits_only", "autopilot")
# a diagnostic run (e2e_vm --profile-agent) profiles the agent's main loop
# (cProfile, written at its exit to <work>/<run>-agent.prof)
PROFILE_AGENT = False
# The agent's sampling: each tenant at its own rate, about SAMPLES_PER_S
# sampled accesses a second (agent/rates.py), starting at SAMPLING_RATE.
# At one rate of 0.01 for all, kv (800 page accesses a second under TCG)
# gave 8 samples a second and search's cached passes (38,000) 380: kv's
# curves of its three policies read the same at its limit, and changed by
# tens of MiB from one interval to the next, while at 0.05 for all the
# agent's miniatures took more than twice the CPU.  A window closes once
# it holds MIN_WINDOW_SAMPLES samples.
SAMPLING_RATE = 0.01
SAMPLES_PER_S = 100
MIN_WINDOW_SAMPLES = 1000
# what the agent and the controller keep above a tenant's anonymous memory
ANON_MARGIN = 16 * MiB
# the agent's log line for a directive it applied
APPLIED = re.compile(r"tenant \S+: (limit \d+ -> \d+ bytes|policy )")
# ... and for a tenant's interval it reported
REPORTED = re.compile(r" \S+: \d+ acc/s, miss ")


# -- cgroups (v1 or v2) -------------------------------------------------------

def memory_hierarchy() -> tuple[Path, int]:
    found = cgroups.memory_hierarchy()
    if found is None:
        raise SystemExit("no memory cgroup hierarchy (v1 /sys/fs/cgroup/memory or v2)")
    return found


@dataclass
class Cgroups:
    root: Path
    version: int

    def make(self, name: str) -> Path:
        if self.version == 2:
            (self.root.parent / "cgroup.subtree_control").write_text(self._controllers())
        self.root.mkdir(exist_ok=True)
        if self.version == 2:
            (self.root / "cgroup.subtree_control").write_text(self._controllers())
        p = self.root / name
        p.mkdir(exist_ok=True)
        return p

    def _controllers(self) -> str:
        """memory, and io and cpu where the kernel has them (v2: for io.max
        and cpu.max)."""
        have = (self.root.parent / "cgroup.controllers").read_text().split()
        return " ".join(f"+{c}" for c in ("memory", "io", "cpu") if c in have)

    def set_io(self, name: str, path: Path, riops: int, rbps: int):
        """Cap the tenant's reads from the disk holding `path` (cgroup v2
        io.max): its own disk bandwidth, as a multi-tenant host gives each
        tenant, so that a miss costs what a disk read does and one tenant's
        misses do not set another's speed."""
        f = self.root / name / "io.max"
        if self.version != 2 or not f.exists():
            raise SystemExit(f"e2e: no io.max for {name} (cgroup v2 with the io "
                             f"controller, CONFIG_BLK_DEV_THROTTLING)")
        dev = os.stat(path).st_dev
        f.write_text(f"{os.major(dev)}:{os.minor(dev)} riops={riops} rbps={rbps}")

    def set_cpu(self, name: str, cpus: float, period_us: int = 100_000):
        """Cap the tenant's CPU time at `cpus` CPUs (cgroup v2 cpu.max), as a
        multi-tenant host gives each tenant its own CPU share.  Under
        emulation a cached read costs a hundred times what it costs on
        hardware; without a cap, a tenant whose reads start to hit takes the
        CPUs from the others and from the agent, and memory given to one
        tenant shows as another's loss."""
        f = self.root / name / "cpu.max"
        if self.version != 2 or not f.exists():
            raise SystemExit(f"e2e: no cpu.max for {name} (cgroup v2 with the cpu "
                             f"controller, CONFIG_CFS_BANDWIDTH)")
        f.write_text(f"{int(cpus * period_us)} {period_us}")

    def unset_io(self, name: str, path: Path):
        """Lift the tenant's disk limit (io.max back to max)."""
        dev = os.stat(path).st_dev
        (self.root / name / "io.max").write_text(
            f"{os.major(dev)}:{os.minor(dev)} riops=max rbps=max")

    def cpu_usage(self, name: str) -> tuple[float, float]:
        """(CPU seconds used, seconds throttled by cpu.max) of the tenant so
        far; v1 has no cpu controller here, so (nan, nan)."""
        try:
            stat = dict(line.split() for line in
                        (self.root / name / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6, int(stat.get("throttled_usec", 0)) / 1e6
        except (OSError, KeyError, ValueError):
            return float("nan"), float("nan")

    def anon_bytes(self, name: str) -> int:
        """The tenant's anonymous memory now (what no limit can reclaim
        without swap)."""
        return cgroups.read_stats(self.root / name).anon_bytes

    def cache_bytes(self, name: str) -> int:
        """The page cache charged to the tenant now (how full its share is)."""
        return cgroups.read_stats(self.root / name).file_bytes

    def limit_file(self, name: str) -> Path:
        return self.root / name / ("memory.limit_in_bytes" if self.version == 1
                                   else "memory.max")

    def set_limit(self, name: str, limit: int):
        self.limit_file(name).write_text(str(limit))

    def limit(self, name: str) -> int:
        text = self.limit_file(name).read_text().strip()
        return 0 if text == "max" else int(text)

    def procs(self, name: str) -> Path:
        return self.root / name / "cgroup.procs"

    def kill_all(self, name: str):
        """Every process left in the cgroup (a two-phase tenant's second
        fio, a scanner's pass) is killed."""
        for _ in range(50):
            pids = [int(x) for x in self.procs(name).read_text().split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)


# -- tenants --------------------------------------------------------------------

@dataclass
class Tenant:
    name: str
    fmt: str                     # exporter format
    unit: str
    command: list[str]
    policies: list[str]          # allowed under the autopilot
    port: int = 0
    sim: dict = field(default_factory=dict)      # the sim's workload phase
    helpers: list[list[str]] = field(default_factory=list)   # more processes in its cgroup
    threads: dict | None = None  # policy_threads rules of its agent config
    slo_threads: dict | None = None  # the threads its throughput counts
    phase_pidfile: Path | None = None   # the first phase's process, to end it

    def switch_phase(self) -> bool:
        """End the first phase of a two-phase tenant: its shell then starts
        the second.  False when the tenant has one phase or already moved."""
        if self.phase_pidfile is None:
            return False
        try:
            os.kill(int(self.phase_pidfile.read_text()), signal.SIGTERM)
            self.phase_pidfile.unlink()
            return True
        except (OSError, ValueError):
            return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fio(name, path, seconds, **opts) -> list[str]:
    cmd = ["fio", f"--name={name}", f"--filename={path}", "--time_based",
           f"--runtime={seconds}", "--invalidate=0", "--fadvise_hint=0",
           "--status-interval=1", "--output-format=json",
           # percentiles off: a smaller document a second to parse
           "--clat_percentiles=0", "--lat_percentiles=0", "--slat_percentiles=0"]
    return cmd + [f"--{k}={v}" for k, v in opts.items()]


def two_phase(first: list[str], second: list[str], pidfile: Path) -> list[str]:
    """A shell that runs `first` until Tenant.switch_phase ends it, then
    `second`.  Both are fio runs with different job names, so the exporter's
    counter adds the second's I/Os to the first's."""
    q = lambda cmd: " ".join(shlex.quote(str(a)) for a in cmd)  # noqa: E731
    return ["sh", "-c", f"{q(first)} & echo $! > {shlex.quote(str(pidfile))}; wait; "
                        f"exec {q(second)}"]


def tenants(data: Path, sizes: dict, seconds: int, phased: bool = False,
            policies: dict | None = None) -> list[Tenant]:
    """kv: point lookups (db_bench readrandom, its GETs are the tenant's
    operations) while a second process, `db_scan` (db_bench by another name,
    so a thread rule can tell it apart), scans the same database read-only
    over and over: the GET-SCAN workload.  search: sequential passes over a
    file larger than its share; with `phased`, it turns into 4 KiB zipf
    point lookups over the same file when the run calls switch_phase.
    zipf: 4 KiB zipf random reads.  stream: a sequential read of a file no
    share can hold."""
    db = data / "db"
    scanner = data / "db_scan"
    if not scanner.exists():
        scanner.symlink_to(shutil.which("db_bench"))
    # GETs favour some keys (db_bench scatters them over the key space):
    # sizes["kv_skew"] is its read_random_exp_range
    skew = [f"--read_random_exp_range={sizes['kv_skew']}"] if sizes.get("kv_skew") else []
    common = [f"--db={db}", f"--num={sizes['kv_keys']}", "--value_size=400",
              "--compression_type=none", "--cache_size=1048576", "--use_existing_db=1",
              "--open_files=-1"]
    policies = policies or {}
    # one thread scanning from random keys to the end of the database, over
    # and over, for the whole run: a thread rule (and get_scan's tid map)
    # names it once, where a new readseq process per pass would bring new
    # thread ids every pass.  It reads block by block, without RocksDB's
    # read-ahead, so it takes its turn at the tenant's disk with the GET
    # threads instead of taking all of its bandwidth
    scan = [str(scanner), "--benchmarks=seekrandom", f"--seek_nexts={sizes['kv_keys']}",
            "--readonly=1", "--threads=1", f"--duration={seconds}",
            "--initial_auto_readahead_size=0", "--max_auto_readahead_size=0", *common]
    return [
        Tenant("kv", "db_bench", "GETs", [
            "db_bench", "--benchmarks=readrandom", *common, *skew, "--threads=2",
            # a report every 100 GETs of a thread (with --stats_interval_seconds
            # db_bench checks the clock only every 1,000, too coarse for a few
            # hundred GETs a second)
            f"--duration={seconds}", "--stats_interval=100"],
            policies=policies.get("kv", ["linux", "lru", "s3fifo", "get_scan"]),
            helpers=[scan],
            threads={"get_scan": {"scan_threads": {"comm": "db_scan*"}}},
            # its SLO counts GETs: its curves count the GET process's reads
            slo_threads={"cmdline": "*--benchmarks=readrandom *"},
            sim={"kind": "get-scan", "footprint": sizes["kv_bytes"], "skew": 0.0,
                 "scan_fraction": 0.5, "scan_length": sizes["kv_bytes"]}),
        Tenant("search", "fio", "64 KiB reads, then 4 KiB lookups" if phased
               else "64 KiB reads", two_phase(
                   fio("search", data / "search", seconds, rw="read", bs="64k"),
                   fio("lookup", data / "search", seconds, rw="randread", bs="4k",
                       random_distribution="zipf:1.1", norandommap=1),
                   data / "run" / "search.phase") if phased else fio(
            "search", data / "search", seconds, rw="read", bs="64k"),
            policies=policies.get("search", ["linux", "lru", "fifo", "mru"]),
            sim={"kind": "loop", "footprint": sizes["search"]},
            phase_pidfile=data / "run" / "search.phase" if phased else None),
        Tenant("zipf", "fio", "4 KiB reads", fio(
            "zipf", data / "zipf", seconds, rw="randread", bs="4k",
            random_distribution="zipf:1.1", norandommap=1),
            policies=policies.get("zipf", ["linux", "lru", "lfu", "s3fifo"]),
            sim={"kind": "zipf", "footprint": sizes["zipf"], "skew": 1.1}),
        Tenant("stream", "fio", "1 MiB reads", fio(
            "stream", data / "stream", seconds, rw="read", bs="1m"),
            policies=policies.get("stream", ["linux", "lru", "mru"]),
            sim={"kind": "scan", "footprint": sizes["stream"]}),
    ]


def host_workspace(budget: int, kv_keys_at_512: int, cgroup_dir: str, data: str):
    """The files of a run on this host, sized for the budget (at 512 MiB:
    search 320 MiB, zipf 512, stream 2 GiB, and kv_keys_at_512 keys), its
    cgroups under <memory hierarchy>/cgroup_dir and its data folder:
    (sizes, Cgroups, cgroup version, data, work folder)."""
    scale = budget / (512 * MiB)
    sizes = {"search": int(320 * MiB * scale), "zipf": int(512 * MiB * scale),
             "stream": int(2048 * MiB * scale), "kv_keys": int(kv_keys_at_512 * scale)}
    base, version = memory_hierarchy()
    work = Path(data) / "run"
    work.mkdir(parents=True, exist_ok=True)
    return sizes, Cgroups(base / cgroup_dir, version), version, Path(data), work


def prepare(data: Path, sizes: dict):
    data.mkdir(parents=True, exist_ok=True)
    for name in ("search", "zipf", "stream"):
        f = data / name
        if not f.exists() or f.stat().st_size != sizes[name]:
            print(f"  writing {f} ({sizes[name] >> 20} MiB)", flush=True)
            subprocess.run(["fio", "--name=prep", f"--filename={f}", f"--size={sizes[name]}",
                            "--rw=write", "--bs=1m"], check=True, capture_output=True)
    db = data / "db"
    stamp = db / f".keys-{sizes['kv_keys']}-seq-compacted"
    if not stamp.exists():
        print(f"  filling {db} ({sizes['kv_keys']} keys)", flush=True)
        shutil.rmtree(db, ignore_errors=True)
        # every key once (fillrandom would leave a third of them out), then
        # compacted, so nothing is left in the write-ahead log: every open
        # would replay it into a memtable, tens of MiB of the tenant's memory
        subprocess.run(["db_bench", "--benchmarks=fillseq,compact", f"--db={db}",
                        f"--num={sizes['kv_keys']}", "--value_size=400",
                        "--compression_type=none", "--threads=1"],
                       check=True, capture_output=True)
        stamp.touch()
    sizes["kv_bytes"] = sum(p.stat().st_size for p in db.iterdir() if p.is_file())


def drop_caches():
    subprocess.run(["sync"])
    Path("/proc/sys/vm/drop_caches").write_text("3")


def scrape(port: int) -> float | None:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("cachepilot_app_operations_total"):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        return None
    return None


def agent_view(port: int, limits: dict) -> dict:
    """What the agent's endpoint says of each tenant now: {tenant:
    {"observed": its miss ratio over the agent's last interval, "curves":
    {policy: the miss ratio its curve gives at the tenant's limit}}} (the
    curves' sizes are limits in pages, interpolated on a log scale).  {}
    when the endpoint does not answer."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    points: dict = {}
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            lab = sample.labels
            if sample.name == "cachepilot_mrc_miss_ratio":
                points.setdefault(lab["tenant"], {}).setdefault(lab["policy"], []).append(
                    (int(lab["size_pages"]), sample.value))
            elif sample.name == "cachepilot_cgroup_miss_ratio":
                out.setdefault(lab["tenant"], {})["observed"] = sample.value
    for tenant, curves in points.items():
        limit = limits.get(tenant)
        if not limit:
            continue
        at = {}
        for policy, pts in curves.items():
            pts.sort()
            sizes = [max(sz, 1) for sz, _ in pts]
            at[policy] = interpolate_log(sizes, [m for _, m in pts], limit / 4096)
        out.setdefault(tenant, {})["curves"] = at
    return out


def interpolate_log(sizes: list, values: list, x: float) -> float:
    """`values` at `x`, linear in log(size) between the points around it,
    the end values beyond them."""
    if not sizes:
        return float("nan")
    if x <= sizes[0]:
        return values[0]
    for (s0, v0), (s1, v1) in zip(zip(sizes, values), zip(sizes[1:], values[1:])):
        if x <= s1:
            f = (math.log(x) - math.log(s0)) / (math.log(s1) - math.log(s0)) if s1 > s0 else 1
            return v0 + f * (v1 - v0)
    return values[-1]


def start_tenant(t: Tenant, cg: Cgroups, log: Path) -> subprocess.Popen:
    """The tenant's application in its cgroup, under an exporter that stays
    outside it (its interpreter is not the tenant's memory)."""
    return subprocess.Popen([*CLI, "exporter", "--port", str(t.port), "--format", t.fmt,
                             "--name", t.name, "--cgroup", str(cg.root / t.name), "--",
                             *t.command],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT)


def start_helper(cmd: list[str], cg: Cgroups, name: str, log: Path) -> subprocess.Popen:
    procs = cg.procs(name)

    def join():
        procs.write_text(str(os.getpid()))
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            preexec_fn=join, start_new_session=True)


def stop(procs):
    for p in procs:
        if p.poll() is None:
            try:                     # helpers lead their own process group
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20      # for all of them, not each
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live children (the agent and the
    sampler loader it runs)."""
    total = 0.0
    try:
        total = cpu_seconds(pid)
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(tree_cpu_seconds(int(k)) for k in kids)


def host_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far (/proc/stat's
    first line; iowait counts as idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    tck = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - idle) / tck, sum(fields[:8]) / tck


# -- controller and agent --------------------------------------------------------

def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    key, cert, token = folder / "key.pem", folder / "cert.pem", folder / "token"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    token.write_text(os.urandom(24).hex())
    return key, cert, token


def node_tenants(name: str, ts) -> list[dict]:
    """Each tenant as its node sees it: its cgroup, its application's
    throughput, the policies it builds curves for (those the controller may
    choose for it only), its thread rules and the threads its throughput
    counts."""
    return [{"name": t.name, "cgroup": t.name,
             "policies": t.policies if name == "autopilot" else ["linux"],
             **({"policy_threads": t.threads} if t.threads else {}),
             **({"slo_threads": t.slo_threads} if t.slo_threads else {}),
             "throughput": {"source": "prometheus",
                            "url": f"http://127.0.0.1:{t.port}/metrics",
                            "metric": "cachepilot_app_operations",
                            "labels": {"name": t.name}, "timeout_s": 10}}
            for t in ts]


def controller_config(name: str, ts, cg: Cgroups, budget: int, interval: float,
                      port: int, tls, slos: dict) -> dict:
    """The controller's config, which holds the tenants: it sends the node
    its own when the agent registers."""
    key, cert, token = tls
    return {
        "control": {"interval_s": interval, "max_step_fraction": 0.25, "hysteresis": 0.01,
                    "warmup_intervals": 2, "anon_margin_bytes": ANON_MARGIN,
                    "autopilot_k": 2, "lost_after_intervals": 10,
                    # the tenants count different operations
                    "objective": "relative"},
        "controller": {"listen": f"127.0.0.1:{port}", "tls_cert": str(cert),
                       "tls_key": str(key), "tls_ca": str(cert), "token_file": str(token)},
        "nodes": [{"name": "host", "memory_bytes": budget, "backend": "linux",
                   "cgroup_roots": [str(cg.root)]}],
        "tenants": [{**nt, "node": "host", "floor_bytes": budget // 16,
                     **({"slo": {"min_throughput": slos[nt["name"]]}}
                        if nt["name"] in slos else {})}
                    for nt in node_tenants(name, ts)]}


def agent_config(name: str, ts, cg: Cgroups, budget: int, interval: float, port: int,
                 tls, standalone: bool = False, calibrate_dir: Path | None = None,
                 metrics_port: int = 0) -> dict:
    """The agent's config: following the controller, or `standalone` with
    the tenants of its own (agent_sampling: curves, no decisions).  The
    policies' hook costs are measured (agent/hookcost.py) with a file in
    `calibrate_dir`, where one is given.  `metrics_port` (0: none) serves
    its Prometheus endpoint on loopback, where a run reads the curves."""
    key, cert, token = tls
    curves = sorted({p for t in ts for p in t.policies}) if name == "autopilot" else ["linux"]
    cfg = {
        "node_id": "host", "roots": [str(cg.root)], "interval_s": interval,
        "memory": budget, "policies": curves,
        "sampling": {"rate": SAMPLING_RATE, "slices": 4, "samples_per_s": SAMPLES_PER_S,
                     "min_window_samples": MIN_WINDOW_SAMPLES},
        "safety": {"floor": budget // 16, "anon_margin": ANON_MARGIN,
                   "max_step": budget // 4},
        "prometheus": {"address": "127.0.0.1", "port": metrics_port},
        "cache_ext": {"calibrate_dir": str(calibrate_dir) if calibrate_dir else None}}
    if standalone:
        cfg["tenants"] = node_tenants(name, ts)
    else:
        cfg["controller"] = {"address": f"127.0.0.1:{port}", "token_file": str(token),
                             "ca_file": str(cert), "server_name": "localhost"}
    return cfg


def running(cg: Cgroups, name: str) -> str:
    """The policy a tenant's cgroup runs, as the agent reads it; "none" for
    the kernel's own."""
    return running_policy(cg.root / name, "none")


def reset_policies(ts, cg: Cgroups):
    """Back to the kernel's own policy between runs."""
    for t in ts:
        if running(cg, t.name) != "none":
            subprocess.run([str(POLICYCTL), "detach", str(cg.root / t.name)],
                           capture_output=True)


# -- one run ------------------------------------------------------------------------

def recording_of(work: Path, name: str) -> Path:
    """Where configuration `name`'s controller keeps its recording."""
    return work / f"{name}-recording"


def keep_recording(work: Path, name: str, out: Path, prefix: str) -> Path | None:
    """Configuration `name`'s last recording, copied beside the results as
    <prefix>_<name>.recording/, so an engine change can be replayed against
    it (`cachepilot replay`) without running again; None if there is none."""
    src = recording_of(work, name)
    if not (src / "recording.jsonl.zst").exists():
        return None
    dst = out / f"{prefix}_{name}.recording"
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


@dataclass
class Run:
    """The processes of one run: tenants (and their helpers), and where a
    controller decides, the controller and the agent."""
    name: str
    work: Path
    procs: list
    ctl: subprocess.Popen | None = None
    agent: subprocess.Popen | None = None
    startup_s: float = 0.0
    last: dict = field(default_factory=dict)
    metrics_port: int = 0        # the agent's Prometheus endpoint (0: no agent)
    agent_cpu0: float = 0.0      # the agent's CPU time when measuring began
    measured_s: float = 0.0      # seconds measured so far


def start_run(name: str, ts, cg: Cgroups, budget: int, interval: float, work: Path,
              slos: dict, static: dict | None = None, cold: bool = True) -> Run:
    """Start a configuration from cold caches and wait until every tenant
    counts (and, where a controller decides, until its first directives are
    applied).  `static` ({tenant: (policy, limit)}) sets each tenant's
    policy and limit once (best_static); `agent_sampling` is the equal
    split with an agent that samples and builds curves but has no
    controller, for the agent's overhead.  `cold=False` keeps what the
    page cache holds."""
    reset_policies(ts, cg)
    if cold:
        drop_caches()
    for t in ts:
        t.port = free_port()
        cg.set_limit(t.name, budget // len(ts))
    if static:
        set_static(ts, cg, static)
    procs = []
    ctl = agent = None
    metrics_port = 0
    try:
        with_agent = name in CONTROLLED or name == "agent_sampling"
        if with_agent:
            port = free_port()
            tls = make_tls(work)
            metrics_port = free_port()
            acfg = agent_config("autopilot" if name == "agent_sampling" else name,
                                ts, cg, budget, interval, port, tls,
                                standalone=name == "agent_sampling",
                                calibrate_dir=work if name == "autopilot" else None,
                                metrics_port=metrics_port)
            (work / "agent.yaml").write_text(yaml.safe_dump(acfg))
        if name in CONTROLLED:
            # each run's controller starts from nothing: the state a run before
            # it saved (its tenants' holds, streaks, SLO feedback) is not its own
            for old in work.glob("controller.state.db*"):
                old.unlink()
            (work / "controller.yaml").write_text(yaml.safe_dump(
                controller_config(name, ts, cg, budget, interval, port, tls, slos)))
            # every round on record, for `cachepilot replay` (keep_recording)
            ctl = subprocess.Popen([*CLI, "controller", "--config",
                                    str(work / "controller.yaml"),
                                    "--record", str(recording_of(work, name))],
                                   stdout=open(work / f"{name}-controller.log", "w"),
                                   stderr=subprocess.STDOUT, cwd=ROOT,
                                   preexec_fn=daemon_priority)
            time.sleep(2)
        if with_agent:
            # before the tenants, as on a host whose agent was there first: it
            # sees every page they read from their cold start, where started
            # with them (its start-up takes a minute or more under emulation)
            # its miniature caches began empty beside page caches already full,
            # and every policy's curve read the cold misses of pages the kernel
            # held (kv's 0.78 at its limit against 0.51 observed)
            profile = ["-m", "cProfile", "-o", str(work / f"{name}-agent.prof")] \
                if PROFILE_AGENT else []
            agent = subprocess.Popen([CLI[0], *profile, *CLI[1:], "agent", "--config",
                                      str(work / "agent.yaml")],
                                     stdout=open(work / f"{name}-agent.log", "w"),
                                     stderr=subprocess.STDOUT, cwd=ROOT,
                                     preexec_fn=daemon_priority)
            # ... and sampling: its first interval reported (under emulation its
            # start-up, the policies' hook costs measured, takes a minute)
            wait_for(work / f"{name}-agent.log", REPORTED, agent, 600)
        for t in ts:
            procs.append(start_tenant(t, cg, work / f"{name}-{t.name}.log"))
            for i, h in enumerate(t.helpers):
                procs.append(start_helper(h, cg, t.name, work / f"{name}-{t.name}-helper{i}.log"))
        # every exporter up and counting before the first interval (under
        # emulation a process takes tens of seconds to start)
        started = time.monotonic()
        while time.monotonic() - started < 600:
            if all((scrape(t.port) or 0) > 0 for t in ts):
                break
            time.sleep(1.0)
        # a static policy's threads exist only now
        for t in ts:
            if static and t.name in static:
                register_threads(t, cg, static[t.name][0])
        # ... and, where a controller decides, its first directives applied
        # (the agent's first interval: under emulation a minute or more)
        while ctl is not None and time.monotonic() - started < 900:
            if APPLIED.search((work / f"{name}-agent.log").read_text(errors="replace")):
                break
            time.sleep(1.0)
    except BaseException:
        # a start that fails or is interrupted leaves nothing running
        halt([p for p in (agent, ctl) if p is not None] + procs, ts, cg)
        raise
    run = Run(name, work, procs, ctl, agent, time.monotonic() - started,
              metrics_port=metrics_port)
    run.last = {t.name: scrape(t.port) or 0.0 for t in ts}
    run.agent_cpu0 = tree_cpu_seconds(agent.pid) if agent is not None else 0.0
    return run


def wait_for(log: Path, pattern: re.Pattern, proc: subprocess.Popen, timeout: float):
    """Until `pattern` shows in `log` (or `proc` exits, or `timeout` s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if pattern.search(log.read_text(errors="replace")):
            return
        time.sleep(1.0)


def daemon_priority():
    """The agent and the controller run behind the tenants (nice 10).
    Under emulation the tenants alone nearly fill every CPU: ahead of them
    (nice -10) the daemons took a third of the tenants' CPU in (b) and (c)
    and none in (a) and (d), so the comparison measured CPU, not memory.
    Behind them they use what the tenants leave and decide a little late;
    what they cost a tenant is measured apart (the overhead runs)."""
    os.nice(10)


def set_static(ts, cg: Cgroups, static: dict):
    """Each tenant's (policy, limit) of `static`: the policy attached,
    swapped or detached first, so the new limit's reclaim runs under it,
    and the threads its tenant's thread rules name registered with it (as
    the agent does)."""
    for t in ts:
        if t.name not in static:
            continue
        policy, limit = static[t.name]
        now = running(cg, t.name)
        want = "none" if policy == "linux" else policy
        if now != want:
            verb = ("detach" if want == "none" else "attach" if now == "none" else "swap")
            policyctl(t, verb, str(cg.root / t.name), *([] if verb == "detach" else [policy]))
        register_threads(t, cg, policy)
        cg.set_limit(t.name, limit)


def policyctl(t: Tenant, *args: str):
    got = subprocess.run([str(POLICYCTL), *args], capture_output=True, text=True)
    if got.returncode:
        raise RuntimeError(f"{t.name}: policyctl {' '.join(args)}: "
                           f"{(got.stderr or got.stdout).strip()}")


def register_threads(t: Tenant, cg: Cgroups, policy: str):
    """Fill the tid maps of the tenant's running `policy` from its thread
    rules, once: the threads they name live as long as the run."""
    rules = (t.threads or {}).get(policy)
    if not rules:
        return
    for tid_map, tids in threads.policy_tids(cg.root / t.name, policy, rules).items():
        policyctl(t, "tids", str(cg.root / t.name), tid_map, *map(str, tids))


class Rate:
    """A counter's rate per second over the time that really passed
    between two of its readings."""

    def __init__(self, value: float):
        self.value, self.at = value, time.monotonic()

    def per_s(self, value: float) -> float:
        now = time.monotonic()
        rate = (value - self.value) / max(now - self.at, 1e-3)
        self.value, self.at = value, now
        return rate


def measure_intervals(run: Run, ts, cg: Cgroups, interval: float, intervals: int,
                      phase_at: int | None = None, label: str = "") -> dict:
    """Per tenant and interval: operations per second, limit, running
    policy and phase.  After interval `phase_at` the two-phase tenants
    switch to their second phase."""
    series = {t.name: {"ops_per_s": [], "limit_bytes": [], "policy": [], "phase": [],
                       "cpu": [], "throttled": [], "cache_bytes": []} for t in ts}
    # the machine's busy CPUs and the agent's, per interval: whether a
    # tenant was held by its disk or by its CPU share, and what was left
    series["_host"] = {"busy_cpus": [], "agent_cpus": []}
    phase = {t.name: 0 for t in ts}
    t0 = time.monotonic()
    # counted from now: what happened since the last call (a sweep setting
    # being made, say) belongs to no interval.  Every rate is divided by the
    # time that really passed between its two readings, not by `interval`:
    # in a saturated TCG guest a round of readings can run seconds late, and
    # the interval after it is as much shorter
    ops = {}
    for t in ts:
        run.last[t.name] = scrape(t.port) or run.last[t.name]
        ops[t.name] = Rate(run.last[t.name])
    cpu = {t.name: tuple(map(Rate, cg.cpu_usage(t.name))) for t in ts}
    busy = Rate(host_cpu()[0])
    agent = Rate(tree_cpu_seconds(run.agent.pid) if run.agent is not None else 0.0)
    t_prev = t0
    for k in range(1, intervals + 1):
        time.sleep(max(0.0, t0 + k * interval - time.monotonic()))
        run.measured_s += time.monotonic() - t_prev
        t_prev = time.monotonic()
        for t in ts:
            now = scrape(t.port)
            if now is not None:
                run.last[t.name] = now
            series[t.name]["ops_per_s"].append(
                ops[t.name].per_s(now) if now is not None else float("nan"))
            series[t.name]["limit_bytes"].append(cg.limit(t.name))
            series[t.name]["cache_bytes"].append(cg.cache_bytes(t.name))
            series[t.name]["policy"].append(running(cg, t.name))
            series[t.name]["phase"].append(phase[t.name])
            used, throttled = cg.cpu_usage(t.name)
            series[t.name]["cpu"].append(cpu[t.name][0].per_s(used))
            series[t.name]["throttled"].append(cpu[t.name][1].per_s(throttled))
        if run.metrics_port:
            seen = agent_view(run.metrics_port,
                              {t.name: series[t.name]["limit_bytes"][-1] for t in ts})
            for t in ts:
                v = seen.get(t.name, {})
                series[t.name].setdefault("observed_miss_ratio", []).append(
                    v.get("observed", float("nan")))
                series[t.name].setdefault("curves_at_limit", []).append(v.get("curves", {}))
        series["_host"]["busy_cpus"].append(busy.per_s(host_cpu()[0]))
        if run.agent is not None and run.agent.poll() is None:
            series["_host"]["agent_cpus"].append(agent.per_s(tree_cpu_seconds(run.agent.pid)))
        print(f"    {label or run.name} {k:>2}/{intervals}: " + "  ".join(
            f"{t.name} {series[t.name]['ops_per_s'][-1]:>6.0f}/s "
            f"{series[t.name]['limit_bytes'][-1] >> 20:>3}M "
            f"{series[t.name]['policy'][-1]} {series[t.name]['cpu'][-1]:.2f}c"
            for t in ts) + f"  busy {series['_host']['busy_cpus'][-1]:.2f}c", flush=True)
        if phase_at is not None and k == phase_at:
            for t in ts:
                if t.switch_phase():
                    phase[t.name] = 1
    return series


def finish_run(run: Run, ts, cg: Cgroups) -> dict:
    """Stop the run (every process left in a tenant's cgroup too) and say
    what it cost: the agent's CPU time over the measured intervals, and
    the controller's view of the tenants and its decision log."""
    extra = {"startup_s": run.startup_s}
    if run.ctl is not None:
        for what in ("tenants", "log"):
            try:
                # the whole decision log: its default is the last 30 entries
                more = ["--limit", "100000"] if what == "log" else []
                got = subprocess.run([*CLI, "admin", "--config",
                                      str(run.work / "controller.yaml"), "--json", what,
                                      *more],
                                     capture_output=True, text=True, cwd=ROOT, timeout=120)
                extra[f"admin_{what}"] = json.loads(got.stdout)
            except subprocess.TimeoutExpired:
                extra[f"admin_{what}"] = "cachepilot admin took over 120 s"
            except ValueError:
                extra[f"admin_{what}"] = got.stderr.strip()
    if run.agent is not None:
        extra["agent_cpu_s"] = tree_cpu_seconds(run.agent.pid) - run.agent_cpu0
        extra["agent_cpu_fraction"] = extra["agent_cpu_s"] / max(run.measured_s, 1e-9)
    end_run(run, ts, cg)
    return extra


def halt(procs, ts, cg: Cgroups) -> None:
    """Stop `procs` and whatever is left in the tenants' cgroups, and take
    the tenants' policies off: the end of a run, or of one that failed or
    was interrupted (then nothing of it is left running)."""
    stop(procs)
    for t in ts:
        cg.kill_all(t.name)
    reset_policies(ts, cg)


def end_run(run: Run, ts, cg: Cgroups) -> None:
    """Everything a run started stopped, its logs kept: at its end, or on
    an error or an interrupt before it."""
    halt([p for p in (run.agent, run.ctl) if p is not None] + run.procs, ts, cg)
    keep_logs(run)


def exit_on_sigterm() -> None:
    """SIGTERM ends an experiment as Ctrl-C does, through its cleanup: the
    tenants, the agent and the controller lead their own sessions, so
    neither signal reaches them, and without this a killed experiment left
    them running."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


# where each run's logs (agent, controller, tenants) are copied when it
# ends; None keeps them only in the run's work folder, which the next run
# of the same name overwrites (in the VM that folder dies with the guest)
LOG_DIR: Path | None = None


def keep_logs(run: Run) -> None:
    if LOG_DIR is None:
        return
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    # the logs, and the agent's profile where one was taken (PROFILE_AGENT)
    for log in [*run.work.glob(f"{run.name}-*.log"), *run.work.glob(f"{run.name}-*.prof")]:
        dest, n = LOG_DIR / log.name, 1
        while dest.exists():            # a configuration run again keeps both
            n += 1
            dest = LOG_DIR / f"{log.stem}.{n}{log.suffix}"
        shutil.copyfile(log, dest)


def warm_up(t: Tenant, cg: Cgroups, files: list[Path]):
    """Read `files` once from inside the tenant's cgroup, so the page cache
    holds them charged to it."""
    procs = cg.procs(t.name)
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=False,
                   preexec_fn=lambda: procs.write_text(str(os.getpid())))


def run_config(name: str, ts, cg: Cgroups, budget: int, interval: float, intervals: int,
               work: Path, slos: dict, static: dict | None = None,
               phase_at: int | None = None, control_interval: float | None = None,
               cold: bool = True) -> dict:
    """One run of a configuration from cold caches: per tenant and
    measured interval its operations per second, limit, running policy and
    phase.  The agent and the controller decide every `control_interval`
    (default: the measured interval)."""
    run = start_run(name, ts, cg, budget, control_interval or interval, work, slos, static,
                    cold)
    try:
        series = measure_intervals(run, ts, cg, interval, intervals, phase_at)
    except BaseException:
        end_run(run, ts, cg)
        raise
    return {"series": series, **finish_run(run, ts, cg)}


def mean(values):
    """The mean of the values that are numbers (a failed scrape is nan,
    left out rather than counted as zero)."""
    v = [x for x in values if x == x]
    return sum(v) / len(v) if v else float("nan")


def mean_after(values, warmup):
    return mean(values[warmup:])


LOG_SPAN = 30     # ops/s spanning more than this factor are plotted on a log axis


def plot(result, path: Path, title: str, phase_at: int | None = None):
    """Per tenant, over the intervals of every run of every configuration
    (a configuration's runs in one colour, its later rounds dashed):
    operations per second, limit and the policy that ran; the title of
    each column gives the mean ratio to the equal split (where the result
    has `ratio`: a diagnostic run has none).  An ops/s axis
    whose values span more than LOG_SPAN is logarithmic, so that a round in
    which a tenant's data came to fit does not flatten the others."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [t["name"] for t in result["tenants"]]
    configs = list(result["runs"])
    fig, axes = plt.subplots(3, len(names), figsize=(4 * len(names), 9), squeeze=False,
                             sharex=True)
    colour = {cfg: f"C{k}" for k, cfg in enumerate(configs)}
    for j, n in enumerate(names):
        seen: list[str] = []
        ops_seen: list[float] = []
        for cfg in configs:
            for k, run in enumerate(result["runs"][cfg]):
                r = run["series"][n]
                style = {"color": colour[cfg], "linestyle": "-" if k == 0 else "--",
                         "label": cfg if k == 0 else None}
                axes[0][j].plot(r["ops_per_s"], **style)
                ops_seen += [x for x in r["ops_per_s"] if x == x and x > 0]
                axes[1][j].plot([b / MiB for b in r["limit_bytes"]], **style)
                pols = ["linux" if p in ("none", "") else p for p in r["policy"]]
                for p in pols:
                    if p not in seen:
                        seen.append(p)
                axes[2][j].step(range(len(pols)), [seen.index(p) for p in pols],
                                where="post", **style)
        if ops_seen and max(ops_seen) > LOG_SPAN * min(ops_seen):
            axes[0][j].set_yscale("log")
        axes[2][j].set_yticks(range(len(seen)), seen)
        ratios = "\n".join(f"{c} {result['ratio'][c][n]:.2f}" for c in configs
                            if c != "default_equal" and "ratio" in result)
        axes[0][j].set_title(f"{n}\n{ratios}", fontsize=8)
        axes[0][j].set_ylabel("ops/s")
        axes[1][j].set_ylabel("limit (MiB)")
        axes[2][j].set_ylabel("policy")
        axes[2][j].set_xlabel("interval")
        if phase_at is not None:
            for row in axes:
                row[j].axvline(phase_at - 0.5, color="grey", linestyle=":", linewidth=1)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def measure(runs: dict, ts, warmup: int) -> tuple[dict, dict, dict]:
    """Mean ops/s per configuration and tenant over the runs (warm-up left
    out), each tenant's ratio to default_equal, and the normalised figure:
    the mean over tenants of those ratios (they count different operations)."""
    measured = {name: {t.name: sum(mean_after(r["series"][t.name]["ops_per_s"], warmup)
                                   for r in rs) / len(rs) for t in ts}
                for name, rs in runs.items()}
    base = measured["default_equal"]
    ratio = {name: {t.name: m[t.name] / base[t.name] if base[t.name] else float("nan")
                    for t in ts} for name, m in measured.items()}
    normalised = {name: sum(r.values()) / len(r) for name, r in ratio.items()}
    return measured, ratio, normalised


def met_fraction(runs: dict, slos: dict, warmup: int) -> dict:
    return {name: {t: sum(sum(1 for x in r["series"][t]["ops_per_s"][warmup:] if x >= v)
                          / max(1, len(r["series"][t]["ops_per_s"]) - warmup)
                          for r in rs) / len(rs) for t, v in slos.items()}
            for name, rs in runs.items()}
