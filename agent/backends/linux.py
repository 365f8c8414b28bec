"""The `linux` backend: a real host.

Several times an interval (tick(), config sampling.slices) it asks the
sampler for its counters, sampled keys and distinct-page sketches and
feeds every watched cgroup's curve builder one time slice.  Each interval
(collect()) it reads the cgroup's memory files and turns it all into one
TenantReport per cgroup.  Directives become memory limits through the
cgroup files, under the safety rules.

Without root, BPF or the tracepoints it runs in stats-only mode: reports
carry what the cgroup files say (limits, usage, refaults, v1 charge
counts) and no curves, and the reason is logged once.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cachepilot.agent import cgroups, damon, hookcost, pods, threads
from cachepilot.agent.cache_ext import (POLICY_DIR, PolicyActuator, PolicyError,
                                        running_policy)
from cachepilot.agent.cgroups import CgroupError, CgroupGone, SafetyRules
from cachepilot.agent.curves import CountedMisses, make_builder, shift_by_anon
from cachepilot.agent.rates import Replay, RateTuner, SampleBudget, warm
from cachepilot.agent.sampler import (Counters, Sampler, SamplerUnavailable,
                                      access_batch, rate_for_threshold, why_unavailable)
from cachepilot.agent.throughput import PrometheusSource
from cachepilot.core import phase
from cachepilot.core.units import size
from cachepilot.models.mrc import PAGE_SIZE
from cachepilot.protocol.types import ApplyResult, Directive, NodeInfo, TenantReport

log = logging.getLogger("cachepilot.agent")

BTF = Path("/sys/kernel/btf/vmlinux")
SAMPLER_RETRY_S = 10            # between tries to start a dead sampler again


def kernel_has_cache_ext(btf: Path = BTF) -> bool:
    """Whether the running kernel's BTF names the type `cache_ext_ops` (the
    cache_ext struct_ops the policies attach through)."""
    try:
        return btf_has_cache_ext(btf.read_bytes())
    except OSError:
        return False


def btf_has_cache_ext(data: bytes) -> bool:
    """The same test on BTF already read."""
    # type names live NUL-separated in BTF's string section
    return b"\x00cache_ext_ops\x00" in data


LRU_GEN = Path("/sys/kernel/mm/lru_gen/enabled")


def kernel_default_policy(lru_gen: Path = LRU_GEN) -> str:
    """The library policy that models what the kernel does with a cgroup
    that has no cache_ext policy: `mglru` where the multi-generational LRU
    is switched on (bit 0 of lru_gen/enabled), else `linux`, the classic
    active/inactive lists."""
    try:
        value = int(lru_gen.read_text().strip(), 0)
    except (OSError, ValueError):
        return "linux"
    return "mglru" if value & 1 else "linux"


def _per_s(now: int | None, last: int | None, dt: float) -> float | None:
    """A cumulative counter's rise per second; None when a reading is
    missing or the counter went back (reset, or a cgroup made again)."""
    if now is None or last is None or now < last:
        return None
    return (now - last) / dt


def mem_total_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Watched:
    tenant: str
    path: str
    cgid: int
    spec: object | None          # TenantSpec or None for a `cgroups:` entry
    builder: object | None
    throughput: PrometheusSource | None
    last_time: float
    last_counters: Counters = field(default_factory=Counters)
    last_stats: cgroups.CgroupStats | None = None
    threshold: int = 0
    totals: Counters = field(default_factory=Counters)   # cumulative, for metrics
    interval: Counters | None = None     # counted since the last report
    policy: str = "linux"                # running, as the kernel last said
    last_tick_ns: int | None = None      # monotonic ns of the last counters read
    tids: dict | None = None             # tid maps last written, from thread rules
    counted_tids: list | None = None     # the threads its curves count (slo_threads)
    counted_misses: CountedMisses | None = None   # their misses this interval
    # its operations per page read, smoothed (core/phase.py): a jump is a
    # new phase, and its builders count the new one from then on
    ops_per_access: float | None = None
    ops_pending: float | None = None     # a jump that the next interval must repeat
    overflow_seen: int = 0               # the policy's overflow last reported
    last_cpu_us: int | None = None       # the cgroup's CPU time at the last report
    last_read_bytes: int | None = None   # its bytes read from disk, likewise
    # (monotonic time, limit before) of the first limit write of the
    # current interval: max_step bounds all of an interval's writes
    step_window: tuple[float, int] | None = None
    # sampling.samples_per_s: the tenant's own rate (agent/rates.py), the
    # rate its builder samples at, and the builder at a new rate counting
    # beside it until its curves take over
    tuner: RateTuner | None = None
    rate: float = 0.0
    next_builder: object | None = None
    # its last intervals' batches as fed, for a builder at a lower rate to
    # start from (agent/rates.py)
    recent: Replay | None = None

    def builders(self) -> list:
        return [b for b in (self.builder, self.next_builder) if b is not None]

    def wanted_threshold(self) -> int:
        """The kernel's threshold for this cgroup: what its builders need."""
        return max((int(b.threshold) for b in self.builders()), default=0)


