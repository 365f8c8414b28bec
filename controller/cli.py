"""Commands: `controller` and `admin`."""
from __future__ import annotations

import json
import logging
import signal
import threading
import time

from cachepilot.core.errors import UserError


def register(subparsers):
    p = subparsers.add_parser("controller", help="run the controller's gRPC service")
    p.add_argument("--config", required=True)
    p.add_argument("--listen", help="address to listen on (default: the config's)")
    p.add_argument("--record", metavar="DIR",
                   help="keep a recording of every round in DIR, for `cachepilot replay` "
                        "(one already there is replaced)")
    p.add_argument("--replica", metavar="NAME",
                   help="with an etcd store: this replica's name among the others, its "
                        "own (default: the config's controller.replica, else the "
                        "advertised address); a name another live replica holds is refused")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="with an etcd store: the address agents are redirected to for the "
                        "nodes this replica owns (default: the config's "
                        "controller.advertise, else the listen address; needed when that "
                        "is a wildcard such as 0.0.0.0)")
    p.set_defaults(func=cmd_controller)
    _register_admin(subparsers)


def _register_admin(subparsers):
    """`cachepilot admin ACTION`: the subcommands that talk to a running
    controller."""
    p = subparsers.add_parser("admin", help="talk to a running controller")
    p.add_argument("--config", required=True,
                   help="the controller's config (address, CA, admin certificate or token)")
    p.add_argument("--target", help="controller address (default: the config's listen)")
    p.add_argument("--cert", help="admin certificate (default: the config's admin_cert)")
    p.add_argument("--key", help="its key (default: the config's admin_key)")
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="admin_command", metavar="ACTION")
    sub.required = True
    sub.add_parser("status", help="nodes, pool, rounds")
    sub.add_parser("tenants", help="tenants: SLO, throughput, limit, policy running and "
                   "directed, the node's answer; in recommend mode what would be sent")
    s = sub.add_parser("set-slo", help="set a tenant's minimum throughput (kept across "
                       "restarts)")
    s.add_argument("tenant")
    s.add_argument("min_throughput", type=float)
    s = sub.add_parser("clear-slo", help="remove a tenant's SLO")
    s.add_argument("tenant")
    s = sub.add_parser("set-mode", help="recommend (decide and show, send nothing that "
                       "changes a cgroup) or enforce, for the controller or one tenant")
    s.add_argument("mode", choices=("recommend", "enforce", "default"),
                   help="'default': the tenant follows the controller's mode again")
    s.add_argument("--tenant", default="", help="this tenant only")
    s = sub.add_parser("log", help="the decision log, newest first")
    s.add_argument("--tenant", default="", help="this tenant's entries only")
    s.add_argument("--since", default="",
                   help="entries since: a duration ago (90s, 15m, 2h, 1d), a date and time "
                        "(2025-01-31T12:00, local time unless it names a zone) or unix seconds")
    s.add_argument("--limit", type=int, default=30, help="at most this many (30)")
    s = sub.add_parser("explain", help="why a tenant got its limit and policy in a round: "
                       "the rule and figures that set each, the alternatives, the prediction")
    s.add_argument("tenant")
    s.add_argument("--round", type=int, default=0, dest="round_",
                   help="this decision round (default: the tenant's latest)")
    s = sub.add_parser("what-if", help="a tenant at another limit or policy, or what a "
                       "node's tenants lose if it gives up memory (nothing changes)")
    s.add_argument("tenant", nargs="?", default="")
    s.add_argument("--limit", default="", help="limit to predict at, e.g. 512MiB (default: "
                                               "the one in force)")
    s.add_argument("--policy", default="", help="policy to predict under (default: the "
                                                "one running)")
    s.add_argument("--node", default="", help="a node, with --free")
    s.add_argument("--free", default="", help="memory the node would give up, e.g. 2GiB")
    s = sub.add_parser("plan", help="a consolidation plan from the live tenants' curves, "
                       "throughput models, memory, disk reads and CPU; --apply carries it out")
    s.add_argument("--apply", action="store_true",
                   help="carry out its moves one at a time (refused when it predicts a "
                        "missed SLO)")
    s.add_argument("--force", action="store_true",
                   help="with --apply: carry out even a plan that predicts a missed SLO")
    s.add_argument("--memory-only", action="store_true",
                   help="pack memory alone (to compare: disk and CPU ignored)")
    s.add_argument("--hosts", type=int, default=0,
                   help="pack into this many hosts, SLOs or not (shows what breaks)")
    p.set_defaults(func=cmd_admin)


