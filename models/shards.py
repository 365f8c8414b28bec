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

This module is the stream side: Shards feeds the native stack-distance
engine and keeps what its estimator says it needs (per-key counts, the
sketch of every reference, time slices).  How a window's sample becomes a
curve is the estimator's business, one class each in models/estimators.py.
"""
from __future__ import annotations

import numpy as np

from cachepilot.models import _mrc, hll
from cachepilot.models import stack as slice_stack
from cachepilot.models.estimators import BY_NAME, Sample, estimate, needs, pick_estimator
from cachepilot.models.exact import as_keys, auto_sizes, check_sizes, hist_array, iter_chunks
from cachepilot.models.mrc import MRC

THRESHOLD_ALL = (1 << 64) - 1


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


def counted_reads(total: float, counted_scaled: float, others_scaled: float) -> float:
    """How many of a stream's `total` accesses some threads made, from a
    sample split by thread, each part scaled back by its rate: all of
    them less the other threads'.  As SHARDS_adj does for the total, this
    lays the sample's deviation (a few hot keys sampled or not) on the
    counted threads, whose point reads are the skewed ones, while the
    others (a scan: many keys, each read alike) scale back well; never
    fewer than the counted threads' own sample scaled back.  The curves
    (runtime.MiniSim) and the agent's observed miss ratio
    (agent/curves.CountedMisses) both count by it, so they agree."""
    return max(counted_scaled, total - others_scaled)


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


class Shards:
    """Streaming SHARDS.  Give `rate` (fixed rate), `max_samples` (fixed
    size, starting at rate 1 or at `rate` when both are given), or both.
    `estimator` names how the curve treats the sample's deviation from
    N * R (models/estimators.py); the older `adj` keyword still works: True is
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
        self.kind = BY_NAME[self.estimator]
        if self.kind.fixed_rate_only and self.max_samples is not None:
            raise ValueError(f'the "{self.estimator}" estimator needs a fixed rate, '
                             'not max_samples')
        slices = {}
        if self.kind.slices:
            slices = {"slice_refs": slice_stack.FIRST_SLICE_REFS if slice_refs is None
                      else int(slice_refs), "max_slices": slice_stack.MAX_SLICES}
        self._sd = _mrc.StackDist(threshold=threshold, max_keys=self.max_samples or 0,
                                  **slices)
        # per-key counts cost a little per batch: kept only when used
        self._keys = KeyCounts() if needs(self.estimator, "key_counts") else None
        self._records = []         # sliced: sampled references of the window
        self._sliced = self.kind.slices   # every batch's sketch known
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
            if self.kind.slices:
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
        if self.kind.slices:
            self._records.append(slice_stack.as_records(self._sd.take_records()).copy())
            if not self._sd.slice_refs:
                # one slice per batch: its own sketch, or the one handed over
                if presampled and sketch is None:
                    self._sliced = False
                else:
                    self._sd.close_slice(None if sketch is None else hll.as_registers(sketch),
                                         len(keys) if total_accesses is None
                                         else int(total_accesses))
        # a sliced estimator counts the sample's keys from its records;
        # per-key counts (a second hash pass here) serve only its fallback,
        # pre-sampled batches without a sketch, where that pass is over few keys
        if self._keys is not None and (not self.kind.slices or presampled):
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
        if reset and self.kind.slices:
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
        stacked = self.slices() if self.kind.slices else None
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


def curve_from_histogram(hist, bin_pages, rate, accesses, sizes=None, *,
                         adj=True, unique=None, max_samples=None,
                         estimator: str | None = None, key_stats=None,
                         all_keys: float | None = None, stacked=None) -> MRC:
    """The curve from a SHARDS histogram by the named estimator (else
    `adj`: True "adj", False "ratio"), given what it needs: `key_stats`
    (Shards.key_stats()), `all_keys` (the window's distinct keys, from the
    sketch), `stacked` (the (Slices, records) of Shards.slices()); one that
    lacks them falls back as models/estimators.py says."""
    name = pick_estimator(estimator, adj)
    sizes = auto_sizes(unique or 1) if sizes is None else check_sizes(sizes)
    return estimate(name, Sample(hist, bin_pages, rate, accesses, sizes, key_stats,
                                 all_keys, stacked, unique, max_samples))


def shards_mrc(source, rate=None, max_samples=None, sizes=None, adj=None, *,
               estimator=None) -> MRC:
    """SHARDS LRU MRC of an array, a trace or an iterable of key chunks."""
    engine = Shards(rate, max_samples, adj, estimator=estimator)
    for chunk in iter_chunks(source):
        engine.feed(chunk)
    return engine.mrc(sizes)
