#!/usr/bin/env python3
"""Faults on real cgroups, counted (`make chaos`).

Real tenants (RocksDB GETs beside a scanner, fio passes, zipf reads and a
stream: experiments/e2e_lib.py's four, smaller) run on this host under a
real agent (eBPF sampler, cgroup v1 or v2) and a real controller, gRPC
with TLS and a token.  The controller runs in a network namespace of its
own, reached over a veth pair, so that "the controller is unreachable" is
a link that goes down, not a process that stops.  A supervisor restarts
the agent or the controller when it exits, after a second, as systemd's
Restart=on-failure does with deploy/systemd's units; nothing else is
restarted for them.

Then, for --minutes and --faults at least (30 and 200), at random moments
(seeded), one fault at a time:

    agent_kill        SIGKILL the agent (the supervisor starts it again)
    agent_stop        SIGSTOP the agent for 2-10 s, then SIGCONT
    controller_kill   SIGKILL the controller
    controller_stop   SIGSTOP the controller for 2-10 s
    sampler_kill      SIGKILL the agent's sampler loader (the agent's own
                      business to start again)
    cgroup_recreate   a tenant's cgroup deleted (its processes parked in
                      another) and made again a few seconds later
    anon_growth       a process in a tenant's cgroup grows anonymous memory
                      up to its limit as it was (the controller has to
                      raise it), holds it, and exits
    partition         the controller's link down for 2-10 s

and after each it waits (at most --recover-timeout s) until the loop has
closed again: the controller has taken two fresh reports from the node
and every tenant's cgroup has a limit (for sampler_kill: the agent says
its sampler runs again).  A monitor reads every tenant's limit, anonymous
memory and OOM-kill count twice a second throughout and counts:

    step_violations   a limit moved by more than the step (the agent's
                      safety.max_step, the controller's max_step_fraction)
    below_anon        a limit set below anonymous memory + the margin (the
                      smaller of the two readings around the change: the
                      agent read it in between)
    oom_kills         OOM kills in tenant cgroups (v1 memory.oom_control,
                      v2 memory.events)
    reports_lost      control intervals from a fault's start to its
                      recovery in which the controller took no report
    unrecovered       faults the system did not recover from by itself
                      within the timeout: a restart by hand would be needed

per fault kind, with the recovery time (median and max).  Writes
experiments/results/chaos.json and .png.  Needs root, fio, db_bench,
openssl, iproute2 (ip netns, veth).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_lib import (ANON_MARGIN, CLI, MiB, ROOT, Cgroups, agent_config,  # noqa: E402
                     controller_config, free_port, host_workspace, make_tls, prepare,
                     start_helper, start_tenant, stop, tenants)

from cachepilot.agent import cgroups  # noqa: E402

KINDS = ("agent_kill", "agent_stop", "controller_kill", "controller_stop", "sampler_kill",
         "cgroup_recreate", "anon_growth", "partition")
NETNS, HOST_IF, NS_IF = "cpchaos", "cpchaos-h", "cpchaos-c"
HOST_IP, NS_IP = "10.231.77.1", "10.231.77.2"     # the namespace's own /30
RESTART_AFTER_S = 1.0

# joins the cgroup whose cgroup.procs it is given (after its interpreter
# started outside it: only what it grows is charged there), grows
# anonymous memory by `step` bytes every half second up to `target`, says
# "peak", holds it `hold` seconds and exits
HOG = r"""
import os, sys, time
procs, target, step, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
with open(procs, "w") as fh:
    fh.write(str(os.getpid()))
chunks, have = [], 0
while have < target:
    b = bytearray(step)
    b[::4096] = b"\x01" * len(range(0, step, 4096))     # fault every page in
    chunks.append(b)
    have += step
    time.sleep(0.5)
