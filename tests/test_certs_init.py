"""Issue 46, item 2: `cachepilot certs init DIR` writes the certificates
and a controller config and an agent config that start as written.

The must-show: the controller and the agent, real processes started from
the two files as `certs init` wrote them (the agent on the linux backend,
against a real memory cgroup), the agent registers over mutual TLS, and
`cachepilot admin --config DIR/controller.yaml tenants` shows its tenant.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from cachepilot.onboard import default_cgroup_root

CLI = [sys.executable, "-m", "cachepilot"]
WRITTEN = ["ca.crt", "ca.key", "controller.crt", "controller.key", "node-n1.crt",
           "node-n1.key", "admin.crt", "admin.key", "controller.yaml", "agent.yaml"]


def _cli(*args, cwd=None, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_writes_certificates_and_configs_and_refuses_to_overwrite(tmp_path):
    d = tmp_path / "dep"
    r = _cli("certs", "init", str(d), "--node", "n1", "--memory", "2GiB",
             "--cgroup-root", "/sys/fs/cgroup/memory/x", "--listen", "0.0.0.0:7443",
             "--host", "ctl.example")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted(WRITTEN)
    assert {p.name for p in d.iterdir() if p.stat().st_mode & 0o077 == 0} == \
        {"ca.key", "controller.key", "node-n1.key", "admin.key"}
    ctl = yaml.safe_load((d / "controller.yaml").read_text())
    assert ctl["controller"] == {"listen": "0.0.0.0:7443", "tls_cert": "controller.crt",
                                 "tls_key": "controller.key", "tls_ca": "ca.crt",
                                 "client_ca": "ca.crt", "admin_cert": "admin.crt",
                                 "admin_key": "admin.key"}
    assert ctl["nodes"] == [{"name": "n1", "memory_bytes": "2048MiB", "backend": "linux",
                             "cgroup_roots": ["/sys/fs/cgroup/memory/x"]}]
    agent = yaml.safe_load((d / "agent.yaml").read_text())
    # a wildcard listener is reached by the first name in its certificate
    assert agent["controller"] == {"address": "ctl.example:7443", "cert_file": "node-n1.crt",
                                   "key_file": "node-n1.key", "ca_file": "ca.crt"}
    assert agent["node_id"] == "n1" and agent["roots"] == ["/sys/fs/cgroup/memory/x"]
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = _cli("certs", "init", str(d), "--node", "n1")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"cachepilot certs: error: {d} already holds "
                        f"{', '.join(WRITTEN)}; give --force to replace them\n")
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    r = _cli("certs", "init", str(d), "--node", "n1", "--force")
    assert r.returncode == 0 and (d / "ca.crt").read_bytes() != before["ca.crt"]


def test_init_node_name_defaults_to_the_host_and_memory_to_memtotal(tmp_path):
    r = _cli("certs", "init", "--dir", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    node = yaml.safe_load((tmp_path / "d" / "controller.yaml").read_text())["nodes"][0]
    assert node["name"] == socket.gethostname()
    kib = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal:")).split()[1])
    assert node["memory_bytes"] == f"{kib >> 10}MiB"
    assert (tmp_path / "d" / f"node-{socket.gethostname()}.crt").exists()


@pytest.fixture
def cgroup_root():
    """A real memory cgroup to be the agent's root, with the written
    config's tenant cgroup in it; removed afterwards."""
    base = Path(default_cgroup_root())
    if os.geteuid() != 0 or not (base / "cgroup.procs").exists():
        pytest.skip("needs root and a memory cgroup hierarchy")
    root = base / f"cachepilot-test-{os.getpid()}"
    tenant = root / "cachepilot-example"
    tenant.mkdir(parents=True)
    yield root
    rmdir_all([tenant, root])


def rmdir_all(paths) -> None:
    """Remove cgroup directories, children first as given, each retried
    for up to 5 s while the kernel lets go of its last task."""
    for p in paths:
        for _ in range(50):
            try:
                p.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _init(d: Path, cgroup_root) -> None:
    r = _cli("certs", "init", str(d), "--listen", f"127.0.0.1:{_free_port()}",
             "--cgroup-root", str(cgroup_root), "--metrics-port", "0")
    assert r.returncode == 0, r.stderr


