"""agent/damon.py against a fake DAMON sysfs tree: which kdamonds page out,
their pageout totals, and pausing them for a measurement."""
import logging

from cachepilot.agent import damon


def make_kdamond(admin, i, state, actions, applied=()):
    kd = admin / str(i)
    for j, action in enumerate(actions):
        scheme = kd / "contexts" / "0" / "schemes" / str(j)
        (scheme / "stats").mkdir(parents=True)
        (scheme / "action").write_text(action + "\n")
        (scheme / "stats" / "sz_applied").write_text(f"{applied[j] if applied else 0}\n")
    kd.mkdir(parents=True, exist_ok=True)
    (kd / "state").write_text(state + "\n")
    return kd


def test_only_running_kdamonds_with_a_pageout_scheme_count(tmp_path):
    admin = tmp_path / "kdamonds"
    admin.mkdir()
    (admin / "nr_kdamonds").write_text("4\n")
    reclaim = make_kdamond(admin, 0, "on", ["stat", "pageout"], [0, 5 << 20])
    make_kdamond(admin, 1, "off", ["pageout"])
    make_kdamond(admin, 2, "on", ["lru_prio"])
    # kdamond 3 is missing altogether: skipped
    assert damon.pageout_kdamonds(admin) == [reclaim]
    assert damon.describe([reclaim]) == "kdamond 0"
    assert damon.paged_out_bytes([reclaim]) == 5 << 20       # the pageout scheme only
    assert (reclaim / "state").read_text() == "update_schemes_stats\n"   # asked to refresh


def test_no_damon_interface_means_nothing_to_do(tmp_path):
    assert damon.pageout_kdamonds(tmp_path / "absent") == []
    (tmp_path / "nr_kdamonds").write_text("junk\n")
    assert damon.pageout_kdamonds(tmp_path) == []
    with damon.paused(tmp_path / "absent") as stopped:
        assert stopped == []


def test_paused_stops_and_restarts_even_when_the_body_fails(tmp_path):
    admin = tmp_path / "kdamonds"
    admin.mkdir()
    (admin / "nr_kdamonds").write_text("1\n")
    kd = make_kdamond(admin, 0, "on", ["pageout"])
    try:
        with damon.paused(admin) as stopped:
            assert stopped == [kd]
            assert (kd / "state").read_text() == "off\n"
            raise RuntimeError("measurement failed")
    except RuntimeError:
        pass
    assert (kd / "state").read_text() == "on\n"


def test_a_kdamond_that_cannot_be_stopped_is_logged_and_left(tmp_path, caplog, monkeypatch):
    admin = tmp_path / "kdamonds"
    admin.mkdir()
    (admin / "nr_kdamonds").write_text("1\n")
    kd = make_kdamond(admin, 0, "on", ["pageout"])

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(kd), "write_text", refuse)
    with caplog.at_level(logging.WARNING), damon.paused(admin) as stopped:
        assert stopped == []
    assert "could not pause DAMON" in caplog.text
    assert (kd / "state").read_text() == "on\n"
