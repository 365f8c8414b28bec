"""The SHARDS estimators behind their one interface (models/estimators.py).

Every estimator in the table is held to the same checks, so one added to
the table is checked by them too: it names itself and says what it does,
its fallbacks end, Shards keeps exactly what it says it needs, it refuses
a fixed-size sample when it needs a fixed rate, and its curve of a zipf
stream at R = 0.1 lands within 0.03 (mean absolute error) of the exact
one -- loose enough for "ratio", the weakest, on this seeded sample.
"""
import numpy as np
import pytest

from cachepilot.models import estimators as est
from cachepilot.models import generators as gen
from cachepilot.models.exact import exact_lru_mrc
from cachepilot.models.shards import Shards, curve_from_histogram, shards_mrc

NAMES = list(est.BY_NAME)


@pytest.fixture(scope="module")
def stream():
    keys = gen.zipf(50000, 0.6, seed=7).next(400_000)
    exact = exact_lru_mrc(keys)
    sizes = np.unique(np.geomspace(exact.meta["unique"] / 100, exact.meta["unique"],
                                   50).astype(np.int64))
    return keys, exact.at(sizes), sizes


@pytest.mark.parametrize("name", NAMES)
def test_each_estimator_names_itself_and_its_fallbacks_end(name):
    e = est.BY_NAME[name]
    assert e.name == name and e.summary and name in est.describe()
    seen = set()
    while e.fallback is not None:
        assert e.fallback in est.BY_NAME and e.fallback not in seen
        seen.add(e.fallback)
        e = est.BY_NAME[e.fallback]


@pytest.mark.parametrize("name", NAMES)
def test_shards_keeps_what_the_estimator_needs(name):
    kw = {"rate": 0.1}
    s = Shards(**kw, estimator=name)
    assert s.kind is est.BY_NAME[name]
    s.feed(np.arange(1000, dtype=np.uint64))
    assert (s.key_stats() is not None) == est.needs(name, "key_counts")
    if est.BY_NAME[name].slices:
        assert s.slices() is not None
    else:
        with pytest.raises(ValueError, match="no slices"):
            s.slices()


@pytest.mark.parametrize("name", NAMES)
def test_fixed_size_only_for_estimators_that_can_follow_it(name):
    if est.BY_NAME[name].fixed_rate_only:
        with pytest.raises(ValueError, match="fixed rate"):
            Shards(max_samples=512, estimator=name)
    else:
        assert Shards(max_samples=512, estimator=name).estimator == name


@pytest.mark.parametrize("name", NAMES)
def test_each_estimator_is_near_the_exact_curve(name, stream):
    keys, truth, sizes = stream
    curve = shards_mrc(keys, rate=0.1, sizes=sizes, estimator=name)
    assert curve.meta["estimator"] == name
    assert float(np.mean(np.abs(curve.miss_ratio - truth))) < 0.03


def test_an_estimator_without_what_it_needs_falls_back():
    hist = np.array([5.0, 3.0, 2.0])
    curve = curve_from_histogram(hist, 1, 0.1, 120, [1, 2, 3], estimator="stack",
                                 key_stats=(8, 10.0, 14.0))
    # no slices: stack -> keys; no sketch either: keys -> split
    assert curve.meta["estimator"] == "split"
    assert curve.meta["estimator_asked"] == "stack"