def _register_and_list(d: Path, logs: Path, cgroup_root, controller: list, env=None):
    """Start the controller (the command `controller`, in `env`) and a real
    linux agent from d's configs; the agent registers over mutual TLS and
    `admin tenants` shows its tenant."""
    node = socket.gethostname()
    ctl_log, agent_log = open(logs / "ctl.log", "w+"), open(logs / "agent.log", "w+")
    # from another folder: the configs' paths are relative to the configs
    ctl = subprocess.Popen([*controller, "controller", "--config", str(d / "controller.yaml")],
                           stdout=ctl_log, stderr=subprocess.STDOUT, cwd="/", env=env)
    agent = None
    try:
        agent = subprocess.Popen([*CLI, "agent", "--config", str(d / "agent.yaml")],
                                 stdout=agent_log, stderr=subprocess.STDOUT, cwd="/")
        deadline, nodes = time.monotonic() + 40, []
        while time.monotonic() < deadline:
            assert ctl.poll() is None, (logs / "ctl.log").read_text()
            assert agent.poll() is None, (logs / "agent.log").read_text()
            r = _cli("admin", "--config", str(d / "controller.yaml"), "--json", "status")
            if r.returncode == 0:
                nodes = json.loads(r.stdout)["nodes"]
                if nodes and nodes[0]["state"] in ("registered", "reporting"):
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"the agent did not register: {nodes}\n"
                        f"{(logs / 'agent.log').read_text()}")
        assert nodes[0]["node_id"] == node and nodes[0]["backend"] == "linux"
        assert "(mutual TLS: a certificate per node)" in (logs / "ctl.log").read_text()
        r = _cli("admin", "--config", str(d / "controller.yaml"), "tenants")
        assert r.returncode == 0, r.stderr
        row = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("example ")]
        assert row and row[0][1] == node, r.stdout
        # the agent watches the tenant's real cgroup
        deadline = time.monotonic() + 10
        while f"watching {cgroup_root}/cachepilot-example as tenant example" not in \
                (logs / "agent.log").read_text():
            assert time.monotonic() < deadline, (logs / "agent.log").read_text()
            time.sleep(0.2)
        # the certificates are told apart: the node's is no admin's
        r = _cli("admin", "--config", str(d / "controller.yaml"), "--cert",
                 str(d / f"node-{node}.crt"), "--key", str(d / f"node-{node}.key"), "tenants")
        assert r.returncode != 0 and "permission_denied" in r.stderr \
            and f"the certificate of node '{node}'" in r.stderr
    finally:
        if agent is not None:
            _stop(agent)
        _stop(ctl)


def test_controller_and_agent_start_from_the_written_configs(tmp_path, cgroup_root):
    d = tmp_path / "dep"
    _init(d, cgroup_root)
    _register_and_list(d, tmp_path, cgroup_root, CLI)
    assert (d / "controller.state.db").exists()


NOBODY = 65534


