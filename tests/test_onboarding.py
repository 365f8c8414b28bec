"""The README's "First five minutes" block, run as written.

The block is read from README.md itself, so the two cannot drift.  Its
command lines run in one bash from the repository root with .venv/bin first
on PATH, as a reader pastes them (a variable set on one line is there on
the next, `&` and `wait` work).  Every command must exit 0 and print the
phrases the README shows after it; each phrase is also checked to be in the
README's comment lines for that command.  The steps from `CG=` on make a
memory cgroup and profile a process in it: they need root and a memory
controller, and are skipped, with the reason, where either is missing;
they run in a second bash beside the others (they wait on fio and the
sampling window), which keeps this file near the demo's own time.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## First five minutes"

# command prefix -> phrases its output must contain (and the README show)
EXPECT = {
    "cachepilot doctor": ["memory cgroup", "the agent can sample on this host"],
    "cachepilot trace gen": ["wrote 400,000 zipf accesses"],
    "cachepilot mrc": ["lru exact", "accesses in"],
    "cachepilot run": ["autopilot vs static equal split", "aggregate",
                       "wrote out/run/run_timeline.png"],
    "sleep 3; cachepilot profile": ["cp-demo", "accesses", "lru (shards)"],
}


def readme_block():
    """The first ```sh block after the heading, as (command, comments) steps."""
    text = (ROOT / "README.md").read_text()
    start = text.index(HEADING + "\n")
    m = re.search(r"^```sh\n(.*?)^```$", text[start:], re.S | re.M)
    assert m, f"no ```sh block under {HEADING!r}"
    steps, pending = [], ""
    for line in m.group(1).splitlines():
        if pending:
            pending += "\n" + line
            if not line.endswith("\\"):
                steps.append([pending, []])
                pending = ""
            continue
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            if steps:
                steps[-1][1].append(line.lstrip()[1:].strip())
            continue
        if line.endswith("\\"):
            pending = line
        else:
            steps.append([line, []])
    return [(cmd, comments) for cmd, comments in steps]


def needs_root(cmd):
    return "CG" in cmd or "cp-demo" in cmd


def memory_cgroup_missing():
    if os.geteuid() != 0:
        return "needs root (it makes a memory cgroup and samples it with BPF)"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if not v1.is_dir() and not (v2.exists() and "memory" in v2.read_text()):
        return "no memory cgroup controller on this host"
    if not shutil.which("fio"):
        return "fio is not installed (make run installs it)"
    return None


def start_steps(steps):
    """Start the steps in one bash; run_steps' second half collects them."""
    script = ["set +e", f"cd {ROOT}"]
    for i, (cmd, _) in enumerate(steps):
        script += [f"echo '@@STEP {i}'", cmd, f"echo \"@@RC {i} $?\""]
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env["COLUMNS"] = "120"
    env.pop("VIRTUAL_ENV", None)
    return subprocess.Popen(["bash", "-c", "\n".join(script)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=ROOT)


def collect(proc, steps, timeout):
    """Per step, its exit status and output."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    results = {}
    for i in range(len(steps)):
        m = re.search(rf"^@@STEP {i}\n(.*?)^@@RC {i} (\d+)$", stdout, re.S | re.M)
        assert m, f"step {i} ({steps[i][0]!r}) did not finish:\n{(stdout + stderr)[-3000:]}"
        results[i] = (int(m.group(2)), m.group(1))
    return results, stderr


def check(steps, results, stderr):
    for i, (cmd, comments) in enumerate(steps):
        rc, out = results[i]
        assert rc == 0, f"{cmd!r} exited {rc}:\n{out[-3000:]}\n{stderr[-3000:]}"
        for prefix, phrases in EXPECT.items():
            if not cmd.startswith(prefix):
                continue
            shown = "\n".join(comments)
            both = out + stderr      # a command's log lines go to stderr
            for phrase in phrases:
                assert phrase in shown, f"the README shows no {phrase!r} for {cmd!r}"
                assert phrase in both, f"{cmd!r} printed no {phrase!r}:\n{out[-3000:]}"


def root_steps():
    block = readme_block()
    first = [s for s in block if s[0].startswith(". .venv/bin/activate")]
    return first + [s for s in block if needs_root(s[0])]


@pytest.fixture(scope="module")
def profile_run():
    """The root steps, started once and early: they wait mostly on fio and
    the sampling window, so they run beside the demo to keep the file's
    time near the demo's alone."""
    reason = memory_cgroup_missing()
    if reason:
        yield reason, None
        return
    steps = root_steps()
    proc = start_steps(steps)
    try:
        yield None, (proc, steps)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for d in ("/sys/fs/cgroup/memory/cp-demo", "/sys/fs/cgroup/cp-demo"):
            if os.path.isdir(d):
                subprocess.run(["rmdir", d], check=False)


def test_the_block_has_every_step():
    cmds = [c for c, _ in readme_block()]
    assert any(c.startswith(". .venv/bin/activate") for c in cmds)
    for prefix in EXPECT:
        assert any(c.startswith(prefix) for c in cmds), prefix


def test_unprivileged_steps_run_as_written(profile_run):
    steps = [s for s in readme_block() if not needs_root(s[0])]
    check(steps, *collect(start_steps(steps), steps, timeout=150))


def test_profile_of_a_process_in_a_cgroup(profile_run):
    reason, started = profile_run
    if reason:
        pytest.skip(reason)
    proc, steps = started
    check(steps, *collect(proc, steps, timeout=90))
