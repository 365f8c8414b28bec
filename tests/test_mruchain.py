"""MRU's chain model (models/mruchain.py): exact where it should be, close
to full simulation from a 1% sample on workloads of every shape, and the
same however the stream is cut into batches."""
import numpy as np
import pytest

from cachepilot.core.errors import UserError
from cachepilot.models import generators as gen
from cachepilot.models import runtime as rt
from cachepilot.models.mruchain import MRUChain
from cachepilot.models.mruchain import exact_miss_ratios as mru_miss_ratios
from cachepilot.models.shards import hash_salts, rate_threshold, sample_mask_index


def chain_curve(keys, sizes, rate, salt=0):
    chain = MRUChain(sizes, rate)
    chain.feed_unsampled(np.asarray(keys, np.uint64) ^ np.uint64(salt), rate_threshold(rate))
    return chain.miss_ratios()


def only_keys(out):
    return out[0] if isinstance(out, tuple) else out


def workloads():
    return {
        "zipf": gen.zipf(60_000, 1.1, seed=5).next(600_000),
        "get-scan": only_keys(gen.get_scan(60_000, 0.9, seed=6).next(600_000)),
        "phases": only_keys(gen.phases([(gen.zipf(40_000, 1.0, seed=7), 200_000),
                              (gen.loop(30_000, seed=8, base=10**7), 200_000),
                              (gen.zipf(50_000, 0.8, seed=9, base=2 * 10**7), 200_000)]
                             ).next(600_000)),
    }


