"""`cachepilot mrc`: miss-ratio curves of a trace file.

    cachepilot mrc TRACE [--format F] [--policy lru,fifo,...|all]
                   [--method exact|shards|minisim|full]
                   [--rate R | --max-samples S] [--sizes a,b,c | auto]
                   [--json OUT] [--plot OUT.png]

Methods come in pairs: `exact` (Mattson stack distances) and `shards` are
LRU-only; asked for with other policies, those get the matching policy-
runtime method (`exact` -> `full` simulation, `shards` -> `minisim`).
`minisim` and `full` run every named policy, LRU included.

Counts in the JSON: `requests` = trace requests (text lines, binary records);
`accesses` = the 4 KiB page accesses they expand to (miss ratios are misses
per page access); `unique` = distinct pages (an estimate, marked by
`unique_estimated`, when only sampled methods ran).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models.estimators import BY_NAME, describe, pick_estimator
from cachepilot.models.exact import ExactLRU, auto_sizes, parse_sizes
from cachepilot.models.mrc import MRC
from cachepilot.models.shards import Shards, rate_threshold, sample_mask_index
from cachepilot.models.traces import open_trace
from cachepilot.models.traces.readers import formats_help, normalise_format

METHODS = ("exact", "shards", "minisim", "full")
DEFAULT_MINISIM_RATE = 0.01
DEFAULT_MAX_SAMPLES = 8192
TABLE_ROWS = 24
FEED_SLICE = 1 << 18         # keys handed to the engines at a time


def register(subparsers):
    register_mrc(subparsers)
    register_trace(subparsers)


def register_mrc(subparsers):
    p = subparsers.add_parser(
        "mrc", help="miss-ratio curves of a trace",
        description="Miss-ratio curves of a trace, for one or more eviction "
                    "policies.  Sizes are in 4 KiB pages.  JSON counts: "
                    "requests = trace requests (lines/records), accesses = "
                    "page accesses they expand to, unique = distinct pages.")
    p.add_argument("trace", help="trace file (txt, csv, lis, oracleGeneral, "
                                 "cpaccess; optionally .zst)")
    p.add_argument("--format", help=f"trace format: {formats_help()} "
                                    "(default: detected)")
    p.add_argument("--policy", default="lru",
                   help="comma-separated policies, or 'all' (default: lru)")
    p.add_argument("--method", default=None,
                   help="exact | shards | minisim | full (default: exact for "
                        "lru, minisim for others; shards if --rate/--max-samples)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rate", type=str, help="sampling rate in (0, 1]")
    g.add_argument("--max-samples", type=str,
                   help="fixed-size SHARDS: at most S sampled pages")
    p.add_argument("--estimator", default=None,
                   help="how SHARDS turns its sample into a curve: "
                        + describe().replace("%", "%%"))
    p.add_argument("--sizes", default="auto",
                   help="comma-separated sizes in pages, or 'auto' "
                        "(~50 log-spaced from 1%% to 100%% of the unique pages)")
    p.add_argument("--json", metavar="OUT", help="write the curves as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a PNG, one line per curve")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_mrc)


# -- argument checking ------------------------------------------------------------
def accepted_policies() -> list[str]:
    try:
        from cachepilot.models import runtime
        others = list(runtime.available_policies())
    except ImportError:
        others = []
    return ["lru"] + [p for p in others if p != "lru"]


def parse_policies(text: str) -> list[str]:
    accepted = accepted_policies()
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not names:
        raise UserError(f"no policy given; accepted: {', '.join(accepted)}, all")
    if "all" in names:
        return accepted
    for name in names:
        if name not in accepted:
            raise UserError(f"unknown policy {name!r}; accepted: "
                            f"{', '.join(accepted)}, all")
    return list(dict.fromkeys(names))


def parse_number(text, name, kind, lo, hi):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise UserError(f"--{name} must be a number, not {text!r}") from None
    if not lo <= value <= hi:
        raise UserError(f"--{name} must be within [{lo}, {hi}], not {text}")
    return value


class Plan:
    """Which engine computes which curve."""

    def __init__(self, args):
        self.policies = parse_policies(args.policy)
        method = args.method.strip().lower() if args.method else None
        if method is not None and method not in METHODS:
            raise UserError(f"unknown method {args.method!r}; accepted: "
                            f"{', '.join(METHODS)}")
        self.rate = (None if args.rate is None else
                     parse_number(args.rate, "rate", float, 1e-9, 1.0))
        if self.rate is not None and self.rate <= 0:
            raise UserError("--rate must be positive")
        self.max_samples = (None if args.max_samples is None else
                            parse_number(args.max_samples, "max-samples", int, 1, 1 << 40))
        sampled = self.rate is not None or self.max_samples is not None
        if method == "exact" and sampled:
            raise UserError("--rate/--max-samples go with --method shards or minisim")
        if method in ("minisim", "full") and self.max_samples is not None:
            raise UserError(f"--method {method} takes --rate, not --max-samples")
        if method == "full" and self.rate is not None:
            raise UserError("--method full simulates every access; it takes no --rate")
        # exact and shards are LRU-only; other policies get their runtime
        # counterpart: exact <-> full simulation, shards <-> miniature sims.
        lru_method = method or ("shards" if sampled else "exact")
        other_method = {None: "minisim", "exact": "full", "shards": "minisim",
                        "minisim": "minisim", "full": "full"}[method]
        self.methods = {p: (lru_method if p == "lru" else other_method)
                        for p in self.policies}
        if self.methods.get("lru") == "shards" and not sampled:
            self.max_samples = DEFAULT_MAX_SAMPLES
        self.minisim_rate = self.rate or DEFAULT_MINISIM_RATE
        self.estimator = None
        if args.estimator is not None:
            try:
                self.estimator = pick_estimator(args.estimator)
            except ValueError as err:
                raise UserError(str(err)) from None
            if self.methods.get("lru") != "shards":
                raise UserError("--estimator goes with SHARDS (--method shards, "
                                "--rate or --max-samples for lru)")
            if BY_NAME[self.estimator].fixed_rate_only and self.max_samples is not None:
                raise UserError(f"--estimator {self.estimator} needs a fixed rate (--rate R), "
                                "not a fixed size (--max-samples)")
        self.sizes = parse_sizes(args.sizes)

    def uses(self, method):
        return [p for p, m in self.methods.items() if m == method]


# -- running ----------------------------------------------------------------------
class Progress:
    """A progress bar on stderr (bytes of the trace file), only on a tty."""

    def __init__(self, trace, label, enabled):
        self.trace, self.bar = trace, None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, Progress as Bar, TextColumn,
                                       TimeRemainingColumn)
            self.bar = Bar(TextColumn(label), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                           TextColumn("{task.fields[acc]} accesses"), TimeRemainingColumn(),
                           console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task(label, total=max(1, trace.size_bytes), acc=0)
            self.bar.start()

    def update(self, done_bytes, accesses):
        if self.bar:
            self.bar.update(self.task, completed=done_bytes, acc=f"{accesses:,}")

    def close(self):
        if self.bar:
            self.bar.stop()


def one_pass(trace, label, progress, consumers):
    bar = Progress(trace, label, progress)
    before_bytes, fed = 0, 0
    try:
        for keys, tids in trace.chunks_with_tids():
            # Reader chunks can be large; feed them in slices so that the bar
            # moves (by interpolating the file position) during slow methods.
            chunk_bytes = trace.bytes_read - before_bytes
            for lo in range(0, len(keys), FEED_SLICE):
                hi = min(len(keys), lo + FEED_SLICE)
                k, t = keys[lo:hi], (None if tids is None else tids[lo:hi])
                for feed in consumers:
                    feed(k, t)
                fed += hi - lo
                bar.update(before_bytes + chunk_bytes * hi / len(keys), fed)
            before_bytes = trace.bytes_read
    finally:
        bar.close()
    if trace.accesses == 0:
        raise UserError(f"{trace.path}: the trace holds no page accesses "
                        f"(accepted formats: {formats_help()})")


def compute(trace, plan: Plan, progress: bool = True) -> dict:
    """Every requested curve, in at most two passes over the trace."""
    from_sample = trace.threshold != rate_threshold(1.0)   # a sampled cpaccess file
    exact = None
    need_unique_first = plan.sizes is None and (plan.uses("minisim") or plan.uses("full"))
    if plan.uses("exact") or need_unique_first:
        exact = ExactLRU() if not from_sample else Shards(rate=trace.rate)
        scale = 1.0 / trace.rate        # a sampled file stands for more accesses
        one_pass(trace, "exact LRU", progress,
                 [lambda k, t: exact.feed(k) if not from_sample
                  else exact.feed(k, len(k) * scale)])
    if from_sample and exact is not None and trace.tallied:
        exact.accesses = trace.tallied      # the file says how many in all
    unique_estimated = from_sample
    unique = None if exact is None else (
        exact.unique if not from_sample else int(round(exact.unique_estimate)))
    requests, accesses = trace.requests, trace.accesses

    shards = None
    if plan.uses("shards"):
        shards = Shards(plan.rate, plan.max_samples, estimator=plan.estimator)
    sizes = plan.sizes
    if sizes is None and unique is not None:
        sizes = auto_sizes(unique)
    minisim = full = None
    consumers = []
    if shards is not None:
        scale = 1.0 / trace.rate
        consumers.append(lambda k, t: shards.feed(k, len(k) * scale))
    if plan.uses("minisim"):
        from cachepilot.models import runtime
        minisim = runtime.MiniSim(plan.uses("minisim"), sizes, plan.minisim_rate)
        thr = minisim.threshold

        per_key = 1.0 / trace.rate      # accesses each key stands for

        def feed_minisim(k, t):
            if not from_sample:         # the full stream: positions are known
                minisim.feed_unsampled(k, t)
                return
            idx = sample_mask_index(k, thr)
            minisim.feed(k[idx], None if t is None else t[idx],
                         accesses=int(round(len(k) * per_key)))
        consumers.append(feed_minisim)
    if plan.uses("full"):
        from cachepilot.models import runtime
        full = {(p, int(s)): runtime.Cache(p, int(s))
                for p in plan.uses("full") for s in sizes}
        full_misses = {k: 0 for k in full}

        def feed_full(k, t):
            for key, cache in full.items():
                full_misses[key] += cache.access(k, t)
        consumers.append(feed_full)
    counter = None
    if consumers and unique is None and shards is None:
        counter = ExactLRU() if not from_sample else Shards(rate=trace.rate)
        # a sampled file's keys stand for 1/rate accesses each: saying so
        # keeps Shards from taking them for the whole stream
        consumers.append(lambda k, t: counter.feed(k) if not from_sample
                         else counter.feed(k, len(k) / trace.rate))
    if consumers:
        one_pass(trace, "curves", progress, consumers)
        requests, accesses = trace.requests, trace.accesses
    if from_sample and trace.tallied:     # the file says how many in all
        if shards is not None:
            shards.accesses = trace.tallied
        if minisim is not None:
            minisim.accesses = trace.tallied
    if counter is not None:
        unique = counter.unique if not from_sample else int(round(counter.unique_estimate))

    if shards is not None and unique is None:
        unique, unique_estimated = int(round(shards.unique_estimate)), True
    if sizes is None:
        sizes = auto_sizes(unique)

    curves = []
    for policy in plan.policies:
        method = plan.methods[policy]
        if method == "exact":
            curve = exact.mrc(sizes)
            if from_sample:
                curve.method = "shards"
        elif method == "shards":
            curve = shards.mrc(sizes)
        elif method == "minisim":
            curve = next(c for c in minisim.curves() if c.policy == policy)
        else:
            ratios = [full_misses[(policy, int(s))] / accesses for s in sizes]
            curve = MRC(sizes, np.array(ratios), policy, "full", 1.0,
                        {"accesses": int(accesses)})
        curves.append(curve)
    return {"trace": str(trace.path), "format": trace.format,
            "requests": int(requests), "accesses": int(accesses),
            "unique": int(unique), "unique_estimated": bool(unique_estimated),
            "curves": curves}


def print_table(result, out=None):
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    curves = result["curves"]
    est = " (estimated)" if result["unique_estimated"] else ""
    title = escape(f"{result['trace']} ({result['format']}): {result['requests']:,} requests, "
             f"{result['accesses']:,} page accesses, {result['unique']:,} unique pages{est}")
    table = Table(title=title, title_justify="left")
    table.add_column("size (pages)", justify="right")
    table.add_column("MiB", justify="right")
    for c in curves:
        table.add_column(f"{c.policy} {c.method}", justify="right")
    sizes = curves[0].sizes
    rows = range(len(sizes))
    if len(sizes) > TABLE_ROWS:
        rows = sorted(set(np.linspace(0, len(sizes) - 1, TABLE_ROWS).round().astype(int)))
    for i in rows:
        table.add_row(f"{sizes[i]:,}", f"{sizes[i] * 4096 / 2**20:,.1f}",
                      *[f"{c.miss_ratio[i]:.4f}" for c in curves])
    Console(file=out or sys.stdout, width=max(100, 24 + 16 * len(curves))).print(table)


def to_json(result) -> dict:
    doc = dict(result)
    doc["curves"] = [{"policy": c.policy, "method": c.method, "rate": c.rate,
                      "sizes": c.sizes.tolist(),
                      "miss_ratio": [round(float(v), 12) for v in c.miss_ratio]}
                     for c in result["curves"]]
    doc["counts"] = ("requests = trace requests (lines or records); accesses = "
                     "4 KiB page accesses (miss-ratio denominator); unique = "
                     "distinct pages; sizes in pages")
    return doc


def run_mrc(args) -> int:
    normalise_format(args.format)             # unknown format: one clear line
    plan = Plan(args)
    trace = open_trace(args.trace, args.format)
    started = time.perf_counter()
    result = compute(trace, plan, progress=not args.no_progress)
    elapsed = time.perf_counter() - started
    print_table(result)
    print(f"{result['accesses']:,} accesses in {elapsed:.2f} s", file=sys.stderr)
    for c in result["curves"]:
        asked = c.meta.get("estimator_asked")
        if asked and asked != c.meta.get("estimator"):
            print(f"note: {c.policy} {c.method}: the {asked!r} estimator needs a sketch of "
                  f"every access, which a sampled file does not hold; used "
                  f"{c.meta.get('estimator')!r}", file=sys.stderr)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(to_json(result), indent=1) + "\n")
        except OSError as err:
            raise UserError(f"cannot write {args.json}: {err.strerror}") from None
    if args.plot:
        from cachepilot.models.plot import plot_curves
        try:
            plot_curves(result["curves"], args.plot,
                        title=f"{Path(result['trace']).name}: {result['accesses']:,} accesses",
                        unique=result["unique"])
        except OSError as err:
            raise UserError(f"cannot write {args.plot}: {err.strerror}") from None
    return 0


# -- `cachepilot trace`: look at a trace, or write a synthetic one ----------------
GENERATORS = ("zipf", "uniform", "scan", "loop", "get-scan")


def register_trace(subparsers):
    p = subparsers.add_parser("trace", help="inspect a trace or write a synthetic one")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    sub.required = True
    info = sub.add_parser("info", help="format, requests, page accesses, unique pages")
    info.add_argument("trace")
    info.add_argument("--format", help=f"trace format: {formats_help()}")
    info.set_defaults(func=run_trace_info)
    gen = sub.add_parser("gen", help="write a seeded synthetic trace "
                                     "(.txt, .cpa for the record format, .zst to compress)")
    gen.add_argument("kind", help=", ".join(GENERATORS))
    gen.add_argument("-o", "--output", required=True)
    gen.add_argument("--keys", default="100000", help="distinct pages (footprint)")
    gen.add_argument("--count", default="1000000", help="accesses to write")
    gen.add_argument("--skew", default="1.0", help="zipf skew (zipf, get-scan)")
    gen.add_argument("--scan-fraction", default="0.3", help="get-scan: share of scan requests")
    gen.add_argument("--scan-pages", default="1024", help="get-scan: pages per scan run")
    gen.add_argument("--seed", default="0")
    gen.set_defaults(func=run_trace_gen)


def run_trace_info(args) -> int:
    normalise_format(args.format)
    trace = open_trace(args.trace, args.format)
    engine = ExactLRU() if trace.threshold == rate_threshold(1.0) else Shards(rate=trace.rate)
    for keys in trace.chunks():
        if isinstance(engine, ExactLRU):
            engine.feed(keys)
        else:       # sampled records: each stands for 1/rate accesses
            engine.feed(keys, len(keys) / trace.rate)
    unique = engine.unique if isinstance(engine, ExactLRU) else round(engine.unique_estimate)
    info = {"trace": str(trace.path), "format": trace.format,
            "compressed": trace.compressed, "requests": trace.requests,
            "accesses": trace.accesses, "unique": int(unique),
            "footprint_mib": round(int(unique) * 4096 / 2**20, 1)}
    if trace.threshold != rate_threshold(1.0):
        info["sampling_rate"] = trace.rate
        info["unique_estimated"] = True
    if trace.tallied is not None:
        info["tallied_accesses"] = trace.tallied
    for key, value in info.items():
        print(f"{key:18s} {value}")
    return 0


def run_trace_gen(args) -> int:
    from cachepilot.models import generators as gen
    from cachepilot.models.traces import records
    kind = args.kind.strip().lower()
    if kind not in GENERATORS:
        raise UserError(f"unknown generator {args.kind!r}; accepted: {', '.join(GENERATORS)}")
    n_keys = parse_number(args.keys, "keys", int, 1, 1 << 40)
    count = parse_number(args.count, "count", int, 1, 1 << 40)
    skew = parse_number(args.skew, "skew", float, 0.0, 10.0)
    seed = parse_number(args.seed, "seed", int, 0, (1 << 63) - 1)
    stream = {"zipf": lambda: gen.zipf(n_keys, skew, seed),
              "uniform": lambda: gen.uniform(n_keys, seed),
              "scan": lambda: gen.scan(n_keys, seed),
              "loop": lambda: gen.loop(n_keys, seed),
              "get-scan": lambda: gen.get_scan(
                  n_keys, skew,
                  parse_number(args.scan_fraction, "scan-fraction", float, 0.0, 1.0),
                  parse_number(args.scan_pages, "scan-pages", int, 1, 1 << 30),
                  seed=seed)}[kind]()
    out = Path(args.output)
    name = out.name.lower()
    compress = name.endswith(".zst")
    as_records = name.removesuffix(".zst").endswith((".cpa", ".cpaccess"))
    import io
    import zstandard
    try:
        with open(out, "wb") as raw:
            sink = zstandard.ZstdCompressor().stream_writer(raw) if compress else raw
            if as_records:
                records.write_header(sink)
            for chunk in stream.chunks(count):
                keys, tids = chunk if isinstance(chunk, tuple) else (chunk, None)
                if as_records:
                    sink.write(records.make_records(keys, tids=tids).tobytes())
                else:
                    text = io.StringIO()
                    np.savetxt(text, keys, fmt="%d")
                    sink.write(text.getvalue().encode())
            if compress:
                sink.flush(zstandard.FLUSH_FRAME)
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror or err}") from None
    print(f"wrote {count:,} {kind} accesses over {n_keys:,} pages to {out}")
    return 0