print("peak", flush=True)
time.sleep(hold)
"""


# Each tenant's operations per second, capped: the faults are the point,
# and uncapped readers of files that fit would make millions of page reads
# a second for the agent to sample on two cores
RATE = {"fio": 3000}


def throttle(ts):
    """Cap every fio tenant's operations per second."""
    for t in ts:
        for cmd in [t.command, *t.helpers]:
            # (db_bench's own read rate limiter asserts on its reads' sizes:
            # RocksDB's GETs run as they come)
            if any(a.startswith("--name=") for a in cmd):
                big = any(a == "--bs=1m" for a in cmd)
                cmd.append(f"--rate_iops={100 if big else RATE['fio']}")


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


# -- the controller's namespace -------------------------------------------------------

def netns_up():
    netns_down()
    sh("ip", "netns", "add", NETNS)
    sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
    sh("ip", "link", "set", NS_IF, "netns", NETNS)
    sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
    sh("ip", "link", "set", HOST_IF, "up")
    sh("ip", "-n", NETNS, "addr", "add", f"{NS_IP}/30", "dev", NS_IF)
    sh("ip", "-n", NETNS, "link", "set", NS_IF, "up")
    sh("ip", "-n", NETNS, "link", "set", "lo", "up")


def netns_down():
    sh("ip", "link", "del", HOST_IF, check=False)
    sh("ip", "netns", "del", NETNS, check=False)


def link(up: bool):
    sh("ip", "link", "set", HOST_IF, "up" if up else "down")


# -- supervised processes -----------------------------------------------------------------

class Supervised:
    """A process restarted RESTART_AFTER_S after it exits, as systemd's
    Restart=on-failure would; `paused` while the harness holds it stopped
    or dead on purpose is not a reason to restart it sooner."""

    def __init__(self, name: str, cmd: list[str], log: Path):
        self.name, self.cmd, self.log = name, cmd, log
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.lock = threading.Lock()
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "a"),
                                     stderr=subprocess.STDOUT, cwd=ROOT)

    def check(self):
        with self.lock:
            if self.proc.poll() is not None:
                time.sleep(RESTART_AFTER_S)
                self.start()
                self.restarts += 1

    def signal(self, sig):
        with self.lock:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)

    def close(self):
        stop([self.proc])


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# -- the monitor ---------------------------------------------------------------------------

def oom_kills(path: Path, version: int) -> int:
    f = path / ("memory.oom_control" if version == 1 else "memory.events")
    try:
        return cgroups.read_kv(f).get("oom_kill", 0)
    except cgroups.CgroupError:
        return 0


@dataclass
class Monitor:
    """Twice a second: every tenant's limit, anonymous memory and OOM
    kills; every limit change checked against the step and the anon
    floor.  Events are attributed to the fault under way (`current`)."""
    cg: Cgroups
    names: list[str]
    max_step: int
    events: list = field(default_factory=list)
    oom_total: dict = field(default_factory=dict)
    current: str = "none"
    min_headroom: float = math.inf
    stop_flag: threading.Event = field(default_factory=threading.Event)

    def run(self):
        last = {n: None for n in self.names}
        last_anon = {n: None for n in self.names}
        seen_oom = {n: None for n in self.names}
        while not self.stop_flag.wait(0.5):
            for n in self.names:
                path = self.cg.root / n
                try:
                    lim = self.cg.limit(n)
                    st = cgroups.read_stats(path)
                except (OSError, cgroups.CgroupError):
                    last[n] = last_anon[n] = None       # gone (being recreated)
                    seen_oom[n] = None
                    continue
                lim = 0 if lim >= cgroups.V1_UNLIMITED else lim
                o = oom_kills(path, self.cg.version)
                if seen_oom[n] is not None and o > seen_oom[n]:
                    self.events.append({"t": time.time(), "kind": "oom", "tenant": n,
                                        "fault": self.current, "count": o - seen_oom[n]})
                seen_oom[n] = o
                old = last[n]
                # the agent read anon when it wrote the limit, between this
                # read and the last: if anon moved one way in between, no
                # less than the smaller of the two
                anon = st.anon_bytes if last_anon[n] is None else \
                    min(st.anon_bytes, last_anon[n])
                last_anon[n] = st.anon_bytes
                if lim and old is not None and lim != old:
                    step_bad = old > 0 and abs(lim - old) > self.max_step + 4096
                    anon_bad = lim < anon + ANON_MARGIN
                    self.events.append({"t": time.time(), "kind": "limit", "tenant": n,
                                        "fault": self.current, "old": old, "new": lim,
                                        "anon": st.anon_bytes, "step_violation": step_bad,
                                        "below_anon": anon_bad})
                if lim:
                    self.min_headroom = min(self.min_headroom, lim - st.anon_bytes)
                last[n] = lim


