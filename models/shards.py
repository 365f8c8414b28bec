"""SHARDS: approximate LRU miss-ratio curves from a spatial sample.

A key is sampled when cp_hash64(key) < threshold (bpf/include/
cachepilot_hash.h, the same test the kernel sampler does), so a rate R keeps
a fixed set of ~R*M keys and every reference to them.  Stack distances among
sampled keys, divided by R, estimate the full distances (Waldspurger et al.,
"Efficient MRC Construction with SHARDS", FAST'15).

- fixed rate:  threshold = R * 2^64 for the whole run.
- fixed size:  at most S keys are tracked; a new key beyond S evicts the key
  with the largest hash, the threshold drops to that hash and the counts so
  far are rescaled by R_new / R_old.

The sample holds n references where N * R were expected.  How the curve
treats that difference is the estimator (the `estimator` keyword):

- "adj" (SHARDS_adj, the paper's): the difference joins the first
  histogram bin, i.e. it is booked as hits at every size.  Right when the
  sample caught more (or fewer) hot keys than its share: the extra
  references are mostly hits.
- "ratio": divide by n instead of N * R.  Right when the sample simply holds
  more (or fewer) keys than R * M, each as busy as the average key.
- "split" (the default at a fixed size): the difference has two causes
  with known shapes.
  The key count is binomial, so log(k / (R*M)) has variance ~(1-R)/k; the
  composition (how busy the sampled keys are) varies like the mean of k
  per-key counts, variance ~CV^2/k, CV^2 estimated from the sampled keys'
  own counts.  The posterior mean of the key-count part, with a Gaussian
  prior for it and a Student-t (3 degrees of freedom, the heaviest tail that
  still has the variance we estimate) for the composition, is booked like
  "ratio"; the rest like "adj".  The heavy tail matters: a sample that
  missed the few hottest keys underestimates CV^2, and a Gaussian would then
  blame the large deficit on the key count, which cannot plausibly be that
  far off.  In fixed-size mode the split is applied the same way to the
  histogram's (rescaled) total, with the frequencies of the keys sampled
  now.  The estimator was chosen on synthetic workloads only
  (experiments/study_shards_estimators.py: 14 workloads x 2 modes x 20 hash
  salts, mean MAE 0.0117 against 0.0148 for SHARDS_adj and 0.0487 for
  ratio).  Booking the composition part by the sampled keys' own
  misses-per-reference slope instead of as hits was tried on the same
  synthetic workloads (a one-off run, not kept in the script) and
  lost badly on skewed workloads, whose hottest keys a sample usually misses.
- "keys" (the default at a fixed rate before "stack"): the deviation is
  measured instead of inferred.  Next to the
  sample, every reference goes into a HyperLogLog sketch of the distinct
  keys (models/hll.py, about 1.6 % error, a few nanoseconds a reference),
  so the realised key rate R' = sampled keys / all keys is known (the
  sketch's count of all keys averaged with sampled keys / R, each weighted
  by the inverse of its variance).  Misses
  are divided by N * R' (the sampled keys' share of the traffic if they are
  as busy as the average key; extra references of hot keys are hits, as in
  SHARDS_adj) and distances are scaled by 1/R' instead of 1/R.  It needs a
  sketch of every reference: the trace path always has one; a stream fed
  pre-sampled keys has one only when the sketch of its accesses is handed
  over (Shards.add_sketch), and falls back to "split" otherwise
  (meta["estimator"] says which ran).
- "stack" (the default at a fixed rate): the sketch is kept per time
  slice, and the distinct-key counts of runs of slices say how many
  references re-use a key last seen how many slices back; the sample only
  says where inside those brackets the distances fall (models/stack.py).
  Chosen on the same synthetic workloads: mean MAE 0.0069 at R = 0.01,
  against 0.0176 for "keys" (lowest on 10 of the 14).  Fixed rate only (a
  fixed-size sample's records would change rate as it shrinks); a stream
  fed pre-sampled keys needs each batch's sketch (feed(..., sketch=)) and
  falls back to "keys" without.  At rate 1 the sample is the stream and
  its histogram the exact curve.
"""
from __future__ import annotations

import math

import numpy as np

from cachepilot.models import _mrc, hll
from cachepilot.models import stack as slice_stack
from cachepilot.models.exact import (as_keys, auto_sizes, check_sizes,
                                     hist_array, iter_chunks, miss_ratios)
from cachepilot.models.mrc import MRC

