"""The policy settling table: its loader (models/policy_settling.py) reads
medians, gives an unmeasured policy the slowest one and a malformed file a
clear error; and the measurement (experiments/policy_settling.py) sees mru,
which discards the cache it is handed, need a loop's whole pass to settle
where a policy that keeps what it is handed settles at once."""
import json
import sys
from pathlib import Path

import pytest

from cachepilot.models import generators as gen
from cachepilot.models import policy_settling as table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import policy_settling as experiment  # noqa: E402


def write(path, policies, version=1):
    path.write_text(json.dumps({"version": version, "made": {}, "policies": policies}))
    return path


def test_reads_medians_and_takes_an_unmeasured_policy_for_the_slowest(tmp_path):
    path = write(tmp_path / "t.json", {"a": {"median": 0.5, "p90": 1, "n": 3},
                                       "b": {"median": 2.0, "p90": 4, "n": 3}})
    assert table.turnovers("a", path) == 0.5
    assert table.turnovers("b", path) == 2.0
    assert table.turnovers("never-measured", path) == 2.0


@pytest.mark.parametrize("doc", ["not json", json.dumps({"version": 9, "policies": {}}),
                                 json.dumps({"version": 1, "policies": {}}),
                                 json.dumps({"version": 1, "policies": {"a": {"p90": 1}}}),
                                 json.dumps({"version": 1,
                                             "policies": {"a": {"median": -1}}})])
def test_a_malformed_table_is_a_clear_error(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(doc)
    with pytest.raises(ValueError, match="policy_settling.py"):
        table.load(path)


def test_a_missing_table_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="nothing.json"):
        table.load(tmp_path / "nothing.json")


def test_the_shipped_table_was_measured():
    doc = json.loads(table.TABLE.read_text())
    assert doc["made"]["command"].startswith("experiments/policy_settling.py")
    assert "mru" in table.load() and "linux" in table.load()


def test_mru_on_a_loop_waits_a_whole_pass_where_lhd_keeps_what_it_is_handed():
    pages = 1024
    make = lambda: gen.loop(pages, seed=0)  # noqa: E731
    mru = experiment.settle_case(make, "mru", pages, 0.5)
    # handed linux's cache as fresh pages, mru evicts them all first: its
    # hits wait for the loop to come round on pages it inserted itself
    assert mru is not None and mru["before"] == pytest.approx(1.0)
    assert mru["accesses_per_footprint"] >= 0.75 and mru["turnovers"] >= 1.5
    lhd = experiment.settle_case(make, "lhd", pages, 0.9)
    assert lhd is not None and lhd["turnovers"] < 0.5 * mru["turnovers"]
    # a policy whose steady state is linux's has nothing to settle to
    assert experiment.settle_case(make, "lru", pages, 0.5) is None
