"""The issue's "must show" for the model watchdog: in the sim, a tenant gets a
policy whose curve is deliberately wrong; the controller switches it back
within K + 2 intervals, and the log entry gives the predicted and observed
miss ratios.

`cachepilot run`'s own wiring (root/run.py: the real controller behind
loopback gRPC, the real engine, sim nodes through NodeClient) runs one node
whose backend reports an optimistic lie for one policy: fifo's curve says
the tenant would barely miss at any size.  The tenant replays a loop larger
than it may hold, where fifo in truth misses nearly everything and mru, the
policy it starts with, hits part of the loop."""
from __future__ import annotations

import numpy as np
import pytest

from cachepilot.sim.backend import SimBackend
from cachepilot import run as run_mod
from cachepilot.controller.config import config_from_dict
from cachepilot.controller.engine import round as round_mod
from cachepilot.models.mrc import MRC

K, MARGIN, COOLDOWN = 3, 0.05, 8
LIAR, VICTIM = "fifo", "victim"
INTERVALS = 20


class LyingSim(SimBackend):
    """The sim backend, except that VICTIM's curves for LIARS are lies."""
    LIARS = (LIAR,)

    def collect(self):
        reports = super().collect()
        for r in reports:
            if r.tenant == VICTIM:
                r.curves = [MRC(c.sizes, np.full(len(c.sizes), 0.01), c.policy, c.method,
                                c.rate, dict(c.meta)) if c.policy in self.LIARS else c
                            for c in r.curves]
        return reports


def config(policies=("mru", LIAR)):
    service = {"t_hit_s": 1e-5, "t_miss_s": 1e-4, "concurrency": 4}
    return config_from_dict({
        "control": {"autopilot_k": 2, "anon_margin_bytes": 0, "max_step_fraction": 0.25},
        "controller": {"insecure": True, "listen": "127.0.0.1:0"},
        "nodes": [{"name": "n", "memory_bytes": "32MiB", "backend": "sim", "seed": 5}],
        "tenants": [
            {"name": VICTIM, "node": "n", "floor_bytes": "2MiB", "ceiling_bytes": "24MiB",
             "policies": list(policies), "initial_policy": "mru",
             "workload": {"accesses_per_interval": 20000, "service": service,
                          "phases": [{"kind": "loop", "footprint": "48MiB"}]}},
            {"name": "neighbour", "node": "n", "floor_bytes": "2MiB", "policies": ["lru"],
             "initial_policy": "lru",
             "workload": {"accesses_per_interval": 20000, "service": service,
                          "phases": [{"kind": "zipf", "skew": 1.0, "footprint": "32MiB"}]}},
        ]}, "watchdog-sim.yaml")


def _patch(mp, backend):
    """The sim backend that lies, and the round's watchdog figures as this
    file's (a shorter cooldown than the engine's, to see its end)."""
    mp.setattr(run_mod, "SimBackend", backend)
    for name, v in (("WATCHDOG_INTERVALS", K), ("WATCHDOG_MARGIN", MARGIN),
                    ("WATCHDOG_COOLDOWN", COOLDOWN)):
        mp.setattr(round_mod, name, v)


@pytest.fixture(scope="module")
def run():
    mp = pytest.MonkeyPatch()
    _patch(mp, LyingSim)
    try:
        history, log, controller = run_mod.run_autopilot(config(), INTERVALS)
    finally:
        mp.undo()
    return history[VICTIM], [e for e in log if e.tenant == VICTIM], controller


def test_the_lying_policy_is_switched_to_and_back_within_k_plus_2_intervals(run):
    history, log, _ = run
    # one node: decision round r answers the report of interval r, and its
    # directive governs interval r + 1
    to_liar = [e for e in log if e.kind == "policy" and e.detail.get("after") == LIAR]
    back = [e for e in log if e.kind == "watchdog"]
    assert to_liar and back
    s, w = to_liar[0].round, back[0].round
    assert to_liar[0].detail["before"] == "mru"
    assert back[0].detail["before"] == LIAR and back[0].detail["after"] == "mru"
    assert s < w <= s + K + 2
    policy = {h["interval"]: h["policy"] for h in history}
    assert [policy[i] for i in range(s + 1, w + 1)] == [LIAR] * (w - s)
    assert policy[w + 1] == "mru"