THRESHOLD_ALL = (1 << 64) - 1
ESTIMATORS = ("split", "adj", "ratio", "keys", "stack")
# Chosen per mode on synthetic workloads only
# (experiments/study_shards_estimators.py): at a fixed rate "stack" (mean MAE
# 0.0069 against 0.0176 for keys), at a fixed size "split" (0.0039 against
# 0.0049 for keys, whose sketch error outweighs what a large sample's own
# key count already says; "stack" needs a fixed rate).
DEFAULT_ESTIMATOR = "stack"           # fixed rate
DEFAULT_SIZE_ESTIMATOR = "split"      # fixed size
COMPOSITION_DOF = 3        # Student-t degrees of freedom of the composition part
SKETCH_RSE = 1.04 / math.sqrt(hll.REGISTERS)   # HyperLogLog relative error


def rate_threshold(rate: float) -> int:
    """Threshold for a sampling rate in (0, 1]; 1 samples every key."""
    rate = float(rate)
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sampling rate must be within (0, 1], not {rate}")
    if rate == 1.0:
        return THRESHOLD_ALL
    return max(1, min(THRESHOLD_ALL, int(rate * 2.0**64)))


def threshold_rate(threshold: int) -> float:
    return 1.0 if threshold >= THRESHOLD_ALL else threshold / 2.0**64


SALT_SEED = 20260401        # the studies' and tests' salts


def hash_salts(n: int, seed: int = SALT_SEED) -> list[int]:
    """n odd 64-bit constants.  Keys xored with one draw a fresh, equally
    likely SHARDS sample without changing the LRU behaviour (xor is a
    bijection): how studies measure the luck of one sample."""
    rng = np.random.default_rng(seed)
    return [int(s) for s in rng.integers(1, 2**63, n, dtype=np.uint64) * 2 + 1]


def hash64(keys):
    """cp_hash64 of an int or of every element of an array (native)."""
    if np.isscalar(keys) and not isinstance(keys, np.ndarray):
        return _mrc.hash64(int(keys))
    src = as_keys(keys)
    out = np.empty_like(src)
    _mrc.hash_into(src, out)
    return out


def sample_mask_index(keys, threshold: int) -> np.ndarray:
    """Indices of the keys with cp_hash64(key) < threshold."""
    return np.frombuffer(_mrc.sample_index(as_keys(keys), int(threshold)), np.uint64)


def pick_estimator(estimator: str | None = None, adj: bool | None = None,
                   fixed_size: bool = False) -> str:
    """The estimator's name: `estimator` if given, else adj=True -> "adj",
    adj=False -> "ratio", neither -> the default of the mode."""
    if estimator is None:
        if adj is None:
            return DEFAULT_SIZE_ESTIMATOR if fixed_size else DEFAULT_ESTIMATOR
        return "adj" if adj else "ratio"
    name = str(estimator).strip().lower()
    if name not in ESTIMATORS:
        raise ValueError(f"unknown SHARDS estimator {estimator!r}; accepted: "
                         + ", ".join(ESTIMATORS))
    return name