# -- the controller's view ----------------------------------------------------------

class Admin:
    """The controller's admin API, in process (a CLI call per poll would
    cost a Python start-up each)."""

    def __init__(self, target: str, cert: Path, token: Path):
        from cachepilot.protocol import cachepilot_pb2 as pb
        from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
        from cachepilot.protocol.channel import make_channel, token_metadata
        self.pb = pb
        self.channel = make_channel(target, cert.read_bytes(), "localhost")
        self.stub = pb_grpc.AdminStub(self.channel)
        self.md = token_metadata(token.read_text().strip())

    def reports(self) -> int | None:
        """The node's report count as the controller has it, or None when
        the controller does not answer."""
        try:
            reply = self.stub.Status(self.pb.StatusRequest(), metadata=self.md, timeout=2)
        except Exception:   # noqa: BLE001 - any failure means: no answer now
            return None
        return sum(n.reports for n in reply.nodes if n.node_id == "host")


# -- faults ------------------------------------------------------------------------------------

@dataclass
class Chaos:
    cg: Cgroups
    names: list[str]
    agent: Supervised
    ctl: Supervised
    admin: Admin
    mon: Monitor
    rng: random.Random
    interval: float
    work: Path
    recover_timeout: float

    def inject(self, kind: str) -> dict:
        """One fault, undone; returns its record with the recovery time."""
        t0 = time.monotonic()
        self.mon.current = kind
        base = self.admin.reports()
        detail = getattr(self, f"_{kind}")()
        ended = time.monotonic()
        rec = self._recovered(kind, ended)
        self.mon.current = "none"
        got = self.admin.reports()
        window = (rec if rec is not None else time.monotonic()) - t0
        expected = int(window / self.interval)
        # a controller restarted in the window counts from its start
        received = None if got is None or base is None else \
            got - base if got >= base else got
        return {"kind": kind, "detail": detail, "duration_s": ended - t0,
                "recovery_s": None if rec is None else rec - ended,
                "intervals": expected,
                "reports_lost": None if received is None else max(0, expected - received)}

    def _hold(self) -> float:
        return self.rng.uniform(2.0, 10.0)

    def _agent_kill(self):
        self.agent.signal(signal.SIGKILL)
        self.agent.proc.wait()
        self.agent.check()
        return "agent killed, restarted by the supervisor"

    def _controller_kill(self):
        self.ctl.signal(signal.SIGKILL)
        self.ctl.proc.wait()
        self.ctl.check()
        return "controller killed, restarted by the supervisor"

    def _stop(self, who: Supervised) -> str:
        hold = self._hold()
        who.signal(signal.SIGSTOP)
        time.sleep(hold)
        who.signal(signal.SIGCONT)
        return f"stopped {hold:.1f} s"

    def _agent_stop(self):
        return self._stop(self.agent)

    def _controller_stop(self):
        return self._stop(self.ctl)

    def _sampler_kill(self):
        pids = [p for p in children(self.agent.proc.pid) if comm(p) == "sampler"]
        for p in pids:
            os.kill(p, signal.SIGKILL)
        return f"killed {len(pids)} sampler loader(s)"

    def _cgroup_recreate(self):
        name = self.rng.choice(self.names)
        park = self.cg.make("chaos-park")
        path = self.cg.root / name
        moved = 0
        for _ in range(20):
            pids = (path / "cgroup.procs").read_text().split()
            if not pids:
                break
            for p in pids:
                try:
                    (park / "cgroup.procs").write_text(p)
                    moved += 1
                except OSError:
                    pass
        path.rmdir()
        gone = self.rng.uniform(2.0, 6.0)
        time.sleep(gone)
        self.cg.make(name)
        for p in (park / "cgroup.procs").read_text().split():
            try:
                (path / "cgroup.procs").write_text(p)
            except OSError:
                pass
        return f"{name}: {moved} processes parked, cgroup gone {gone:.1f} s"

    def _anon_growth(self):
        name = self.rng.choice(self.names)
        lim = self.cg.limit(name)
        hold = self._hold()
        # up to the limit as it is, and past it where the controller
        # raises the limit as it should (anon + margin): 2 MiB a half
        # second, a fraction of the margin per control interval
        target = min(lim, 96 * MiB) if 0 < lim < cgroups.V1_UNLIMITED else 64 * MiB
        procs = self.cg.root / name / "cgroup.procs"
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(procs), str(target),
                                str(2 * MiB), str(hold)], stdout=subprocess.PIPE, text=True)
        hog.stdout.readline()
        rc = hog.wait()
        return f"{name}: +{target >> 20} MiB anon (limit {lim >> 20} MiB) held {hold:.1f} s " \
               f"(exit {rc})"

    def _partition(self):
        hold = self._hold()
        link(False)
        time.sleep(hold)
        link(True)
        return f"link down {hold:.1f} s"

    def _recovered(self, kind: str, since: float) -> float | None:
        """When the loop closed again after `since` (monotonic), or None."""
        log = self.work / "agent.log"
        mark = log.stat().st_size if log.exists() else 0
        base = None
        while time.monotonic() - since < self.recover_timeout:
            self.agent.check()
            self.ctl.check()
            n = self.admin.reports()
            if n is not None and (base is None or n < base):
                base = n        # a restarted controller counts from zero
            limited = all(self._limited(t) for t in self.names)
            sampler_ok = kind != "sampler_kill" or "runs again" in _tail(log, mark)
            if n is not None and base is not None and n >= base + 2 and limited and sampler_ok:
                return time.monotonic()
            time.sleep(0.25)
        return None

    def _limited(self, name: str) -> bool:
        try:
            lim = self.cg.limit(name)
        except OSError:
            return False
        return 0 < lim < cgroups.V1_UNLIMITED