def cmd_controller(args) -> int:
    from cachepilot.controller.config import load_config
    from cachepilot.controller.service import serve
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(args.config)
    _replica_flags(cfg.controller, args)
    served = serve(cfg, listen=args.listen, record=args.record)
    spec = cfg.controller
    how = "plaintext" if spec.insecure else \
        "mutual TLS: a certificate per node" if spec.mutual_tls else "TLS and a token"
    print(f"controller listening on {served.address} ({how}); state in "
          f"{getattr(served.controller.store, 'path', None) or 'memory'}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    served.stop(1.0)
    return 0


def _replica_flags(spec, args) -> None:
    """--replica and --advertise over the config's: one config can serve
    every replica, each started with its own name and address."""
    import re

    from pydantic import TypeAdapter, ValidationError

    from cachepilot.controller.config import Name
    if args.replica is not None:
        try:
            spec.replica = TypeAdapter(Name).validate_python(args.replica)
        except ValidationError:
            raise UserError(f"--replica {args.replica!r}: expected 1-128 of A-Z a-z 0-9 "
                            "_ . : -") from None
    if args.advertise is not None:
        if not re.fullmatch(r"\S+:\d{1,5}", args.advertise):
            raise UserError(f"--advertise {args.advertise!r}: expected HOST:PORT")
        spec.advertise = args.advertise


def cmd_admin(args) -> int:
    import grpc

    from google.protobuf.json_format import MessageToDict

    from cachepilot.controller.config import load_config
    from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
    from cachepilot.protocol.channel import make_channel, read_identity, token_metadata

    cfg = load_config(args.config)
    spec = cfg.controller
    target = args.target or spec.listen
    request = _admin_request(args)      # bad arguments fail before connecting
    identity = None
    cert, key = args.cert or spec.admin_cert, args.key or spec.admin_key
    if (cert is None) != (key is None):
        raise UserError("give the admin certificate and its key together (--cert, --key)")
    if cert is not None and not spec.insecure:
        identity = read_identity(cert, key, "admin certificate")
    elif spec.mutual_tls:
        raise UserError("this controller wants an admin certificate: give --cert and --key "
                        "or set controller.admin_cert and admin_key (cachepilot certs admin)")
    md = () if spec.mutual_tls else token_metadata(spec.token_value())
    channel = make_channel(target, spec.client_root_cert(), insecure=spec.insecure,
                           identity=identity)
    stub = pb_grpc.AdminStub(channel)
    method, message = request
    try:
        reply = getattr(stub, method)(message, metadata=md, timeout=10)
    except grpc.RpcError as err:
        raise UserError(f"{target}: {err.code().name.lower()}: {err.details()}") from None
    finally:
        channel.close()
    if args.json and args.admin_command == "explain":
        print(json.dumps(json.loads(reply.record_json), indent=1))
    elif args.json and args.admin_command == "plan":
        print(json.dumps({"plan": json.loads(reply.plan_json), "applied": list(reply.applied)},
                         indent=1))
    elif args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=1))
    else:
        _print_admin(args.admin_command, reply, args)
    return 0