class KeyCounts:
    """References per sampled key (sampled keys are few, so this is cheap):
    what the "split" estimator needs to tell a key-count deviation from a
    composition one.  A key under the current threshold was under every
    earlier (higher) one, so its count covers all its references.  Keys a
    lowered threshold no longer samples are dropped lazily (when the table
    has doubled, and when stats are read): pruning on every drop of the
    threshold would cost O(keys) per batch in fixed-size mode."""

    def __init__(self):
        self._counts: dict[int, int] = {}
        self._pruned_len = 0

    def add(self, sampled_keys: np.ndarray) -> None:
        if len(sampled_keys) == 0:
            return
        uniq, counts = np.unique(sampled_keys, return_counts=True)
        table = self._counts
        for key, c in zip(uniq.tolist(), counts.tolist()):
            table[key] = table.get(key, 0) + c

    def prune_if_grown(self, threshold: int) -> None:
        if len(self._counts) > 2 * self._pruned_len + 1024:
            self.prune(threshold)

    def prune(self, threshold: int) -> None:
        """Forget keys at or above the threshold."""
        if self._counts:
            keys = np.fromiter(self._counts.keys(), np.uint64, len(self._counts))
            keep = keys[sample_mask_index(keys, threshold)]
            if len(keep) != len(keys):
                table = self._counts
                self._counts = {k: table[k] for k in keep.tolist()}
        self._pruned_len = len(self._counts)

    def clear(self) -> None:
        self._counts = {}
        self._pruned_len = 0

    def stats(self, threshold: int) -> tuple[int, float, float]:
        """(keys, references, sum of squared per-key references) of the keys
        under `threshold`."""
        self.prune(threshold)
        if not self._counts:
            return 0, 0.0, 0.0
        c = np.fromiter(self._counts.values(), np.float64, len(self._counts))
        return len(c), float(c.sum()), float(np.dot(c, c))


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
    sample's deviation sampled / (accesses*rate) that comes from how many
    keys it holds (see the module docstring); `keys` and `cv2` describe the
    sampled keys.  1 = no key-count deviation.  dof = inf models the
    composition as Gaussian (the study's comparison)."""
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


class Shards:
    """Streaming SHARDS.  Give `rate` (fixed rate), `max_samples` (fixed
    size, starting at rate 1 or at `rate` when both are given), or both.
    `estimator` names how the curve treats the sample's deviation from
    N * R (ESTIMATORS); the older `adj` keyword still works: True is
    "adj" (SHARDS_adj), False is "ratio".  `slice_refs` ("stack"): the
    first automatic time slices' length (None: stack.FIRST_SLICE_REFS), or
    0 for one slice per fed batch; batches that come pre-sampled are always
    one slice each."""

    def __init__(self, rate: float | None = None, max_samples: int | None = None,
                 adj: bool | None = None, *, estimator: str | None = None,
                 slice_refs: int | None = None):
        if rate is None and max_samples is None:
            raise ValueError("SHARDS needs a rate or a max_samples bound")
        if max_samples is not None and int(max_samples) < 1:
            raise ValueError("max_samples must be at least 1")
        threshold = THRESHOLD_ALL if rate is None else rate_threshold(rate)
        self.max_samples = None if max_samples is None else int(max_samples)
        self.estimator = pick_estimator(estimator, adj, fixed_size=max_samples is not None)
        if self.estimator == "stack" and self.max_samples is not None:
            raise ValueError('the "stack" estimator needs a fixed rate, not max_samples')
        self.adj = self.estimator == "adj"
        slices = {}
        if self.estimator == "stack":
            slices = {"slice_refs": slice_stack.FIRST_SLICE_REFS if slice_refs is None
                      else int(slice_refs), "max_slices": slice_stack.MAX_SLICES}
        self._sd = _mrc.StackDist(threshold=threshold, max_keys=self.max_samples or 0,
                                  **slices)
        # per-key counts cost a little per batch: kept only when used
        self._keys = KeyCounts() if self.estimator in ("split", "keys", "stack") else None
        self._records = []         # "stack": sampled references of the window
        self._sliced = self.estimator == "stack"   # every batch's sketch known
        self.accesses = 0          # unsampled references represented
        # the native sketch counts what feed() is given; it is the window's
        # distinct keys only while every batch is unsampled
        self._own_sketch_valid = True
        self._given_sketch = None  # sketch handed over with pre-sampled batches
        self._windows_ended = False

    @property
    def threshold(self) -> int:
        return self._sd.threshold

    @property
    def rate(self) -> float:
        return threshold_rate(self._sd.threshold)

    @property
    def sampled_keys(self) -> int:
        return self._sd.live

    @property
    def unique_estimate(self) -> float:
        """Distinct keys seen so far: the sketch's count while it covers the
        whole stream (one window, every reference in it), else tracked
        keys / rate (tracked keys outlive windows; the sketch does not)."""
        sketch = self.sketch()
        if sketch is not None and self._sd.seen and not self._windows_ended:
            return hll.estimate(sketch)
        return self._sd.live / self.rate

    def sketch(self) -> np.ndarray | None:
        """HyperLogLog registers of every reference of the current window,
        or None when the batches were pre-sampled and no sketch came with
        them."""
        if self._given_sketch is not None:
            return self._given_sketch
        if self._own_sketch_valid:
            own = np.frombuffer(self._sd.hll(), np.uint8)
            if self.estimator == "stack":
                # the engine's sketch restarts with every slice
                raw = np.frombuffer(self._sd.slices()[0], np.uint8)
                if len(raw):
                    own = np.maximum(own, raw.reshape(-1, hll.REGISTERS).max(axis=0))
            return own
        return None

    def add_sketch(self, registers) -> None:
        """Merge the sketch of accesses fed (or to be fed) pre-sampled: the
        kernel sampler's per-cgroup registers for this window."""
        regs = hll.as_registers(registers)
        self._given_sketch = (regs.copy() if self._given_sketch is None
                              else hll.merge(self._given_sketch, regs))

    def feed(self, keys, total_accesses: int | None = None, sketch=None) -> None:
        """Keys (unsampled, or pre-sampled at a threshold >= ours: they are
        re-filtered).  total_accesses = the unsampled references the batch
        stands for; None = len(keys).  `sketch`: the HyperLogLog registers
        of those references when the keys come pre-sampled; with "stack"
        each such batch is one time slice."""
        keys = as_keys(keys)
        # a batch with a sketch is the kernel's, even when it sampled every
        # key or none arrived
        presampled = sketch is not None or (total_accesses is not None
                                            and total_accesses != len(keys))
        if presampled:
            self._own_sketch_valid = False
            if self._sd.slice_refs:
                # slices are the batches now, not runs of offered keys
                self._sd.slice_refs = 0
        self._sd.feed(keys)
        if sketch is not None:
            self.add_sketch(sketch)
        if self.estimator == "stack":
            self._records.append(slice_stack.as_records(self._sd.take_records()).copy())
            if not self._sd.slice_refs:
                # one slice per batch: its own sketch, or the one handed over
                if presampled and sketch is None:
                    self._sliced = False
                else:
                    self._sd.close_slice(None if sketch is None else hll.as_registers(sketch),
                                         len(keys) if total_accesses is None
                                         else int(total_accesses))
        # "stack" counts the sample's keys from its records; per-key counts
        # (a second hash pass here) serve only its fallback, pre-sampled
        # batches without a sketch, where that pass is over few keys
        if self._keys is not None and (self.estimator != "stack" or presampled):
            threshold = self._sd.threshold
            self._keys.add(keys[sample_mask_index(keys, threshold)])
            self._keys.prune_if_grown(threshold)
        self.accesses += len(keys) if total_accesses is None else total_accesses

    def key_stats(self) -> tuple[int, float, float] | None:
        """(sampled keys, their references, sum of squared per-key
        references) in the current window; None unless the estimator
        keeps them."""
        return None if self._keys is None else self._keys.stats(self._sd.threshold)

    def take_histogram(self, reset: bool = False):
        """(histogram at the current rate, bin width in pages, rate, accesses);
        reset=True starts a new window (tracked keys stay, their counts
        restart; "stack" drops the window's slices unless slices(take=True)
        took them first)."""
        out = (hist_array(self._sd.hist(reset=reset)), self._sd.bin_pages,
               self.rate, self.accesses)
        if reset and self.estimator == "stack":
            self.slices(take=True)
        if reset:
            self.accesses = 0
            self._given_sketch = None
            self._own_sketch_valid = True
            self._windows_ended = True
            if self._keys is not None:
                self._keys.clear()
        return out

    def slices(self, take: bool = False):
        """("stack") The window's time slices (models.stack.Slices, the open
        one of a trace included) and its sampled references; take=True
        hands them over and starts afresh.  None when some batch of the
        window came without its sketch."""
        if take and self._sd.slice_refs and self._sd.slice_fill:
            # the window ends its open slice: the next starts a new one
            self._sd.close_slice(accesses=self._sd.slice_fill)
        raw, acc, first = self._sd.slices(take=take)
        sketches = np.frombuffer(raw, np.uint8).reshape(-1, hll.REGISTERS)
        acc = np.frombuffer(acc, np.uint64).astype(np.float64)
        first = np.frombuffer(first, np.uint32).astype(np.int64)
        if self._sd.slice_refs and self._sd.slice_fill:
            # the open slice of an automatically sliced stream
            sketches = np.vstack((sketches, np.frombuffer(self._sd.hll(), np.uint8)))
            acc = np.append(acc, float(self._sd.slice_fill))
            first = np.append(first, self._sd.slice)
        records = (np.concatenate(self._records) if self._records
                   else np.zeros(0, slice_stack.RECORD_DTYPE))
        whole = self._sliced
        if take:
            self._records = []
            self._sliced = True         # the next window starts whole
        if not whole:
            return None
        return (slice_stack.Slices(sketches, acc, first, np.ones(len(acc))), records)

    def window_unique(self) -> float | None:
        """Distinct keys of the current window by the sketch; None without one."""
        sketch = self.sketch()
        return None if sketch is None else hll.estimate(sketch)

    def mrc(self, sizes=None) -> MRC:
        key_stats = self.key_stats()
        stacked = self.slices() if self.estimator == "stack" else None
        if stacked is not None:
            # the slices' union is the window's sketch: count it once
            all_keys = stacked[0].distinct
            unique = all_keys if not self._windows_ended else self.unique_estimate
        else:
            all_keys = self.window_unique()
            unique = self.unique_estimate
        hist, bin_pages, rate, accesses = self.take_histogram()
        return curve_from_histogram(hist, bin_pages, rate, accesses, sizes,
                                    estimator=self.estimator, key_stats=key_stats,
                                    unique=unique, all_keys=all_keys,
                                    max_samples=self.max_samples, stacked=stacked)


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


def curve_from_histogram(hist, bin_pages, rate, accesses, sizes=None, *,
                         adj=True, unique=None, max_samples=None,
                         estimator: str | None = None, key_stats=None,
                         all_keys: float | None = None, stacked=None) -> MRC:
    """The curve from a SHARDS histogram.  `estimator` (else `adj`) picks
    the estimator; "split" needs `key_stats` (Shards.key_stats()), "keys"
    also `all_keys` (the window's distinct keys, from the sketch) and falls
    back to "split" without it; "stack" needs `stacked`, the (Slices,
    records) of Shards.slices(), and falls back to "keys" without."""
    name = pick_estimator(estimator, adj)
    sizes = auto_sizes(unique or 1) if sizes is None else check_sizes(sizes)
    sampled = float(np.sum(hist))
    extra = 0.0
    factor = 1.0
    asked = name
    eff_rate = None
    if name == "stack" and rate >= 1.0:
        # the sample is the stream: its histogram is the exact curve
        return MRC(sizes, miss_ratios(hist, bin_pages, sizes), "lru", "shards", 1.0,
                   {"accesses": int(accesses), "sampled": sampled, "estimator": "stack",
                    "bin_pages": int(bin_pages),
                    **({} if unique is None else {"unique_estimate": float(unique)})})
    if name == "stack":
        if stacked is not None and len(stacked[0]):
            slices, records = stacked
            span_keys = slices.distinct
            eff_rate = key_rate((slice_stack.sampled_keys(slices, records), 0.0, 0.0),
                                span_keys, rate)
            if eff_rate is not None:
                return _stack_curve(stacked, eff_rate, sizes, rate, span_keys,
                                    unique, sampled)
        name = "keys"
    if name == "keys":
        eff_rate = key_rate(key_stats, all_keys, rate)
        if eff_rate is None or not accesses:
            name = "split"
    lookup = sizes
    if name == "keys":
        # distances were scaled by 1/rate; the realised rate says by how much
        # they should have been: a size c covers scaled distances c * R' / R
        extra = accesses * eff_rate - sampled
        lookup = np.floor(sizes * (eff_rate / rate)).astype(np.int64)
    elif accesses and name == "adj":
        extra = accesses * rate - sampled
    elif accesses and name == "split":
        if key_stats is None:
            raise ValueError('the "split" estimator needs per-key counts (key_stats)')
        factor = key_count_factor(key_stats[0], frequency_cv2(key_stats),
                                  sampled, accesses, rate)
        # the key-count part scales the whole sample; what is left of the
        # deviation is composition and is booked as hits, as SHARDS_adj does
        extra = accesses * rate * factor - sampled
    ratios = miss_ratios(hist, bin_pages, lookup, extra)
    meta = {"accesses": int(accesses), "sampled": sampled, "estimator": name,
            "adj": float(extra), "bin_pages": int(bin_pages)}
    if asked != name:
        meta["estimator_asked"] = asked
    if eff_rate is not None:
        meta["key_rate"] = eff_rate
        meta["all_keys_estimate"] = float(all_keys)
    if name == "split":
        meta["key_count_factor"] = float(factor)
        meta["frequency_cv2"] = frequency_cv2(key_stats) if key_stats else 0.0
    if unique is not None:
        meta["unique_estimate"] = float(unique)
    if max_samples:
        meta["max_samples"] = int(max_samples)
    return MRC(sizes, ratios, "lru", "shards", float(rate), meta)


def _stack_curve(stacked, eff_rate, sizes, rate, all_keys, unique, sampled) -> MRC:
    slices, records = stacked
    misses, accesses, facts = slice_stack.stack_misses(slices, records, eff_rate, sizes)
    ratios = np.clip(misses / accesses, 0.0, 1.0) if accesses > 0 else np.ones(len(sizes))
    meta = {"accesses": int(round(accesses)), "sampled": sampled, "estimator": "stack",
            "key_rate": eff_rate, "all_keys_estimate": float(all_keys), **facts}
    if unique is not None:
        meta["unique_estimate"] = float(unique)
    return MRC(sizes, ratios, "lru", "shards", float(rate), meta)


def shards_mrc(source, rate=None, max_samples=None, sizes=None, adj=None, *,
               estimator=None) -> MRC:
    """SHARDS LRU MRC of an array, a trace or an iterable of key chunks."""
    engine = Shards(rate, max_samples, adj, estimator=estimator)
    for chunk in iter_chunks(source):
        engine.feed(chunk)
    return engine.mrc(sizes)
