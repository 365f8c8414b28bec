"""Pod-to-cgroup rules against the layouts kubelet makes (written out here
by hand, as they appear on real nodes, not derived from the code under
test): both cgroup drivers, the three QoS classes, cgroup v1 (under the
memory controller's mount) and v2."""
import sys
from pathlib import Path

import pytest

from cachepilot.agent import pods
from cachepilot.agent.cgroups import CgroupGone

sys.path.insert(0, str(Path(__file__).parent))

UID = "0b5ea7a3-7b1a-4c4e-9f2e-3e0a3a1d9c55"
CTR = "4f1c" * 16          # a container id: 64 hex digits

# (driver, qos) -> the pod's cgroup and one container below it, as kubelet
# with containerd lays them out
LAYOUTS = {
    ("cgroupfs", "Guaranteed"): f"kubepods/pod{UID}/{CTR}",
    ("cgroupfs", "Burstable"): f"kubepods/burstable/pod{UID}/{CTR}",
    ("cgroupfs", "BestEffort"): f"kubepods/besteffort/pod{UID}/{CTR}",
    ("systemd", "Guaranteed"):
        "kubepods.slice/kubepods-pod0b5ea7a3_7b1a_4c4e_9f2e_3e0a3a1d9c55.slice/"
        f"cri-containerd-{CTR}.scope",
    ("systemd", "Burstable"):
        "kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0b5ea7a3_7b1a_4c4e_9f2e_3e0a3a1d9c55.slice/"
        f"cri-containerd-{CTR}.scope",
    ("systemd", "BestEffort"):
        "kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0b5ea7a3_7b1a_4c4e_9f2e_3e0a3a1d9c55.slice/"
        f"cri-containerd-{CTR}.scope",
}
# where the hierarchy is: v1 under the memory controller, v2 unified
HIERARCHY = {1: "sys/fs/cgroup/memory", 2: "sys/fs/cgroup"}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("driver,qos", sorted(LAYOUTS))
def test_pod_cgroup_on_real_layouts(tmp_path, version, driver, qos):
    root = tmp_path / HIERARCHY[version]
    container = root / LAYOUTS[(driver, qos)]
    container.mkdir(parents=True)
    pod_dir = container.parent
    pod = pods.Pod("shop", "db-0", UID, qos)
    assert pods.pod_cgroup(UID, qos, driver) == str(pod_dir.relative_to(root))
    # with the driver named, and found by looking
    assert pods.find_pod_cgroup(root, pod, driver) == pod_dir
    assert pods.find_pod_cgroup(root, pod) == pod_dir
    # the other driver's layout is not there
    other = "systemd" if driver == "cgroupfs" else "cgroupfs"
    with pytest.raises(CgroupGone, match="shop/db-0 has no cgroup"):
        pods.find_pod_cgroup(root, pod, other)


def test_unknown_qos_or_driver_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="QoS class"):
        pods.pod_cgroup(UID, "Gold", "systemd")
    with pytest.raises(ValueError, match="cgroup driver"):
        pods.pod_cgroup(UID, "Burstable", "docker")
    with pytest.raises(CgroupGone, match="tried .*kubepods/burstable.*kubepods.slice"):
        pods.find_pod_cgroup(tmp_path, pods.Pod("a", "b", UID, "Burstable"))


def pod_list():
    """A PodList as the API server returns it (fields trimmed)."""
    def item(ns, name, uid, qos, labels, phase="Running"):
        return {"metadata": {"namespace": ns, "name": name, "uid": uid, "labels": labels},
                "status": {"phase": phase, "qosClass": qos}}
    return {"kind": "PodList", "items": [
        item("shop", "db-0", "u0", "Guaranteed", {"app": "db", "tier": "data"}),
        item("shop", "db-1", "u1", "Burstable", {"app": "db", "tier": "data"}),
        item("shop", "web-0", "u2", "BestEffort", {"app": "web"}),
        item("ads", "db-0", "u3", "Burstable", {"app": "db"}),
        item("shop", "db-2", "u4", "Burstable", {"app": "db"}, phase="Pending"),
        {"metadata": {"namespace": "shop", "name": "new", "uid": "u5"}, "status": {}},
    ]}


def test_pods_by_name_or_labels():
    ps = pods.pods_from_list(pod_list())
    # pending pods and pods without a QoS class yet are left out
    assert {p.uid for p in ps} == {"u0", "u1", "u2", "u3"}
    assert [p.uid for p in pods.select(ps, "shop", name="db-0")] == ["u0"]
    assert [p.uid for p in pods.select(ps, "ads", name="db-0")] == ["u3"]
    assert [p.name for p in pods.select(ps, "shop", selector={"app": "db"})] == ["db-0", "db-1"]
    assert [p.name for p in pods.select(ps, "shop", selector={"app": "db", "tier": "x"})] == []
    assert pods.select(ps, "nowhere", name="db-0") == []


def test_the_lister_outside_a_cluster_says_so(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CgroupGone, match="not running in a Kubernetes pod"):
        pods.ApiLister("node-1")


def test_the_agent_watches_the_pods_a_tenant_names(tmp_path):
    """A LinuxBackend whose tenants name pods (one by name, a set by label)
    watches their pod cgroups on a v2 tree laid out by kubelet's systemd
    driver; a pod without a cgroup here is left out, and a config naming
    both or neither of cgroup and pod is refused in one line."""
    from cachepilot.agent.backends.linux import LinuxBackend
    from cachepilot.agent.config import config_from_dict
    from cachepilot.core.errors import UserError
    from test_cgroups_tree import make_v2

    ps = pods.pods_from_list(pod_list())
    root = tmp_path / "cgroup"
    for p in ps:
        if p.uid != "u1":                       # db-1 runs on another node
            make_v2(root / pods.pod_cgroup(p.uid, p.qos, "systemd"))
    cfg = config_from_dict({
        "node_id": "node-1", "roots": [str(root)], "memory": "1GiB",
        "prometheus": {"port": 0},
        "tenants": [{"name": "web", "pod": {"namespace": "shop", "name": "web-0"}},
                    {"name": "db", "pod": {"namespace": "shop", "selector": {"app": "db"}}}]})
    calls = []
    b = LinuxBackend(cfg, start_sampler=False, pod_lister=lambda: calls.append(1) or ps)
    calls.clear()                               # (the constructor's first look)
    want = b._wanted()
    assert {t: str(Path(p).relative_to(root)) for t, (p, _) in want.items()} == {
        "web": pods.pod_cgroup("u2", "BestEffort", "systemd"),
        "db/db-0": pods.pod_cgroup("u0", "Guaranteed", "systemd")}
    assert calls == [1]                         # one listing for both tenants
    for bad in ({"name": "x"}, {"name": "x", "cgroup": "a", "pod": {"namespace": "n",
                                                                     "name": "p"}},
                {"name": "x", "pod": {"namespace": "n"}}):
        with pytest.raises(UserError, match="exactly one of") as err:
            config_from_dict({"roots": [str(root)], "tenants": [bad]})
        assert "\n" not in str(err.value)
