#!/usr/bin/env python3
"""`make consolidate`: a consolidation plan made from live agents, carried
out on real tenants, and held to its predictions (issue 47).

Three emulated hosts on this machine's stock kernel, each a parent cgroup
with its own memory budget, its own disk (a read throttle: v1 blkio, which
does not throttle children, so a host's tenants share its blkio cgroup;
v2 io.max) and its own cores (cpu quota), each watched by its own
`cachepilot agent`, all following one controller over mutual TLS.  Seven
real tenants, each behind `cachepilot exporter` (its throughput is its own
operations): two RocksDB `db_bench` lookups, three fio zipf readers, a
fio loop over a small file and a fio scan of a large one.  The three SLO
tenants are closed-loop; the others are batch jobs at fixed rates.

    1. in place: the tenants run where they start; their SLOs are set to
       SLO_FRACTION of what they do there (`admin set-slo`);
    2. `admin plan` from the live data, then `admin plan --apply`: the
       controller moves each tenant in its store, and this script makes
       its cgroup on the new host at the plan's limit, moves its processes
       there and drops its files from the page cache (a migration leaves
       the cache behind);
    3. after the move: each tenant's throughput against the plan's
       prediction and its SLO;
    4. the same for two plans the planner would not make, carried out with
       --force: the memory-only plan, and one host fewer than the plan.

Writes experiments/results/consolidate_host.json and .png, and keeps the
controller's recording of every round in consolidate_host_consolidate.recording/
(`cachepilot replay` it to judge an engine change against this run).
Usage: experiments/consolidate_host.py [--interval S] [--quick] [--data DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_lib as lib  # noqa: E402

from cachepilot.agent import cgroups, testbed  # noqa: E402

MiB = lib.MiB
HOSTS = ("h1", "h2", "h3")
HOST_MEMORY = 192 * MiB
HOST_DISK = 24 * MiB            # read bytes per second
HOST_CORES = 0.4               # 1.2 of this machine's 2 CPUs: the rest for the agents
SLO_FRACTION = 0.3              # of what an SLO tenant does in place
PARENT = "cachepilot-consolidate"
# name, host, kind, size (bytes, or keys for kv), SLO?, options.  The SLO
# tenants read far more than their host's memory holds (their disk binds);
# the others are batch jobs at fixed rates (rate: bytes/s, reads: ops/s).
TENANTS = [
    ("kv-a", "h1", "kv", 500_000, True, {}),
    ("zipf-a", "h1", "zipf", 256 * MiB, True, {"zipf": "0.9"}),
    ("zipf-b", "h2", "zipf", 224 * MiB, True, {"zipf": "0.95"}),
    ("loop-a", "h2", "loop", 48 * MiB, False, {"rate": "2m"}),
    ("scan-a", "h3", "scan", 384 * MiB, False, {"rate": "3m"}),
    ("zipf-c", "h3", "zipf", 48 * MiB, False, {"zipf": "1.2", "rate_iops": "300"}),
    ("kv-b", "h3", "kv", 50_000, False, {"reads": 3000}),
]


# -- emulated hosts -------------------------------------------------------------

class Hosts:
    """The three hosts' cgroups: memory (and v1 cpu, cpuacct, blkio at the
    same relative path, where the agent looks for a tenant's namesakes)."""

    def __init__(self, disk_dev: str):
        self.base, self.version = lib.memory_hierarchy()
        self.dev = disk_dev
        self.rel = self.base.relative_to(cgroups_root(self.base, self.version)) \
            if self.version == 1 else None

    def path(self, ctrl: str, *parts: str) -> Path:
        if self.version == 2 or ctrl == "memory":
            return self.base.joinpath(PARENT, *parts)
        return Path("/sys/fs/cgroup", ctrl, self.rel, PARENT, *parts)

    def make(self):
        for host in HOSTS:
            for ctrl in (("memory",) if self.version == 2 else
                         ("memory", "cpu", "cpuacct", "blkio")):
                self.path(ctrl, host).mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                for p in (self.base, self.base / PARENT, self.path("memory", host)):
                    _write(p / "cgroup.subtree_control", "+memory +io +cpu")
                _write(self.path("memory", host, "memory.max"), str(HOST_MEMORY))
                _write(self.path("memory", host, "io.max"), f"{self.dev} rbps={HOST_DISK}")
                _write(self.path("memory", host, "cpu.max"),
                       f"{int(HOST_CORES * 100_000)} 100000")
            else:
                _write(self.path("memory", host, "memory.limit_in_bytes"), str(HOST_MEMORY))
                _write(self.path("blkio", host, "blkio.throttle.read_bps_device"),
                       f"{self.dev} {HOST_DISK}")
                _write(self.path("cpu", host, "cpu.cfs_period_us"), "100000")
                _write(self.path("cpu", host, "cpu.cfs_quota_us"), str(int(HOST_CORES * 1e5)))

    def tenant_dirs(self, host: str, tenant: str) -> dict[str, Path]:
        """Where a tenant's processes go on `host`, per controller (v1: its
        own memory, cpu and cpuacct cgroups, its host's blkio one)."""
        if self.version == 2:
            return {"memory": self.path("memory", host, tenant)}
        return {"memory": self.path("memory", host, tenant),
                "cpu": self.path("cpu", host, tenant),
                "cpuacct": self.path("cpuacct", host, tenant),
                "blkio": self.path("blkio", host)}

    def place(self, pids, host: str, tenant: str):
        for d in self.tenant_dirs(host, tenant).values():
            d.mkdir(exist_ok=True)
            for pid in pids:
                try:
                    _write(d / "cgroup.procs", str(pid))
                except OSError:
                    pass            # gone already

    def pids(self, host: str, tenant: str) -> list[int]:
        f = self.path("memory", host, tenant, "cgroup.procs")
        return [int(x) for x in f.read_text().split()] if f.exists() else []

    def remove(self) -> int:
        """Every process left in the hosts' cgroups killed, then the
        cgroups removed; how many were killed.  A tenant's process that
        outlived its exporter (killed after its grace) stayed in a cgroup
        the next run made again by name: run J found a fio of run I in
        scan-a's, holding memory under its 16 MiB floor, and scan-a was
        killed by the OOM killer in its first seconds."""
        ctrls = ("memory",) if self.version == 2 else ("memory", "cpu", "cpuacct", "blkio")
        return sum(_remove_tree(self.path(ctrl)) for ctrl in ctrls)


