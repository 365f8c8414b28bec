"""experiments/replan_recording.py: plans made again from a recorded
controller, with and without the larger sizes demands offer.  Options
only add choices to an exact packing, so a plan with them never uses
more hosts than one without."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import replan_recording  # noqa: E402

RECORDING = ROOT / "experiments" / "results" / "consolidate_host_consolidate.recording"


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
