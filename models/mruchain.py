"""MRU's miss-ratio curve from a SHARDS sample: the chain model.

A miniature simulation is a faithful model of LRU, FIFO and their kin,
because whether a page survives depends on the pages around it only
through counts that sampling scales.  MRU is different: a miss with the
cache full evicts the page of the access just before it, so a page survives
until its next use exactly when the access after its previous use hits (or
repeats it, or comes while the cache fills).  Outcomes chain from access to
access, and a miniature cache, which sees only the sampled ones, follows
the wrong chain.  This model follows the chain with what the sample knows
exactly and estimates the rest per time bin, all sizes at once, then takes
out three sampling effects (strata, counts before ratios, heavy pages).

Memory: the last position of every sampled page, and the hit ratios of the
last HISTORY_BINS bins (links further back use the oldest bin kept).

The derivation and the three corrections: docs/internals.md#models-mruchain.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepilot.models import _mrc
from cachepilot.models.shards import sample_mask_index

BIN_SAMPLES = 5           # expected sampled accesses per bin
MIN_BIN = 100             # accesses: a bin is never narrower
STRATUM_BINS = 200        # bins per stratum: 1000 expected sampled accesses
HISTORY_BINS = 64 * STRATUM_BINS


class MRUChain:
    """Streaming MRU miss ratios at `sizes` (pages) from the accesses of a
    rate-`rate` SHARDS sample and their positions in the full stream."""

    def __init__(self, sizes, rate: float):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.rate = float(rate)
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"sampling rate must be within (0, 1], not {rate}")
        k = len(self.sizes)
        # a cache of C pages is full once C distinct pages came: in the
        # sample, once round(R*C) distinct sampled pages did; the next first
        # access is the first miss that evicts
        self._fill = np.round(self.sizes * self.rate).astype(np.int64)
        self.bin_width = max(MIN_BIN, int(round(BIN_SAMPLES / self.rate)))
        self.stratum_width = self.bin_width * STRATUM_BINS
        self.position = 0                 # full-stream accesses seen
        self.colds = 0                    # distinct sampled pages seen
        self.evicting_from = np.full(k, np.iinfo(np.int64).max)
        self._last: dict[int, int] = {}   # sampled page -> position of last use
        self._last_key = None             # the last key of the last unsampled feed
        self._bin_start = np.zeros(0, dtype=np.int64)
        self._bin_hit = np.zeros((0, k))
        self._stratum_start = 0
        self._pend_keys: list[np.ndarray] = []
        self._pend_pos: list[np.ndarray] = []
        self._pend_repeats = 0.0
        self._repeats_known = True
        self._estimated = None            # (state, _Stratum) of the open stratum
        # the counting window
        self.misses = np.zeros(k)
        self.accesses = 0.0
        self.sampled = 0

    # -- input ----------------------------------------------------------------
    def feed(self, sampled_keys, positions, accesses: int, repeats=None) -> None:
        """Sampled keys of the next `accesses` full-stream accesses, with
        each one's position among them (0 <= position < accesses,
        increasing).  `repeats`: how many of those accesses repeated the
        page of the access before (None: unknown)."""
        keys = np.ascontiguousarray(sampled_keys, dtype=np.uint64)
        pos = np.asarray(positions, dtype=np.int64)
        accesses = int(accesses)
        if pos.shape != keys.shape:
            raise ValueError("one position per sampled key")
        if len(pos) and (pos[0] < 0 or pos[-1] >= accesses or np.any(np.diff(pos) <= 0)):
            raise ValueError("positions must increase within [0, accesses)")
        start = self.position
        pos = pos + start
        end = start + accesses
        while True:
            cut = self._stratum_start + self.stratum_width
            if cut > end:
                break
            part = pos < cut
            self._pend(keys[part], pos[part], repeats, cut - start, accesses)
            keys, pos = keys[~part], pos[~part]
            self.position = cut
            self._close()
            start = cut
        self._pend(keys, pos, repeats, end - start, accesses)
        self.position = end

    def _pend(self, keys, pos, repeats, share, accesses):
        if len(keys):
            self._pend_keys.append(keys)
            self._pend_pos.append(pos)
        if repeats is None:
            self._repeats_known = False
        elif accesses:
            self._pend_repeats += float(repeats) * share / accesses

    def feed_unsampled(self, keys, threshold: int, sampled=None) -> None:
        """The full stream: sample it under `threshold` (cp_hash64(key) <
        threshold) and count its repeats exactly, stratum by stratum.
        `sampled`: the indices of the keys under the threshold, when the
        caller has them already."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if sampled is None:
            sampled = sample_mask_index(keys, threshold)
        sampled = np.asarray(sampled, dtype=np.int64)
        done = 0
        while done < len(keys):
            room = self._stratum_start + self.stratum_width - self.position
            part = keys[done:done + room]
            rep = int(np.count_nonzero(part[1:] == part[:-1]))
            if self._last_key is not None and len(part) and part[0] == self._last_key:
                rep += 1
            self._last_key = part[-1]
            lo, hi = np.searchsorted(sampled, [done, done + len(part)])
            idx = sampled[lo:hi] - done
            self.feed(part[idx], idx, len(part), rep)
            done += len(part)

    def reset_counts(self) -> None:
        """End the counting window here: the open stratum is cut, its
        accesses belong to the window that ends (read it first); the
        history the chains follow is kept."""
        if self.position > self._stratum_start:
            self._close()
        self.misses[:] = 0.0
        self.accesses = 0.0
        self.sampled = 0

    # -- output ---------------------------------------------------------------
    def miss_ratios(self) -> np.ndarray:
        """Miss ratio at every size over the counting window (1 where the
        window has nothing to go on)."""
        misses, accesses = self.misses.copy(), self.accesses
        if self.position > self._stratum_start:
            st = self._stratum()
            misses += st.misses
            accesses += st.accesses
        if accesses <= 0:
            return np.ones(len(self.sizes))
        return np.clip(misses / accesses, 0.0, 1.0)

    # -- one stratum ----------------------------------------------------------
    def _close(self) -> None:
        """Add the open stratum to the window and to the history, and open
        the next one."""
        st = self._stratum()
        self._last.update(st.last_here)
        self.colds += st.colds
        self.evicting_from = st.evicting
        self._bin_start, self._bin_hit = st.bin_start, st.bin_hit
        self.misses += st.misses
        self.accesses += st.accesses
        self.sampled += st.sampled
        self._stratum_start = self.position
        self._pend_keys, self._pend_pos = [], []
        self._pend_repeats = 0.0
        self._repeats_known = True
        self._estimated = None

    def _stratum(self) -> "_Stratum":
        """The estimate of the open stratum [_stratum_start, position), made
        once however often it is asked for (a snapshot, then the end of its
        window, read the same stratum)."""
        state = (self.position, len(self._pend_keys), self._pend_repeats,
                 self._repeats_known)
        if self._estimated is None or self._estimated[0] != state:
            self._estimated = (state, self._estimate())
        return self._estimated[1]

    def _estimate(self) -> "_Stratum":
        start, end = self._stratum_start, self.position
        keys = np.concatenate(self._pend_keys) if self._pend_keys else np.zeros(0, np.uint64)
        pos = np.concatenate(self._pend_pos) if self._pend_pos else np.zeros(0, np.int64)
        n_here = end - start
        repeats = self._pend_repeats if self._repeats_known else None
        m = len(keys)
        k = len(self.sizes)

        # previous use of every sampled access
        prev = np.full(m, -1, dtype=np.int64)
        last_here = {}
        if m:
            prev, first_here, lasts = previous_use(keys, pos)
            for i in first_here.tolist():
                prev[i] = self._last.get(int(keys[i]), -1)
            last_here = dict(zip(keys[lasts].tolist(), pos[lasts].tolist()))
        cold = prev < 0
        repeat = (prev == pos - 1) & ~cold
        link = prev + 1

        # when each size's cache starts evicting
        evicting = self.evicting_from.copy()
        cold_pos = pos[cold]
        waiting = (evicting == np.iinfo(np.int64).max) & (self._fill < self.colds + len(cold_pos))
        evicting[waiting] = cold_pos[self._fill[waiting] - self.colds]

        # weights: heavy sampled pages count once, the rest share the remainder
        weight = np.ones(m)
        if m:
            uniq, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
            rem, heavy = float(n_here), np.zeros(len(uniq), bool)
            for q in np.argsort(-counts, kind="stable").tolist():
                if counts[q] / self.rate > rem:
                    heavy[q] = True
                    rem -= counts[q]
                else:
                    break
            if heavy.any():
                rest = counts[~heavy].sum()
                weight = np.where(heavy, 1.0, rem / rest if rest else 1.0)[inv]

        # outcome classes per size
        early = link[:, None] < evicting[None, :]
        known_hit = ~cold[:, None] & (repeat[:, None] | early)
        free = ~cold[:, None] & ~known_hit                # follows the chain
        body = ~cold & ~repeat          # neither a first access nor a repeat

        # repeats and first accesses are counted, not sampled for a ratio:
        # repeats exactly when the caller knows them, first accesses as
        # sampled first accesses / R (a count of pages, not of accesses,
        # which a ratio over sampled accesses would skew by their heat)
        if repeats is None:
            wm = weight.sum()
            repeats = n_here * (weight[repeat].sum() / wm) if wm > 0 else 0.0
        firsts = len(cold_pos) / self.rate

        # bins of this stratum and their hit ratios among non-repeats, in
        # order; a bin's sampled accesses may link into the bin itself
        starts = np.arange(start, end, self.bin_width, dtype=np.int64)
        all_start = np.concatenate((self._bin_start, starts))
        all_hit = np.concatenate((self._bin_hit, np.zeros((len(starts), k))))
        base = len(self._bin_start)
        in_bin = np.searchsorted(starts, pos, side="right") - 1
        target = np.maximum(np.searchsorted(all_start, np.maximum(link, 0), side="right") - 1, 0)
        bounds = np.searchsorted(in_bin, np.arange(len(starts) + 1))
        w_counted = weight * ~repeat
        if len(starts):
            # bin by bin in order: each bin's ratio reads those before it
            _mrc.mru_bins(np.ascontiguousarray(w_counted, np.float64),
                          np.ascontiguousarray(known_hit), np.ascontiguousarray(free),
                          np.ascontiguousarray(target, np.int64),
                          np.ascontiguousarray(bounds, np.int64), all_hit,
                          m, len(starts), base, k)
        prior = all_hit[-1] if len(all_hit) else np.ones(k)
        hit = np.where(known_hit, 1.0, np.where(free, all_hit[target], 0.0)) if m else np.zeros((0, k))
        w_body = weight * body

        # the stratum's misses: its first accesses, and its body accesses
        # at the weighted miss ratio of the sampled ones
        misses, accesses = np.zeros(k), 0.0
        if n_here:
            body_n = max(0.0, n_here - repeats - firsts)
            ws = w_body.sum()
            share = (w_body[:, None] * (1.0 - hit)).sum(0) / ws if ws > 0 else 1.0 - prior
            misses = np.minimum(firsts + share * body_n, n_here)
            accesses = float(n_here)

        keep = max(0, len(all_start) - HISTORY_BINS)
        return _Stratum(misses, accesses, m, len(cold_pos), last_here, evicting,
                        all_start[keep:], all_hit[keep:])