def sizes_of(keys, points=8):
    unique = len(np.unique(keys))
    return np.unique(np.geomspace(unique // 100, unique, points).astype(np.int64))


def test_the_exact_oracle_is_the_runtime():
    keys = gen.zipf(5_000, 1.0, seed=1).next(60_000)
    sizes = [50, 400, 2_000, 4_900]
    want = [rt.Cache("mru", s).access(keys) / len(keys) for s in sizes]
    assert np.allclose(mru_miss_ratios(keys, sizes), want, atol=1e-12)


@pytest.mark.parametrize("name", ["zipf", "get-scan", "phases"])
def test_every_access_sampled_the_model_is_exact_mru(name):
    # rate 1: nothing is left to sampling, so what remains is the model's
    # one assumption (a link's outcome is its neighbourhood's hit ratio)
    keys = workloads()[name][:150_000]
    sizes = sizes_of(keys)
    err = np.abs(chain_curve(keys, sizes, 1.0) - mru_miss_ratios(keys, sizes))
    assert err.max() <= 0.005, err


@pytest.mark.parametrize("name", ["zipf", "get-scan", "phases"])
def test_one_percent_sample_beats_the_miniature_on_any_salt(name):
    keys = workloads()[name]
    sizes = sizes_of(keys)
    exact = mru_miss_ratios(keys, sizes)
    chain, mini = [], []
    for salt in hash_salts(4):
        salted = keys ^ np.uint64(salt)          # a fresh, equally likely sample
        chain.append(np.abs(chain_curve(keys, sizes, 0.01, salt) - exact).mean())
        sim = rt.MiniSim("mru", sizes, 0.01)
        sim.feed(rt.sample(salted, 0.01)[0], accesses=len(keys))  # no positions: the miniature
        curve = sim.curves()[0]
        assert curve.meta["estimator"] == "scaled"
        mini.append(np.abs(curve.miss_ratio - exact).mean())
    assert np.mean(chain) <= 0.02 and max(chain) <= 0.05, chain
    assert np.mean(chain) < np.mean(mini) / 3, (chain, mini)


def test_batches_and_presampled_positions_give_the_same_curve():
    keys = workloads()["zipf"][:300_000]
    sizes = sizes_of(keys)
    whole = chain_curve(keys, sizes, 0.02)
    cut = MRUChain(sizes, 0.02)
    for part in np.array_split(keys, [1, 777, 50_000, 51_000, 200_000]):
        cut.feed_unsampled(part, rate_threshold(0.02))
    assert np.array_equal(cut.miss_ratios(), whole)
    # what a sampler that knows positions would hand over, one stratum a batch
    pre = MRUChain(sizes, 0.02)
    width = pre.stratum_width
    for lo in range(0, len(keys), width):
        part = keys[lo:lo + width]
        repeats = int(np.count_nonzero(part[1:] == part[:-1]))
        if lo and part[0] == keys[lo - 1]:
            repeats += 1
        idx = sample_mask_index(part, rate_threshold(0.02)).astype(np.int64)
        pre.feed(part[idx], idx, len(part), repeats)
    assert np.allclose(pre.miss_ratios(), whole, atol=1e-12)


def test_a_counting_window_sees_its_own_phase():
    # a loop fills most of the cache and stays there (MRU keeps what came
    # first); the window after reset_counts is the zipf phase alone
    first = gen.loop(20_000, seed=12).next(300_000)
    second = gen.zipf(30_000, 1.0, seed=11, base=10**7).next(300_000)
    sizes = np.array([2_000, 8_000, 15_000, 30_000, 50_000])
    want = []
    for s in sizes.tolist():
        cache = rt.Cache("mru", s)
        cache.access(first)
        want.append(cache.access(second) / len(second))
    got = []
    for salt in hash_salts(4):
        chain = MRUChain(sizes, 0.1)
        chain.feed_unsampled(first ^ np.uint64(salt), rate_threshold(0.1))
        chain.reset_counts()
        assert chain.accesses == 0 and chain.position == len(first)
        chain.feed_unsampled(second ^ np.uint64(salt), rate_threshold(0.1))
        assert chain.accesses + chain.stratum_width > len(second)
        got.append(chain.miss_ratios())
    err = np.abs(np.mean(got, axis=0) - want)
    assert err.max() <= 0.03, (np.mean(got, axis=0), want)
    # both phases together would be far off: the window is not the stream
    whole = mru_miss_ratios(np.concatenate([first, second]), sizes)
    assert np.abs(whole - want)[:3].min() > 0.03


def test_minisim_uses_the_chain_while_positions_come_and_falls_back_without():
    keys = workloads()["zipf"][:100_000]
    sizes = sizes_of(keys)
    sim = rt.MiniSim(["fifo", "mru"], sizes, 0.01)
    sim.feed_unsampled(keys[:50_000])
    fifo, mru = sim.curves()
    assert fifo.meta["estimator"] == "scaled" and mru.meta["estimator"] == "chain"
    assert np.allclose(mru.meta["est_misses"], mru.miss_ratio * 50_000)
    sampled, _ = rt.sample(keys[50_000:], 0.01)
    sim.feed(sampled, accesses=50_000)
    assert sim.curves()[1].meta["estimator"] == "scaled"
    sim.feed_unsampled(keys[:1000])        # no way back: the chain lost track
    assert sim.curves()[1].meta["estimator"] == "scaled"


def test_bad_positions_are_refused():
    sim = rt.MiniSim("mru", [100, 1000], 0.5)
    with pytest.raises(UserError, match="positions"):
        sim.feed(np.array([1, 2], np.uint64), accesses=10, positions=[3, 3])
    with pytest.raises(UserError, match="positions"):
        rt.MiniSim("mru", [100], 0.5).feed(np.array([1], np.uint64), accesses=4,
                                           positions=[4])
    with pytest.raises(ValueError, match="rate"):
        MRUChain([10], 0.0)


def bins_reference(w, known, free, target, bounds, hit, base):
    """The bin recurrence written out plainly: a bin's ratio is its
    accesses' weighted hits (known, or their chain's bin's ratio) over
    those that do not link into the bin itself; an empty bin (or one with
    nothing left to count) takes the ratio before it."""
    k = hit.shape[1]
    prior = hit[base - 1].copy() if base else np.ones(k)
    for b in range(len(bounds) - 1):
        here = base + b
        num, den = np.zeros(k), np.zeros(k)
        for i in range(bounds[b], bounds[b + 1]):
            for j in range(k):
                own = free[i, j] and target[i] == here
                if not own:
                    den[j] += w[i]
                num[j] += w[i] * known[i, j]
                if free[i, j] and not own:
                    num[j] += w[i] * hit[target[i], j]
        for j in range(k):
            if bounds[b + 1] > bounds[b] and den[j] > 1e-12:
                prior[j] = min(1.0, max(0.0, num[j] / den[j]))
        hit[here] = prior
    return hit


@pytest.mark.parametrize("base", [0, 7])
def test_the_native_bin_loop_is_the_recurrence(base):
    """models/_mrc.mru_bins, the chain model's sequential part, against
    the recurrence written out: empty bins, links into the bin itself and
    into the history, bins with nothing left to count."""
    from cachepilot.models import _mrc
    rng = np.random.default_rng(base)
    k, nbins = 5, 40
    per_bin = rng.integers(0, 6, nbins)
    per_bin[[3, 4, 20]] = 0
    bounds = np.concatenate(([0], np.cumsum(per_bin))).astype(np.int64)
    m = int(bounds[-1])
    in_bin = np.repeat(np.arange(nbins), per_bin) + base
    target = np.array([rng.integers(0, t + 1) for t in in_bin], np.int64)
    target[:3] = in_bin[:3]                              # links into their own bin
    known = rng.random((m, k)) < 0.3
    free = ~known & (rng.random((m, k)) < 0.7)
    w = rng.random(m) * 2
    w[5] = 0.0
    hist = rng.random((base, k))
    hit = np.concatenate((hist, np.zeros((nbins, k))))
    want = bins_reference(w, known, free, target, bounds, hit.copy(), base)
    _mrc.mru_bins(w, known, free, target, bounds, hit, m, nbins, base, k)
    assert np.allclose(hit, want, rtol=0, atol=1e-12)
    assert np.array_equal(hit[:base], hist)              # the history is read, not written
    # a target beyond the bins it may read is refused, not followed
    bad = target.copy()
    bad[-1] = base + nbins
    with pytest.raises(ValueError, match="out of range"):
        _mrc.mru_bins(w, known, free, bad, bounds, hit, m, nbins, base, k)
    with pytest.raises(ValueError, match="hit"):
        _mrc.mru_bins(w, known, free, target, bounds, hit[:-1], m, nbins, base, k)