@pytest.fixture
def open_dir():
    """A folder another user can reach (pytest's own are root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="cachepilot-unit-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_controller_starts_as_its_systemd_unit_runs_it(open_dir, cgroup_root):
    """deploy/systemd/cachepilot-controller.service runs the controller as
    an unprivileged dynamic user, on a read-only /etc, with the key that
    `certs init` keeps 0600 to root handed over by LoadCredential= and its
    state in StateDirectory=.  The same here: uid nobody, the config folder
    root's, the key copied to a credentials folder the way systemd does,
    STATE_DIRECTORY and CREDENTIALS_DIRECTORY set."""
    unit = (REPO / "deploy" / "systemd" / "cachepilot-controller.service").read_text()
    assert "LoadCredential=controller.key:/etc/cachepilot/controller.key" in unit
    assert "StateDirectory=cachepilot-controller" in unit and "DynamicUser=yes" in unit
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    d, state, creds = open_dir / "etc", open_dir / "state", open_dir / "creds"
    _init(d, cgroup_root)
    d.chmod(0o755)
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *CLI]
    env = dict(os.environ, STATE_DIRECTORY=str(state))
    # without the credential: the key is root's, and the error says so
    r = subprocess.run([*as_nobody, "controller", "--config", str(d / "controller.yaml")],
                       capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert r.returncode != 0 and f"{d}/controller.key" in r.stderr \
        and "Permission denied" in r.stderr, r.stderr
    creds.mkdir()
    shutil.copy(d / "controller.key", creds / "controller.key")
    os.chown(creds / "controller.key", NOBODY, NOBODY)
    os.chmod(creds / "controller.key", 0o400)
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    _register_and_list(d, open_dir, cgroup_root, as_nobody, env)
    assert [p.name for p in state.iterdir() if p.suffix == ".db"] == ["controller.state.db"]
    assert not list(d.glob("*.state.db*"))


# -- the shipped configs: they run, or one line names the command ------------

REPO = Path(__file__).resolve().parents[1]
SHIPPED = [
    (["controller", "--config", "configs/controller.yaml"], "/etc/cachepilot/controller.key",
     "cachepilot controller: error: /etc/cachepilot/controller.key: cannot read the TLS key: "
     "No such file or directory; run `cachepilot certs init /etc/cachepilot` first\n"),
    (["admin", "--config", "configs/controller.yaml", "status"], "/etc/cachepilot/admin.crt",
     "cachepilot admin: error: /etc/cachepilot/admin.crt: cannot read the admin certificate: "
     "No such file or directory; run `cachepilot certs init /etc/cachepilot` first\n"),
    (["agent", "--config", "configs/agent-v1-host.yaml"], "/sys/fs/cgroup/memory/tenants",
     "cachepilot agent: error: configs/agent-v1-host.yaml: roots: "
     "/sys/fs/cgroup/memory/tenants is not a directory; make it with "
     "`mkdir -p /sys/fs/cgroup/memory/tenants` (as root)\n"),
    (["agent", "--config", "configs/agent-v2-host.yaml"], "/sys/fs/cgroup/tenants.slice",
     "cachepilot agent: error: configs/agent-v2-host.yaml: roots: "
     "/sys/fs/cgroup/tenants.slice is not a directory; make it with "
     "`mkdir -p /sys/fs/cgroup/tenants.slice` (as root)\n"),
]


@pytest.mark.parametrize("args,needs,message", SHIPPED, ids=lambda v: None)
def test_shipped_configs_name_the_command_that_makes_what_they_need(args, needs, message):
    if os.path.exists(needs):
        pytest.skip(f"{needs} exists on this host")
    r = _cli(*args, cwd=REPO, timeout=60)
    assert r.returncode == 2 and r.stderr == message


@pytest.mark.parametrize("name,what,message", [
    ("node-h1.key", "key", "run `cachepilot certs node h1 --dir {d}` first"),
    ("ca.crt", "CA certificate", "run `cachepilot certs init {d}` first"),
    ("token", "token file", "make one with `head -c 32 /dev/urandom | base64 > {d}/token`"),
])
def test_a_missing_file_names_the_command_that_makes_it(tmp_path, name, what, message):
    from cachepilot.core.errors import unreadable
    try:
        open(tmp_path / name)
    except OSError as err:
        text = unreadable(tmp_path / name, what, err)
    assert text == (f"{tmp_path / name}: cannot read the {what}: No such file or directory; "
                    + message.format(d=tmp_path))


def test_the_shipped_controller_config_runs_once_certs_init_made_its_files(tmp_path):
    """configs/controller.yaml with /etc/cachepilot moved to a temporary
    folder (and another port) starts once `certs init` has filled it."""
    d = tmp_path / "etc"
    assert _cli("certs", "init", str(d)).returncode == 0
    text = (REPO / "configs" / "controller.yaml").read_text()
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(text.replace("/etc/cachepilot", str(d)).replace(
        "listen: 127.0.0.1:50551", f"listen: 127.0.0.1:{_free_port()}").replace(
        "metrics_port: 9106", "metrics_port: 0"))
    log = open(tmp_path / "ctl.log", "w+")
    ctl = subprocess.Popen([*CLI, "controller", "--config", str(cfg)], stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while "controller listening on" not in (tmp_path / "ctl.log").read_text():
            assert ctl.poll() is None, (tmp_path / "ctl.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "ctl.log").read_text()
            time.sleep(0.2)
        r = _cli("admin", "--config", str(cfg), "tenants")
        assert r.returncode == 0 and "shop" in r.stdout, r.stderr
    finally:
        _stop(ctl)
