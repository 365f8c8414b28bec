"""`cachepilot run`: the controller and its sim nodes in one process.

The controller serves real gRPC on a loopback port; every sim node talks to
it through its own NodeClient, exactly as a remote agent would.  Nodes step
in lock-step on the virtual clock (no waiting for wall-clock intervals), so
a run of many intervals takes seconds and is reproducible for a seed.

After the autopilot run, the same sim hosts run again with the same seed
under a static equal split of each node's memory and the kernel default
policy: the baseline the summary compares against.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from cachepilot.agent.client import NodeClient
from cachepilot.controller.config import load_config
from cachepilot.controller.service import serve
from cachepilot.controller.store import MemoryStore, SQLiteStore
from cachepilot.core.errors import UserError
from cachepilot.protocol.types import Directive
from cachepilot.sim.backend import SimBackend

log = logging.getLogger("cachepilot.run")

BASELINE_POLICY = "linux"
DEFAULT_INTERVALS = 30


# -- the command ----------------------------------------------------------------
def register(subparsers):
    p = subparsers.add_parser("run", help="controller + sim nodes in one process (the demo)")
    p.add_argument("--config", required=True)
    p.add_argument("--intervals", type=int, default=None,
                   help="control intervals to run (default 30)")
    p.add_argument("--json", dest="json_out", help="write the results as JSON here")
    p.add_argument("--plots", default="out/run",
                   help="write PNG plots into this folder (default out/run)")
    p.add_argument("--no-plots", action="store_true", help="write no plots")
    p.add_argument("--no-live", action="store_true", help="no live table (headless)")
    p.add_argument("--seed", type=int, help="override the nodes' seeds")
    p.add_argument("--record", metavar="DIR",
                   help="keep a recording of the controller's rounds in DIR, for "
                        "`cachepilot replay` (one already there is replaced)")
    p.add_argument("--curve-rate", type=float, default=1.0, metavar="R",
                   help="sample each tenant's accesses at rate R for its curves, as an "
                        "agent does (its default is 0.01); default 1: exact curves")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.intervals is not None and args.intervals < 1:
        raise UserError(f"--intervals {args.intervals}: expected at least 1")
    if not 0 < args.curve_rate <= 1:
        raise UserError(f"--curve-rate {args.curve_rate:g}: expected a rate in (0, 1]")
    cfg = load_config(args.config)
    bad = [n.name for n in cfg.nodes if n.backend != "sim"]
    if bad:
        raise UserError(f"{args.config}: run embeds sim nodes only; node(s) "
                        f"{', '.join(bad)} use another backend (start `cachepilot controller` "
                        f"and agents instead)")
    plots = None if args.no_plots else args.plots
    if plots and Path(plots).exists() and not Path(plots).is_dir():
        raise UserError(f"--plots {plots}: not a folder")
    intervals = DEFAULT_INTERVALS if args.intervals is None else args.intervals
    run_command(cfg, intervals=intervals, json_out=args.json_out,
                plots=plots, live=not args.no_live, seed=args.seed, record=args.record,
                curve_rate=args.curve_rate)
    return 0


# -- the two runs ------------------------------------------------------------------
def run_autopilot(cfg, intervals: int, seed: int | None = None, on_interval=None,
                  engine=None, record: str | None = None, curve_rate: float = 1.0):
    """Controller + sim nodes over loopback gRPC.  Returns per-tenant history.
    `record`: a folder for a recording of the controller's rounds;
    `curve_rate`: the rate the sim nodes sample accesses at for curves."""
    run_cfg = cfg.model_copy(deep=True)
    spec = run_cfg.controller
    root = spec.client_root_cert()
    # Loopback only, on a free port: the demo never listens beyond this host.
    # The nodes step in lock-step on a virtual clock, so a slow interval in
    # wall time says nothing about a node being lost: no wall-clock watch.
    # A run keeps its state in memory unless the config names a state path.
    store = SQLiteStore(spec.state_path) if spec.state_path is not None else MemoryStore()
    served = serve(run_cfg, listen="127.0.0.1:0", engine=engine, watch_lost=False,
                   store=store, record=record)
    target = f"{'localhost' if root else '127.0.0.1'}:{served.port}"
    clients = {}
    try:
        for node in run_cfg.nodes:
            backend = SimBackend(run_cfg, node.name, seed=_node_seed(node, seed),
                                 curve_rate=curve_rate)
            clients[node.name] = NodeClient(backend, target, token=spec.token_value(),
                                            root_cert=root, insecure=spec.insecure)
        history = {t.name: [] for t in run_cfg.tenants}
        for i in range(intervals):
            for name, client in clients.items():
                out = client.step()
                if not out.connected:
                    raise UserError(f"run: node {name} could not reach the embedded "
                                    f"controller: {out.error}")
                _record(history, client.backend, i)
            if on_interval:
                on_interval(i, history, served.controller)
        return history, list(served.controller.log), served.controller
    finally:
        for c in clients.values():
            c.close()
        served.stop(0)


def run_static_equal(cfg, intervals: int, seed: int | None = None):
    """The baseline: each node's memory split equally, kernel default policy,
    no controller; same seeds as the autopilot run."""
    return _run_static(cfg, intervals, seed, "static-equal",
                       lambda node, specs, t: node.memory_bytes // len(specs))


def run_static_whole(cfg, intervals: int, seed: int | None = None):
    """Each tenant with its whole node's memory, less the other tenants'
    floors, kernel default policy; same seeds.  The sim's tenants do not
    share a cache, so one run gives each what memory can do for it: an SLO
    missed here in an interval could not be held in it whatever the memory
    (a cache still cold, a burst of new pages), and bench_scenarios reports
    those intervals apart."""
    def whole(node, specs, t):
        return node.memory_bytes - sum(o.floor_bytes for o in specs if o is not t)
    return _run_static(cfg, intervals, seed, "static-whole", whole)


def _run_static(cfg, intervals, seed, why, limit_of):
    history = {t.name: [] for t in cfg.tenants}
    for node in cfg.nodes:
        backend = SimBackend(cfg, node.name, seed=_node_seed(node, seed), curves=False)
        specs = cfg.tenants_on(node.name)
        limits = {t.name: limit_of(node, specs, t) for t in specs}
        results = backend.apply([Directive(t.name, limits[t.name], BASELINE_POLICY, why)
                                 for t in specs])
        for r in results:
            if not r.ok or r.applied_limit_bytes != limits[r.tenant]:
                # A floor or ceiling that forbids the limit: say so rather
                # than quietly comparing against something else.
                log.warning("%s: %s: %s", why, r.tenant, r.message)
        for i in range(intervals):
            backend.collect()
            _record(history, backend, i)
        backend.close()
    return history


def _node_seed(node, seed):
    return node.seed if seed is None else seed * 1000 + node.seed


def _record(history, backend, interval):
    for name, t in backend.tenants.items():
        if len(t.history) > len(history[name]):
            h = dict(t.history[-1])
            h["interval"] = interval + 1
            history[name].append(h)


# -- summaries ---------------------------------------------------------------------
def summarise(cfg, history, warmup: int):
    """The JSON shape of issue item 7 (plus per-interval history)."""
    tenants, total = [], 0.0
    for t in cfg.tenants:
        rows = history[t.name]
        counted = rows[warmup:]
        tput = sum(r["throughput"] for r in counted) / max(1, len(counted))
        total += tput
        slo = t.slo.min_throughput if t.slo else None
        met = None
        first_met = None
        if slo is not None:
            met = sum(r["throughput"] >= slo for r in counted) / max(1, len(counted))
            first_met = next((r["interval"] for r in rows if r["throughput"] >= slo), None)
        last = rows[-1] if rows else {}
        tenants.append({
            "name": t.name, "node": t.node, "slo": slo, "met_fraction": met,
            "first_met_interval": first_met, "throughput": tput,
            "limit_bytes": last.get("limit_bytes"), "policy": last.get("policy"),
            "history": rows})
    return tenants, total


def build_result(cfg, intervals, seed, auto_hist, base_hist, decisions=(), latencies=()):
    # a run no longer than the warm-up is summarised over all its intervals
    warmup = cfg.control.warmup_intervals if intervals > cfg.control.warmup_intervals else 0
    auto, auto_total = summarise(cfg, auto_hist, warmup)
    base, base_total = summarise(cfg, base_hist, warmup)
    return {
        "config": str(cfg.source) if cfg.source else None,
        "intervals": intervals, "seed": seed, "warmup_intervals": warmup,
        "interval_s": cfg.control.interval_s,
        "tenants": auto, "aggregate_throughput": auto_total,
        "baseline": {"name": "static-equal", "policy": BASELINE_POLICY, "tenants": base},
        "baseline_aggregate_throughput": base_total,
        "throughput_ratio": auto_total / base_total if base_total else None,
        "decision_seconds": {"rounds": len(latencies),
                             "median": float(np.median(latencies)) if latencies else None,
                             "max": max(latencies) if latencies else None},
        "decisions": [{"round": e.round, "node": e.node, "tenant": e.tenant, "kind": e.kind,
                       "message": e.message} for e in decisions
                      if e.kind not in ("register",)][:2000],
    }


# -- presentation ------------------------------------------------------------------
def _fmt_bytes(n):
    if n is None:
        return "-"
    return f"{n / (1 << 20):.0f} MiB"


def tenant_table(cfg, history, title):
    from rich.table import Table
    table = Table(title=title)
    for col in ("tenant", "node", "phase", "SLO ops/s", "ops/s", "SLO", "limit", "policy"):
        table.add_column(col, justify="right" if col in ("SLO ops/s", "ops/s", "limit")
                         else "left")
    for t in cfg.tenants:
        rows = history[t.name]
        if not rows:
            continue
        r = rows[-1]
        slo = t.slo.min_throughput if t.slo else None
        ok = "-" if slo is None else ("[green]met[/]" if r["throughput"] >= slo
                                      else "[red]MISSED[/]")
        table.add_row(t.name, t.node, str(r["phase"]), "-" if slo is None else f"{slo:,.0f}",
                      f"{r['throughput']:,.0f}", ok, _fmt_bytes(r["limit_bytes"]), r["policy"])
    return table


def summary_table(result):
    from rich.table import Table
    warmup = result["warmup_intervals"]
    counted = f"intervals after warm-up ({warmup})" if warmup else "all intervals"
    table = Table(title=f"autopilot vs static equal split ({BASELINE_POLICY}), {counted}")
    for col in ("tenant", "SLO ops/s", "met (auto)", "met (equal)", "ops/s (auto)",
                "ops/s (equal)", "limit", "policy"):
        table.add_column(col, justify="left" if col in ("tenant", "policy") else "right")
    base = {t["name"]: t for t in result["baseline"]["tenants"]}
    for t in result["tenants"]:
        b = base[t["name"]]
        pct = (lambda v: "-" if v is None else f"{100 * v:.0f}%")
        table.add_row(t["name"], "-" if t["slo"] is None else f"{t['slo']:,.0f}",
                      pct(t["met_fraction"]), pct(b["met_fraction"]),
                      f"{t['throughput']:,.0f}", f"{b['throughput']:,.0f}",
                      _fmt_bytes(t["limit_bytes"]), t["policy"])
    table.add_row("[b]aggregate[/]", "", "", "", f"[b]{result['aggregate_throughput']:,.0f}[/]",
                  f"{result['baseline_aggregate_throughput']:,.0f}", "",
                  f"[b]{result['throughput_ratio']:.2f}x[/]")
    return table


def write_plots(cfg, result, folder: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    tenants = result["tenants"]
    policies = sorted({r["policy"] for t in tenants for r in t["history"]})
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for t in tenants:
        xs = [r["interval"] for r in t["history"]]
        line, = axes[0].plot(xs, [r["limit_bytes"] / (1 << 20) for r in t["history"]],
                             label=f"{t['name']} ({t['node']})")
        axes[1].plot(xs, [r["throughput"] for r in t["history"]], color=line.get_color())
        if t["slo"]:
            axes[1].axhline(t["slo"], color=line.get_color(), linestyle=":", linewidth=0.8,
                            label=f"{t['name']}'s SLO")
        axes[2].step(xs, [policies.index(r["policy"]) + 0.03 * tenants.index(t)
                          for r in t["history"]], where="post", color=line.get_color())
    axes[0].set_ylabel("limit (MiB)")
    axes[1].set_ylabel("throughput (ops/s)")
    axes[1].set_yscale("log")
    axes[2].set_yticks(range(len(policies)), policies)
    axes[2].set_ylabel("policy")
    axes[2].set_xlabel("control interval")
    axes[0].legend(fontsize=7, ncol=2)
    if any(t["slo"] for t in tenants):
        axes[1].legend(fontsize=7, ncol=2, title="dotted: SLOs", title_fontsize=7)
    axes[0].set_title(f"cachepilot run: {result['throughput_ratio']:.2f}x the static "
                      f"equal split")
    fig.tight_layout()
    path = folder / "run_timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


# -- the command ----------------------------------------------------------------------
def _check_writable(folder: Path, option: str, given) -> None:
    """Create `folder` if needed and prove a file can be written in it."""
    import tempfile
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cachepilot-probe-"):
            pass
    except OSError as err:
        raise UserError(f"{option} {given}: cannot write there: "
                        f"{err.strerror or err}") from None


def run_command(cfg, intervals=DEFAULT_INTERVALS, json_out=None, plots=None, live=True,
                seed=None, console=None, record=None, curve_rate: float = 1.0) -> dict:
    from rich.console import Console
    console = console or Console()
    if not console.is_terminal:
        # Headless (a pipe, a log): do not squeeze the tables to 80 columns.
        console = Console(width=120)
    if intervals < 1:
        raise UserError("run: --intervals must be at least 1")
    # find out now, not after minutes of simulation, that an output is unwritable
    if json_out:
        _check_writable(Path(json_out).parent, "--json", json_out)
        if Path(json_out).is_dir():
            raise UserError(f"--json {json_out}: is a directory; give a file name")
    if plots:
        _check_writable(Path(plots), "--plots", plots)
    if record:
        _check_writable(Path(record), "--record", record)
    if cfg.controller.insecure:
        console.print("[yellow]note:[/] the embedded controller serves plaintext gRPC on "
                      "127.0.0.1 only (config says insecure: true)")
    started = time.monotonic()
    live_ctx = None
    if live:
        from rich.live import Live
        live_ctx = Live(console=console, refresh_per_second=8, transient=False)
        live_ctx.start()

    def on_interval(i, history, controller):
        if live_ctx is not None:
            live_ctx.update(tenant_table(cfg, history, f"interval {i + 1}/{intervals}  "
                                         f"(decision rounds: {controller.rounds})"))
    try:
        auto_hist, decisions, controller = run_autopilot(cfg, intervals, seed, on_interval,
                                                         record=record, curve_rate=curve_rate)
    finally:
        if live_ctx is not None:
            live_ctx.stop()
            console.print()     # the summary starts on a line of its own
    base_hist = run_static_equal(cfg, intervals, seed)
    result = build_result(cfg, intervals, seed, auto_hist, base_hist, decisions,
                          list(controller.latencies))
    result["wall_seconds"] = time.monotonic() - started
    console.print(summary_table(result))
    if json_out:
        try:
            Path(json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(json_out).write_text(json.dumps(result, indent=1))
        except OSError as err:
            raise UserError(f"--json {json_out}: cannot write: {err.strerror}") from None
        console.print(f"wrote {json_out}")
    if plots:
        try:
            written = write_plots(cfg, result, Path(plots))
        except OSError as err:
            raise UserError(f"--plots {plots}: cannot write: {err.strerror}") from None
        for p in written:
            console.print(f"wrote {p}")
    if record:
        console.print(f"recorded the controller's rounds in {record} "
                      f"(cachepilot replay {record})")
    return result