def _admin_request(args):
    """(stub method, request message) for the admin action."""
    from cachepilot.core.config import parse_bytes
    from cachepilot.protocol import cachepilot_pb2 as pb
    action = args.admin_command
    if action == "status":
        return "Status", pb.StatusRequest()
    if action == "tenants":
        return "Tenants", pb.TenantsRequest()
    if action == "set-slo":
        return "SetSLO", pb.SetSLORequest(tenant=args.tenant, min_throughput=args.min_throughput)
    if action == "clear-slo":
        return "ClearSLO", pb.ClearSLORequest(tenant=args.tenant)
    if action == "set-mode":
        if args.mode == "default" and not args.tenant:
            raise UserError("set-mode default: only a tenant follows a default (give --tenant)")
        return "SetMode", pb.SetModeRequest(tenant=args.tenant,
                                            mode="" if args.mode == "default" else args.mode)
    if action == "explain":
        if args.round_ < 0:
            raise UserError(f"--round {args.round_}: expected a round number (1 or more)")
        return "Explain", pb.ExplainRequest(tenant=args.tenant, round=args.round_)
    if action == "plan":
        if args.hosts < 0:
            raise UserError(f"--hosts {args.hosts}: expected a number of hosts (1 or more)")
        if args.force and not args.apply:
            raise UserError("--force goes with --apply")
        return "Plan", pb.PlanRequest(apply=args.apply, memory_only=args.memory_only,
                                      hosts=args.hosts, force=args.force)
    if action == "log":
        return "DecisionLog", pb.DecisionLogRequest(limit=max(0, args.limit),
                                                    tenant=args.tenant,
                                                    since=parse_since(args.since))
    sizes = {}
    for opt in ("limit", "free"):
        try:
            sizes[opt] = parse_bytes(getattr(args, opt)) if getattr(args, opt) else 0
        except ValueError as err:
            raise UserError(f"--{opt} {getattr(args, opt)!r}: {err}") from None
    if bool(args.tenant) == bool(args.node):
        raise UserError("what-if: name a TENANT (with --limit and/or --policy), or --node "
                        "with --free")
    if args.node and (args.limit or args.policy):
        raise UserError("what-if --node takes --free only")
    if args.tenant and args.free:
        raise UserError("what-if TENANT takes --limit and --policy; --free goes with --node")
    return "WhatIf", pb.WhatIfRequest(tenant=args.tenant, limit_bytes=sizes["limit"],
                                      policy=args.policy, node=args.node,
                                      free_bytes=sizes["free"])


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """Unix seconds from "90s" / "15m" / "2h" / "1d" ago, an ISO date and
    time, or unix seconds; 0 for an empty string."""
    import datetime
    import re
    import time
    text = text.strip()
    if not text:
        return 0.0
    now = time.time() if now is None else now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UserError(f"--since {text!r}: expected a duration ago (90s, 15m, 2h, 1d), a "
                        f"date and time (2025-01-31T12:00) or unix seconds") from None


def _mib(n) -> str:
    return f"{n / (1 << 20):6.0f} MiB"


def _print_admin(action, reply, args=None):
    if action == "status":
        print(f"rounds {reply.rounds}  uptime {reply.uptime_s:.0f}s  pool "
              f"{reply.pool_bytes / (1 << 20):.0f} MiB  tls {'on' if reply.tls else 'OFF'}  "
              f"predicted violations {reply.violations}")
        for n in reply.nodes:
            age = "never" if n.seconds_since_report < 0 else f"{n.seconds_since_report:.1f}s ago"
            print(f"  {n.node_id:16} {n.state:10} {n.memory_bytes / (1 << 20):8.0f} MiB  "
                  f"{n.backend or '-':5} reports {n.reports} (last {age})"
                  + ("  policies advisory (no cache_ext)" if n.advisory else "")
                  + (f"  (registered less than the {n.config_memory_bytes / (1 << 20):.0f} "
                     f"MiB its config gives it)"
                     if n.config_memory_bytes > n.memory_bytes else ""))
    elif action == "tenants":
        _print_tenants(reply)
    elif action in ("set-slo", "clear-slo"):
        before = f"{reply.previous:g}" if reply.had_slo else "none"
        after = f"{reply.current:g}" if reply.has_slo else "none"
        print(f"{reply.tenant}: SLO {before} -> {after}")
    elif action == "set-mode":
        print(f"{reply.tenant or 'controller'}: mode {reply.previous} -> {reply.current}")
    elif action == "what-if":
        _print_what_if(reply)
    elif action == "plan":
        from cachepilot.controller.plan_cli import print_plan
        print_plan(json.loads(reply.plan_json))
        for line in reply.applied:
            print(f"moved {line}")
        if reply.message:
            print(reply.message)
    elif action == "explain":
        from cachepilot.controller.engine.trace import explain
        print(explain(json.loads(reply.record_json)))
        print(f"  (rounds {reply.first_round}-{reply.last_round} are kept: --round N)")
    else:
        if not reply.entries:
            print(empty_log(args))
        for e in reply.entries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
            print(f"{when} [{e.round:5}] {e.node:10} {e.kind:10} {e.message}")


