"""deploy/kubernetes: every manifest validates against the Kubernetes
schema (kubernetes-validate, strict: unknown fields are errors), the
configs the ConfigMaps carry load with the agent's and the controller's own
loaders, and the DaemonSet asks for capabilities, not privilege."""
from pathlib import Path

import pytest
import yaml

from cachepilot.agent.config import config_from_dict as agent_config
from cachepilot.controller.config import config_from_dict as controller_config

kv = pytest.importorskip("kubernetes_validate",
                         reason="kubernetes-validate is not installed (make test installs it)")

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
K8S = "1.30"


def documents():
    for f in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                yield f.name, doc


def test_every_manifest_validates():
    kinds = []
    for name, doc in documents():
        kv.validate(doc, K8S, strict=True)
        kinds.append(doc["kind"])
    for kind in ("DaemonSet", "Deployment", "Service", "ConfigMap", "Secret",
                 "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert kind in kinds


def test_a_broken_manifest_is_refused():
    ds = next(d for _, d in documents() if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicee"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S, strict=True)


def test_configmaps_hold_configs_the_loaders_accept():
    maps = {d["metadata"]["name"]: d["data"] for _, d in documents() if d["kind"] == "ConfigMap"}
    acfg = agent_config(yaml.safe_load(maps["cachepilot-agent"]["agent.yaml"]), "agent.yaml")
    assert acfg.tenants == [] and acfg.controller is not None
    ccfg = controller_config(yaml.safe_load(maps["cachepilot-controller"]["controller.yaml"]),
                             "controller.yaml")
    assert ccfg.controller.metrics_port == 9465
    # the controller's config names the tenant's pod; the agent receives it
    assert ccfg.tenants[0].node_tenant().pod is not None


def test_agent_has_capabilities_not_privilege_and_the_host_paths():
    ds = next(d for _, d in documents() if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_RESOURCE"}
    host = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {"/sys/fs/cgroup", "/sys/fs/bpf", "/sys/kernel/btf"}
    assert "--node-id" in c["args"] and c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] \
        == "spec.nodeName"
    dep = next(d for _, d in documents() if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_the_manifests_run_the_image_the_containerfile_builds():
    """Every container names cachepilot:VERSION (the package's version, the
    tag deploy/container/build-image.sh gives), and its arguments are a
    cachepilot command for the image's entrypoint."""
    import tomllib
    root = DEPLOY.parents[1]
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    containerfile = (root / "deploy" / "container" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["cachepilot"]' in containerfile
    assert f"cachepilot:{version}" in containerfile
    script = (root / "deploy" / "container" / "build-image.sh").read_text()
    assert 'NAME=cachepilot' in script and "pyproject.toml" in script
    seen = set()
    for _, doc in documents():
        if doc["kind"] in ("DaemonSet", "Deployment"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                assert c["image"] == f"cachepilot:{version}", c["image"]
                seen.add(c["args"][0])
    assert seen == {"agent", "controller"}
