"""The decision engine: one round from reports to directives.

    decide(state, reports, config) -> (Decision, new_state)

`reports` maps a live node to its TenantReports this interval; nodes and
tenants may come and go.  decide() never changes the state it is given:
it works on a fork (EngineState.fork) and returns it, so what-if and
replay call it and throw the new state away.  The policy in force is the
one the node reports running, not the one last directed; on an advisory
node (no cache_ext) the engine still chooses and logs a policy but sizes
on the one running.  Same state, reports and config: same decision.
The round is a list of named steps over one Round (engine/round.py);
docs/design.md describes it on one page.  Each decision carries a trace
(engine/trace.py) from which `admin explain` rebuilds it.
"""
from __future__ import annotations

from collections.abc import Collection

from cachepilot.controller.engine.emit import emit
from cachepilot.controller.engine.trace import RoundTrace
from cachepilot.controller.engine.round import (allocate_memory, bank_curves,
                                                choose_policies, fit_models,
                                                gather_rows, predict, size_bounds,
                                                size_slos, step_limits)
from cachepilot.controller.engine.types import (Decision, EngineState, LogEntry,
                                                TenantPlan, TenantState, Violation)
from cachepilot.protocol.types import TenantReport

__all__ = ["decide", "keep_freed_memory", "Decision", "EngineState", "LogEntry",
           "TenantPlan", "TenantState", "Violation"]


def decide(state: EngineState, reports: dict[str, list[TenantReport]], config,
           node_memory: dict[str, int] | None = None,
           advisory_nodes: Collection[str] = (), recommend: Collection[str] = (),
           settled: bool = False) -> tuple[Decision, EngineState]:
    """One decision round over the live nodes' reports (see the module doc):
    (the decision, the state after it).

    node_memory overrides the config's memory per node (e.g. the capacity
    a node registered with); nodes in neither are ignored with a note.
    advisory_nodes names the nodes that cannot swap policies (the service
    knows from their registration); every other node is taken to swap.
    recommend names the tenants whose directives are only recommendations
    (recommend mode): decided and logged, not expected to take effect.
    settled: a what-if of where the nodes' division settles, without the
    holds of a phase change under way (engine/whatif.allocate)."""
    state = state.fork(r.tenant for rs in reports.values() for r in rs)
    state.round += 1
    ctl = config.control
    specs, node_specs = _indexes(config)
    rnd = gather_rows(state, reports, specs, node_specs, node_memory, advisory_nodes,
                      recommend)
    rnd.settled = settled
    fit_models(state, rnd, ctl)
    bank_curves(rnd, ctl)
    size_bounds(rnd, ctl)
    choose_policies(rnd, ctl)
    size_slos(rnd, ctl)
    allocate_memory(rnd, ctl)
    step_limits(rnd, ctl)
    predict(rnd)
    decision = emit(state, rnd, ctl)
    decision.trace = RoundTrace(rnd, decision, ctl)
    return decision, state


_INDEXES: list = [None]


def _indexes(config):
    """Name -> spec maps for the config, kept across calls: the service calls
    decide once per node, and rebuilding them for 1,000 tenants each time
    would cost more than the node's own decision.  A cache of the process,
    keyed on the config's identity, not part of any state."""
    key = (id(config.tenants), len(config.tenants), id(config.nodes), len(config.nodes))
    cached = _INDEXES[0]
    # the config itself is held, so its id cannot pass to another meanwhile
    if cached is None or cached[0] is not config or cached[1] != key:
        cached = (config, key, {t.name: t for t in config.tenants},
                  {n.name: n for n in config.nodes})
        _INDEXES[0] = cached
    return cached[2], cached[3]


def keep_freed_memory() -> None:
    """A round allocates a few dozen arrays of megabytes and frees them.
    glibc hands blocks that large back to the kernel on free and maps them
    again on the next round, so every round pays page faults for memory it
    just had.  Let the heap keep them (up to 256 MiB of free heap; blocks
    up to 32 MiB from the heap).  Process-wide, so the process that runs
    rounds calls it (the service at start); a no-op without glibc."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 256 << 20)
    except (OSError, AttributeError):
        pass
