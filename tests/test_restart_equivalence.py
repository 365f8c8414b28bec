"""A controller killed with SIGKILL and started again from its store decides,
from then on, exactly what a controller that was never interrupted decides
(issue 44, item 5).

The demo's two sim hosts (same seeds) are stepped in lock-step from this
process against a `cachepilot controller` process with an SQLite store and
a recording, for 60 intervals: once straight through, and once with the
controller SIGKILLed after interval 30 and started again on the same
store.  Every directive of intervals 31-60 must be the same in both runs:
a field of the engine's state left out of the store, or restored
differently, changes one (tests/test_engine_pure.py finds which).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cachepilot.agent.client import NodeClient
from cachepilot.controller import recording
from cachepilot.controller.config import load_config
from cachepilot.sim.backend import SimBackend

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
INTERVALS, KILL_AFTER = 60, 30

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    """`cachepilot controller` as a process of its own."""

    def __init__(self, config: Path, record: Path):
        log = record.with_suffix(".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cachepilot", "controller", "--config", str(config),
             "--record", str(record)],
            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "controller listening" not in log.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


def config(tmp: Path, name: str) -> Path:
    doc = yaml.safe_load(DEMO.read_text())
    port = free_port()
    doc["controller"] = {"insecure": True, "listen": f"127.0.0.1:{port}",
                         "state_path": str(tmp / f"{name}.db")}
    # nodes stepped by the test, not the clock: no report is shed, no node lost
    doc["control"]["interval_s"] = 60.0
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def clients(cfg, target, backends):
    return [NodeClient(b, target, insecure=True) for b in backends]


def step_all(cs):
    for c in cs:
        reports = c.backend.collect()
        for _ in range(100):
            if c.step(reports).connected:
                break
            time.sleep(0.1)
            c.next_attempt = 0.0
        else:
            raise AssertionError(f"{c.info.node_id}: no controller to report to")


def run(tmp: Path, name: str, kill: bool):
    path = config(tmp, name)
    cfg = load_config(path)
    target = cfg.controller.listen
    backends = [SimBackend(cfg, n.name, seed=n.seed) for n in cfg.nodes]
    ctl = Controller(path, tmp / f"{name}-1")
    cs = clients(cfg, target, backends)
    try:
        for i in range(INTERVALS):
            step_all(cs)
            if kill and i + 1 == KILL_AFTER:
                ctl.kill()
                for c in cs:
                    c.channel.close()
                ctl = Controller(path, tmp / f"{name}-2")
                cs = clients(cfg, target, backends)
    finally:
        ctl.stop()
        for b in backends:
            b.close()
    parts = [tmp / f"{name}-1"] + ([tmp / f"{name}-2"] if kill else [])
    return [recording.read(p) for p in parts]


def rounds_of(lines) -> dict[int, dict]:
    return {line["round"]: line["directives"] for line in lines if line["type"] == "round"}


def test_a_killed_controller_decides_as_one_that_ran_on(tmp_path):
    (straight,) = run(tmp_path, "straight", kill=False)
    before, after = run(tmp_path, "killed", kill=True)
    a = rounds_of(straight)
    b1, b2 = rounds_of(before), rounds_of(after)
    nodes = len(load_config(DEMO).nodes)
    cut = KILL_AFTER * nodes
    assert len(a) == INTERVALS * nodes and max(b1) == cut
    # the restarted controller took up at the next round, from its store
    assert sorted(b2) == list(range(cut + 1, INTERVALS * nodes + 1))
    assert any(line["type"] == "restore" and line["records"] for line in after)
    differ = [(r, a[r], b2[r]) for r in b2 if a[r] != b2[r]]
    assert not differ, differ[:3]
    # and before the kill the two runs were the same run
    assert all(a[r] == b1[r] for r in b1)
    # the runs moved limits and policies: a comparison of idle rounds proves little
    limits = {d[1] for r in b2 for ds in b2[r].values() for d in ds}
    policies = {d[2] for r in a for ds in a[r].values() for d in ds}
    assert len(limits) > 5 and len(policies) > 1
