"""SHARDS estimators: how a sample becomes an LRU miss-ratio curve.

A spatial sample at rate R holds n references where N * R were expected;
an estimator decides what that difference means and turns the sampled
stack-distance histogram into a curve.  Each is one class below, chosen by
name from BY_NAME, the way libCacheSim's algorithms sit behind one cache
interface.  A class states what it needs from the stream (Estimator lists
the flags), and Shards keeps exactly that.

When what it needs is missing (a stream fed pre-sampled keys without their
sketch), `curve` returns None and its `fallback` is tried, and the curve's
meta says which ran.  The defaults per mode were chosen by
experiments/study_shards_estimators.py; its results are in
experiments/results/ and docs/results.md.

Adding an estimator is one class here, with its entry in BY_NAME, and its
test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cachepilot.models import hll
from cachepilot.models import stack as slice_stack
from cachepilot.models.exact import miss_ratios
from cachepilot.models.mrc import MRC

COMPOSITION_DOF = 3        # Student-t degrees of freedom of the composition part
SKETCH_RSE = 1.04 / math.sqrt(hll.REGISTERS)   # HyperLogLog relative error


@dataclass
class Sample:
    """What a SHARDS window hands an estimator."""
    hist: np.ndarray          # sampled stack distances, in bins of bin_pages
    bin_pages: int
    rate: float               # the sampling rate the histogram is counted at
    accesses: float           # unsampled references the window stands for
    sizes: np.ndarray         # cache sizes (pages) to evaluate
    key_stats: tuple | None = None      # (keys, references, sum of squares)
    all_keys: float | None = None       # the window's distinct keys (sketch)
    stacked: tuple | None = None        # (stack.Slices, sampled references)
    unique: float | None = None         # distinct keys seen, for the meta
    max_samples: int | None = None

    @property
    def sampled(self) -> float:
        return float(np.sum(self.hist))


class Estimator:
    """One way to turn a Sample into a curve.  What it needs from the
    stream, which Shards then keeps:

    - key_counts: references per sampled key (Shards' KeyCounts);
    - sketch:     a HyperLogLog sketch of every reference in the window
                  (models/hll.py), so the true key count is known;
    - slices:     that sketch per time slice, with the sampled references'
                  slices (models/stack.py);
    - fixed_rate_only: it cannot follow a fixed-size sample, whose rate
                  changes as it shrinks."""
    name = ""
    summary = ""               # one line for --help
    key_counts = False
    sketch = False
    slices = False
    fixed_rate_only = False
    fallback: str | None = None

    def curve(self, s: Sample, asked: str) -> MRC | None:
        """The curve, or None when the stream lacks what this needs."""
        raise NotImplementedError


class HistogramEstimator(Estimator):
    """An estimator that reads the histogram as SHARDS does, differing in
    how many references it books as hits at every size (`extra`) and at
    which scaled distance a size is read (`lookup`)."""

    def book(self, s: Sample):
        """(lookup sizes, extra hits, meta) or None to fall back."""
        raise NotImplementedError

    def curve(self, s: Sample, asked: str) -> MRC | None:
        booked = self.book(s)
        if booked is None:
            return None
        lookup, extra, facts = booked
        meta = {"accesses": int(s.accesses), "sampled": s.sampled, "estimator": self.name,
                "adj": float(extra), "bin_pages": int(s.bin_pages)}
        if asked != self.name:
            meta["estimator_asked"] = asked
        meta.update(facts)
        if s.unique is not None:
            meta["unique_estimate"] = float(s.unique)
        if s.max_samples:
            meta["max_samples"] = int(s.max_samples)
        return MRC(s.sizes, miss_ratios(s.hist, s.bin_pages, lookup, extra), "lru",
                   "shards", float(s.rate), meta)


class Ratio(HistogramEstimator):
    """Divide by n instead of N * R: right when the sample simply holds more
    (or fewer) keys than R * M, each as busy as the average key."""
    name = "ratio"
    summary = "divides by the references sampled"

    def book(self, s):
        return s.sizes, 0.0, {}


class Adj(HistogramEstimator):
    """SHARDS_adj (Waldspurger et al., FAST'15): the difference joins the
    first histogram bin, i.e. it is booked as hits at every size.  Right
    when the sample caught more (or fewer) hot keys than its share."""
    name = "adj"
    summary = "SHARDS_adj"

    def book(self, s):
        extra = s.accesses * s.rate - s.sampled if s.accesses else 0.0
        return s.sizes, extra, {}


class Split(HistogramEstimator):
    """The difference has two causes with known shapes: how many keys the
    sample holds (binomial) and how busy they are (the spread of the
    sampled keys' own counts).  The part key_count_factor blames on the
    key count scales the whole sample, like "ratio"; the rest is booked as
    hits, like "adj"."""
    name = "split"
    summary = "tells too many keys from too many hot keys"
    key_counts = True

    def book(self, s):
        factor, extra = 1.0, 0.0
        if s.accesses:
            if s.key_stats is None:
                raise ValueError('the "split" estimator needs per-key counts (key_stats)')
            factor = key_count_factor(s.key_stats[0], frequency_cv2(s.key_stats),
                                      s.sampled, s.accesses, s.rate)
            extra = s.accesses * s.rate * factor - s.sampled
        cv2 = frequency_cv2(s.key_stats) if s.key_stats else 0.0
        return s.sizes, extra, {"key_count_factor": float(factor), "frequency_cv2": cv2}


class Keys(HistogramEstimator):
    """Measure the deviation instead of inferring it: a sketch of every
    reference gives the realised key rate R' = sampled keys / all keys;
    misses are divided by N * R' and distances scaled by 1/R' instead of
    1/R (extra references of hot keys are hits, as in SHARDS_adj)."""
    name = "keys"
    summary = "divides by the key rate a sketch of every reference measures"
    key_counts = True
    sketch = True
    fallback = "split"

    def book(self, s):
        eff_rate = key_rate(s.key_stats, s.all_keys, s.rate)
        if eff_rate is None or not s.accesses:
            return None
        # distances were scaled by 1/rate; a size c covers scaled
        # distances c * R' / R
        lookup = np.floor(s.sizes * (eff_rate / s.rate)).astype(np.int64)
        return lookup, s.accesses * eff_rate - s.sampled, {
            "key_rate": eff_rate, "all_keys_estimate": float(s.all_keys)}


class Stack(Estimator):
    """The sketch kept per time slice: the distinct-key counts of runs of
    slices say how many references re-use a key last seen how many slices
    back, and the sample only says where inside those brackets the
    distances fall (models/stack.py).  At rate 1 the sample is the stream
    and its histogram the exact curve."""
    name = "stack"
    summary = ("distinct-page sketches of time slices count every reference, the "
               "sample places distances inside their brackets")
    slices = True
    fixed_rate_only = True
    fallback = "keys"

    def curve(self, s, asked):
        if s.rate >= 1.0:
            return MRC(s.sizes, miss_ratios(s.hist, s.bin_pages, s.sizes), "lru", "shards",
                       1.0, {"accesses": int(s.accesses), "sampled": s.sampled,
                             "estimator": self.name, "bin_pages": int(s.bin_pages),
                             **({} if s.unique is None
                                else {"unique_estimate": float(s.unique)})})
        if s.stacked is None or not len(s.stacked[0]):
            return None
        slices, records = s.stacked
        span_keys = slices.distinct
        eff_rate = key_rate((slice_stack.sampled_keys(slices, records), 0.0, 0.0),
                            span_keys, s.rate)
        if eff_rate is None:
            return None
        misses, accesses, facts = slice_stack.stack_misses(slices, records, eff_rate,
                                                           s.sizes)
        ratios = (np.clip(misses / accesses, 0.0, 1.0) if accesses > 0
                  else np.ones(len(s.sizes)))
        meta = {"accesses": int(round(accesses)), "sampled": s.sampled,
                "estimator": self.name, "key_rate": eff_rate,
                "all_keys_estimate": float(span_keys), **facts}
        if s.unique is not None:
            meta["unique_estimate"] = float(s.unique)
        return MRC(s.sizes, ratios, "lru", "shards", float(s.rate), meta)


BY_NAME: dict[str, Estimator] = {e.name: e for e in (Split(), Adj(), Ratio(), Keys(),
                                                     Stack())}
ESTIMATORS = tuple(BY_NAME)           # their names, in the table's order


# Chosen per mode by experiments/study_shards_estimators.py: "stack" needs
# a fixed rate; at a fixed size a large sample's own key count already says
# what a sketch would.
DEFAULT_ESTIMATOR = "stack"           # fixed rate
DEFAULT_SIZE_ESTIMATOR = "split"      # fixed size


def pick_estimator(estimator: str | None = None, adj: bool | None = None,
                   fixed_size: bool = False) -> str:
    """The estimator's name: `estimator` if given, else adj=True -> "adj",
    adj=False -> "ratio", neither -> the default of the mode."""
    if estimator is None:
        if adj is None:
            return DEFAULT_SIZE_ESTIMATOR if fixed_size else DEFAULT_ESTIMATOR
        return "adj" if adj else "ratio"
    name = str(estimator).strip().lower()
    if name not in BY_NAME:
        raise ValueError(f"unknown SHARDS estimator {estimator!r}; accepted: "
                         + ", ".join(BY_NAME))
    return name


def describe() -> str:
    """Every estimator in a sentence, the defaults marked (for --help)."""
    marks = {DEFAULT_ESTIMATOR: "default at a fixed rate",
             DEFAULT_SIZE_ESTIMATOR: "default at a fixed size"}
    return "; ".join(f"{e.name}: " + (f"{marks[e.name]}, " if e.name in marks else "")
                     + e.summary for e in BY_NAME.values())


def needs(name: str, what: str) -> bool:
    """Whether the estimator, or one it may fall back to, uses `what`
    ("key_counts", "sketch" or "slices") from the stream."""
    while name is not None:
        est = BY_NAME[name]
        if getattr(est, what):
            return True
        name = est.fallback
    return False


def estimate(name: str, s: Sample) -> MRC:
    """The curve by the named estimator, or by the first of its fallbacks
    that has what it needs."""
    est = BY_NAME[name]
    while True:
        curve = est.curve(s, name)
        if curve is not None:
            return curve
        est = BY_NAME[est.fallback]


# -- the estimators' arithmetic ------------------------------------------------

def frequency_cv2(key_stats) -> float:
    """Squared coefficient of variation of the references per sampled key."""
    keys, refs, sum_sq = key_stats
    if keys <= 0 or refs <= 0:
        return 0.0
    return max(0.0, keys * sum_sq / (refs * refs) - 1.0)


def key_count_factor(keys: int, cv2: float, sampled: float,
                     accesses: float, rate: float,
                     dof: float = COMPOSITION_DOF) -> float:
    """Estimated (sampled keys) / (rate * all keys): the part of the
    sample's deviation sampled / (accesses * rate) that comes from how many
    keys it holds.  `keys` and `cv2` describe the sampled keys; 1 means no
    key-count deviation.

    log(k / (R*M)) has variance ~(1-R)/k (the key count is binomial); the
    composition varies like the mean of k per-key counts, variance
    ~CV^2/k.  The result is the posterior mean of the key-count part, with
    a Gaussian prior for it and a Student-t (`dof` degrees of freedom; 3 is
    the heaviest tail that still has the variance estimated) for the
    composition: a sample that missed the few hottest keys underestimates
    CV^2, and a Gaussian would then blame the large deficit on the key
    count, which cannot plausibly be that far off.  dof = inf models the
    composition as Gaussian."""
    if keys <= 0 or sampled <= 0 or accesses <= 0 or rate >= 1.0:
        return 1.0
    dev = math.log(sampled / (accesses * rate))
    var_count = (1.0 - rate) / keys
    var_comp = cv2 * var_count
    sd_count = math.sqrt(var_count)
    if math.isinf(dof):
        # Gaussian composition: the posterior mean is a fixed share of dev
        return math.exp(dev * var_count / (var_count + var_comp))
    # Student-t scale whose variance is var_comp
    scale = math.sqrt(var_comp * (dof - 2) / dof)
    if scale < 1e-3 * sd_count:
        # every sampled key equally busy: the whole deviation is the count
        return math.exp(dev)
    # posterior mean by quadrature, on a grid fine both where the prior
    # lives and where a narrow likelihood peaks
    x = np.union1d(np.linspace(-8.0 * sd_count, 8.0 * sd_count, 2001),
                   np.linspace(dev - 8.0 * scale, dev + 8.0 * scale, 2001))
    log_post = (-0.5 * (x / sd_count) ** 2
                - 0.5 * (dof + 1) * np.log1p((dev - x) ** 2 / (dof * scale * scale)))
    w = np.exp(log_post - log_post.max())
    mean = float(np.trapezoid(w * x, x) / np.trapezoid(w, x))
    # the posterior mean lies between the prior's centre and the deviation;
    # keep quadrature error from stepping outside
    return math.exp(min(max(mean, min(0.0, dev)), max(0.0, dev)))


def key_rate(key_stats, all_keys, rate: float) -> float | None:
    """The realised key rate, sampled keys / all keys (None if unknown).

    Two independent counts of all keys are at hand: the sketch's (relative
    error SKETCH_RSE) and sampled keys / rate (relative error
    sqrt((1 - rate) / keys), binomial).  They are combined in log space,
    each weighted by the inverse of its variance: at a low rate the sketch
    decides, in a large fixed-size sample the sample's own count weighs in."""
    if key_stats is None or all_keys is None or not all_keys > 0 or key_stats[0] <= 0:
        return None
    keys = float(key_stats[0])
    var_sketch = SKETCH_RSE ** 2
    var_sample = max(0.0, 1.0 - rate) / keys
    w = var_sample / (var_sample + var_sketch)
    log_all = w * math.log(all_keys) + (1.0 - w) * math.log(keys / rate)
    return keys / math.exp(log_all)
