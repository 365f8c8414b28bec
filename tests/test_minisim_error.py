"""The minisim error table: its loader (models/minisim_error.py) interpolates
in log(sampled pages), is flat beyond the ends, gives an unmeasured policy
the worst sd and a malformed file a clear error; the shipped table covers
the whole policy library; and the measurement (experiments/
minisim_error.py) sees LRU's error shrink as the miniature cache grows."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from cachepilot.models import generators as gen
from cachepilot.models import minisim_error as table
from cachepilot.models import runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import minisim_error as experiment  # noqa: E402


def rows(*points):
    return [{"sampled_pages": p, "bias": b, "sd": s, "n": 10} for p, b, s in points]


def write(path, policies, version=1):
    path.write_text(json.dumps({"version": version, "made": {}, "policies": policies}))
    return path


@pytest.fixture
def small(tmp_path):
    return write(tmp_path / "t.json", {
        "a": rows((8, -0.02, 0.10), (32, 0.0, 0.05), (128, 0.01, 0.02)),
        "b": rows((8, 0.03, 0.06), (128, 0.0, 0.04))})


def test_interpolates_in_log_pages_and_is_flat_beyond_the_ends(small):
    x = np.array([1, 8, 16, 32, 64, 128, 1e6])
    np.testing.assert_allclose(table.error_sd("a", x, small),
                               [0.10, 0.10, 0.075, 0.05, 0.035, 0.02, 0.02])
    np.testing.assert_allclose(table.bias("a", x, small),
                               [-0.02, -0.02, -0.01, 0.0, 0.005, 0.01, 0.01])
    # 16 pages: a quarter of the way from 8 to 128 on a log axis
    np.testing.assert_allclose(table.error_sd("b", 16, small), 0.06 - 0.25 * 0.02)


def test_keeps_the_shape_of_its_input(small):
    assert table.error_sd("a", 8.0, small).shape == ()
    assert table.bias("a", np.full((2, 3), 20.0), small).shape == (2, 3)
    assert isinstance(table.error_sd("a", 8, small), np.ndarray)


def test_an_unmeasured_policy_gets_the_worst_sd_and_no_bias(small):
    x = np.array([8, 32, 128, 512])
    worst = table.error_sd("arc", x, small)
    # a's sd is the larger at 8 pages, both are 0.05 at 32, b's is from 128 on
    np.testing.assert_allclose(worst, [0.10, 0.05, 0.04, 0.04])
    assert (worst >= table.error_sd("a", x, small)).all()
    assert (worst >= table.error_sd("b", x, small)).all()
    np.testing.assert_array_equal(table.bias("arc", x, small), 0.0)


@pytest.mark.parametrize("content", [
    None,                                                     # missing
    "{not json",
    json.dumps([1, 2]),
    json.dumps({"version": 2, "policies": {"a": rows((8, 0, 0.1))}}),
    json.dumps({"version": 1, "policies": {}}),
    json.dumps({"version": 1, "policies": {"a": []}}),
    json.dumps({"version": 1, "policies": {"a": [{"sampled_pages": 8, "sd": 0.1}]}}),
    json.dumps({"version": 1, "policies": {"a": rows((32, 0, 0.1), (8, 0, 0.1))}}),
    json.dumps({"version": 1, "policies": {"a": rows((8, 0, -0.1))}}),
    json.dumps({"version": 1, "policies": {"a": rows((8, float("nan"), 0.1))}}),
])
def test_a_missing_or_malformed_table_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match="bad.json: not a usable minisim error table"):
        table.error_sd("a", 64, path)


def test_the_table_is_loaded_once(small):
    assert table.load(small) is table.load(small)


def test_the_shipped_table_covers_every_policy_of_the_library():
    shipped = table.load()
    missing = set(runtime.available_policies()) - set(shipped)
    assert not missing, (f"policies without a measured minisim error: {sorted(missing)}; "
                         "run experiments/minisim_error.py")
    doc = json.loads(table.TABLE.read_text())
    assert doc["made"]["workloads"] and doc["made"]["command"]
    for policy in runtime.available_policies():
        pages = np.exp(shipped[policy]["log_pages"])
        assert pages[0] <= 16 and pages[-1] >= 1024, policy
        sd = table.error_sd(policy, np.array([8, 64, 1024]))
        assert np.isfinite(sd).all() and (sd > 0).all(), policy


def test_measured_lru_error_falls_as_the_miniature_cache_grows():
    buckets = (8, 32, 128, 512)
    raws = []
    for seed in range(2):
        keys = gen.keys(gen.zipf(20_000, 0.9, seed=seed), 100_000)
        raws.append(experiment.measure(experiment.Workload(f"zipf{seed}", keys), ["lru"],
                                       rates=(2**-6, 2**-4, 2**-2), buckets=buckets,
                                       salts=5))
    got = experiment.summarise(raws, buckets=buckets, min_points=8)["lru"]
    assert [r["sampled_pages"] for r in got] == list(buckets)
    sd = [r["sd"] for r in got]
    assert all(b < a for a, b in zip(sd, sd[1:])), sd
    assert sd[-1] < sd[0] / 3, sd
    assert all(r["n"] >= 16 for r in got)
