"""`cachepilot agent` (the node daemon on a real host) and `cachepilot
profile` (a one-shot curve of a running cgroup)."""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from cachepilot.core.errors import UserError, unreadable
from cachepilot.core.units import size

log = logging.getLogger("cachepilot.agent")


def register(sub):
    p = sub.add_parser("agent", help="run the node agent on this host",
                       description="Watch the configured cgroups, report every interval, "
                                   "export Prometheus metrics, follow a controller if one "
                                   "is configured.")
    p.add_argument("--config", required=True, help="agent YAML config")
    p.add_argument("--intervals", type=int, help="stop after this many intervals")
    p.add_argument("--interval", type=float, help="override the config's interval_s")
    p.add_argument("--node-id", help="override the config's node_id (a DaemonSet passes "
                                     "the node's name)")
    p.add_argument("--reports", metavar="FILE",
                   help="append each interval's reports to FILE as JSON lines")
    p.add_argument("--stats-only", action="store_true",
                   help="do not load the BPF sampler (cgroup files only)")
    p.set_defaults(func=run_agent)

    q = sub.add_parser("profile", help="one-shot miss-ratio curve of a running cgroup",
                       description="Sample a cgroup's page-cache accesses for a while and "
                                   "print (or save) its miss-ratio curve.")
    q.add_argument("--cgroup", required=True, help="memory cgroup directory (v1 or v2)")
    q.add_argument("--duration", type=float, default=30.0, help="seconds to sample (30)")
    q.add_argument("--warmup", type=float, default=0.0,
                   help="seconds at the start left out of the curve (0)")
    q.add_argument("--rate", type=float, default=0.01, help="SHARDS sampling rate (0.01)")
    q.add_argument("--policies", default="lru", help="comma-separated policies (lru)")
    q.add_argument("--json", metavar="OUT", help="write the curves and counters as JSON")
    q.add_argument("--plot", metavar="OUT.png", help="plot the curves")
    q.set_defaults(func=run_profile)


# -- agent --------------------------------------------------------------------

def report_to_json(r) -> dict:
    d = asdict(r)
    d["curves"] = [c.to_dict() for c in r.curves]
    return d


