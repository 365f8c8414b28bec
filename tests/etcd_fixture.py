"""A real etcd on loopback for tests: free ports, a temporary data dir.

`EtcdServer(data_dir)` starts Debian's `etcd` (package etcd-server, which
`make deps` installs) listening on 127.0.0.1 only, waits until /health
says true, and can be SIGKILLed and started again on the same data dir
and ports (what a test of losing the store needs).  Without the binary,
`require_etcd()` skips the test and says why.
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def require_etcd() -> str:
    path = shutil.which("etcd")
    if path is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server; "
                    "`make deps` installs it)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(self, data_dir: Path, name: str = "test"):
        self.binary = require_etcd()
        self.data_dir = Path(data_dir)
        self.name = name
        self.client_port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str = "") -> str:
        return f"etcd://{self.host_port}{prefix}"

    def start(self, timeout: float = 20.0) -> None:
        client, peer = f"http://{self.host_port}", f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--name", self.name, "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}", "--log-level", "warn",
             # a one-member cluster elects at once; short ticks let it grant
             # 1 s leases (its least TTL is 1.5 election timeouts)
             "--heartbeat-interval", "20", "--election-timeout", "200"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see "
                                   f"{self.data_dir}.log")
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"etcd not healthy after {timeout} s")
            time.sleep(0.1)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host_port}/health", timeout=1) as r:
                return json.load(r).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL: no goodbye to anyone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        self.proc = None


def wait_until(cond, timeout: float, step: float = 0.05) -> bool:
    """Poll cond() until it holds or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()
