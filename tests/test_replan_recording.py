"""experiments/replan_recording.py: plans made again from a recorded
controller, with and without the larger sizes demands offer.  Options
only add choices to an exact packing at one disk share, so over these
rounds a plan with them uses no more hosts than one without (a plan whose
prediction misses an SLO is packed again at a lower share, and there the
two can part: round 228 of run K's recording); and the run's own
placement, predicted again, is scored against what the run measured."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import replan_recording  # noqa: E402

# run M of make consolidate, kept under its own name: a new run replaces
# consolidate_host.json and its recording, and these rounds are M's
RECORDING = ROOT / "experiments" / "results" / "consolidate_host_runM.recording"


def test_plans_from_a_recording_never_use_more_hosts_with_the_offers(tmp_path, capsys):
    assert replan_recording.main([str(RECORDING), "--from", "150", "--to", "200",
                                  "--every", "25", "--results", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("replan_*.json")
    doc = json.loads(out.read_text())
    assert [r["round"] for r in doc["plans"]] == [150, 175, 200]
    for r in doc["plans"]:
        assert r["offers"]["hosts"] is not None
        assert r["without"]["hosts"] is None or r["offers"]["hosts"] <= r["without"]["hosts"]
    assert doc["more_hosts_with_offers"] == 0
    assert out.with_suffix(".png").stat().st_size > 0
    assert "3 plans" in capsys.readouterr().out


def test_a_missing_recording_is_a_clear_error(tmp_path, capsys):
    assert replan_recording.main([str(tmp_path / "nope"), "--results", str(tmp_path)]) == 2
    assert "replan:" in capsys.readouterr().err


def test_the_runs_own_placement_is_scored_against_what_it_measured(tmp_path, capsys):
    measured = ROOT / "experiments" / "results" / "consolidate_host_runM.json"
    assert replan_recording.main([str(RECORDING), "--from", "372", "--to", "378",
                                  "--every", "3", "--results", str(tmp_path),
                                  "--measured", str(measured)]) == 0
    (out,) = tmp_path.glob("replan_*.json")
    doc = json.loads(out.read_text())
    run = json.loads(measured.read_text())
    for r in doc["plans"]:
        for label in ("recent", "one_report"):
            errors = r["own"][label]["errors"]
            assert set(errors) <= set(run["plan"]["assignment"]) and len(errors) >= 5
            assert r["own"][label]["worst"] == pytest.approx(max(map(abs, errors.values())))
    assert doc["own_placement"]["recent"]["rounds"] == 3
    assert "its own placement" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert replan_recording.main([str(RECORDING), "--measured", str(bad),
                                  "--results", str(tmp_path)]) == 2