def run_agent(args) -> int:
    from cachepilot.agent.backends.linux import LinuxBackend
    from cachepilot.agent.config import load_config
    from cachepilot.agent.metrics import AgentMetrics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(args.config)
    if args.interval is not None:
        if args.interval <= 0:
            raise UserError("--interval must be > 0")
        cfg.interval_s = args.interval
    if args.node_id is not None:
        if not args.node_id.strip():
            raise UserError("--node-id must not be empty")
        cfg.node_id = args.node_id
    for root in cfg.roots:
        if not os.path.isdir(root):
            raise UserError(f"{args.config}: roots: {root} is not a directory; make it "
                            f"with `mkdir -p {root}` (as root)")
    try:
        out = open(args.reports, "a", buffering=1) if args.reports else None
    except OSError as err:
        raise UserError(f"--reports {args.reports}: cannot open: {err.strerror}") from None
    backend = LinuxBackend(cfg, start_sampler=not args.stats_only)
    if args.stats_only:
        backend.stats_only_reason = "--stats-only was given"
    metrics = AgentMetrics()
    server = None
    if cfg.prometheus.port:
        try:
            server = metrics.serve(cfg.prometheus.address, cfg.prometheus.port)
        except OSError as err:
            backend.close()
            raise UserError(f"cannot serve Prometheus metrics on "
                            f"{cfg.prometheus.address}:{cfg.prometheus.port}: "
                            f"{err.strerror or err}") from None
        log.info("Prometheus metrics on http://%s:%d/metrics",
                 cfg.prometheus.address, cfg.prometheus.port)
    client = _controller_client(cfg, backend)
    # the controller names this node's tenants: ask before the first interval
    if client is not None and not client.register():
        log.warning("controller: %s; watching nothing until it names this node's "
                    "tenants", client.last_error)
    info = backend.info()
    log.info("node %s: cgroup v%d, %d MiB, cache_ext %s, policies %s%s", info.node_id,
             info.cgroup_version, info.memory_bytes >> 20,
             "present" if info.has_cache_ext else "absent", ",".join(info.policies),
             f"; stats-only: {backend.stats_only_reason}" if backend.stats_only_reason else "")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    done = 0
    next_at = time.monotonic() + cfg.interval_s
    slices = cfg.sampling.slices
    try:
        while not stop.is_set() and (args.intervals is None or done < args.intervals):
            # time slices of the curves: collect() takes the last one
            start = next_at - cfg.interval_s
            ticking, cpu_began = 0.0, time.process_time()
            for k in range(1, slices):
                stop.wait(max(0.0, start + k * cfg.interval_s / slices - time.monotonic()))
                if stop.is_set():
                    break
                began = time.monotonic()
                backend.tick()
                ticking += time.monotonic() - began
            stop.wait(max(0.0, next_at - time.monotonic()))
            if stop.is_set():
                break
            next_at = _next_interval(next_at, cfg.interval_s, time.monotonic())
            began = time.monotonic()
            reports = backend.collect()
            collected = time.monotonic()
            metrics.update(reports, backend)
            if client is not None:
                outcome = client.step(reports)
                if not outcome.connected and outcome.error:
                    log.warning("controller: %s", outcome.error)
            took = time.monotonic() - began
            if ticking + took > cfg.interval_s / 2:
                # feeding the curves and the controller's answer take most
                # of an interval: the next ones start late.  The agent's own
                # CPU time tells a heavy interval (too many policies'
                # miniature simulations for this CPU) from a starved one
                # (the tenants leave the agent little CPU)
                log.warning("busy %.1f s of a %.1f s interval (feeding curves %.1f s, "
                            "last slice and curves %.1f s, controller %.1f s; "
                            "the agent's CPU %.1f s)",
                            ticking + took, cfg.interval_s, ticking, collected - began,
                            took - (collected - began), time.process_time() - cpu_began)
            if out:
                out.write(json.dumps({"time": time.time(),
                                      "reports": [report_to_json(r) for r in reports]}) + "\n")
            for r in reports:
                log.info("%s: %.0f acc/s, miss %.3f, limit %d MiB, file %d MiB, anon %d MiB",
                         r.tenant, r.accesses_per_s, r.miss_ratio, r.limit_bytes >> 20,
                         r.usage_file_bytes >> 20, r.usage_anon_bytes >> 20)
            done += 1
    finally:
        if out:
            out.close()
        if client is not None:
            client.close()      # closes the backend too
        else:
            backend.close()
        if server is not None:
            try:
                server[0].shutdown()
            except (TypeError, AttributeError):
                pass
    return 0


def _next_interval(next_at: float, interval: float, now: float) -> float:
    """When the interval after the one due at `next_at` ends.  An agent
    that fell more than an interval behind (stopped, starved of CPU) skips
    the intervals it missed rather than running them back to back: each
    would bring a directive, and a limit would move several steps within
    a second (the step rule is per interval of time, not per report)."""
    nxt = next_at + interval
    if nxt < now:
        missed = math.ceil((now - nxt) / interval)
        log.warning("%d interval(s) missed (the agent was stopped or starved); "
                    "skipping them", missed)
        nxt += missed * interval
    return nxt