@dataclass
class _Stratum:
    """One stratum's estimate, and the history it leaves."""
    misses: np.ndarray          # per size
    accesses: float
    sampled: int
    colds: int                  # sampled pages first seen in it
    last_here: dict             # sampled page -> its last position in it
    evicting: np.ndarray        # MRUChain.evicting_from once it is done
    bin_start: np.ndarray       # the bins kept after it, and their hit ratios
    bin_hit: np.ndarray


def previous_use(keys: np.ndarray, pos: np.ndarray):
    """For accesses to `keys` at increasing positions `pos` (at least one):
    the position of each one's previous access to its key among them (-1
    for none), and the indices of each key's first and last access."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    same = sk[1:] == sk[:-1]
    prev = np.full(len(keys), -1, dtype=np.int64)
    prev[order[1:][same]] = pos[order[:-1][same]]
    first = order[np.concatenate(([True], ~same))]
    last = order[np.concatenate((~same, [True]))]
    return prev, first, last


def exact_miss_ratios(keys, sizes) -> np.ndarray:
    """Exact MRU miss ratios at every size from the recursion above, in
    O(N log N) for all sizes together: follow each access's links (by
    pointer doubling) to where its chain ends -- a repeat, a hit; or a
    first access, a miss that evicted (and so a miss for the whole chain)
    only if it came once the cache was full.  The oracle of the tests and
    of study_minisim_mru.py; the runtime's MRU agrees to the access."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    n = len(keys)
    if n == 0:
        raise ValueError("no accesses")
    t = np.arange(n)
    prev, _, _ = previous_use(keys, t)
    cold, repeat = prev < 0, prev == t - 1
    end = np.where(cold | repeat, t, prev + 1)
    while True:
        nxt = end[end]
        if np.array_equal(nxt, end):
            break
        end = nxt
    firsts = np.flatnonzero(cold)
    out = []
    for c in np.asarray(sizes, dtype=np.int64).tolist():
        evicting = firsts[c] if c < len(firsts) else n
        miss = cold | (~repeat & cold[end] & (end >= evicting))
        out.append(np.count_nonzero(miss) / n)
    return np.array(out)