def _tail(path: Path, offset: int) -> str:
    try:
        with open(path, errors="replace") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return ""


# -- summary ------------------------------------------------------------------------------------

def summarise(faults: list[dict], events: list[dict], args, wall_s: float,
              restarts: dict, min_headroom: float) -> dict:
    per = {}
    for k in KINDS:
        fs = [f for f in faults if f["kind"] == k]
        rec = [f["recovery_s"] for f in fs if f["recovery_s"] is not None]
        ev = [e for e in events if e["fault"] == k]
        per[k] = {
            "faults": len(fs),
            "unrecovered": sum(f["recovery_s"] is None for f in fs),
            "recovery_median_s": statistics.median(rec) if rec else None,
            "recovery_max_s": max(rec) if rec else None,
            "reports_lost": sum(f["reports_lost"] or 0 for f in fs),
            "intervals": sum(f["intervals"] for f in fs),
            "step_violations": sum(e.get("step_violation", False) for e in ev),
            "below_anon": sum(e.get("below_anon", False) for e in ev),
            "oom_kills": sum(e.get("count", 0) for e in ev if e["kind"] == "oom"),
            "limit_changes": sum(e["kind"] == "limit" for e in ev),
        }
    quiet = [e for e in events if e["fault"] == "none"]
    totals = {key: sum(v[key] for v in per.values())
              for key in ("faults", "unrecovered", "reports_lost", "step_violations",
                          "below_anon", "oom_kills", "limit_changes")}
    for key, flag in (("step_violations", "step_violation"), ("below_anon", "below_anon")):
        totals[key] += sum(e.get(flag, False) for e in quiet)
    totals["oom_kills"] += sum(e.get("count", 0) for e in quiet if e["kind"] == "oom")
    totals["limit_changes"] += sum(e["kind"] == "limit" for e in quiet)
    totals["manual_restarts"] = totals["unrecovered"]
    return {"minutes": wall_s / 60, "seed": args.seed, "interval_s": args.interval,
            "budget_bytes": args.budget * MiB, "per_kind": per, "totals": totals,
            "supervisor_restarts": restarts, "min_limit_headroom_over_anon_bytes":
            None if math.isinf(min_headroom) else min_headroom,
            "faults": faults, "events": events}