def _controller_client(cfg, backend):
    if cfg.controller is None:
        return None
    try:
        from cachepilot.agent.client import NodeClient
        from cachepilot.protocol.channel import read_identity
    except ImportError as err:
        log.warning("no controller client available (%s); running stand-alone", err)
        return None
    c = cfg.controller
    token = None
    if c.token_file is not None:
        try:
            token = c.token_file.read_text().strip()
        except OSError as err:
            raise UserError(f"controller.token_file: "
                            f"{unreadable(c.token_file, 'token file', err)}") from None
    root = identity = None
    if c.ca_file is not None and not c.insecure:
        try:
            root = c.ca_file.read_bytes()
        except OSError as err:
            raise UserError(f"controller.ca_file: "
                            f"{unreadable(c.ca_file, 'CA certificate', err)}") from None
    if c.cert_file is not None and not c.insecure:
        identity = read_identity(c.cert_file, c.key_file, "node certificate")
    return NodeClient(backend, c.address, token=token, root_cert=root,
                      server_name=c.server_name, insecure=c.insecure, identity=identity,
                      fallbacks=c.fallbacks)


# -- profile ------------------------------------------------------------------

def run_profile(args) -> int:
    from cachepilot.agent import cgroups
    from cachepilot.agent.profile import profile_cgroup
    from cachepilot.agent.sampler import SamplerUnavailable, why_unavailable

    if args.duration <= 0 or args.warmup < 0:
        raise UserError("--duration must be > 0 and --warmup >= 0")
    if not 0 < args.rate <= 1:
        raise UserError(f"--rate must be in (0, 1], got {args.rate}")
    try:
        cgroups.version_of(args.cgroup)
    except cgroups.CgroupError as err:
        raise UserError(str(err)) from None
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    reason = why_unavailable()
    if reason:
        print(f"cachepilot profile: no access sampling ({reason}); "
              "reporting the cgroup's own counters only", file=sys.stderr)
        result = _stats_only_profile(args.cgroup, args.warmup + args.duration)
    else:
        tty = sys.stderr.isatty()

        def progress(elapsed, c, warming):
            if not tty:
                return
            total = args.warmup + args.duration
            sys.stderr.write(f"\r{'warming up' if warming else 'sampling  '} "
                             f"{elapsed:6.1f}/{total:.0f} s  accesses {c.accesses:>12,}  "
                             f"misses {c.inserts:>10,}  sampled {c.sampled:>9,}  "
                             f"drops {c.drops:,}   ")
            sys.stderr.flush()
        try:
            # miniature simulations need a size grid before any access is
            # seen: up to the limit in force, else four times today's usage
            now = cgroups.read_stats(args.cgroup)
            top = now.effective_limit_bytes or max(4 * now.usage_bytes, 1 << 30)
            prof = profile_cgroup(args.cgroup, args.duration, rate=args.rate,
                                  warmup_s=args.warmup, policies=policies,
                                  progress=progress, max_pages=top // 4096)
        except SamplerUnavailable as err:
            raise UserError(str(err)) from None
        except ValueError as err:       # e.g. a policy the engine does not know
            raise UserError(f"--policies: {err}") from None
        except cgroups.CgroupGone as err:
            raise UserError(f"the cgroup went away while profiling: {err}") from None
        if tty:
            sys.stderr.write("\n")
        result = prof.to_json()
        if not result["cgroup"].get("accesses"):
            raise UserError(empty_profile(args.cgroup, args.duration))
    _print_summary(result)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        except OSError as err:
            raise UserError(f"cannot write {args.json}: {err.strerror}") from None
    if args.plot:
        _plot(result, args.plot)
    return 0


def empty_profile(cgroup, seconds: float) -> str:
    """What to check when a profile saw no page-cache access at all."""
    return (f"{cgroup}: no page-cache accesses in {seconds:g} s of sampling; nothing to "
            f"draw a curve from. Check that the workload's processes are in this cgroup "
            f"(its cgroup.procs), that they read files (anonymous memory is not page "
            f"cache) and that they run during --duration")


def _stats_only_profile(path, seconds) -> dict:
    from cachepilot.agent import cgroups
    before = cgroups.read_stats(path)
    time.sleep(seconds)
    after = cgroups.read_stats(path)
    return {"curves": [], "cgroup": {
        "path": path, "id": cgroups.cgroup_id(path), "version": after.version,
        "duration_s": seconds, "accesses": None,
        "inserts": after.pgpgin - before.pgpgin if after.version == 1 else None,
        "refaults": after.refaults - before.refaults,
        "limit_bytes": after.effective_limit_bytes, "usage_bytes": after.usage_bytes,
        "usage_file_bytes": after.file_bytes, "usage_anon_bytes": after.anon_bytes,
        "stats_only": True}}


def _print_summary(result):
    cg = result["cgroup"]
    print(f"{cg['path']}: {cg.get('accesses')} accesses, {cg.get('inserts')} misses "
          f"in {cg['duration_s']:.1f} s; file {cg['usage_file_bytes'] >> 20} MiB, "
          f"anon {cg['usage_anon_bytes'] >> 20} MiB, limit "
          f"{(cg['limit_bytes'] >> 20) if cg['limit_bytes'] else 'none'}"
          f"{' MiB' if cg['limit_bytes'] else ''}")
    nf = result.get("nonfile")
    if nf:
        print(f"  limit = cache + {nf['offset_bytes'] / 2**20:.1f} MiB non-file: anonymous "
              f"and shared memory, and the mapped file pages its processes touched while "
              f"profiled ({nf['mapped_referenced_bytes'] / 2**20:.1f} MiB touched; "
              f"{nf['mapped_file_bytes'] / 2**20:.1f} MiB mapped are charged here); near "
              f"that floor "
              f"the real miss ratio lies between the curves at "
              f"{nf['floor_bytes'] / 2**20:.1f} MiB (anonymous and shared memory alone) "
              f"and {nf['peak_bytes'] / 2**20:.1f} MiB (all of it): --json's band")
    for c in result["curves"]:
        pts = list(zip(c["sizes"], c["miss_ratio"]))
        step = max(1, len(pts) // 8)
        shown, last = [], None
        for s, m in pts[::step]:
            label = size(s * 4096)
            if label != last:          # two sizes that round alike are shown once
                shown.append(f"{label}: {m:.3f}")
                last = label
        row = "  ".join(shown)
        print(f"  {c['policy']:>8} ({c['method']}): {row}")


def _plot(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    from cachepilot.models.mrc import MRC
    from cachepilot.models.plot import same_groups, style
    band = result.get("band") or {}
    edges = [{c["policy"]: c for c in band.get(k, [])} for k in ("low", "high")]
    banded = False
    curves = [MRC.from_dict(c) for c in result["curves"]]
    groups = same_groups(curves)
    for i, (c, names) in enumerate(groups):
        pts = [(s * 4096 / 2**20, m) for s, m in zip(c.sizes, c.miss_ratio) if s > 0]
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=" = ".join(names),
                        **style(i))
        for edge in edges:
            # where the curve meets the non-file floor: what reclaim keeps
            # of the cgroup's other memory decides between the two edges
            b = edge.get(c.policy)
            if b is not None and list(b["sizes"]) != list(c.sizes):
                ax.plot([s * 4096 / 2**20 for s in b["sizes"] if s > 0],
                        [m for s, m in zip(b["sizes"], b["miss_ratio"]) if s > 0],
                        color=line.get_color(), ls=":", lw=1,
                        label=None if banded else "band: what reclaim keeps of the "
                                                  "non-file memory (dotted)")
                banded = True
    same = [" and ".join(n) for _, n in groups if len(n) > 1]
    if same:
        fig.text(0.01, 0.01, "identical, drawn once: " + "; ".join(same), fontsize=7)
    ax.set_xscale("log")        # curves span MiB to the node's memory
    ax.set_xlabel("memory limit (MiB, log scale)")
    ax.set_ylabel("miss ratio")
    ax.set_ylim(0, 1.02)
    ax.set_title(result["cgroup"]["path"])
    if result["curves"]:
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror}") from None
    finally:
        plt.close(fig)
