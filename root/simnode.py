"""One sim node as a process of its own, against a running controller.

    python -m cachepilot.simnode --config CONTROLLER.yaml --node NAME

The controller's config names the node and its tenants; the node's sim
host (cachepilot.sim) is driven by the agent's own node client over real
gRPC, so a test or a demo can run a controller and many nodes as separate
processes.  It lives in the root package because it joins the agent's
client to the controller's config.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from cachepilot.agent.client import NodeClient
from cachepilot.controller.config import load_config
from cachepilot.core.errors import UserError
from cachepilot.sim.backend import SimBackend


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cachepilot.simnode",
                                 description="Run one sim node against a controller.")
    ap.add_argument("--config", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--target", help="controller address (default: the config's listen)")
    ap.add_argument("--server-name", help="TLS name to expect (default: from the target)")
    ap.add_argument("--intervals", type=int)
    ap.add_argument("--pace", type=float, help="seconds between intervals")
    ap.add_argument("--status-file", help="append one JSON line per interval")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(args.config)
        try:
            cfg.node(args.node)
        except KeyError:
            raise UserError(f"{args.config}: no node named {args.node!r}") from None
        spec = cfg.controller
        root = spec.client_root_cert()
        client = NodeClient(SimBackend(cfg, args.node), args.target or spec.listen,
                            token=spec.token_value(), root_cert=root,
                            server_name=args.server_name, insecure=spec.insecure)
    except UserError as err:
        print(f"cachepilot simnode: error: {err}", file=sys.stderr)
        return 2
    status = open(args.status_file, "a", buffering=1) if args.status_file else None

    def on_step(c, outcome):
        if status:
            limits = c.backend.current()
            status.write(json.dumps({"t": time.time(), "seq": outcome.seq,
                                     "connected": outcome.connected, "error": outcome.error,
                                     "tenants": limits}) + "\n")
    try:
        client.run(args.intervals, args.pace, on_step=on_step)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
