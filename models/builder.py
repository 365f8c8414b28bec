"""MRCBuilder: the streaming, per-cgroup MRC engine the agent runs.

The agent feeds batches of sampled page keys (numpy uint64) as they come out
of the kernel's ring buffer; a snapshot at any time gives one curve per
policy: LRU from SHARDS (all sizes at once), every other policy from
miniature simulations of the real policy code (models/runtime.py).

Counts are kept per window and aged, by a sliding window or by exponential
decay; the cache state (LRU stack, miniature cache contents) is never aged,
because it is the state of a real cache.  How the sampling threshold is
shared and how windows age: MRCBuilder; how the "stack" estimator's time
slices travel with the windows: _merge_stack.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cachepilot.models import stack as slice_stack
from cachepilot.models.exact import as_keys, auto_sizes, check_sizes, coarsen
from cachepilot.models.mrc import MRC
from cachepilot.models.shards import (Shards, curve_from_histogram,
                                      rate_threshold, sample_mask_index,
                                      threshold_rate)

DEFAULT_MAX_SAMPLES = 8192
AUTO_GRID_POINTS = 24
MIN_MINI_PAGES = 32        # smallest miniature cache the default rate allows
MIN_MINISIM_RATE = 0.001
STACK_MIN_WEIGHT = 1e-3    # older slices count for too little to keep


@dataclass
class _Window:
    """Counts of one window (or of the decayed past)."""
    hist: np.ndarray = field(default_factory=lambda: np.zeros(1))
    bin_pages: int = 1
    rate: float = 1.0              # SHARDS rate the histogram is counted at
    accesses: float = 0.0          # unsampled accesses represented
    mini: dict = field(default_factory=dict)   # policy -> (misses, accesses) arrays
    # what the SHARDS estimator needs (models/estimators.py): per-key
    # statistics (keys, references, sum of squares), the distinct keys of
    # every access (the sketch), the time slices (stack.Slices, sampled
    # references); None where the estimator keeps none
    key_stats: tuple | None = None
    all_keys: float | None = None
    stack: tuple | None = None

    def scaled_to(self, rate: float, bin_pages: int) -> np.ndarray:
        hist = coarsen(self.hist, bin_pages // self.bin_pages)
        return hist * (rate / self.rate)


def _add_hist(a: np.ndarray, b: np.ndarray, wb: float = 1.0) -> np.ndarray:
    out = np.zeros(max(len(a), len(b)))
    out[:len(a)] += a
    out[:len(b)] += wb * b
    return out


def _merge_stack(cur, past, weight: float, decaying: bool):
    """The slices of two windows, the past one's weighted, as one history.

    The "stack" SHARDS estimator (models/stack.py) works on time slices: a
    window's slices travel with its counts, and merging windows lays the
    older ones' slices before the newer, weighted like their histograms.
    A sliding window's past is one window, and a past window weighted 0
    still serves as history (its keys bound the distances of later
    re-uses); a decaying past (half_life) keeps every window, so slices
    whose weight has decayed below STACK_MIN_WEIGHT of the newest are
    dropped.  Neighbours merge in pairs beyond stack.MAX_SLICES."""
    if cur is None or past is None:
        # a window without slices (a batch came without its sketch) has no
        # history worth joining
        return cur
    slices = slice_stack.Slices.concat([past[0].weighted(weight), cur[0]])
    records = np.concatenate((past[1], cur[1]))
    if decaying and len(slices):
        faded = slices.weight < STACK_MIN_WEIGHT * slices.weight.max()
        first_kept = int(np.argmin(faded)) if not faded.all() else len(slices)
        if first_kept:
            slices = slice_stack.Slices(slices.sketches[first_kept:],
                                        slices.accesses[first_kept:],
                                        slices.first[first_kept:], slices.weight[first_kept:])
            records = records[records["slice"].astype(np.int64) >= slices.first[0]] \
                if len(slices) else records[:0]
    return slices.coarsen(), records


class MRCBuilder:
    """One cgroup's curves, one per policy, from a stream of sampled keys.

    Sampling.  `threshold` is the hash threshold the kernel should sample at:
    the largest any consumer needs.  SHARDS re-filters at its own (possibly
    lower, in fixed-size mode) threshold, the miniature simulations at
    theirs, so keys sampled under an older, higher threshold are still fine.

    Ageing.  Counts are kept per window; the cache state is never aged.
    - default: a sliding window.  The snapshot is the current window plus
      the previous one, the previous weighted by the part of a window the
      current one has not filled yet.  A phase change shows completely one
      window after it happens, or one control interval after new_phase() is
      called (the agent calls it when the tenant's operations per page read
      jump).
    - half_life=h: exponential decay, the past loses half its weight every
      h windows.
    A window ends when end_window() is called, when end_interval() finds it
    holds enough samples (the agent calls it every control interval), or,
    with window=W, automatically every W accesses."""

    def __init__(self, policies=("lru",), *, rate: float | None = None,
                 max_samples: int | None = None, sizes=None,
                 max_pages: int | None = None, window: int | None = None,
                 half_life: float | None = None, minisim_rate: float | None = None,
                 adj: bool | None = None, estimator: str | None = None,
                 slice_refs: int | None = None, counted: bool = False):
        if isinstance(policies, str):
            policies = [policies]
        self.policies = list(dict.fromkeys(p.strip().lower() for p in policies))
        if not self.policies:
            raise ValueError("MRCBuilder needs at least one policy")
        if window is not None and int(window) < 1:
            raise ValueError("window must be at least one access")
        if half_life is not None and not half_life > 0:
            raise ValueError("half_life must be positive")
        if rate is None and max_samples is None:
            max_samples = DEFAULT_MAX_SAMPLES
        self.shards = Shards(rate, max_samples, adj, estimator=estimator,
                             slice_refs=slice_refs)
        self.estimator = self.shards.estimator
        self.window = None if window is None else int(window)
        self.half_life = half_life
        self.max_pages = None if max_pages is None else int(max_pages)
        if sizes is not None:
            self.sizes = check_sizes(sizes)
            if self.sizes[0] < 1:
                raise ValueError("cache sizes must be at least one page")
        elif self.max_pages is not None:
            top = max(1, self.max_pages)
            self.sizes = np.unique(np.round(np.geomspace(
                max(1, top / 100), top, AUTO_GRID_POINTS)).astype(np.int64))
        else:
            self.sizes = None

        self.minisim = None
        # SHARDS counts every access; a builder whose curves may count some
        # threads' accesses only (count_threads) simulates LRU in miniature
        # like every other policy
        self.counted = bool(counted)
        self.mini_policies = [p for p in self.policies if p != "lru" or self.counted]
        if self.mini_policies:
            from cachepilot.models import runtime
            known = runtime.available_policies()
            unknown = [p for p in self.mini_policies if p not in known]
            if unknown:
                raise ValueError(f"unknown policy {unknown[0]!r}; accepted: "
                                 + ", ".join(sorted(set(known) | {"lru"})))
            if self.sizes is None:
                raise ValueError("miniature simulations need sizes or max_pages")
            if minisim_rate is None:
                minisim_rate = rate if rate is not None else min(
                    1.0, max(MIN_MINISIM_RATE, MIN_MINI_PAGES / float(self.sizes[0])))
            self.minisim_rate = float(minisim_rate)
            self.minisim_threshold = rate_threshold(self.minisim_rate)
            self.minisim = runtime.MiniSim(self.mini_policies, self.sizes, self.minisim_rate)
        else:
            self.minisim_rate = None
            self.minisim_threshold = 0

        self._past = _Window()
        self._cur_accesses = 0.0
        self._cur_samples = 0
        self._cur_intervals = 0
        self._past_intervals = 1       # control intervals the past window spans
        self._phase_span = None        # new_phase(): the past's accesses of one interval
        self.total_accesses = 0
        self.windows = 0

    # -- sampling -------------------------------------------------------------
    @property
    def threshold(self) -> int:
        """The threshold the kernel sampler should use for this cgroup."""
        return max(self.shards.threshold, self.minisim_threshold)

    @property
    def rate(self) -> float:
        return threshold_rate(self.threshold)

    @property
    def distinct_pages(self) -> float:
        """Distinct pages seen since the builder began (estimated from its
        sample): how far its miniature caches can have filled."""
        return float(self.shards.unique_estimate)

    @property
    def window_samples(self) -> int:
        """Sampled accesses (keys under this builder's threshold) fed into
        the current window: what its curve's counts rest on."""
        return self._cur_samples

    # -- input ----------------------------------------------------------------
    def feed(self, keys, total_accesses: int | None = None, tids=None,
             sketch=None, positions=None) -> None:
        """A batch of keys, unsampled or pre-sampled at a threshold >= the
        current one.  total_accesses = unsampled accesses the batch stands
        for (None: len(keys), the keys are unsampled).  `sketch`: the
        HyperLogLog registers of those accesses (models/hll.py), which the
        "stack" and "keys" estimators need when the keys come pre-sampled
        ("stack" makes each such batch one time slice).  `positions`: where
        among those accesses each pre-sampled key was (increasing; the
        agent interpolates them from the records' times), which MRU's chain
        model needs (models/mruchain.py); without them MRU's curve is its
        miniature's."""
        keys = as_keys(keys)
        total = len(keys) if total_accesses is None else int(total_accesses)
        if total < 0:
            raise ValueError("total_accesses must not be negative")
        # The kernel's counters and its ring buffer are read at slightly
        # different moments; a batch never stands for fewer accesses than
        # it holds.
        total = max(total, len(keys))
        if tids is not None:
            tids = np.ascontiguousarray(np.asarray(tids, dtype=np.uint32).reshape(-1))
            if len(tids) != len(keys):
                raise ValueError("tids and keys differ in length")
        if positions is not None and np.shape(positions) != (len(keys),):
            raise ValueError("positions and keys differ in length")
        if self.window is not None and self._cur_accesses + total > self.window \
                and len(keys) > 1 and total == len(keys):
            # Unsampled input: split the batch at the window boundary.
            cut = int(self.window - self._cur_accesses)
            self.feed(keys[:cut], None, None if tids is None else tids[:cut])
            self.feed(keys[cut:], None, None if tids is None else tids[cut:])
            return
        self.shards.feed(keys, total, sketch=sketch)
        self._cur_samples += len(sample_mask_index(keys, self.threshold)) if len(keys) else 0
        if self.minisim is not None:
            if total == len(keys):      # the full stream: positions are known
                self.minisim.feed_unsampled(keys, tids)
            else:
                idx = sample_mask_index(keys, self.minisim_threshold)
                self.minisim.feed(keys[idx], None if tids is None else tids[idx],
                                  accesses=total,
                                  positions=None if positions is None
                                  else np.asarray(positions, np.int64)[idx])
        self._cur_accesses += total
        self.total_accesses += total
        if self.window is not None and self._cur_accesses >= self.window:
            self.end_window()

    def register_threads(self, policy: str, tids) -> None:
        """The threads in `policy`'s tid map (an application-informed
        policy's scan or bypass threads): its miniature simulations treat
        their accesses as the kernel policy treats them."""
        if self.minisim is not None:
            self.minisim.register_threads(policy, tids)

    def count_threads(self, tids) -> None:
        """The threads whose accesses the curves count from now on (the
        ones a tenant's throughput counts: a store's GET threads beside its
        scanner); None or empty: every thread.  Needs counted=True."""
        if not self.counted:
            raise ValueError("this builder counts every access; make it with counted=True")
        self.minisim.count_threads(tids)

    # -- ageing ---------------------------------------------------------------
    def end_interval(self, min_samples: int = 0, max_intervals: int = 1) -> bool:
        """The end of a control interval: close the window once it holds
        `min_samples` sampled accesses or has spanned `max_intervals`
        intervals, so that a slow stream's curve rests on enough samples
        and a fast one's on the last interval alone.  True when it closed."""
        self._cur_intervals += 1
        if self._cur_samples >= min_samples or self._cur_intervals >= max_intervals:
            self.end_window()
            return True
        return False

    def end_window(self) -> None:
        """Close the current window (call once per control interval)."""
        self._past_intervals = max(1, self._cur_intervals)
        self._phase_span = None
        cur = self._current(reset=True)
        if self.half_life is None:
            self._past = cur
        else:
            decay = 0.5 ** (1.0 / self.half_life)
            self._past = self._merge(cur, self._past, decay)
        self._cur_accesses = 0.0
        self._cur_samples = 0
        self._cur_intervals = 0
        self.windows += 1

    def new_phase(self) -> None:
        """The stream's workload just changed (core/phase.py): close the
        window under way, and from now on let the past count only until
        one control interval's worth of new accesses replaces it, rather
        than a whole window's.  A slow stream's window spans several
        intervals, and with the sliding window's weights its curve would
        read the old workload for that long again; once a new window
        closes, the usual weights are back.  The cache state is kept: it
        is what the real cache holds as the new phase begins."""
        if self._cur_accesses > 0:
            self.end_window()
        self._phase_span = self._past.accesses / self._past_intervals

    def _current(self, reset: bool) -> _Window:
        key_stats = self.shards.key_stats()
        all_keys = self.shards.window_unique()
        stack = self.shards.slices(take=reset) if self.shards.kind.slices else None
        hist, bin_pages, rate, accesses = self.shards.take_histogram(reset=reset)
        mini = {}
        if self.minisim is not None:
            # misses scaled back to the full stream, over the full stream's
            # accesses: the SHARDS_adj-style estimate (see runtime.MiniSim)
            for curve in self.minisim.curves():
                misses = np.asarray(curve.meta["est_misses"], dtype=np.float64)
                mini[curve.policy] = (misses, np.full(len(misses),
                                                      curve.meta["est_accesses"]))
            accesses = float(self.minisim.accesses)
            if reset:
                self.minisim.reset_counts()
        return _Window(hist, bin_pages, rate, float(accesses), mini, key_stats,
                       all_keys, stack)

    def _merge(self, cur: _Window, past: _Window, weight: float) -> _Window:
        bin_pages = max(cur.bin_pages, past.bin_pages)
        hist = _add_hist(cur.scaled_to(cur.rate, bin_pages),
                         past.scaled_to(cur.rate, bin_pages), weight)
        mini = {}
        for p in set(cur.mini) | set(past.mini):
            zero = (np.zeros(len(self.sizes)), np.zeros(len(self.sizes)))
            cm, ca = cur.mini.get(p, zero)
            pm, pa = past.mini.get(p, zero)
            mini[p] = (cm + weight * pm, ca + weight * pa)
        key_stats = cur.key_stats
        if key_stats is not None and past.key_stats is not None and weight > 0:
            # weighted like the histograms; a key in both windows counts
            # twice, an approximation that only shades the estimator's
            # spread-of-frequencies figure
            key_stats = tuple(a + weight * b for a, b in zip(cur.key_stats, past.key_stats))
        all_keys = cur.all_keys
        if weight > 0 and past.accesses > 0:
            # summed like the sampled key counts above, so their ratio (the
            # realised key rate) stays consistent; unknown if either is
            all_keys = (None if cur.all_keys is None or past.all_keys is None
                        else cur.all_keys + weight * past.all_keys)
        return _Window(hist, bin_pages, cur.rate,
                       cur.accesses + weight * past.accesses, mini, key_stats,
                       all_keys, _merge_stack(cur.stack, past.stack, weight,
                                              self.half_life is not None))

    # -- output ---------------------------------------------------------------
    def snapshot(self) -> list[MRC]:
        """One MRC per policy, in the order given: "lru" by SHARDS (method
        "shards"), the others by miniature simulation (method "minisim")."""
        cur = self._current(reset=False)
        if self.half_life is None:
            weight = 0.0
            span = self._past.accesses
            if self._phase_span is not None:
                span = min(span, self._phase_span)
            if span > 0:
                weight = max(0.0, 1.0 - cur.accesses / span)
        else:
            weight = 1.0
        both = self._merge(cur, self._past, weight)
        sizes = self.sizes
        if sizes is None:
            sizes = auto_sizes(max(1, int(round(self.shards.unique_estimate))))
        out = []
        for policy in self.policies:
            if policy == "lru" and not self.counted:
                curve = curve_from_histogram(
                    both.hist, both.bin_pages, both.rate, both.accesses, sizes,
                    estimator=self.estimator, key_stats=both.key_stats,
                    all_keys=both.all_keys, unique=self.shards.unique_estimate,
                    max_samples=self.shards.max_samples, stacked=both.stack)
            else:
                misses, acc = both.mini[policy]
                ratios = np.where(acc > 0, misses / np.maximum(acc, 1e-300), 1.0)
                curve = MRC(sizes, np.clip(ratios, 0.0, 1.0), policy, "minisim",
                            self.minisim_rate,
                            {"accesses": float(acc[0]) if len(acc) else 0.0,
                             "estimator": self.minisim.estimator(policy),
                             "counted": self.minisim.counts_threads(policy)})
            curve.meta["window_accesses"] = float(both.accesses)
            out.append(curve)
        return out