def plot(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    data = [[f["recovery_s"] for f in result["faults"]
             if f["kind"] == k and f["recovery_s"] is not None] for k in KINDS]
    ax.boxplot([d or [float("nan")] for d in data])
    ax.set_xticks(range(1, len(KINDS) + 1),
                  [f"{k}\n({result['per_kind'][k]['faults']})" for k in KINDS])
    ax.set_ylabel("recovery time, s")
    t = result["totals"]
    ax.set_title(f"chaos: {t['faults']} faults in {result['minutes']:.0f} min; "
                 f"step violations {t['step_violations']}, below anon+margin "
                 f"{t['below_anon']}, OOM kills {t['oom_kills']}, unrecovered "
                 f"{t['unrecovered']}", fontsize=9)
    plt.setp(ax.get_xticklabels(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="inject for at least this long (30)")
    ap.add_argument("--faults", type=int, default=200,
                    help="... and until at least this many faults (200)")
    ap.add_argument("--budget", type=int, default=256, help="node memory budget, MiB (256)")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the agent's and the controller's interval, s (1)")
    ap.add_argument("--gap", type=float, default=0.5,
                    help="mean seconds between faults (0.5)")
    ap.add_argument("--recover-timeout", type=float, default=90.0,
                    help="seconds a fault may take to recover by itself (90)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="/var/tmp/cachepilot-chaos", help="data folder")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("chaos: needs root (cgroups, BPF, network namespaces)", file=sys.stderr)
        return 2
    for tool in ("fio", "db_bench", "openssl", "ip"):
        if not shutil.which(tool):
            print(f"chaos: {tool} is not installed (make deps)", file=sys.stderr)
            return 2
    # SIGTERM and SIGHUP end the campaign as Ctrl-C does: the processes,
    # cgroups and namespace it made are removed, and the faults so far
    # are written out
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    rng = random.Random(args.seed)
    budget = args.budget * MiB
    sizes, cg, _, data, work = host_workspace(budget, 400_000, "cachepilot-chaos", args.data)
    prepare(data, sizes)
    seconds = int(args.minutes * 60 * 2 + 900)
    ts = tenants(data, sizes, seconds)
    throttle(ts)
    names = [t.name for t in ts]
    for n in names:
        cg.make(n)
    netns_up()
    procs, faults = [], []
    agent = ctl = mon = None
    interrupted = False
    wall = 0.0
    try:
        port = free_port()
        key, cert, token = tls = make_tls(work)
        for t in ts:
            t.port = free_port()
            procs.append(start_tenant(t, cg, work / f"{t.name}.log"))
            for i, h in enumerate(t.helpers):
                procs.append(start_helper(h, cg, t.name, work / f"{t.name}-helper{i}.log"))
        ccfg = controller_config("limits_only", ts, cg, budget, args.interval, port, tls, {})
        ccfg["controller"]["listen"] = f"{NS_IP}:{port}"
        (work / "controller.yaml").write_text(yaml.safe_dump(ccfg))
        acfg = agent_config("limits_only", ts, cg, budget, args.interval, port, tls)
        acfg["controller"]["address"] = f"{NS_IP}:{port}"
        (work / "agent.yaml").write_text(yaml.safe_dump(acfg))
        ctl = Supervised("controller", ["ip", "netns", "exec", NETNS, *CLI, "controller",
                                        "--config", str(work / "controller.yaml")],
                         work / "controller.log")
        agent = Supervised("agent", [*CLI, "agent", "--config", str(work / "agent.yaml")],
                           work / "agent.log")
        admin = Admin(f"{NS_IP}:{port}", cert, token)
        max_step = min(acfg["safety"]["max_step"],
                       int(ccfg["control"]["max_step_fraction"] * budget))
        mon = Monitor(cg, names, max_step)
        threading.Thread(target=mon.run, daemon=True).start()
        chaos = Chaos(cg, names, agent, ctl, admin, mon, rng, args.interval, work,
                      args.recover_timeout)
        # the loop closed once before the first fault
        if chaos._recovered("start", time.monotonic()) is None:
            print("chaos: the agent and the controller never closed the loop "
                  f"(see {work})", file=sys.stderr)
            return 1
        print(f"chaos: loop closed; injecting for {args.minutes:g} min and "
              f"{args.faults} faults at least", flush=True)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < args.minutes * 60 or len(faults) < args.faults:
                if time.monotonic() - t0 > args.minutes * 60 * 2:
                    print(f"chaos: {len(faults)} faults in twice the time asked; "
                          "stopping", file=sys.stderr)
                    break
                time.sleep(rng.expovariate(1.0 / args.gap))
                kind = rng.choice(KINDS)
                f = chaos.inject(kind)
                f["at_s"] = time.monotonic() - t0
                faults.append(f)
                rec = "UNRECOVERED" if f["recovery_s"] is None else f"{f['recovery_s']:.1f} s"
                print(f"  {len(faults):>4} {f['at_s']:>7.0f}s {kind:<16} {f['detail']:<48} "
                      f"recovered in {rec}, reports lost {f['reports_lost']}", flush=True)
        except KeyboardInterrupt:
            interrupted = True
            print(f"chaos: interrupted after {len(faults)} faults; cleaning up", flush=True)
        wall = time.monotonic() - t0
    except KeyboardInterrupt:
        interrupted = True          # before the first fault: nothing to write
    finally:
        if mon is not None:
            mon.stop_flag.set()
        for s in (agent, ctl):
            if s is not None:
                s.close()
        stop(procs)
        for n in names + ["chaos-park"]:
            if (cg.root / n).exists():
                cg.kill_all(n)
        netns_down()
    if interrupted and not faults:
        print("chaos: interrupted before the first fault", file=sys.stderr)
        return 130
    result = summarise(faults, mon.events, args, wall,
                       {"agent": agent.restarts, "controller": ctl.restarts}, mon.min_headroom)
    result["interrupted"] = interrupted
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "chaos.png")
    t = result["totals"]
    print(f"chaos: {t['faults']} faults in {result['minutes']:.1f} min: step violations "
          f"{t['step_violations']}, below anon + margin {t['below_anon']}, OOM kills "
          f"{t['oom_kills']}, reports lost {t['reports_lost']}, manual restarts "
          f"{t['manual_restarts']}")
    for k, v in result["per_kind"].items():
        med = "-" if v["recovery_median_s"] is None else f"{v['recovery_median_s']:.1f}"
        mx = "-" if v["recovery_max_s"] is None else f"{v['recovery_max_s']:.1f}"
        print(f"  {k:<16} {v['faults']:>4} faults, recovery median {med} s, max {mx} s, "
              f"unrecovered {v['unrecovered']}, reports lost {v['reports_lost']}")
    print(f"wrote {out / 'chaos.json'} and {out / 'chaos.png'}")
    return 0 if t["step_violations"] == t["below_anon"] == t["oom_kills"] == \
        t["manual_restarts"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
