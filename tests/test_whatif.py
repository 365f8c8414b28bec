"""Issue 15, item 5: what-if, checked against the simulator.

After a short `cachepilot run` (tests/test_recommend.py's one-node config,
enforce mode) the controller is asked what a tenant's miss ratio would be
at another limit and policy; the same tenant is then run in the sim at
that limit and policy (same seed, no controller) and its observed miss
ratio must agree within 0.02.  `what-if --node --free` re-runs the
round's allocation with less memory: the SLO tenant is served first, the
others give up the memory.  Asking changes nothing.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_recommend import _config  # noqa: E402

from cachepilot.controller.engine import saved
from cachepilot.controller.registry import Refused
from cachepilot.protocol import cachepilot_pb2 as pb
from cachepilot.protocol.types import Directive
from cachepilot.run import run_autopilot
from cachepilot.sim.backend import SimBackend

MiB = 1 << 20
INTERVALS = 20
WARM = 5            # intervals the sim's cache takes to fill before it is measured
LONG_RUN = 60       # intervals the sim runs for the long-run miss ratio: under
                    # MRU a tenant's misses drift and cycle over tens of
                    # intervals (hot at 12 MiB: 0.655 over intervals 5-20,
                    # 0.68 over 5-60)


@pytest.fixture(scope="module")
def after_run():
    cfg = _config("enforce")
    _, _, controller = run_autopilot(cfg, INTERVALS)
    return cfg, controller


def _sim_miss_ratio(cfg, tenant, limit, policy):
    b = SimBackend(cfg, "n1", seed=5, curves=False)
    b.apply([Directive(t.name, limit if t.name == tenant else 4 * MiB, policy, "what-if check")
             for t in cfg.tenants])
    ms = []
    for _ in range(LONG_RUN):
        ms.append(next(r.miss_ratio for r in b.collect() if r.tenant == tenant))
    b.close()
    return float(np.mean(ms[WARM:]))


# A report's curve covers one interval (the agent's builder window).  Where
# a window is shorter than the workload's period -- a 24 MiB loop, half a
# pass per interval, under MRU -- one curve is not the long-run miss
# ratio: the last one alone said 0.00 at 20 MiB where the sim's long run
# gives 0.17 (and 0.55 at 12 MiB against 0.50).  What-if reads the mean
# over the last reports' curves; both scan-under-MRU cases fail on the
# last curve alone.
@pytest.mark.parametrize("tenant,policy,limit_mib", [
    ("hot", "lru", 4), ("hot", "lru", 10), ("hot", "fifo", 20),
    ("hot", "mru", 12), ("scan", "mru", 20), ("scan", "mru", 12), ("scan", "fifo", 16),
    ("scan", "lru", 8), ("cold", "lru", 20), ("cold", "fifo", 6)])
def test_what_if_agrees_with_a_sim_run_at_that_limit(after_run, tenant, policy, limit_mib):
    cfg, c = after_run
    state = {t: saved.tenant_record(c.engine.state, t) for t in c.engine.state.tenants}
    rounds = c.rounds
    p = c.what_if(pb.WhatIfRequest(tenant=tenant, limit_bytes=limit_mib * MiB,
                                   policy=policy)).tenants[0]
    assert (p.tenant, p.policy, p.limit_bytes) == (tenant, policy, limit_mib * MiB)
    observed = _sim_miss_ratio(cfg, tenant, limit_mib * MiB, policy)
    assert abs(p.miss_ratio - observed) <= 0.02, (p.miss_ratio, observed)
    # the SLO verdict follows the predicted throughput
    if p.has_slo:
        assert p.slo_met == (p.throughput >= p.slo_min_throughput)
    # asking changed nothing
    assert c.rounds == rounds
    assert {t: saved.tenant_record(c.engine.state, t) for t in c.engine.state.tenants} == state


def test_what_if_a_node_gives_up_memory(after_run):
    cfg, c = after_run
    reply = c.what_if(pb.WhatIfRequest(node="n1", free_bytes=8 * MiB))
    rows = {t.tenant: t for t in reply.tenants}
    assert set(rows) == {"hot", "scan", "cold"}
    assert sum(t.limit_before for t in rows.values()) <= 32 * MiB + 3 * 4096
    assert sum(t.limit_bytes for t in rows.values()) <= 24 * MiB + 3 * 4096
    # the SLO is served first: hot keeps its SLO (it may give up what it
    # held beyond its SLO's safe size for throughput), the others pay
    # most, and nobody gains from less memory
    cut = {t: r.limit_before - r.limit_bytes for t, r in rows.items()}
    assert rows["hot"].slo_met and rows["hot"].slo_met_before
    assert cut["hot"] < max(cut["scan"], cut["cold"])
    assert sum(t.limit_before - t.limit_bytes for t in rows.values()) >= 8 * MiB - 3 * 4096
    for t in rows.values():
        assert t.throughput <= t.throughput_before * (1 + 1e-9)
        assert t.miss_ratio >= t.miss_ratio_before - 1e-9


def test_what_if_refuses_what_it_cannot_answer(after_run):
    cfg, c = after_run
    for req, words in [
            (pb.WhatIfRequest(tenant="nobody", limit_bytes=MiB), "unknown tenant"),
            (pb.WhatIfRequest(tenant="cold", policy="mru"), "may not run"),
            (pb.WhatIfRequest(tenant="hot", policy="s3fifo"), "may not run"),
            (pb.WhatIfRequest(node="n1", free_bytes=64 * MiB), "less than"),
            (pb.WhatIfRequest(node="n9", free_bytes=MiB), "unknown node"),
            (pb.WhatIfRequest(tenant="hot", node="n1"), "name a tenant")]:
        with pytest.raises(Refused) as err:
            c.what_if(req)
        assert words in err.value.message, (req, err.value.message)
