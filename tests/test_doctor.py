"""`cachepilot doctor`: each check's verdict on a host that lacks it (fake
BTF bytes, capability words), and the whole command on this host for real,
where its verdict must agree with what the sampler itself does."""
import json
import subprocess
import sys

import pytest

from cachepilot import doctor
from cachepilot.agent import binaries
from cachepilot.agent.sampler import why_unavailable

ALL_TP = b"".join(b"btf_trace_" + t.encode() + b"\0" for t in doctor.TRACEPOINTS)


def test_kernel_checks_name_what_is_missing():
    names = lambda cs: {c.name: c.status for c in cs}  # noqa: E731
    assert names(doctor.check_kernel(None))["btf"] == "missing"
    got = doctor.check_kernel(b"junk\0" + ALL_TP)
    assert names(got) == {"kernel": "ok", "btf": "ok", "tracepoints": "ok"}
    # one tracepoint absent (a prefix of another name does not count)
    partial = ALL_TP.replace(b"btf_trace_mm_filemap_get_pages\0", b"btf_trace_mm_filemap_get\0")
    tp = [c for c in doctor.check_kernel(partial) if c.name == "tracepoints"][0]
    assert tp.status == "missing" and tp.sampling
    assert "mm_filemap_get_pages" in tp.detail and "add_to_page_cache" not in tp.detail


@pytest.mark.parametrize("bits,ok", [
    ([], False), ([doctor.CAP_BPF], False), ([doctor.CAP_PERFMON], False),
    ([doctor.CAP_BPF, doctor.CAP_PERFMON], True), ([doctor.CAP_SYS_ADMIN], True)])
def test_bpf_permissions_from_capabilities(bits, ok):
    caps = sum(1 << b for b in bits)
    status = f"Name:\tx\nCapEff:\t{caps:016x}\n"
    assert doctor.effective_caps(status) == caps
    c = doctor.check_permissions(caps)
    assert (c.status == "ok") is ok
    assert c.sampling or ok


def test_cache_ext_absent_is_a_note_not_a_failure():
    cs = doctor.check_cache_ext(None, b"no such struct here\0")
    assert [c.status for c in cs] == ["note"]
    assert doctor.can_sample(cs)


def test_verdict_and_rendering():
    good = [doctor.Check("a", "ok", "fine"), doctor.Check("fio", "missing", "not found",
                                                          "apt-get install fio")]
    assert doctor.can_sample(good)       # fio is not needed to sample
    text = doctor.render(good)
    assert "-> apt-get install fio" in text and text.endswith("can sample on this host")
    bad = good + [doctor.Check("sampler", "missing", "refused", "", True)]
    assert not doctor.can_sample(bad)
    assert "cannot sample" in doctor.render(bad)


def test_missing_sampler_is_reported(monkeypatch):
    monkeypatch.setattr(binaries, "sampler", lambda: None)
    c = doctor.check_sampler()
    assert c.status == "missing" and c.sampling and "make -C bpf" in c.fix


def test_doctor_on_this_host_agrees_with_the_sampler():
    """The real command: JSON on stdout, exit 0 exactly when it says the
    agent can sample, and that verdict matches whether the sampler loads
    here (why_unavailable is the agent's own test, run before it starts
    the sampler)."""
    proc = subprocess.run([sys.executable, "-m", "cachepilot", "doctor", "--json"],
                          capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == (0 if doc["can_sample"] else 1)
    names = [c["name"] for c in doc["checks"]]
    for name in ("kernel", "btf", "bpf permissions", "sampler", "memory cgroup",
                 "cache_ext", "fio", "db_bench"):
        assert name in names
    sampler = [c for c in doc["checks"] if c["name"] == "sampler"][0]
    if why_unavailable() is None:
        # the agent would start its sampler: doctor must have loaded it
        assert sampler["status"] == "ok", sampler
        assert doc["can_sample"]
    else:
        assert not doc["can_sample"]
