"""Commands: `controller` and `admin`."""
from __future__ import annotations

import json
import logging
import signal
import threading

from cachepilot.core.errors import UserError


def register(subparsers):
    p = subparsers.add_parser("controller", help="run the controller's gRPC service")
    p.add_argument("--config", required=True)
    p.add_argument("--listen", help="address to listen on (default: the config's)")
    p.set_defaults(func=cmd_controller)

    p = subparsers.add_parser("admin", help="talk to a running controller")
    p.add_argument("--config", required=True,
                   help="the controller's config (address, token, CA)")
    p.add_argument("--target", help="controller address (default: the config's listen)")
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="admin_command", metavar="ACTION")
    sub.required = True
    sub.add_parser("status", help="nodes, pool, rounds")
    sub.add_parser("tenants", help="tenants: SLO, throughput, limit, policy running and "
                   "directed, the node's answer")
    s = sub.add_parser("set-slo", help="set a tenant's minimum throughput")
    s.add_argument("tenant")
    s.add_argument("min_throughput", type=float)
    s = sub.add_parser("clear-slo", help="remove a tenant's SLO")
    s.add_argument("tenant")
    s = sub.add_parser("log", help="the decision log, newest first")
    s.add_argument("--tenant", default="")
    s.add_argument("--limit", type=int, default=30)
    p.set_defaults(func=cmd_admin)


def cmd_controller(args) -> int:
    from cachepilot.controller.config import load_config
    from cachepilot.controller.service import serve
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(args.config)
    served = serve(cfg, listen=args.listen)
    print(f"controller listening on {served.address} "
          f"({'plaintext' if cfg.controller.insecure else 'TLS'})", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    served.stop(1.0)
    return 0


def cmd_admin(args) -> int:
    import grpc

    from google.protobuf.json_format import MessageToDict

    from cachepilot.controller.config import load_config
    from cachepilot.protocol import cachepilot_pb2 as pb
    from cachepilot.protocol import cachepilot_pb2_grpc as pb_grpc
    from cachepilot.protocol.channel import make_channel, token_metadata

    cfg = load_config(args.config)
    spec = cfg.controller
    target = args.target or spec.listen
    root = spec.client_root_cert()
    token = spec.token_value()
    md = token_metadata(token)
    channel = make_channel(target, root, insecure=spec.insecure)
    stub = pb_grpc.AdminStub(channel)
    action = args.admin_command
    try:
        if action == "status":
            reply = stub.Status(pb.StatusRequest(), metadata=md, timeout=10)
        elif action == "tenants":
            reply = stub.Tenants(pb.TenantsRequest(), metadata=md, timeout=10)
        elif action == "set-slo":
            reply = stub.SetSLO(pb.SetSLORequest(tenant=args.tenant,
                                                 min_throughput=args.min_throughput),
                                metadata=md, timeout=10)
        elif action == "clear-slo":
            reply = stub.ClearSLO(pb.ClearSLORequest(tenant=args.tenant), metadata=md,
                                  timeout=10)
        else:
            reply = stub.DecisionLog(pb.DecisionLogRequest(limit=max(0, args.limit),
                                                           tenant=args.tenant),
                                     metadata=md, timeout=10)
    except grpc.RpcError as err:
        raise UserError(f"{target}: {err.code().name.lower()}: {err.details()}") from None
    finally:
        channel.close()
    if args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=1))
    else:
        _print_admin(action, reply)
    return 0


def _print_admin(action, reply):
    if action == "status":
        print(f"rounds {reply.rounds}  uptime {reply.uptime_s:.0f}s  pool "
              f"{reply.pool_bytes / (1 << 20):.0f} MiB  tls {'on' if reply.tls else 'OFF'}  "
              f"predicted violations {reply.violations}")
        for n in reply.nodes:
            age = "never" if n.seconds_since_report < 0 else f"{n.seconds_since_report:.1f}s ago"
            print(f"  {n.node_id:16} {n.state:10} {n.memory_bytes / (1 << 20):8.0f} MiB  "
                  f"{n.backend or '-':5} reports {n.reports} (last {age})"
                  + ("  policies advisory (no cache_ext)" if n.advisory else ""))
    elif action == "tenants":
        print(f"{'tenant':16} {'node':10} {'SLO':>10} {'ops/s':>10} {'met':4} "
              f"{'limit':>9} {'running':10} directed")
        for t in reply.tenants:
            slo = f"{t.slo_min_throughput:,.0f}" if t.has_slo else "-"
            met = ("yes" if t.slo_met else "NO") if (t.has_slo and t.reported) else "-"
            directed = (t.policy or "-") + (" (advice)" if t.advisory else "")
            print(f"{t.name:16} {t.node:10} {slo:>10} {t.throughput:10,.0f} {met:4} "
                  f"{t.limit_bytes / (1 << 20):6.0f} MiB {t.running_policy or '-':10} "
                  f"{directed}")
            # what the node said about the last directive: refusals and
            # clamps are the operator's business
            if t.applied == "refused":
                print(f"{'':16} node REFUSED: {t.applied_message}")
            elif t.applied_message:
                print(f"{'':16} node: {t.applied_message}")
            if t.policy_overflow_pages:
                print(f"{'':16} policy had no room for {t.policy_overflow_pages:,} pages "
                      f"(sized for {t.policy_capacity_pages:,})")
    elif action in ("set-slo", "clear-slo"):
        before = f"{reply.previous:g}" if reply.had_slo else "none"
        after = f"{reply.current:g}" if reply.has_slo else "none"
        print(f"{reply.tenant}: SLO {before} -> {after}")
    else:
        for e in reply.entries:
            print(f"[{e.round:5}] {e.node:10} {e.kind:10} {e.message}")