def _remove_tree(top: Path) -> int:
    """The cgroup tree at `top` removed, deepest first, every member of each
    cgroup killed before it goes (testbed.remove_cgroup); how many
    processes were in it."""
    if not top.exists():
        return 0
    members = set()
    for f in top.rglob("cgroup.procs"):
        try:
            members.update(f.read_text().split())
        except OSError:
            pass
    for d in sorted([p for p in top.rglob("*") if p.is_dir()], key=lambda p: -len(p.parts)):
        testbed.remove_cgroup(d)
    testbed.remove_cgroup(top)
    return len(members)


def cgroups_root(base: Path, version: int) -> Path:
    return Path("/sys/fs/cgroup/memory") if version == 1 else Path("/sys/fs/cgroup")


def _write(path: Path, text: str):
    path.write_text(text)


def whole_disk(path: Path) -> str:
    """MAJ:MIN of the disk holding `path` (its parent disk, if a partition)."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if (sysfs / "partition").exists():
        return (sysfs.parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


# -- tenants ----------------------------------------------------------------------

def prepare(data: Path):
    """The tenants' files and databases (made once, kept between runs)."""
    data.mkdir(parents=True, exist_ok=True)
    for name, _, kind, size, _, _ in TENANTS:
        if kind == "kv":
            db = data / name
            stamp = db / f".keys-{size}"
            if not stamp.exists():
                print(f"  filling {db} ({size} keys)", flush=True)
                subprocess.run(["rm", "-rf", str(db)], check=True)
                subprocess.run(["db_bench", "--benchmarks=fillseq,compact", f"--db={db}",
                                f"--num={size}", "--value_size=400",
                                "--compression_type=none", "--threads=1"],
                               check=True, capture_output=True)
                stamp.touch()
            continue
        f = data / name
        if not f.exists() or f.stat().st_size != size:
            print(f"  writing {f} ({size >> 20} MiB)", flush=True)
            subprocess.run(["fio", "--name=prep", f"--filename={f}", f"--size={size}",
                            "--rw=write", "--bs=1m"], check=True, capture_output=True)


