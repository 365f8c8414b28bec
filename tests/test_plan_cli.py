"""`cachepilot plan` end to end through the command dispatcher."""
import json

import pytest

from cachepilot.main import main
from cachepilot.models.mrc import MRC


def small_config(tmp_path, slo_b=30000):
    curve = MRC([1024, 4096, 8192, 16384], [0.7, 0.4, 0.2, 0.05], "lru")
    (tmp_path / "curves.json").write_text(json.dumps([curve.to_dict()]))
    (tmp_path / "plan.yaml").write_text(f"""
control: {{anon_margin_bytes: 1MiB}}
nodes:
  - {{name: h1, memory_bytes: 128MiB}}
  - {{name: h2, memory_bytes: 128MiB}}
  - {{name: h3, memory_bytes: 128MiB}}
tenants:
  - {{name: a, node: h1, slo: {{min_throughput: 20000}}, policies: [lru], curves_file: curves.json}}
  - {{name: b, node: h2, slo: {{min_throughput: {slo_b}}}, policies: [lru], curves_file: curves.json}}
  - {{name: c, node: h3, floor_bytes: 8MiB}}
""")
    return tmp_path / "plan.yaml"


def test_plan_prints_a_placement_and_writes_json(tmp_path, capsys):
    cfg = small_config(tmp_path)
    out = tmp_path / "out.json"
    assert main(["plan", "--config", str(cfg), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "milp (optimal)" in text
    assert "fewest hosts: 1 of 3" in text
    assert "memory freed 256.0 of 384.0 MiB" in text
    data = json.loads(out.read_text())
    plan = data["plan"]
    assert len(plan["hosts_used"]) == 1
    assert set(plan["assignment"]) == {"a", "b", "c"}
    assert plan["memory_freed_bytes"] == 256 << 20
    # every tenant of the used host fits in it
    host = next(h for h in plan["hosts"] if h["tenants"])
    assert host["demand_bytes"] <= host["memory_bytes"]


def test_plan_with_ffd(tmp_path, capsys):
    assert main(["plan", "--config", str(small_config(tmp_path)), "--method", "ffd"]) == 0
    assert "first-fit decreasing" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--config", "/nonexistent/x.yaml"], "no such config file"),
    (["--headroom", "-1"], "--headroom"),
    (["--time-limit", "0"], "--time-limit"),
])
def test_plan_bad_input_is_one_line(tmp_path, capsys, args, message):
    argv = ["plan"] + (args if args[0] == "--config" else
                       ["--config", str(small_config(tmp_path))] + args)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_plan_refuses_an_unmeetable_slo(tmp_path, capsys):
    # 1e6 ops/s would need a miss ratio below zero
    assert main(["plan", "--config", str(small_config(tmp_path, slo_b=1e6))]) == 2
    err = capsys.readouterr().err
    assert "cannot be met" in err and "b (" in err


def test_plan_refuses_a_config_error(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [{name: h1, memory_bytes: 1G}]\ntenants: [{name: a, node: h1, "
                 "slo: {min_throughput: -5}}]\n")
    assert main(["plan", "--config", str(p)]) == 2
    assert "tenants[0].slo.min_throughput: expected a number >= 0, got -5" in \
        capsys.readouterr().err


def test_plan_confirm_replays_on_the_sim(tmp_path, capsys):
    (tmp_path / "w.yaml").write_text("""
control: {anon_margin_bytes: 1MiB}
nodes:
  - {name: h1, memory_bytes: 64MiB}
  - {name: h2, memory_bytes: 64MiB}
tenants:
  - name: z
    node: h1
    slo: {min_throughput: 40000}
    policies: [lru]
    workload: {phases: [{kind: zipf, skew: 1.0, footprint: 8MiB}], accesses_per_interval: 4000, seed: 1}
  - name: u
    node: h2
    slo: {min_throughput: 20000}
    policies: [lru]
    workload: {phases: [{kind: uniform, footprint: 4MiB}], accesses_per_interval: 4000, seed: 2}
""")
    out = tmp_path / "o.json"
    assert main(["plan", "--config", str(tmp_path / "w.yaml"), "--confirm",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fewest hosts: 1 of 2" in text
    assert "sim confirms every SLO" in text
    sim = json.loads(out.read_text())["sim"]
    assert set(sim) == {"z", "u"} and all(v["met"] for v in sim.values())


def test_plan_reads_curves_written_by_the_mrc_command(tmp_path, capsys):
    from cachepilot.models import generators as gen
    keys = gen.zipf(4000, 1.0, seed=3).next(60000)
    (tmp_path / "t.txt").write_text("\n".join(str(int(k)) for k in keys) + "\n")
    assert main(["mrc", str(tmp_path / "t.txt"), "--policy", "lru,fifo", "--no-progress",
                 "--json", str(tmp_path / "curves.json")]) == 0
    (tmp_path / "p.yaml").write_text("""
control: {anon_margin_bytes: 4KiB}
nodes: [{name: h1, memory_bytes: 64MiB}, {name: h2, memory_bytes: 64MiB}]
tenants:
  - {name: a, node: h1, slo: {min_throughput: 50000}, policies: [lru, fifo],
     curves_file: curves.json, model: {t_hit_s: 2.0e-6, t_miss_s: 1.0e-4}}
  - {name: b, node: h2, slo: {min_throughput: 50000}, policies: [lru, fifo],
     curves_file: curves.json, model: {t_hit_s: 2.0e-6, t_miss_s: 1.0e-4}}
""")
    capsys.readouterr()
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(tmp_path / "p.yaml"), "--headroom", "0",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())["plan"]
    curves = {c["policy"]: MRC.from_dict(c)
              for c in json.loads((tmp_path / "curves.json").read_text())["curves"]}
    m_star = (1 / 50000 - 2e-6) / 1e-4
    best = min(curves[p].size_for(m_star) for p in ("lru", "fifo"))
    for d in plan["demands"]:
        assert d["demand_bytes"] == pytest.approx(best * 4096, abs=4096)
    assert len(plan["hosts_used"]) == 1
