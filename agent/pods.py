"""Kubernetes pods as tenants: from a pod's name or labels to its cgroup.

A tenant may name a pod (`pod: {namespace, name}`) or a set of pods
(`pod: {namespace, selector: {label: value}}`) instead of a cgroup.  The
agent lists the pods of its own node from the API server (in-cluster: the
service account's token and CA), and each pod's cgroup follows from its UID
and QoS class by the kubelet's naming rules, which differ by cgroup driver
and not by cgroup version (v1 puts the tree under the memory controller's
mount, v2 under the unified one):

    cgroupfs  kubepods/pod<uid>                         (Guaranteed)
              kubepods/<qos>/pod<uid>                   (Burstable, BestEffort)
    systemd   kubepods.slice/kubepods-pod<uid_>.slice
              kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice

where <uid_> is the UID with its dashes turned into underscores (systemd
reserves the dash as its slice separator).  The driver is found by looking:
whichever layout exists on the host is the kubelet's.
"""
from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.agent.cgroups import CgroupGone

QOS = ("Guaranteed", "Burstable", "BestEffort")
DRIVERS = ("cgroupfs", "systemd")
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    qos: str                                    # status.qosClass
    labels: dict = field(default_factory=dict, hash=False, compare=False)


def pod_cgroup(uid: str, qos: str, driver: str) -> str:
    """The pod-level cgroup of a pod, relative to the hierarchy root."""
    if qos not in QOS:
        raise ValueError(f"unknown QoS class {qos!r} (expected one of {', '.join(QOS)})")
    if driver == "cgroupfs":
        return (f"kubepods/pod{uid}" if qos == "Guaranteed"
                else f"kubepods/{qos.lower()}/pod{uid}")
    if driver == "systemd":
        u = uid.replace("-", "_")
        if qos == "Guaranteed":
            return f"kubepods.slice/kubepods-pod{u}.slice"
        q = qos.lower()
        return f"kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{u}.slice"
    raise ValueError(f"unknown cgroup driver {driver!r} (expected cgroupfs or systemd)")


def find_pod_cgroup(root: str | os.PathLike, pod: Pod, driver: str | None = None) -> Path:
    """The pod's cgroup directory under `root` (the memory hierarchy: v1's
    memory mount or the v2 root), trying the given driver's layout or both."""
    tried = []
    for d in ([driver] if driver else DRIVERS):
        path = Path(root) / pod_cgroup(pod.uid, pod.qos, d)
        if path.is_dir():
            return path
        tried.append(str(path))
    raise CgroupGone(f"pod {pod.namespace}/{pod.name} has no cgroup on this node "
                     f"(tried {', '.join(tried)})")


def select(pods, namespace: str, name: str | None = None,
           selector: dict | None = None) -> list[Pod]:
    """The pods a tenant names: one by name, or all whose labels carry
    every key and value of `selector`, in `namespace`."""
    out = []
    for p in pods:
        if p.namespace != namespace:
            continue
        if name is not None and p.name != name:
            continue
        if selector and any(p.labels.get(k) != v for k, v in selector.items()):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.name)


def pods_from_list(doc: dict) -> list[Pod]:
    """Pods of a PodList document (the API server's answer) that are
    running; pods without a UID or QoS class yet are skipped."""
    out = []
    for item in doc.get("items") or []:
        meta, status = item.get("metadata") or {}, item.get("status") or {}
        if status.get("phase") not in (None, "Running") or not meta.get("uid") \
                or status.get("qosClass") not in QOS:
            continue
        out.append(Pod(meta.get("namespace", "default"), meta.get("name", ""), meta["uid"],
                       status["qosClass"], dict(meta.get("labels") or {})))
    return out


class ApiLister:
    """Lists this node's pods from the API server, in-cluster."""

    def __init__(self, node: str, host: str | None = None, port: str | None = None,
                 account: Path = SERVICE_ACCOUNT, timeout_s: float = 5.0):
        host = host or os.environ.get("KUBERNETES_SERVICE_HOST")
        port = port or os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise CgroupGone("tenants name pods but the agent is not running in a "
                             "Kubernetes pod (KUBERNETES_SERVICE_HOST is unset)")
        self.url = f"https://{host}:{port}/api/v1/pods?" + urllib.parse.urlencode(
            {"fieldSelector": f"spec.nodeName={node}"})
        self.account = Path(account)
        self.timeout_s = timeout_s

    def __call__(self) -> list[Pod]:
        try:
            token = (self.account / "token").read_text().strip()
            ctx = ssl.create_default_context(cafile=str(self.account / "ca.crt"))
            req = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx) as r:
                return pods_from_list(json.loads(r.read()))
        except (OSError, ValueError) as err:
            raise CgroupGone(f"cannot list this node's pods: {err}") from None
