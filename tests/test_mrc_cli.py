"""The `cachepilot mrc` command, end to end (in-process and as a process)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from cachepilot.main import main
from cachepilot.models import generators as gen
from cachepilot.models import runtime
from cachepilot.models.exact import exact_lru_mrc
from cachepilot.models.shards import rate_threshold, sample_mask_index
from cachepilot.models.traces import open_trace, records, read_keys


def run(argv, capsys):
    code = main(["mrc", "--no-progress", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def small_trace(tmp_path):
    keys = gen.get_scan(3000, 0.9, scan_fraction=0.2, scan_pages=128, seed=1).next(60_000)[0]
    p = tmp_path / "small.txt"
    p.write_text("\n".join(map(str, keys.tolist())) + "\n")
    return p, keys


def test_oltp_json_table_and_plot(oltp_lis, tmp_path, capsys):
    out_json, out_png = tmp_path / "oltp.json", tmp_path / "oltp.png"
    code, out, err = run([oltp_lis, "--json", out_json, "--plot", out_png], capsys)
    assert code == 0
    doc = json.loads(out_json.read_text())
    assert doc["requests"] == 914_145 and doc["unique"] == 186_880
    assert doc["trace"] == str(oltp_lis)
    (curve,) = doc["curves"]
    assert set(curve) >= {"policy", "method", "rate", "sizes", "miss_ratio"}
    assert (curve["policy"], curve["method"], curve["rate"]) == ("lru", "exact", 1.0)
    assert curve["sizes"][-1] == 186_880 and len(curve["sizes"]) >= 50
    ref = exact_lru_mrc(read_keys(oltp_lis), curve["sizes"])
    assert np.allclose(curve["miss_ratio"], ref.miss_ratio, atol=1e-11)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "186,880 unique pages" in out and "lru exact" in out


def test_policy_all_and_method_pairs(small_trace, tmp_path, capsys):
    path, keys = small_trace
    out_json = tmp_path / "all.json"
    code, _, _ = run([path, "--policy", "all", "--sizes", "300,1000,3000,9000",
                      "--json", out_json], capsys)
    assert code == 0
    curves = json.loads(out_json.read_text())["curves"]
    expected = ["lru"] + [p for p in runtime.available_policies() if p != "lru"]
    assert [c["policy"] for c in curves] == expected
    assert [c["method"] for c in curves] == ["exact"] + ["minisim"] * (len(expected) - 1)

    code, _, _ = run([path, "--policy", "lru,fifo", "--method", "exact",
                      "--sizes", "300,1000,3000", "--json", out_json], capsys)
    methods = [c["method"] for c in json.loads(out_json.read_text())["curves"]]
    assert code == 0 and methods == ["exact", "full"]


def test_full_simulation_of_lru_equals_stack_distances(small_trace, tmp_path, capsys):
    # two independent implementations: the policy runtime's LRU cache and
    # Mattson's algorithm must agree exactly
    path, keys = small_trace
    out_json = tmp_path / "full.json"
    sizes = [1, 50, 700, 2500, 3100, 8000]
    code, _, _ = run([path, "--method", "full", "--sizes", ",".join(map(str, sizes)),
                      "--json", out_json], capsys)
    assert code == 0
    (curve,) = json.loads(out_json.read_text())["curves"]
    assert curve["method"] == "full"
    assert np.allclose(curve["miss_ratio"], exact_lru_mrc(keys, sizes).miss_ratio, atol=1e-12)


def test_shards_options(oltp_lis, tmp_path, capsys):
    out_json = tmp_path / "s.json"
    code, _, _ = run([oltp_lis, "--max-samples", 8192, "--json", out_json], capsys)
    doc = json.loads(out_json.read_text())
    (curve,) = doc["curves"]
    assert code == 0 and curve["method"] == "shards" and 0 < curve["rate"] < 0.1
    assert doc["unique_estimated"] and abs(doc["unique"] - 186_880) < 0.1 * 186_880
    code, _, _ = run([oltp_lis, "--rate", 0.01, "--sizes", "1000,100000",
                      "--json", out_json], capsys)
    (curve,) = json.loads(out_json.read_text())["curves"]
    assert code == 0 and curve["rate"] == pytest.approx(0.01) and curve["sizes"] == [1000, 100000]


def test_sampled_cpaccess_file_is_scaled(tmp_path, capsys):
    keys = gen.zipf(50_000, 0.9, seed=3).next(500_000)
    thr = rate_threshold(0.1)
    kept = keys[sample_mask_index(keys, thr)]
    path = tmp_path / "agent.cpa"
    # the agent writes sampled accesses and, per drain, a tally of all accesses
    parts = []
    for chunk in np.array_split(keys, 10):
        parts.append(records.make_records(chunk[sample_mask_index(chunk, thr)]))
        parts.append(records.make_tally(len(chunk)))
    records.write_records(path, parts, threshold=thr)
    assert sum(len(p) for p in parts) == len(kept) + 10
    out_json = tmp_path / "cpa.json"
    sizes = np.unique(np.geomspace(500, 50_000, 20).astype(int))
    code, _, _ = run([path, "--sizes", ",".join(map(str, sizes)), "--json", out_json], capsys)
    assert code == 0
    (curve,) = json.loads(out_json.read_text())["curves"]
    assert curve["method"] == "shards" and curve["rate"] == pytest.approx(0.1)
    exact = exact_lru_mrc(keys, sizes)
    assert np.mean(np.abs(np.array(curve["miss_ratio"]) - exact.miss_ratio)) < 0.02
    # a sampled file's key count is scaled up, not taken for the whole
    # stream's (its records are 10 % of the keys)
    capsys.readouterr()
    assert main(["trace", "info", str(path)]) == 0
    info = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert int(info["unique"]) == pytest.approx(len(np.unique(keys)), rel=0.1)
    code, out, _ = run([path, "--policy", "fifo", "--json", out_json], capsys)
    assert code == 0
    doc = json.loads(out_json.read_text())
    assert doc["unique"] == pytest.approx(len(np.unique(keys)), rel=0.1)
    # "keys" cannot run on a sampled file: the curve falls back and says so
    code, _, err = run([path, "--rate", "0.05", "--estimator", "keys"], capsys)
    assert code == 0 and "'keys' estimator needs a sketch" in err and "'split'" in err


def test_estimator_option_picks_the_shards_estimator(small_trace, tmp_path, capsys):
    from cachepilot.models.shards import shards_mrc
    path, keys = small_trace
    sizes = [300, 1000, 3000]
    for name in ("keys", "split", "adj", "ratio"):
        out_json = tmp_path / f"{name}.json"
        code, _, _ = run([path, "--rate", "0.05", "--estimator", name, "--sizes",
                          ",".join(map(str, sizes)), "--json", out_json], capsys)
        assert code == 0
        (curve,) = json.loads(out_json.read_text())["curves"]
        library = shards_mrc(keys, rate=0.05, sizes=sizes, estimator=name)
        np.testing.assert_allclose(curve["miss_ratio"], library.miss_ratio, atol=1e-12)


@pytest.mark.parametrize("argv,message", [
    (["--policy", "bogus"], "unknown policy 'bogus'; accepted: lru, "),
    (["--format", "nope"], "unknown trace format 'nope'; accepted: txt, csv, lis"),
    (["--method", "magic"], "unknown method 'magic'; accepted: exact, shards, minisim, full"),
    (["--rate", "0"], "--rate must be within"),
    (["--sizes", "10,x"], "--sizes takes 'auto' or comma-separated page counts"),
    (["--method", "full", "--rate", "0.1"], "takes no --rate"),
    (["--rate", "0.1", "--estimator", "guess"], "unknown SHARDS estimator 'guess'; accepted: "),
    (["--estimator", "adj"], "--estimator goes with SHARDS"),
])
def test_bad_options_one_line_and_nonzero(small_trace, capsys, argv, message):
    path, _ = small_trace
    code, out, err = run([path, *argv], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("cachepilot mrc: error: ")


def test_bad_traces_through_a_real_process(tmp_path):
    bad = tmp_path / "bad.lis"
    bad.write_text("1 1 0 0\n2 1 0 1\n3 one 0 2\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    blob = tmp_path / "blob"
    blob.write_bytes(b"\x00\x01garbage")
    cases = [(bad, f"{bad}:3: malformed lis line"),
             (empty, "holds no page accesses (accepted formats: txt, csv, lis"),
             (blob, "use --format with one of: txt, csv, lis, oracle, cpaccess"),
             (tmp_path / "absent.txt", "no such trace file")]
    for path, message in cases:
        proc = subprocess.run([sys.executable, "-m", "cachepilot", "mrc", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, path
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_trace_gen_then_info_and_mrc(tmp_path, capsys):
    out = tmp_path / "gs.cpa.zst"
    assert main(["trace", "gen", "get-scan", "--keys", "4000", "--count", "50000",
                 "--seed", "7", "-o", str(out)]) == 0
    capsys.readouterr()
    # the file holds exactly what the generator yields for that seed
    keys, tids = gen.get_scan(4000, 1.0, 0.3, 1024, seed=7).next(50_000)
    (back_keys, back_tids), = list(open_trace(out).chunks_with_tids())
    assert np.array_equal(back_keys, keys) and np.array_equal(back_tids, tids)
    assert main(["trace", "info", str(out)]) == 0
    info = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert info["format"] == "cpaccess" and info["compressed"] == "True"
    assert int(info["accesses"]) == 50_000 and int(info["unique"]) == len(np.unique(keys))
    code, _, _ = run([out, "--policy", "lru,fifo", "--sizes", "1000,4000"], capsys)
    assert code == 0


def test_trace_gen_refuses_unknown_kind(tmp_path, capsys):
    assert main(["trace", "gen", "fractal", "-o", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("cachepilot trace: error: unknown generator 'fractal'; "
                           "accepted: zipf, uniform, scan, loop, get-scan")