def empty_log(args) -> str:
    """What `admin log` says when it has no entry to show."""
    what = f" of tenant {args.tenant}" if args.tenant else ""
    since = f" since {args.since}" if args.since else ""
    return (f"no log entries{what}{since}: the controller logs registrations, and decisions "
            f"once nodes report")


def _print_tenants(reply):
    print(f"{'tenant':16} {'node':10} {'SLO':>10} {'ops/s':>10} {'met':4} "
          f"{'limit':>9} {'running':10} directed")
    for t in reply.tenants:
        slo = f"{t.slo_min_throughput:,.0f}" if t.has_slo else "-"
        met = ("yes" if t.slo_met else "NO") if (t.has_slo and t.reported and
                                                   t.throughput_known) else "-"
        ops = f"{t.throughput:10,.0f}" if t.throughput_known or not t.reported \
            else f"{'unknown':>10}"
        directed = (t.policy or "-") + (" (advice)" if t.advisory else "")
        print(f"{t.name:16} {t.node:10} {slo:>10} {ops} {met:4} "
              f"{_mib(t.limit_bytes)} {t.running_policy or '-':10} {directed}")
        # what is not plain: a hold, a recommendation, the node's answer
        if t.held:
            print(f"{'':16} HELD: {t.held}")
        if t.mode == "recommend":
            rec = (f"{_mib(t.recommended_limit_bytes).strip()} {t.recommended_policy}"
                   if t.recommended_policy else "nothing yet")
            print(f"{'':16} recommend mode: would send {rec} (not sent)")
        if t.held_off:
            print(f"{'':16} watchdog holds off: {', '.join(t.held_off)}")
        if t.applied == "refused":
            print(f"{'':16} node REFUSED: {t.applied_message}")
        elif t.applied_message:
            print(f"{'':16} node: {t.applied_message}")
        if t.policy_overflow_pages:
            print(f"{'':16} policy had no room for {t.policy_overflow_pages:,} pages "
                  f"(sized for {t.policy_capacity_pages:,})")


def _print_what_if(reply):
    if reply.note:
        print(reply.note)
        print(f"{'tenant':16} {'policy':10} {'limit':>10} {'-> limit':>10} {'miss':>6} "
              f"{'-> miss':>7} {'ops/s':>12} {'-> ops/s':>12} {'loss':>7}  SLO")
        for t in reply.tenants:
            loss = 1 - t.throughput / t.throughput_before if t.throughput_before else 0.0
            slo = "-" if not t.has_slo else \
                f"{'met' if t.slo_met_before else 'MISSED'} -> {'met' if t.slo_met else 'MISSED'}"
            print(f"{t.tenant:16} {t.policy:10} {_mib(t.limit_before)} {_mib(t.limit_bytes)} "
                  f"{t.miss_ratio_before:6.3f} {t.miss_ratio:7.3f} {t.throughput_before:12,.0f} "
                  f"{t.throughput:12,.0f} {loss:7.1%}  {slo}")
        return
    for t in reply.tenants:
        slo = "-" if not t.has_slo else \
            f"{t.slo_min_throughput:,.0f}/s {'met' if t.slo_met else 'NOT met'}"
        model = "fitted" if t.model_fitted else "prior"
        print(f"{t.tenant}: {t.policy} at {_mib(t.limit_bytes).strip()}: miss ratio "
              f"{t.miss_ratio:.3f}, {t.throughput:,.0f} ops/s ({model} model); SLO {slo}")
