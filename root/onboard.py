"""What `cachepilot certs init` writes besides the CA: this node's and an
admin's certificates, and a controller config and an agent config that
follows it over mutual TLS, so that

    cachepilot controller --config DIR/controller.yaml
    cachepilot agent --config DIR/agent.yaml

start as written.  Paths in both configs are relative to DIR, so the
folder can be moved whole.  It lives in the root package because it joins
the controller's config to the agent's.
"""
from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

from cachepilot.core.errors import UserError

DEFAULT_LISTEN = "127.0.0.1:50551"
WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")


def add_arguments(p) -> None:
    """The flags of `certs init` that shape the two configs."""
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where the controller listens (default {DEFAULT_LISTEN})")
    p.add_argument("--node", metavar="NAME",
                   help="the node the agent config registers as (default: this host's "
                        "name)")
    p.add_argument("--memory", metavar="SIZE",
                   help="memory the controller divides among the node's tenants, e.g. "
                        "16GiB (default: MemTotal from /proc/meminfo)")
    p.add_argument("--cgroup-root", metavar="DIR",
                   help="the cgroup folder the agent may touch (default: the memory "
                        "hierarchy, /sys/fs/cgroup/memory on cgroup v1, /sys/fs/cgroup "
                        "on v2)")
    p.add_argument("--metrics-port", type=int, default=9105, metavar="PORT",
                   help="the agent's Prometheus port (default 9105; 0: off)")


def memtotal(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise UserError(f"cannot read MemTotal from {meminfo}: give --memory")


def default_cgroup_root() -> str:
    return "/sys/fs/cgroup/memory" if os.path.isdir("/sys/fs/cgroup/memory") \
        else "/sys/fs/cgroup"


def _mib(n: int) -> str:
    return f"{n >> 20}MiB"


def _plan(args) -> dict:
    """The figures both configs are written from, checked."""
    from cachepilot.certs import NAME_RE
    from cachepilot.core.config import parse_bytes
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--listen {args.listen!r}: expected HOST:PORT")
    node = args.node or socket.gethostname()
    if not NAME_RE.match(node):
        raise UserError(f"node name {node!r}: expected letters, digits and _.:- only; "
                        f"give --node NAME")
    if args.memory is not None:
        try:
            memory = parse_bytes(args.memory)
        except ValueError as err:
            raise UserError(f"--memory {args.memory!r}: {err}") from None
    else:
        memory = memtotal()
    if not 0 <= args.metrics_port < 65536:
        raise UserError(f"--metrics-port {args.metrics_port}: expected 0-65535")
    # agents reach a wildcard listener by the first name the certificate has
    reach = (args.host[0] if args.host else "localhost") if host in WILDCARDS else host
    return {"listen": args.listen, "address": f"{reach}:{port}", "node": node,
            "memory": _mib(memory),
            "memory_source": "--memory" if args.memory is not None else "MemTotal",
            "root": args.cgroup_root or default_cgroup_root(),
            "metrics_port": args.metrics_port,
            "date": datetime.date.today().isoformat()}


CONTROLLER_YAML = """\
# The controller of a one-node cachepilot deployment, written by
# `cachepilot certs init` on {date}.  Paths are relative to this file.
#
#   cachepilot controller --config {dir}/controller.yaml
#   cachepilot admin --config {dir}/controller.yaml tenants
#
# Mutual TLS: every caller shows a certificate signed by ca.crt; a node's
# names the node (node-{node}.crt), the admin's carries the admin role
# (admin.crt).  More nodes: `cachepilot certs node NAME --dir {dir}`, and an
# entry under nodes: for each.  The controller needs no root.

control:
  interval_s: 10                # as the agent's interval_s

controller:
  listen: {listen}
  tls_cert: controller.crt
  tls_key: controller.key
  tls_ca: ca.crt                # what agents and admins verify this controller by
  client_ca: ca.crt             # what every caller's certificate is signed by
  admin_cert: admin.crt         # what `cachepilot admin` shows
  admin_key: admin.key
  # state (SLOs, modes, registrations, the decision log): controller.state.db here

nodes:
  - name: {node}
    memory_bytes: {memory}      # what its tenants share ({memory_source})
    backend: linux
    cgroup_roots: [{root}]

# One tenant per cgroup, relative to the agent's roots.  Put a workload in
# this one (as root):
#   mkdir {root}/cachepilot-example
#   echo $PID > {root}/cachepilot-example/cgroup.procs
# Until the cgroup exists the agent reports nothing for it.
tenants:
  - name: example
    node: {node}
    cgroup: cachepilot-example
"""

AGENT_YAML = """\
# The agent of node {node}, following the controller of controller.yaml
# over mutual TLS; written by `cachepilot certs init` on {date}.  Paths are
# relative to this file.
#
#   cachepilot agent --config {dir}/agent.yaml
#
# Run it as root: it writes the tenants' memory limits under roots.  It
# samples page-cache accesses with BPF tracepoints (CAP_BPF and
# CAP_PERFMON, kernel BTF); without them it runs stats-only (limits from
# the cgroups' own counters, no curves; `cachepilot doctor` says why).
# Policies other than the kernel's own need the cache_ext kernel.
# The controller's config names this node's tenants: none are listed here.

node_id: {node}
roots: [{root}]   # the only cgroups it may touch are under these
interval_s: 10
prometheus: {{address: 127.0.0.1, port: {metrics_port}}}  # port 0: off

controller:
  address: {address}
  cert_file: node-{node}.crt   # this node's identity (CN = node_id)
  key_file: node-{node}.key
  ca_file: ca.crt               # what the controller's certificate is signed by
"""


def _check_configs(texts: dict[Path, str]) -> None:
    """Both configs load as written (a bug here is caught before any file is)."""
    import yaml

    from cachepilot.agent.config import config_from_dict as agent_config
    from cachepilot.controller.config import config_from_dict as controller_config
    for path, text in texts.items():
        check = controller_config if path.name == "controller.yaml" else agent_config
        check(yaml.safe_load(text), str(path))


def init_deployment(folder: Path, args) -> list[Path]:
    """The CA, the controller's, the node's and the admin's certificates,
    and controller.yaml and agent.yaml, in `folder`; nothing is written
    when any of them exists, unless args.force."""
    from cachepilot.certs import _write, make_ca, make_leaf
    plan = _plan(args)
    plan["dir"] = str(folder.resolve())
    texts = {folder / "controller.yaml": CONTROLLER_YAML.format(**plan),
             folder / "agent.yaml": AGENT_YAML.format(**plan)}
    _check_configs(texts)
    node = plan["node"]
    leaves = [folder / n for n in (f"node-{node}.crt", f"node-{node}.key",
                                   "admin.crt", "admin.key")]
    ca = [folder / n for n in ("ca.crt", "ca.key", "controller.crt", "controller.key")]
    existing = [p.name for p in ca + leaves + list(texts) if p.exists()]
    if existing and not args.force:
        raise UserError(f"{folder} already holds {', '.join(existing)}; give --force to "
                        f"replace them")
    written = make_ca(folder, args.days, args.host, args.force)
    written += make_leaf(folder, "node", node, args.days, args.force)
    written += make_leaf(folder, "admin", "admin", args.days, args.force)
    for path, text in texts.items():
        _write(path, text.encode(), private=False)
        written.append(path)
    return written