def test_the_watchdog_entry_gives_predicted_and_observed_miss_ratios(run):
    history, log, _ = run
    e = next(e for e in log if e.kind == "watchdog")
    predicted, observed = e.detail["predicted_miss"], e.detail["observed_miss"]
    assert set(predicted) == {LIAR, "mru"}
    assert predicted[LIAR] == pytest.approx(0.01)            # the lie
    assert observed > predicted["mru"] + MARGIN
    # the observed figure is what the tenant really missed while fifo ran
    s = next(x for x in log if x.kind == "policy" and x.detail.get("after") == LIAR).round
    ran = [h["miss_ratio"] for h in history if s + 1 < h["interval"] <= e.round]
    assert observed == pytest.approx(sum(ran) / len(ran))
    # ... and the message an operator reads carries the three numbers
    for v in (observed, predicted[LIAR], predicted["mru"]):
        assert f"{v:.3f}" in e.message


def test_the_lying_policy_is_not_picked_again_during_the_cooldown(run):
    history, log, _ = run
    w = next(e for e in log if e.kind == "watchdog").round
    assert INTERVALS >= w + COOLDOWN + 1
    again = [e.round for e in log if e.kind == "policy" and e.detail.get("after") == LIAR
             and e.round > w]
    assert all(r > w + COOLDOWN for r in again), again
    policy = {h["interval"]: h["policy"] for h in history}
    assert [policy[i] for i in range(w + 1, w + COOLDOWN + 2)] == ["mru"] * (COOLDOWN + 1)


def test_each_revert_is_counted_for_prometheus(run):
    """The controller's cachepilot_watchdog_reverts_total counts the
    watchdog's reverts per tenant (deploy/prometheus alerts on it)."""
    _, log, controller = run
    reverts = sum(e.kind == "watchdog" for e in log)
    assert reverts >= 1
    text = controller.metrics.exposition().decode()
    line = f'cachepilot_watchdog_reverts_total{{tenant="{VICTIM}"}} {float(reverts)}'
    assert line in text, [x for x in text.splitlines() if "reverts" in x]


class TwoLiars(LyingSim):
    LIARS = (LIAR, "lfu")


def test_a_sibling_that_lies_the_same_way_is_not_tried_after_a_revert():
    """fifo and lfu both claim the victim would barely miss.  Once fifo's
    switch is undone, lfu's claim -- the same kind of curve from the same
    stream -- is held off as long: one revert, not one per sibling."""
    mp = pytest.MonkeyPatch()
    _patch(mp, TwoLiars)
    try:
        history, log, _ = run_mod.run_autopilot(config(("mru", LIAR, "lfu")), INTERVALS)
    finally:
        mp.undo()
    mine = [e for e in log if e.tenant == VICTIM]
    first = [e for e in mine if e.kind == "watchdog"]
    assert first, "no switch was undone: nothing tested"
    w = first[0].round
    assert INTERVALS >= w + COOLDOWN + 1
    tried = [e for e in mine if e.kind == "policy" and e.round > w
             and e.detail.get("after") in (LIAR, "lfu")]
    assert all(e.round > w + COOLDOWN for e in tried), [(e.round, e.message) for e in tried]
    assert sum(e.kind == "watchdog" for e in mine if e.round <= w + COOLDOWN) == 1


def test_after_the_cooldown_the_same_lie_is_not_tried_again():
    """The cooldown ends, but the evidence has not changed: fifo's curve
    still promises what it promised when it failed, and what it failed by
    is in every challenger's doubt now, so it is not tried again."""
    mp = pytest.MonkeyPatch()
    _patch(mp, LyingSim)
    try:
        history, log, _ = run_mod.run_autopilot(config(), INTERVALS + 3 * COOLDOWN)
    finally:
        mp.undo()
    mine = [e for e in log if e.tenant == VICTIM]
    w = next(e.round for e in mine if e.kind == "watchdog")
    assert INTERVALS + 3 * COOLDOWN >= w + 2 * COOLDOWN
    again = [(e.round, e.message) for e in mine if e.kind == "policy" and e.round > w
             and e.detail.get("after") == LIAR]
    assert not again
    assert sum(e.kind == "watchdog" for e in mine) == 1
