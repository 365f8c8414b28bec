"""The MRC type: reading curves forwards and backwards, hulls, JSON."""
import json

import numpy as np
import pytest

from cachepilot.models.mrc import MRC


def test_interpolates_between_points_and_from_the_origin():
    c = MRC([10, 20, 40], [0.8, 0.5, 0.2])
    assert c.at(15) == pytest.approx(0.65)
    assert c.at(5) == pytest.approx(0.9)       # between (0, 1.0) and (10, 0.8)
    assert c.at(1000) == pytest.approx(0.2)    # flat beyond the last point
    assert np.allclose(c.at([10, 40]), [0.8, 0.2])
    assert c.at_bytes(20 * 4096) == pytest.approx(0.5)


def test_size_for_reads_the_curve_backwards():
    c = MRC([10, 20, 40], [0.8, 0.5, 0.2])
    assert c.size_for(0.5) == pytest.approx(20)
    assert c.size_for(0.35) == pytest.approx(30)
    assert c.size_for(0.9) == pytest.approx(5)
    assert c.size_for(0.1) is None             # never reached
    # round trip: the size found gives back the ratio asked for
    for target in np.linspace(0.21, 0.99, 17):
        assert c.at(c.size_for(target)) == pytest.approx(target)


def test_size_for_ignores_a_non_monotone_bump():
    # sampled curves can wiggle; the least size reaching the ratio wins
    c = MRC([10, 20, 30], [0.4, 0.6, 0.3])
    assert c.size_for(0.4) == pytest.approx(10)


def test_convex_hull_lies_on_or_below_the_curve_and_is_convex():
    rng = np.random.default_rng(7)
    sizes = np.arange(1, 200) * 8
    ratios = np.clip(1 / np.sqrt(sizes) + rng.normal(0, 0.02, len(sizes)), 0, 1)
    c = MRC(sizes, ratios)
    h = c.convex_hull()
    assert np.all(h.at(c.sizes) <= np.minimum.accumulate(c.miss_ratio) + 1e-12)
    slopes = np.diff(h.miss_ratio) / np.diff(h.sizes)
    assert np.all(np.diff(slopes) >= -1e-12)   # slopes never decrease: convex
    assert h.sizes[0] == c.sizes[0] and h.sizes[-1] == c.sizes[-1]


def test_json_round_trip():
    c = MRC([1, 2, 8], [0.9, 0.7, 0.1], policy="fifo", method="minisim", rate=0.01)
    back = MRC.from_json(c.to_json())
    assert back.policy == "fifo" and back.method == "minisim" and back.rate == 0.01
    assert np.array_equal(back.sizes, c.sizes)
    assert np.allclose(back.miss_ratio, c.miss_ratio)
    assert set(json.loads(c.to_json())) >= {"policy", "method", "rate", "sizes", "miss_ratio"}


@pytest.mark.parametrize("sizes,ratios,msg", [
    ([1, 1], [0.5, 0.4], "increasing"),
    ([1, 2], [0.5], "equally long"),
    ([1, 2], [0.5, float("nan")], "finite"),
    ([1, 2], [0.5, 1.5], "within"),
    ([], [], "at least one"),
])
def test_malformed_curves_are_refused(sizes, ratios, msg):
    with pytest.raises(ValueError, match=msg):
        MRC(sizes, ratios)


def test_from_dict_names_a_missing_key():
    with pytest.raises(ValueError, match="sizes"):
        MRC.from_dict({"miss_ratio": [0.5]})


@pytest.mark.parametrize("sizes,ratios,why", [
    ([10, 10, 20], [0.5, 0.4, 0.3], "strictly increasing"),
    ([20, 10], [0.5, 0.4], "strictly increasing"),
    ([-1, 10], [0.5, 0.4], "non-negative"),
    ([10, 20], [0.5, float("nan")], "within"),
    ([10, 20], [float("inf"), 0.4], "within"),
    ([10, 20], [0.5, float("-inf")], "within"),
    ([10, 20], [1.1, 0.4], "within"),
    ([10, 20], [0.5, -0.01], "within"),
    ([], [], "at least one point"),
    ([10, 20], [0.5], "equally long"),
])
def test_a_curve_that_breaks_the_rules_is_refused_and_so_is_its_message(sizes, ratios, why):
    """The type refuses it, and so does the wire (which checks a report's
    curves itself and makes them with MRC.checked), each with its reason."""
    from cachepilot.protocol import cachepilot_pb2 as pb
    from cachepilot.protocol.wire import WireError, curve_from_pb
    with pytest.raises(ValueError, match=why):
        MRC(np.array(sizes, dtype=np.int64), np.array(ratios, dtype=np.float64))
    msg = pb.Curve(policy="lru", rate=0.1, sizes_pages=sizes, miss_ratio=ratios)
    with pytest.raises(WireError):
        curve_from_pb(msg)


def test_the_wire_makes_the_same_curve_as_the_type():
    from cachepilot.protocol import cachepilot_pb2 as pb
    from cachepilot.protocol.wire import curve_from_pb, curve_to_pb
    c = MRC([0, 10, 40], [1.0, 0.6, 0.25], "s3fifo", "minisim", 0.125, {"k": 1})
    back = curve_from_pb(pb.Curve.FromString(curve_to_pb(c).SerializeToString()))
    assert back.sizes.dtype == np.int64 and back.miss_ratio.dtype == np.float64
    assert back.sizes.tolist() == [0, 10, 40] and back.miss_ratio.tolist() == [1.0, 0.6, 0.25]
    assert (back.policy, back.method, back.rate, back.meta) == ("s3fifo", "minisim", 0.125,
                                                               {"k": 1})
    assert back.at(25) == pytest.approx(c.at(25))