class LinuxBackend:
    def __init__(self, cfg, sampler: Sampler | None = None, start_sampler: bool = True,
                 pod_lister=None):
        # lists this node's pods (agent/pods.py) when a tenant names pods;
        # made on first use, so hosts without Kubernetes never need one
        self.pod_lister = pod_lister
        self.cfg = cfg
        self.rules = SafetyRules(cfg.safety.floor, cfg.safety.anon_margin,
                                 cfg.safety.anon_margin_ratio, cfg.safety.max_step)
        self.has_cache_ext = kernel_has_cache_ext()
        self.default_policy = kernel_default_policy()
        self.memory_bytes = cfg.memory or mem_total_bytes()
        self.policies = self._policies()
        # the tenants to watch: the config's (stand-alone), or those the
        # controller assigns at registration (assign())
        self.tenants = list(cfg.tenants)
        self.watched: dict[str, Watched] = {}       # tenant -> Watched
        self.sampler = sampler
        self.stats_only_reason: str | None = None
        # a sampler that ran and died is started again (restart_sampler),
        # at most once every SAMPLER_RETRY_S; one that never ran is not
        self.sampler_lost_at: float | None = None
        self.sampler_retry_at = 0.0
        self.sampler_restarts = 0
        if self.sampler is None and start_sampler:
            reason = why_unavailable()
            if reason is None:
                try:
                    self.sampler = Sampler(ring_bytes=cfg.sampling.ring_bytes)
                except SamplerUnavailable as err:
                    reason = str(err)
            if reason:
                self.stats_only_reason = reason
        elif self.sampler is None:
            self.stats_only_reason = "the sampler was not started"
        if self.stats_only_reason:
            log.warning("stats-only mode (no access sampling, no curves): %s",
                        self.stats_only_reason)
        reclaimers = damon.pageout_kdamonds()
        if reclaimers:
            log.warning("this host's DAMON pages out idle-looking page cache (%s): pages of "
                        "any cgroup are reclaimed below its limit, so miss ratios can run "
                        "above the curves", damon.describe(reclaimers))
        self.sampler_totals = {"events": 0, "samples": 0, "drops": 0}
        # sampling.samples_per_s, lowered while the curve work outruns the
        # agent's CPU (agent/rates.py); the wall time that work took since
        # the last report, and when that report began
        self.budget = SampleBudget(cfg.sampling.samples_per_s) \
            if cfg.sampling.samples_per_s else None
        self.busy_s, self.reported_at = 0.0, time.monotonic()
        self.actuator: PolicyActuator | None = None
        self.no_actuation_reason = "this kernel has no cache_ext"
        if self.has_cache_ext:
            act = PolicyActuator(cfg.roots, self.default_policy,
                                 policy_dir=cfg.cache_ext.policy_dir or POLICY_DIR,
                                 pin_root=cfg.cache_ext.pin_root)
            self.no_actuation_reason = act.why_unavailable()
            if self.no_actuation_reason:
                log.warning("cache_ext policies cannot be attached: %s",
                            self.no_actuation_reason)
            else:
                self.actuator = act
        self.hook_ns: dict[str, float] = {}     # per policy: ns a cached read
        self.miss_ns: dict[str, float] = {}     # ... and a read that misses
        self._calibrate()
        self._refresh()
        self._adopt()

    def _calibrate(self) -> None:
        """Measure what each policy's hooks cost a cached read here
        (agent/hookcost.py), before any tenant is watched."""
        folder = self.cfg.cache_ext.calibrate_dir
        if self.actuator is None or folder is None:
            return
        try:
            costs = hookcost.measure(self.actuator, self.cfg.roots[0], self.policies, folder)
        except hookcost.CalibrationError as err:
            log.warning("policy hook costs not measured (policies are scored on their "
                        "curves alone): %s", err)
            return
        for per, alone, base, figures, failed, into in (
                ("cached read", "a read", costs.baseline_ns, costs.ns_per_access,
                 costs.failed, self.hook_ns),
                ("read that misses", "a miss", costs.miss_baseline_ns, costs.ns_per_miss,
                 costs.miss_failed, self.miss_ns)):
            if figures:
                into.update(figures)
                into[self.default_policy] = 0.0
            for p, why in failed.items():
                log.warning("policy %s: hook cost per %s not measured: %s", p, per, why)
            log.info("policy hook costs per %s (%s alone: %.0f ns): %s", per, alone, base,
                     ", ".join(f"{p} +{v:.0f} ns" for p, v in sorted(figures.items()))
                     or "none")

    def _adopt(self):
        if self.actuator is not None:
            for line in self.actuator.adopt({w.cgid: w.path for w in self.watched.values()}):
                log.info("cache_ext: %s", line)

    def assign(self, tenants) -> None:
        """The tenants the controller names for this node (its config is
        the one list): watch those, and stop watching any other."""
        known = self._known_policies()
        for t in tenants:
            extra = [p for p in t.policies or [] if p not in known]
            if extra:
                log.warning("tenant %s: no curves for %s (this agent's engine has no such "
                            "policy)", t.name, ", ".join(extra))
        self.tenants = list(tenants)
        self._refresh()
        self._adopt()

    # -- what we watch -------------------------------------------------------
    def _policies(self) -> list[str]:
        if self.cfg.policies:
            return list(self.cfg.policies)
        return self._known_policies()

    @staticmethod
    def _known_policies() -> list[str]:
        """Every policy the MRC engine can build a curve for."""
        try:
            from cachepilot.models.builder import MRCBuilder  # noqa: F401
            from cachepilot.models.runtime import available_policies
            return ["lru"] + [p for p in available_policies() if p != "lru"]
        except Exception:   # noqa: BLE001 - engine parts not built: LRU only
            return ["lru"]

    def _wanted(self) -> dict[str, tuple[str, object | None]]:
        """tenant name -> (cgroup path, its TenantSpec or None)."""
        roots = self.cfg.roots
        want = {}
        listed = None
        for spec in self.tenants:
            if spec.pod is not None:
                if listed is None:
                    listed = self._list_pods()
                want.update(self._pod_cgroups(spec, listed, roots))
                continue
            hits = cgroups.expand([spec.cgroup], roots)
            if len(hits) == 1:
                want[spec.name] = (hits[0], spec)
            else:
                for h in hits:
                    want[f"{spec.name}/{os.path.basename(h)}"] = (h, spec)
        for h in cgroups.expand(self.cfg.cgroups, roots):
            if any(p == h for p, _ in want.values()):
                continue
            name = next((os.path.relpath(h, r) for r in roots
                         if cgroups.is_under(h, [r])), h)
            want[name if name != "." else os.path.basename(h)] = (h, None)
        return want

    def _list_pods(self) -> list:
        """This node's pods, once a refresh; none (and a warning) when the
        API server cannot be asked."""
        try:
            if self.pod_lister is None:
                self.pod_lister = pods.ApiLister(self.cfg.node_id)
            return self.pod_lister()
        except CgroupError as err:
            log.warning("%s", err)
            return []

    def _pod_cgroups(self, spec, listed, roots) -> dict:
        """tenant name -> (pod cgroup, spec) for the pods a tenant names:
        the tenant's own name for one pod by name, name/pod for a selector."""
        out = {}
        ref = spec.pod
        for pod in pods.select(listed, ref.namespace, ref.name, ref.selector):
            for root in roots:
                try:
                    path = str(pods.find_pod_cgroup(root, pod))
                except CgroupError:
                    continue
                out[spec.name if ref.name else f"{spec.name}/{pod.name}"] = (path, spec)
                break
            else:
                log.warning("tenant %s: pod %s/%s has no cgroup under %s", spec.name,
                            pod.namespace, pod.name, ", ".join(map(str, roots)))
        return out

    def _refresh(self):
        want = self._wanted()
        for tenant in list(self.watched):
            if tenant not in want or want[tenant][0] != self.watched[tenant].path:
                self._drop(tenant, "no longer matches the config" if tenant in want
                           else "is gone")
        for tenant, (path, spec) in want.items():
            if tenant in self.watched:
                continue
            try:
                cgroups.version_of(path)
                cgid = cgroups.cgroup_id(path)
            except CgroupError as err:
                log.warning("not watching %s: %s", path, err)
                continue
            sampling = self.cfg.sampling
            builder = self._builder(spec) if self.sampler is not None else None
            tp = None
            if spec is not None and spec.throughput.source == "prometheus":
                tp = PrometheusSource(spec.throughput)
            w = Watched(tenant, path, cgid, spec, builder, tp, time.monotonic(),
                        policy=running_policy(path, self.default_policy),
                        rate=sampling.start_rate,
                        tuner=RateTuner(self.budget.value, sampling.min_rate,
                                        sampling.max_rate)
                        if self.budget is not None else None,
                        recent=Replay() if self.budget is not None else None,
                        last_read_bytes=cgroups.read_bytes(path))
            try:
                w.last_stats = cgroups.read_stats(path)
            except CgroupError as err:
                log.warning("not watching %s: %s", path, err)
                continue
            if self.sampler is not None:
                try:
                    w.threshold = int(builder.threshold)
                    self.sampler.watch(cgid, w.threshold)
                    # counters may be left over from an earlier watch of this id
                    w.last_tick_ns, snap = self.sampler.counters()
                    w.last_counters = snap.get(cgid, (0, Counters()))[1]
                except SamplerUnavailable as err:
                    self._lose_sampler(str(err))
            self.watched[tenant] = w
            self._simulate_thread_rules(w)
            log.info("watching %s as tenant %s (cgroup id %d)", path, tenant, cgid)

    def _builder(self, spec, rate: float | None = None):
        """A tenant's curve builder: the policies it names that the engine
        knows, else the node's; at `rate` (default: sampling.start_rate)."""
        known = self._known_policies()
        policies = [p for p in spec.policies if p in known] \
            if spec is not None and spec.policies else []
        policies = policies or self.policies
        max_pages = (self.cfg.max_cache or self.memory_bytes) // PAGE_SIZE
        return make_builder(policies, rate=rate or self.cfg.sampling.start_rate,
                            max_pages=max_pages, max_samples=self.cfg.sampling.max_samples,
                            counted=spec is not None and spec.slo_threads is not None)

    def _drop(self, tenant: str, why: str):
        w = self.watched.pop(tenant)
        gone = ""
        if self.actuator is not None and not os.path.isdir(w.path):
            # the kernel detached its policy with it; the pins are ours
            try:
                if self.actuator.forget(w.cgid):
                    gone = "; its policy's pins removed"
            except PolicyError as err:
                gone = f"; its policy's pins stay: {err}"
        log.warning("cgroup %s (tenant %s) %s; dropped from the reports%s", w.path, tenant,
                    why, gone)
        if self.sampler is not None:
            try:
                self.sampler.unwatch(w.cgid)
            except SamplerUnavailable:
                pass

    def _lose_sampler(self, why: str):
        log.error("the sampler stopped (%s); continuing in stats-only mode, starting "
                  "it again in %d s", why, SAMPLER_RETRY_S)
        self.stats_only_reason = why
        if self.sampler is not None:
            self.sampler.close()
        self.sampler = None
        now = time.monotonic()
        self.sampler_lost_at = self.sampler_lost_at or now
        self.sampler_retry_at = now + SAMPLER_RETRY_S

    def restart_sampler(self) -> bool:
        """Start the sampler again after it died (the loader killed, its
        pipe broken): every watched cgroup is watched again from the
        counters as they are now, so the first interval after counts only
        what it saw; curves keep what they had.  Until then, and when this
        fails, reports are stats-only.  True when it runs again."""
        if self.sampler is not None or self.sampler_lost_at is None or \
                time.monotonic() < self.sampler_retry_at:
            return self.sampler is not None
        try:
            s = Sampler(ring_bytes=self.cfg.sampling.ring_bytes)
            for w in self.watched.values():
                if w.builder is None:
                    w.builder = self._builder(w.spec, w.rate)
                w.threshold = w.wanted_threshold()
                s.watch(w.cgid, w.threshold)
            now_ns, snap = s.counters()
        except SamplerUnavailable as err:
            self.sampler_retry_at = time.monotonic() + SAMPLER_RETRY_S
            log.warning("the sampler did not start again: %s; next try in %d s",
                        err, SAMPLER_RETRY_S)
            return False
        for w in self.watched.values():
            w.last_counters = snap.get(w.cgid, (0, Counters()))[1]
            w.last_tick_ns, w.interval = now_ns, None
        self.sampler, self.stats_only_reason = s, None
        self.sampler_restarts += 1
        log.info("the sampler runs again, %.0f s after it stopped",
                 time.monotonic() - self.sampler_lost_at)
        self.sampler_lost_at = None
        return True

    # -- Backend -------------------------------------------------------------
    def info(self) -> NodeInfo:
        version = 0
        # a root may be a plain folder of cgroups; then its members tell
        for path in list(self.cfg.roots) + [w.path for w in self.watched.values()]:
            try:
                version = cgroups.version_of(path)
                break
            except CgroupError:
                continue
        return NodeInfo(self.cfg.node_id, self.memory_bytes, version,
                        self.has_cache_ext, list(self.policies), "linux",
                        disk_read_bytes_per_s=self._disk_read_bytes_per_s(),
                        cores=float(self.cfg.cores or len(os.sched_getaffinity(0))))

    def _disk_read_bytes_per_s(self) -> float:
        """What the tenants' disk can read a second: the config's figure,
        else, when every root has a read throttle of its own (an emulated
        host), the smallest; else 0, not known."""
        if self.cfg.disk_read_bytes_per_s:
            return float(self.cfg.disk_read_bytes_per_s)
        found = [cgroups.read_throttle_bps(root) for root in self.cfg.roots]
        if found and None not in found:
            return float(min(found))
        return 0.0

    def tick(self) -> None:
        """One time slice: feed every builder what the kernel counted, sampled
        and sketched since the last tick.  The agent ticks sampling.slices
        times an interval (collect() makes the last tick); the builders'
        "stack" estimator counts every page read by slice from the sketches."""
        if self.sampler is None and not self.restart_sampler():
            return
        began = time.monotonic()
        try:
            self._tick()
        finally:
            self.busy_s += time.monotonic() - began

    def _tick(self) -> None:
        try:
            # the loader hands over the records read before it answers a
            # command, so these keys are those the counters count (give or
            # take the few read between the two commands)
            now_ns, snap = self.sampler.counters()
            records = self.sampler.drain()
            sketches = self.sampler.sketches()
        except SamplerUnavailable as err:
            self._lose_sampler(str(err))
            return
        for w in self.watched.values():
            counted = snap.get(w.cgid)
            if counted is None or self.sampler is None:
                continue
            d = counted[1] - w.last_counters
            w.last_counters = counted[1]
            w.totals = counted[1]
            w.interval = d if w.interval is None else w.interval + d
            if w.builder is not None:
                self._feed(w, d, records.get(w.cgid), sketches.get(w.cgid), now_ns)
            w.last_tick_ns = now_ns

    def _feed(self, w: Watched, d: Counters, recs, sketch, now_ns: int) -> None:
        # the first tick of a cgroup starts at its first record
        start = w.last_tick_ns
        if start is None:
            start = int(recs["time_ns"].min()) - 1 if recs is not None and len(recs) \
                else now_ns - 1
        keys, tids, positions = access_batch(recs, start, now_ns, d.accesses)
        if w.counted_tids:
            if w.counted_misses is None:
                w.counted_misses = CountedMisses()
            w.counted_misses.add(recs, np.asarray(w.counted_tids, np.uint32),
                                 rate_for_threshold(w.threshold), d.accesses, d.insert_drops)
        batch = (keys, tids, positions, d.accesses, sketch)
        if w.recent is not None:
            w.recent.add(batch)
        if not self._shed(w):
            for b in w.builders():
                # each builder keeps the keys under its own threshold
                _feed_batch(b, batch)
        # fixed-size SHARDS lowers the threshold as keys pile up
        self._follow_threshold(w)

    def _shed(self, w: Watched) -> bool:
        """Move a tenant whose interval under way has already sampled
        several intervals' budget down to its rate now (agent/rates.py),
        from its kept batches, this slice's last among them."""
        if w.tuner is None or w.builder is None or w.interval is None:
            return False
        elapsed = max(time.monotonic() - w.last_time,
                      self.cfg.interval_s / self.cfg.sampling.slices)
        new = w.tuner.shed(w.rate, w.interval.sampled, w.interval.accesses, elapsed,
                           self.cfg.interval_s, self._limit_pages(w.last_stats))
        if new is None:
            return False
        log.info("tenant %s: %d samples of %.0f accesses/s in %.1f s of an interval, "
                 "sampling rate %g -> %g now (from its last %d intervals again)", w.tenant,
                 w.interval.sampled, w.interval.accesses / elapsed, elapsed, w.rate, new,
                 len(w.recent))
        self._move_down(w, new, interval_done=False)
        return True

    def _limit_pages(self, stats) -> float:
        """The tenant's limit in pages, the node's memory at most (and when
        there is none, or no stats yet)."""
        limit = stats.effective_limit_bytes if stats is not None else None
        return min(limit or self.memory_bytes, self.memory_bytes) / PAGE_SIZE

    def _follow_threshold(self, w: Watched) -> None:
        """The kernel samples the cgroup at the threshold its builders need."""
        new_threshold = w.wanted_threshold()
        if new_threshold != w.threshold and self.sampler is not None:
            try:
                self.sampler.watch(w.cgid, new_threshold)
                w.threshold = new_threshold
            except SamplerUnavailable as err:
                self._lose_sampler(str(err))

    def _retune(self, w: Watched, accesses_per_s: float, limit_pages: float) -> None:
        """sampling.samples_per_s: move the tenant to the rate its speed asks
        for (agent/rates.py).  Down, a builder at the new rate is fed the
        tenant's last intervals again and takes over at once; up, it counts
        beside the old one and takes over once it is warm at the limit.
        Either way the curves keep what the builder saw from the start."""
        if w.tuner is None or w.builder is None:
            return
        if w.next_builder is not None:
            nb = w.next_builder
            if warm(nb.distinct_pages, w.builder.distinct_pages, limit_pages, nb.windows):
                w.builder, w.next_builder = nb, None
                self._follow_threshold(w)
                log.info("tenant %s: curves now sampled at rate %g (after %d windows, "
                         "%.0f distinct pages seen)", w.tenant, w.rate, nb.windows,
                         nb.distinct_pages)
            return
        new = w.tuner.decide(w.rate, accesses_per_s, limit_pages)
        if new is None:
            return
        down = new < w.rate
        log.info("tenant %s: %.0f accesses/s, sampling rate %g -> %g%s", w.tenant,
                 accesses_per_s, w.rate, new,
                 f" (from its last {len(w.recent)} intervals again)" if down else
                 " (the new curves count beside the old until they are warm)")
        if down:
            self._move_down(w, new, interval_done=True)
            return
        w.rate = new
        w.next_builder = self._builder(w.spec, new)
        self._simulate_thread_rules(w)      # before it sees a read
        self._follow_threshold(w)

    def _move_down(self, w: Watched, new: float, interval_done: bool) -> None:
        """A builder at the lower rate `new` takes over at once: the keys
        kept were sampled above its threshold, and fed again interval by
        interval they warm it.  The interval under way is closed only if it
        is done (`interval_done`); else the report closes it."""
        builder = self._builder(w.spec, new)
        w.rate = new
        w.builder, w.next_builder = builder, None
        self._simulate_thread_rules(w)      # before it sees a read
        s = self.cfg.sampling
        intervals = list(w.recent.intervals)
        for k, interval in enumerate(intervals):
            for batch in interval:
                _feed_batch(builder, batch)
            if interval and (interval_done or k < len(intervals) - 1):
                builder.end_interval(s.min_window_samples, s.max_window_intervals)
        self._follow_threshold(w)

    def collect(self) -> list[TenantReport]:
        self._refresh()
        self.tick()
        self._pace()
        began = time.monotonic()
        try:
            return self._collect()
        finally:
            self.busy_s += time.monotonic() - began

    def _pace(self) -> None:
        """Once a report: the sample budget after the curve work of the wall
        time since the last report (agent/rates.py), each tenant's tuner
        told, so that its rate follows in this report."""
        now = time.monotonic()
        busy, elapsed = self.busy_s, now - self.reported_at
        self.busy_s, self.reported_at = 0.0, now
        new = self.budget.after(busy, elapsed) if self.budget is not None else None
        if new is None:
            return
        log.warning("curve work took %.1f s of the last %.1f s: %g samples a second "
                    "per tenant now (sampling.samples_per_s %g)", busy, elapsed, new,
                    self.budget.ceiling)
        for w in self.watched.values():
            if w.tuner is not None:
                w.tuner.samples_per_s = new

    def _collect(self) -> list[TenantReport]:
        reports = []
        for tenant in list(self.watched):
            w = self.watched[tenant]
            try:
                stats = cgroups.read_stats(w.path)
            except CgroupGone:
                self._drop(tenant, "was deleted")
                continue
            except CgroupError as err:
                log.warning("tenant %s: %s", tenant, err)
                continue
            w.policy = running_policy(w.path, self.default_policy)
            self._follow_thread_rules(w)
            self._simulate_thread_rules(w)
            reports.append(self._report(w, stats))
        return reports

    def _rule_tids(self, w: Watched, policy: str) -> dict[str, list[int]] | None:
        """The tid maps the tenant's thread rules give `policy`, or None."""
        rules = w.spec.thread_rules().get(policy) if w.spec is not None else None
        if not rules:
            return None
        try:
            return threads.policy_tids(w.path, policy, rules)
        except cgroups.CgroupError:
            return None

    def _follow_thread_rules(self, w: Watched) -> None:
        """Once an interval: the running policy's tid maps follow the threads
        the tenant's rules match (thread pools grow, processes restart)."""
        if self.actuator is None:
            return
        tids = self._rule_tids(w, w.policy)
        if tids is None or tids == w.tids:
            return
        try:
            self.actuator.set_tids(w.path, tids)
            w.tids = tids
            log.info("tenant %s: %s threads: %s", w.tenant, w.policy,
                     "; ".join(f"{m} {len(t)}" for m, t in tids.items()))
        except PolicyError as err:
            log.warning("tenant %s: thread rules not applied: %s", w.tenant, err)

    def _simulate_thread_rules(self, w: Watched) -> None:
        """Once an interval: every application-informed policy the tenant's
        curves simulate sees the threads its rules name now, as the kernel
        policy would if it ran (its scan threads' pages go first, say), and
        the curves count the reads of the threads its `slo_threads` names."""
        if w.builder is None or w.spec is None:
            return
        if w.spec.slo_threads is not None:
            # the curves count the reads of the threads the throughput
            # counts; none found (yet, or any more): every thread's
            try:
                counted = threads.match(w.path, w.spec.slo_threads)
            except cgroups.CgroupError:
                counted = []
            for b in w.builders():
                b.count_threads(counted)
            if counted != w.counted_tids:
                log.info("tenant %s: curves count %s", w.tenant,
                         f"{len(counted)} threads' reads" if counted else
                         "every thread's reads (slo_threads matches none)")
                w.counted_tids = counted
        for policy in w.spec.thread_rules():
            if policy not in w.builder.policies:
                continue
            tids = self._rule_tids(w, policy)
            for b in w.builders():
                b.register_threads(policy,
                                   sorted({t for ts in (tids or {}).values() for t in ts}))

    def _report(self, w: Watched, stats) -> TenantReport:
        now = time.monotonic()
        dt = max(now - w.last_time, 1e-6)
        prev = w.last_stats or stats
        counted, w.interval = w.interval, None
        d = counted or Counters()
        # the miss ratio of the threads its curves count, where they count some
        own_misses, w.counted_misses = w.counted_misses, None
        own_ratio = own_misses.miss_ratio() if own_misses is not None else None
        curves = []
        if w.builder is not None and self.sampler is not None:
            # the limit must also hold what is not page cache (anon + kernel)
            offset_pages = stats.nonfile_bytes // PAGE_SIZE
            curves = [shift_by_anon(c, offset_pages) for c in w.builder.snapshot()]
            for c in curves:
                if c.policy in self.hook_ns:
                    c.meta["hook_ns_per_access"] = self.hook_ns[c.policy]
                if c.policy in self.miss_ns:
                    c.meta["hook_ns_per_miss"] = self.miss_ns[c.policy]
            # the builder's counts age by control interval (sliding window),
            # a window closing once it holds enough samples
            s = self.cfg.sampling
            for b in w.builders():
                b.end_interval(s.min_window_samples, s.max_window_intervals)
            if counted is not None:
                self._retune(w, d.accesses / dt, self._limit_pages(stats))
            if w.recent is not None:
                w.recent.next_interval()
        if counted is not None:
            accesses, inserts, removals = d.accesses, d.inserts, d.removals
        else:
            # stats-only: the v1 charge counter stands in for insertions
            accesses, inserts, removals = 0, max(0, stats.pgpgin - prev.pgpgin), 0
        refaults = max(0, stats.refaults - prev.refaults)
        throughput, why_unknown = accesses / dt, ""
        if w.throughput is not None:
            throughput = w.throughput.read(now)
            why_unknown = w.throughput.error if throughput is None else ""
        if w.throughput is not None:
            self._follow_phase(w, throughput, accesses / dt)
        cpu_us, read = cgroups.cpu_usage_us(w.path), cgroups.read_bytes(w.path)
        cpu_per_s = (_per_s(cpu_us, w.last_cpu_us, dt) or 0.0) / 1e6
        read_per_s = _per_s(read, w.last_read_bytes, dt)
        w.last_time, w.last_stats, w.last_cpu_us, w.last_read_bytes = now, stats, cpu_us, read
        capacity, overflow = self._policy_room(w)
        return TenantReport(
            tenant=w.tenant, cgroup=w.path, interval_s=dt,
            accesses_per_s=accesses / dt, inserts_per_s=inserts / dt,
            removals_per_s=removals / dt, refaults_per_s=refaults / dt,
            limit_bytes=stats.effective_limit_bytes,
            usage_file_bytes=stats.file_bytes, usage_anon_bytes=stats.anon_bytes,
            policy=w.policy, throughput=throughput,
            miss_ratio=own_ratio if own_ratio is not None else
            min(1.0, inserts / accesses) if accesses else 0.0,
            curves=curves, throughput_error=why_unknown, policy_capacity_pages=capacity,
            policy_overflow_pages=overflow, cpu_per_s=cpu_per_s,
            read_bytes_per_s=read_per_s)

    def _follow_phase(self, w: Watched, ops_per_s: float | None, accesses_per_s: float) -> None:
        """After this interval's report: a tenant whose operations per page
        read jumped (the rule the controller uses too, core/phase.py) has
        its builders count the new phase from the next interval on
        (MRCBuilder.new_phase), rather than read the old one for a window
        or two more -- several intervals where the tenant is slow and its
        windows long."""
        if ops_per_s is None or not accesses_per_s > 0:
            return
        before = w.ops_per_access
        w.ops_per_access, changed, w.ops_pending = phase.follow(
            before, ops_per_s / accesses_per_s, pending=w.ops_pending)
        if changed and w.builder is not None:
            log.info("tenant %s: %.3g -> %.3g operations per page read: a new phase; "
                     "its curves count it from the next interval", w.tenant, before,
                     w.ops_per_access)
            for b in w.builders():
                b.new_phase()

    def _policy_room(self, w: Watched) -> tuple[int, int]:
        """(capacity, overflow) of the cgroup's cache_ext policy, (0, 0)
        when none of ours runs.  A policy that finds no room for pages is
        a warning once per growth of the count."""
        if self.actuator is None or w.policy == self.default_policy:
            return 0, 0
        st = self.actuator.stats(w.path)
        if st is None:
            return 0, 0
        if st.overflow_pages > w.overflow_seen:
            log.warning("tenant %s: policy %s had no room for %d pages (capacity %d pages)",
                        w.tenant, w.policy, st.overflow_pages, st.capacity_pages)
        w.overflow_seen = st.overflow_pages
        return st.capacity_pages, st.overflow_pages

    def _resize_policy(self, w: Watched, limit_bytes: int) -> str:
        """After a limit rises past the capacity the policy was sized for,
        load it afresh for the new limit; returns a note, or ""."""
        if self.actuator is None or w.policy == self.default_policy:
            return ""
        st = self.actuator.stats(w.path)
        if st is None or limit_bytes // PAGE_SIZE <= st.capacity_pages:
            return ""
        try:
            self.actuator.resize(w.path, w.policy, self._rule_tids(w, w.policy))
        except PolicyError as err:
            log.warning("tenant %s: policy %s not resized for %d pages: %s", w.tenant,
                        w.policy, limit_bytes // PAGE_SIZE, err)
            return f"policy {w.policy} keeps room for {st.capacity_pages} pages: {err}"
        w.tids = None
        w.overflow_seen = 0
        log.info("tenant %s: policy %s resized from %d to %d pages", w.tenant, w.policy,
                 st.capacity_pages, limit_bytes // PAGE_SIZE)
        return ""


    def apply(self, directives: list[Directive]) -> list[ApplyResult]:
        return [self._apply_one(d) for d in directives]

    def _apply_one(self, d: Directive) -> ApplyResult:
        w = self.watched.get(d.tenant)
        if w is None:
            return ApplyResult(d.tenant, 0, "", False, f"unknown tenant {d.tenant!r} on this node",
                               policy_ok=False)
        if not cgroups.is_under(w.path, self.cfg.roots):
            msg = f"{w.path} is outside the configured roots; not touched"
            return ApplyResult(d.tenant, 0, w.policy, False, msg, False, msg)
        # the policy first: the reclaim a new limit causes is the new policy's
        policy_ok, policy_msg = self._apply_policy(w, d.policy)
        applied_policy = w.policy
        try:
            stats = cgroups.read_stats(w.path)
        except CgroupError as err:
            return ApplyResult(d.tenant, 0, applied_policy, False, str(err),
                               policy_ok, policy_msg)
        spec = w.spec
        # max_step is per interval, not per write: directives that come
        # back to back (an agent resumed after a stop gets the one it
        # missed and the next) are stepped from the limit the interval
        # began with
        now = time.monotonic()
        base = stats.effective_limit_bytes
        if w.step_window is not None and now - w.step_window[0] < self.cfg.interval_s / 2 \
                and stats.effective_limit_bytes:
            base = w.step_window[1] or base
        else:
            w.step_window = (now, stats.effective_limit_bytes)
        dec = cgroups.safe_limit(
            d.limit_bytes, base, stats.anon_bytes, self.rules,
            floor_bytes=spec.floor if spec is not None and spec.floor is not None else None,
            ceiling_bytes=(spec.ceiling or 0) if spec is not None else 0,
            node_memory=self.memory_bytes, usage_bytes=stats.usage_bytes)
        notes = [] if not dec.clamped else [dec.reason]
        try:
            applied = cgroups.write_limit(w.path, dec.limit, self.cfg.limit_knob)
        except CgroupError as err:
            return ApplyResult(d.tenant, stats.effective_limit_bytes, applied_policy, False,
                               f"limit not changed: {err}", policy_ok, policy_msg)
        log.info("tenant %s: limit %s -> %s%s", d.tenant, size(stats.effective_limit_bytes),
                 size(applied), f" ({'; '.join(notes)})" if notes else "")
        if policy_ok and applied > stats.effective_limit_bytes:
            note = self._resize_policy(w, applied)
            if note:
                notes.append(note)
        return ApplyResult(d.tenant, applied, applied_policy, True, "; ".join(notes),
                           policy_ok, policy_msg)

    def _apply_policy(self, w: Watched, policy: str) -> tuple[bool, str]:
        """Attach, swap or detach the tenant's policy; (ok, what happened).
        A refusal leaves the cgroup with the policy it ran, and says why;
        either way w.policy is what the kernel says runs after."""
        w.policy = running_policy(w.path, self.default_policy)
        if not policy or policy == w.policy:
            return True, ""
        if self.actuator is None:
            return False, f"policy {policy!r} not attached: {self.no_actuation_reason}"
        try:
            done = self.actuator.apply(w.path, policy, w.cgid, self._rule_tids(w, policy))
        except PolicyError as err:
            w.policy = running_policy(w.path, self.default_policy)
            log.warning("tenant %s: policy %s refused, %s keeps running: %s", w.tenant,
                        policy, w.policy, err)
            return False, f"policy {policy!r} refused: {err}"
        # apply() has read back that `policy` runs
        w.policy = policy
        w.tids = None          # the new instance's maps: rewrite next interval
        log.info("tenant %s: policy %s", w.tenant, done)
        return True, done

    def close(self):
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None


def _feed_batch(builder, batch) -> None:
    """One tick's (keys, tids, positions, accesses, sketch) into a builder,
    with what of it the builder takes."""
    keys, tids, positions, accesses, sketch = batch
    extra = {name: value for name, value in (("tids", tids), ("positions", positions))
             if _takes(builder, name)}
    builder.feed(keys, total_accesses=accesses, sketch=sketch, **extra)


def _takes(builder, parameter: str) -> bool:
    import inspect
    try:
        return parameter in inspect.signature(builder.feed).parameters
    except (TypeError, ValueError):
        return False
