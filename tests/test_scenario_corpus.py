"""experiments/scenarios.py: the seeded scenario corpus (docs/scenarios.md).

The generator replays both shared traces to place the SLOs, so every test
here needs ../shared/traces and skips, saying so, without it."""
import json
import sys
from pathlib import Path

import pytest

from cachepilot.controller.config import load_config
from cachepilot.models.runtime import available_policies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import scenarios  # noqa: E402

MiB = 1 << 20
COUNT = 20


@pytest.fixture(scope="module")
def traces(shared_traces, oltp_lis, cloudphysics_csv) -> Path:
    """../shared/traces with both traces the corpus replays (skips without)."""
    assert {oltp_lis.name, cloudphysics_csv.name} == set(scenarios.TRACE_FILES)
    return shared_traces


@pytest.fixture(scope="module")
def corpus(traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "a"
    index = scenarios.generate(out, seed=scenarios.DEFAULT_SEED, count=COUNT, traces=traces)
    configs = {e["name"]: load_config(out / e["file"]) for e in index["scenarios"]}
    return out, index, configs


def test_writes_at_least_20_valid_configs_and_an_index(corpus):
    out, index, configs = corpus
    files = sorted(out.glob("scenario-*.yaml"))
    assert len(files) == COUNT >= 20
    assert [f.name for f in files] == [f"scenario-{i:02d}.yaml" for i in range(COUNT)]
    assert json.loads((out / "index.json").read_text()) == index
    for e in index["scenarios"]:
        for key in ("name", "nodes", "tenants", "kinds", "slo_classes", "every_policy"):
            assert key in e
        assert set(configs) == {e["name"] for e in index["scenarios"]}


def test_the_same_seed_writes_byte_identical_files(corpus, traces):
    out, index, _ = corpus
    # a sibling folder: the trace paths, relative to it, read the same
    again = out.parent / "b"
    index2 = scenarios.generate(again, seed=scenarios.DEFAULT_SEED, count=3, traces=traces)
    for name in ("scenario-00.yaml", "scenario-01.yaml", "scenario-02.yaml"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    assert index2["scenarios"] == index["scenarios"][:3]
    other = scenarios.generate(out.parent / "c", seed=7, count=1, traces=traces)
    assert (out.parent / "c" / "scenario-00.yaml").read_bytes() != \
        (out / "scenario-00.yaml").read_bytes()
    assert other["seed"] == 7


def test_nodes_and_tenants_are_within_the_ranges(corpus):
    _, _, configs = corpus
    for name, cfg in configs.items():
        assert 1 <= len(cfg.nodes) <= 3, name
        assert all(32 * MiB <= n.memory_bytes <= 1024 * MiB for n in cfg.nodes), name
        assert all(n.backend == "sim" for n in cfg.nodes)
        assert 3 <= len(cfg.tenants) <= 10, name
        assert {t.node for t in cfg.tenants} == {n.name for n in cfg.nodes}, name
        for n in cfg.nodes:
            assert sum(t.floor_bytes for t in cfg.tenants_on(n.name)) < n.memory_bytes
    sizes = {n.memory_bytes for cfg in configs.values() for n in cfg.nodes}
    assert min(sizes) == 32 * MiB and max(sizes) == 1024 * MiB
    assert {len(cfg.nodes) for cfg in configs.values()} == {1, 2, 3}
    counts = {len(cfg.tenants) for cfg in configs.values()}
    assert 3 in counts and 10 in counts


def test_every_workload_kind_both_traces_and_phase_changes_appear(corpus, traces):
    _, index, configs = corpus
    phases = [ph for cfg in configs.values() for t in cfg.tenants for ph in t.workload.phases]
    assert {ph.kind for ph in phases} == set(scenarios.KINDS)
    assert {k for e in index["scenarios"] for k in e["kinds"]} == set(scenarios.KINDS)
    used = {ph.trace.resolve() for ph in phases if ph.kind == "trace"}
    assert used == {(traces / n).resolve() for n in scenarios.TRACE_FILES}
    changing = [t for cfg in configs.values() for t in cfg.tenants
                if len(t.workload.phases) > 1]
    assert changing and all(any(len(t.workload.phases) > 1 for t in cfg.tenants)
                            for cfg in configs.values())
    for t in changing:          # every phase begins within the run
        assert sum(ph.intervals for ph in t.workload.phases[:-1]) < index["intervals"]


def test_half_allow_every_policy_and_the_rest_a_restricted_list(corpus):
    _, index, configs = corpus
    everything = set(available_policies())
    every = {name for name, cfg in configs.items()
             if all(t.policies is None or set(t.policies) == everything for t in cfg.tenants)}
    restricted = {name for name, cfg in configs.items()
                  if all(t.policies is not None and "linux" in t.policies
                         and set(t.policies) < everything for t in cfg.tenants)}
    assert len(every) == len(restricted) == COUNT // 2
    assert every | restricted == set(configs)
    assert every == {e["name"] for e in index["scenarios"] if e["every_policy"]}


def test_slos_of_every_class_placed_against_the_equal_split(corpus):
    out, index, configs = corpus
    classes = [s["class"] for e in index["scenarios"] for s in e["slos"]]
    assert set(classes) == set(scenarios.CLASSES)
    for e in index["scenarios"]:
        cfg = configs[e["name"]]
        assert e["slos"], e["name"]
        header = (out / e["file"]).read_text().split("\n\n", 1)[0]
        for s in e["slos"]:
            t = cfg.tenant(s["tenant"])
            assert t.slo.min_throughput == s["min_throughput"]
            assert f"{s['tenant']}: {s['class']}" in header
            assert s["min_throughput"] == pytest.approx(s["factor"] * s["equal_mean"],
                                                        rel=0.01)
            if s["class"] == "easy":
                assert s["factor"] <= 0.85 and s["equal_met"] >= 0.9
            elif s["class"] == "tight":
                assert 1.1 <= s["factor"] <= 1.3
                assert s["equal_met"] <= 0.5 and s["whole_met"] >= 0.8
            else:
                assert s["factor"] >= 3.0 and s["whole_met"] == 0.0
    priorities = {t.priority for cfg in configs.values() for t in cfg.tenants}
    assert len(priorities) >= 3
    services = {(t.workload.service.t_hit_s, t.workload.service.t_miss_s,
                 t.workload.service.concurrency)
                for cfg in configs.values() for t in cfg.tenants}
    assert len(services) >= 10


def test_the_command_line_writes_the_corpus(traces, tmp_path, capsys):
    assert scenarios.main(["--out", str(tmp_path), "--count", "1", "--seed", "3",
                           "--traces", str(traces)]) == 0
    assert (tmp_path / "scenario-00.yaml").is_file()
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["seed"] == 3 and index["count"] == 1
    assert "wrote 1 scenarios" in capsys.readouterr().out


def test_a_trace_replays_from_its_offset_and_wraps(tmp_path):
    from cachepilot.models import generators as gen
    path = tmp_path / "t.txt"
    path.write_text("\n".join(str(k) for k in range(10)) + "\n")
    assert gen.trace_stream(path, skip=3).next(5).tolist() == [3, 4, 5, 6, 7]
    # past the end it wraps round, as the replay itself does
    assert gen.trace_stream(path, skip=13).next(9).tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert gen.trace_stream(path).next(2).tolist() == [0, 1]
