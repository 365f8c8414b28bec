"""Synthetic key streams: seeded, shaped as named, chunk-friendly."""
import numpy as np
import pytest

from cachepilot.models import generators as gen


def test_same_seed_same_stream_other_seed_other_stream():
    a = gen.zipf(10_000, 0.9, seed=3).next(5000)
    b = gen.zipf(10_000, 0.9, seed=3).next(5000)
    c = gen.zipf(10_000, 0.9, seed=4).next(5000)
    assert a.dtype == np.uint64 and np.array_equal(a, b) and not np.array_equal(a, c)
    ka, ta = gen.get_scan(1000, seed=1).next(3000)
    kb, tb = gen.get_scan(1000, seed=1).next(3000)
    assert np.array_equal(ka, kb) and np.array_equal(ta, tb)


def test_zipf_rank_frequency_slope_is_the_skew():
    for skew in (0.6, 1.0):
        keys = gen.zipf(2000, skew, seed=1).next(2_000_000)
        counts = np.sort(np.bincount(keys.astype(np.int64)))[::-1]
        ranks = np.arange(1, 201)
        slope = np.polyfit(np.log(ranks), np.log(counts[:200]), 1)[0]
        assert slope == pytest.approx(-skew, abs=0.05)
        assert keys.max() < 2000


def test_zipf_skew_zero_and_uniform_are_flat():
    for stream in (gen.zipf(100, 0.0, seed=2), gen.uniform(100, seed=2)):
        counts = np.bincount(stream.next(200_000).astype(np.int64), minlength=100)
        assert len(counts) == 100
        assert counts.min() > 1700 and counts.max() < 2300


def test_scan_never_rereads_and_loop_cycles():
    s = gen.scan(100, base=50)
    k = np.concatenate([s.next(70), s.next(200)])
    assert len(np.unique(k)) == len(k) and k[0] == 50 and np.all(np.diff(k) == 1)
    lp = gen.loop(7, base=10)
    k = np.concatenate([lp.next(5), lp.next(12)])
    assert k.tolist() == [10 + i % 7 for i in range(17)]


def test_get_scan_tids_mark_sequential_scan_runs():
    stream = gen.get_scan(5000, 0.9, scan_fraction=0.25, scan_pages=64, seed=5)
    keys, tids = stream.next(200_000)
    scan = tids == gen.SCAN_TID
    assert set(np.unique(tids).tolist()) == {gen.GET_TID, gen.SCAN_TID}
    assert scan.mean() == pytest.approx(0.25, abs=0.01)
    assert keys[~scan].max() < 5000 <= keys[scan].min()     # disjoint regions
    steps = np.diff(keys[scan].astype(np.int64))
    # inside a run of 64 pages the scan thread reads the next page
    assert np.mean(steps == 1) == pytest.approx(63 / 64, abs=0.01)


def test_phases_switch_at_the_boundary_across_chunks():
    stream = gen.phases([(gen.loop(3), 5), (gen.scan(10, base=100), 4), (gen.loop(2, base=7), 1)])
    out = np.concatenate([stream.next(3), stream.next(4), stream.next(6)])
    assert out.tolist() == [0, 1, 2, 0, 1, 100, 101, 102, 103, 7, 8, 7, 8]


def test_phases_with_tids_fill_zero_for_tidless_streams():
    stream = gen.phases([(gen.loop(4), 3), (gen.get_scan(10, seed=1), 5)])
    keys, tids = stream.next(8)
    assert tids[:3].tolist() == [0, 0, 0] and (tids[3:] > 0).all()


def test_mix_interleaves_by_weight_and_streams_go_on():
    stream = gen.mix([(gen.loop(1000), 3), (gen.scan(10, base=10**6), 1)], seed=4)
    keys = np.concatenate([stream.next(5000), stream.next(3000)])
    from_scan = keys >= 10**6
    assert abs(from_scan.mean() - 0.25) < 0.02
    # each stream continues where it left off, across calls
    assert np.array_equal(keys[from_scan], 10**6 + np.arange(from_scan.sum()))
    assert np.array_equal(keys[~from_scan], np.arange((~from_scan).sum()) % 1000)
    again = gen.mix([(gen.loop(1000), 3), (gen.scan(10, base=10**6), 1)], seed=4)
    assert np.array_equal(again.next(8000), keys)


def test_chunks_cover_the_total():
    sizes = [len(c) for c in gen.uniform(10).chunks(2500, chunk=1000)]
    assert sizes == [1000, 1000, 500]


def test_trace_stream_loops(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("1\n2\n3\n")
    stream = gen.trace_stream(p)
    assert stream.next(7).tolist() == [1, 2, 3, 1, 2, 3, 1]
    once = gen.trace_stream(p, loop=False)
    assert once.next(7).tolist() == [1, 2, 3]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        gen.zipf(0)
    with pytest.raises(ValueError):
        gen.zipf(10, -1)
    with pytest.raises(ValueError):
        gen.get_scan(10, scan_fraction=1.5)
    with pytest.raises(ValueError):
        gen.mix([(gen.loop(3), 0)])