def files_of(data: Path, name: str) -> list[Path]:
    p = data / name
    return [f for f in p.iterdir() if f.is_file()] if p.is_dir() else [p]


def command(data: Path, name: str, kind: str, size: int, opts: dict, seconds: int):
    """(exporter format, the tenant's command)."""
    if kind == "kv":
        paced = [f"--benchmark_read_rate_limit={opts['reads']}"] if "reads" in opts else []
        return "db_bench", [
            "db_bench", "--benchmarks=readrandom", f"--db={data / name}", f"--num={size}",
            "--value_size=400", "--compression_type=none", "--cache_size=1048576",
            "--use_existing_db=1", "--open_files=-1", "--threads=1",
            "--read_random_exp_range=8", f"--duration={seconds}", "--stats_interval=100",
            *paced]
    extra = {k: v for k, v in opts.items() if k in ("rate", "rate_iops")}
    if kind == "zipf":
        return "fio", lib.fio(name, data / name, seconds, rw="randread", bs="4k",
                              random_distribution=f"zipf:{opts['zipf']}", norandommap=1,
                              **extra)
    return "fio", lib.fio(name, data / name, seconds, rw="read",
                          bs="64k" if kind == "scan" else "16k", **extra)


class Running:
    """The tenants' exporters and where each one is."""

    def __init__(self, hosts: Hosts, data: Path, work: Path, seconds: int):
        self.hosts, self.data, self.work = hosts, data, work
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.where = {name: host for name, host, *_ in TENANTS}
        for name, host, kind, size, _, opts in TENANTS:
            fmt, cmd = command(data, name, kind, size, opts, seconds)
            self.ports[name] = lib.free_port()
            dirs = hosts.tenant_dirs(host, name)
            for d in dirs.values():
                d.mkdir(exist_ok=True)
            # the exporter stays outside: only the application is the tenant
            self.procs[name] = subprocess.Popen(
                [*lib.CLI, "exporter", "--port", str(self.ports[name]), "--format", fmt,
                 "--name", name, "--cgroup", str(dirs["memory"]), "--", *cmd],
                stdout=open(work / f"{name}.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True)

    def sweep(self):
        """Every process of a tenant's memory cgroup into its other
        controllers' cgroups too (v1: the exporter puts the application in
        the memory one; what it forks follows within an interval)."""
        if self.hosts.version == 1:
            for name, host in self.where.items():
                self.hosts.place(self.hosts.pids(host, name), host, name)

    def move(self, name: str, host: str, limit: int):
        """Its cgroup on `host` made at the plan's `limit` (what it gets on
        arrival), its processes moved there, its files out of the page
        cache."""
        old = self.where[name]
        target = self.hosts.path("memory", host, name)
        target.mkdir(exist_ok=True)
        cgroups.write_limit(target, limit)
        self.hosts.place(self.hosts.pids(old, name), host, name)
        for f in files_of(self.data, name):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        self.where[name] = host

    def limits(self) -> dict[str, int | None]:
        """Each tenant's memory limit where it runs now (None: none, or
        unreadable)."""
        out = {}
        for name, host in self.where.items():
            try:
                out[name] = cgroups.read_limit(self.hosts.path("memory", host, name)) or None
            except cgroups.CgroupError:
                out[name] = None
        return out

    def counts(self) -> dict[str, float | None]:
        return {name: lib.scrape(port) for name, port in self.ports.items()}

    def stop(self):
        lib.stop(list(self.procs.values()))


# -- the controller and the agents --------------------------------------------------

def deployment(work: Path, hosts: Hosts, running: Running, interval: float) -> dict:
    """Certificates (`certs init`, a node certificate per host) and the
    controller's and agents' configs; {name: config path}."""
    tls = work / "tls"
    port = lib.free_port()
    subprocess.run([*lib.CLI, "certs", "init", str(tls), "--node", HOSTS[0], "--force",
                    "--listen", f"127.0.0.1:{port}", "--metrics-port", "0"],
                   check=True, capture_output=True)
    for host in HOSTS[1:]:
        subprocess.run([*lib.CLI, "certs", "node", host, "--dir", str(tls), "--force"], check=True,
                       capture_output=True)
    tenants = []
    for name, host, *_ in TENANTS:
        tenants.append({
            "name": name, "node": host, "cgroup": name, "policies": ["linux"],
            "floor_bytes": "16MiB",
            "throughput": {"source": "prometheus",
                           "url": f"http://127.0.0.1:{running.ports[name]}/metrics",
                           "metric": "cachepilot_app_operations", "labels": {"name": name},
                           "timeout_s": 5}})
    ctl = {"control": {"interval_s": interval, "anon_margin_bytes": "16MiB",
                       "warmup_intervals": 2, "lost_after_intervals": 10},
           "controller": {"listen": f"127.0.0.1:{port}",
                          **{k: str(tls / v) for k, v in (
                              ("tls_cert", "controller.crt"), ("tls_key", "controller.key"),
                              ("tls_ca", "ca.crt"), ("client_ca", "ca.crt"),
                              ("admin_cert", "admin.crt"), ("admin_key", "admin.key"))},
                          "state_path": str(work / "controller.state.db")},
           "nodes": [{"name": h, "memory_bytes": HOST_MEMORY, "backend": "linux",
                      "cgroup_roots": [str(hosts.path("memory", h))], "cores": HOST_CORES,
                      "disk_read_bytes_per_s": HOST_DISK} for h in HOSTS],
           "tenants": tenants}
    out = {"controller": work / "controller.yaml"}
    out["controller"].write_text(json.dumps(ctl))
    for h in HOSTS:
        out[h] = work / f"agent-{h}.yaml"
        out[h].write_text(json.dumps({
            "node_id": h, "roots": [str(hosts.path("memory", h))], "interval_s": interval,
            "memory": HOST_MEMORY, "policies": ["linux"],
            "sampling": {"rate": lib.SAMPLING_RATE, "samples_per_s": lib.SAMPLES_PER_S,
                         "min_window_samples": lib.MIN_WINDOW_SAMPLES},
            "safety": {"floor": 16 * MiB, "anon_margin": 16 * MiB},
            "prometheus": {"port": 0},
            "controller": {"address": f"127.0.0.1:{port}",
                           "cert_file": str(tls / f"node-{h}.crt"),
                           "key_file": str(tls / f"node-{h}.key"),
                           "ca_file": str(tls / "ca.crt")}}))
    return out


def admin(configs: dict, *args: str) -> str:
    r = subprocess.run([*lib.CLI, "admin", "--config", str(configs["controller"]), *args],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"admin {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


# -- a run ------------------------------------------------------------------------

def measure(running: Running, interval: float, intervals: int, label: str) -> dict:
    """Each tenant's operations per second, each host's disk reads in
    bytes per second (key "disk:HOST") and each tenant's memory limit in
    bytes at the interval's end (key "limit:NAME"), interval by interval."""
    series = {name: [] for name in running.ports}
    series.update({f"disk:{h}": [] for h in HOSTS})
    series.update({f"limit:{name}": [] for name in running.ports})
    last, at = _sample(running), time.monotonic()
    for i in range(intervals):
        running.sweep()
        time.sleep(max(0.0, at + interval - time.monotonic()))
        now, t = _sample(running), time.monotonic()
        for name, v in now.items():
            prev = last.get(name)
            series[name].append(None if v is None or prev is None else (v - prev) / (t - at))
        for name, v in running.limits().items():
            series[f"limit:{name}"].append(v)
        last, at = now, t
        print(f"\r  {label}: {i + 1}/{intervals}", end="", flush=True)
    print()
    return series


def _sample(running: Running) -> dict:
    out = running.counts()
    for h in HOSTS:
        out[f"disk:{h}"] = cgroups.read_bytes(running.hosts.path("memory", h))
    return out


def disks(series: dict, warm: int) -> dict:
    """Each host's mean disk reads after warm-up, MiB/s."""
    return {k[5:]: round(mean(v[warm:]) / MiB, 2) if mean(v[warm:]) is not None else None
            for k, v in series.items() if k.startswith("disk:")}


def carry_out(configs: dict, running: Running, plan_args: list[str], label: str) -> dict:
    """`admin plan --apply ARGS`, then each move done to the processes;
    the plan carried out (kept in the work folder, and shown)."""
    reply = json.loads(admin(configs, "--json", "plan", "--apply", *plan_args))
    for move in reply["plan"]["moves"]:
        running.move(move["tenant"], move["to"], move["limit_bytes"])
    (running.work / f"plan-{label}.json").write_text(json.dumps(reply["plan"], indent=1))
    print(f"{label}: the plan carried out")
    from cachepilot.controller.plan_cli import print_plan
    print_plan(reply["plan"])
    return reply["plan"]


def mean(values):
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summary(plan: dict, series: dict, slos: dict, warm: int) -> list[dict]:
    """Per tenant: SLO, prediction, measured mean after warm-up, the share
    of those intervals that met the SLO."""
    out = []
    for name in (n for n in series if ":" not in n):
        after = [v for v in series[name][warm:] if v is not None]
        slo = slos.get(name)
        planned = plan["predictions"].get(name, {})
        pred = planned.get("predicted_ops")
        out.append({"name": name, "host": plan["assignment"][name], "slo": slo,
                    "predicted_ops": pred, "measured_ops": mean(after),
                    "planned_limit_bytes": planned.get("limit_bytes"),
                    "limit_bytes": mean(series.get(f"limit:{name}", [])[warm:]),
                    "met_fraction": (sum(v >= slo for v in after) / len(after))
                    if slo and after else None,
                    "error": (mean(after) / pred - 1) if pred and after else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--intervals", type=int, default=60, help="per measured run (60)")
    # a moved tenant's cache starts empty and refills at its share of its
    # new disk (150 MiB at 8 MiB/s: 20 s), while the rounds step its limit
    ap.add_argument("--warm", type=int, default=25,
                    help="intervals after a move left out (25)")
    ap.add_argument("--data", default="/var/tmp/cachepilot-consolidate")
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("consolidate_host: needs root (cgroups, BPF)")
    lib.exit_on_sigterm()           # a stopped run still cleans up after itself
    if args.quick:
        args.intervals, args.warm = 8, 3
    data = Path(args.data)
    work = data / "run"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("controller.state.db*"):     # a last run's placements
        old.unlink()
    prepare(data)
    hosts = Hosts(whole_disk(data))
    stale = hosts.remove()
    if stale:
        print(f"killed {stale} processes an earlier run left in the hosts' cgroups")
    hosts.make()
    seconds = int(args.interval * args.intervals * 6 + 600)
    lib.drop_caches()
    running, daemons = None, []
    try:
        running = Running(hosts, data, work, seconds)
        configs = deployment(work, hosts, running, args.interval)
        recording = lib.recording_of(work, "consolidate")
        shutil.rmtree(recording, ignore_errors=True)
        for key, kind in [("controller", "controller")] + [(h, "agent") for h in HOSTS]:
            record = ["--record", str(recording)] if kind == "controller" else []
            daemons.append(subprocess.Popen(
                [*lib.CLI, kind, "--config", str(configs[key]), *record],
                stdout=open(work / f"{key}.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True))
        return run(args, configs, running, work)
    finally:
        lib.stop(daemons)
        if running is not None:
            running.stop()
        left = hosts.remove()
        if left:
            print(f"killed {left} tenant processes that outlived their exporters")


def run(args, configs, running, work) -> int:
    time.sleep(3 * args.interval)
    first = measure(running, args.interval, args.intervals, "in place")
    slos = {}
    for name, _, _, _, has_slo, _ in TENANTS:
        if has_slo:
            slos[name] = round(SLO_FRACTION * mean(first[name][args.warm:]), 1)
            admin(configs, "set-slo", name, str(slos[name]))
    before = measure(running, args.interval, args.intervals, "in place, SLOs set")
    offered = json.loads(admin(configs, "--json", "plan"))["plan"]
    memory_only = json.loads(admin(configs, "--json", "plan", "--memory-only"))["plan"]
    plan = carry_out(configs, running, [], "plan")
    after = measure(running, args.interval, args.intervals, "after the move")
    runs = {"plan": (plan, after)}
    tighter_hosts = max(1, len(plan["hosts_used"]) - 1)
    for key, extra in (("memory_only", ["--memory-only", "--force"]),
                       ("tighter", ["--hosts", str(tighter_hosts), "--force"])):
        applied = carry_out(configs, running, extra, key)
        runs[key] = (applied, measure(running, args.interval, args.intervals, key))
    result = {
        "hosts_before": len(set(t[1] for t in TENANTS)),
        "hosts_after": len(plan["hosts_used"]),
        "host": {"memory_bytes": HOST_MEMORY, "disk_read_bytes_per_s": HOST_DISK,
                 "cores": HOST_CORES},
        "interval_s": args.interval, "warm_intervals": args.warm, "slos": slos,
        "before": {n: mean(v[args.warm:]) for n, v in before.items()},
        "plan_offered": offered, "memory_only_plan": memory_only,
        "tenants": summary(plan, after, slos, args.warm),
        "plan": plan, "series": {"in_place": before, "after": after},
        "memory_only": {"tenants": summary(runs["memory_only"][0], runs["memory_only"][1],
                                           slos, args.warm),
                        "plan": runs["memory_only"][0]},
        "tighter": {"tenants": summary(runs["tighter"][0], runs["tighter"][1], slos,
                                       args.warm),
                    "plan": runs["tighter"][0]},
        # each host's disk reads, MiB/s after warm-up, in each run
        "disk_mib_s": {"in_place": disks(before, args.warm), "plan": disks(after, args.warm),
                       **{k: disks(v[1], args.warm) for k, v in runs.items() if k != "plan"}},
    }
    return report(result, work)


def checks(result: dict) -> dict:
    """The issue's must-shows, each True or False, from the result."""
    ts = result["tenants"]
    promised = [t for t in ts if t["slo"] and result["plan"]["predictions"][t["name"]][
        "slo_met"]]
    errors = sorted(abs(t["error"]) for t in ts if t["error"] is not None)
    median = errors[len(errors) // 2] if errors else None
    return {
        "frees_a_host": result["hosts_after"] < result["hosts_before"],
        "promised_slos_met_95pct": all((t["met_fraction"] or 0) >= 0.95 for t in promised),
        "median_error_within_15pct": median is not None and median <= 0.15,
        "every_error_within_30pct": bool(errors) and errors[-1] <= 0.30,
        "tighter_misses_an_slo": any(t["slo"] and (t["met_fraction"] or 0) < 0.95
                                     for t in result["tighter"]["tenants"]),
        "median_abs_error": median,
    }


def report(result: dict, work: Path) -> int:
    result["checks"] = checks(result)
    print(f"hosts: {result['hosts_before']} -> {result['hosts_after']}")
    print(f"{'tenant':8} {'host':4} {'before':>9} {'SLO':>9} {'predicted':>9} {'after':>9} "
          f"{'err':>6} {'met':>5} | {'mem-only':>9} {'met':>5} | {'tighter':>9} {'met':>5}")
    rows = {k: {t["name"]: t for t in result[k]["tenants"]} for k in ("memory_only",
                                                                       "tighter")}
    for t in result["tenants"]:
        m, g = rows["memory_only"][t["name"]], rows["tighter"][t["name"]]
        err = f"{t['error']:+.0%}" if t["error"] is not None else "-"
        print(f"{t['name']:8} {t['host']:4} {_n(result['before'][t['name']])} {_n(t['slo'])} "
              f"{_n(t['predicted_ops'])} {_n(t['measured_ops'])} "
              f"{err:>6} "
              f"{_p(t['met_fraction'])} | {_n(m['measured_ops'])} {_p(m['met_fraction'])} | "
              f"{_n(g['measured_ops'])} {_p(g['met_fraction'])}")
    for run, per_host in result["disk_mib_s"].items():
        print(f"  disk reads, {run}: " + ", ".join(
            f"{h} {v if v is not None else '-'} MiB/s" for h, v in per_host.items())
            + f" (each host's disk: {HOST_DISK / MiB:g} MiB/s)")
    for k, v in result["checks"].items():
        print(f"  {k}: {v}")
    out = lib.RESULTS / "consolidate_host.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    kept = lib.keep_recording(work, "consolidate", lib.RESULTS, "consolidate_host")
    if kept is not None:
        print(f"kept the controller's recording of every round in {kept} "
              f"(`cachepilot replay {kept}`)")
    return 0


def _n(v) -> str:
    return f"{v:9,.0f}" if isinstance(v, (int, float)) else f"{'-':>9}"


def _p(v) -> str:
    return f"{v:5.0%}" if isinstance(v, (int, float)) else f"{'-':>5}"


def plot(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [t["name"] for t in result["tenants"]]
    bars = [("before (in place)", [result["before"][n] for n in names], "#999999"),
            ("predicted", [t["predicted_ops"] for t in result["tenants"]], "#8fb8de"),
            ("after the plan", [t["measured_ops"] for t in result["tenants"]], "#1f5fa8"),
            ("memory-only plan", [t["measured_ops"] for t in result["memory_only"]["tenants"]],
             "#e0a040"),
            ("one host tighter", [t["measured_ops"] for t in result["tighter"]["tenants"]],
             "#c03030")]
    fig, (ax, lim) = plt.subplots(1, 2, figsize=(15, 4.8),
                                  gridspec_kw={"width_ratios": [2.2, 1]})
    width = 0.16
    for i, (label, vals, colour) in enumerate(bars):
        ax.bar([x + (i - 2) * width for x in range(len(names))],
               [v or 0 for v in vals], width, label=label, color=colour)
    for x, t in enumerate(result["tenants"]):
        if t["slo"]:
            ax.plot([x - 2.5 * width, x + 2.5 * width], [t["slo"]] * 2, "k--", lw=1,
                    label="SLO" if x == 0 or "SLO" not in
                    ax.get_legend_handles_labels()[1] else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("operations per second (log)")
    ax.set_title(f"consolidation on real tenants: {result['hosts_before']} hosts -> "
                 f"{result['hosts_after']} (median |prediction error| "
                 f"{(result['checks']['median_abs_error'] or 0):.0%})")
    ax.legend(fontsize=8, ncol=3)
    # the SLO tenants' limits after the move against the plan's
    after = result["series"]["after"]
    for t in (t for t in result["tenants"] if t["slo"]):
        line, = lim.plot([(v or 0) / MiB for v in after.get(f"limit:{t['name']}", [])],
                         label=t["name"])
        if t.get("planned_limit_bytes"):
            lim.axhline(t["planned_limit_bytes"] / MiB, ls="--", lw=1, color=line.get_color())
    lim.axvline(result["warm_intervals"], color="#999999", lw=0.8)
    lim.set_xlabel("interval after the move (grey: warm-up ends)")
    lim.set_ylabel("memory limit, MiB (dashed: the plan's)")
    lim.set_title("limits held after the move", fontsize=10)
    lim.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
