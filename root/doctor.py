"""`cachepilot doctor`: what this host can do for cachepilot, checked for real.

Each check is one line: ok, missing (with what to do), or a note.  The
decisive check is the sampler's: it loads and attaches the real BPF
programs (`sampler --check`) rather than inferring from versions, because a
kernel can have BTF and still refuse a program type (this project's CI host
refuses fentry and kprobes).  The command exits 1 when the agent cannot
sample, so a provisioning script or a unit's ExecStartPre can gate on it.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from cachepilot.agent import binaries
from cachepilot.agent.backends.linux import btf_has_cache_ext
from cachepilot.agent.cache_ext import PolicyActuator, PolicyError
from cachepilot.agent.cgroups import cgroup_id, memory_hierarchy
from cachepilot.agent.sampler import BTF, why_unavailable

TRACEPOINTS = ("mm_filemap_get_pages", "mm_filemap_add_to_page_cache",
               "mm_filemap_delete_from_page_cache")
# capability bits (linux/capability.h)
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


@dataclass
class Check:
    name: str
    status: str             # "ok", "missing" or "note"
    detail: str
    fix: str = ""
    sampling: bool = False  # the agent cannot sample without it


def _btf_bytes() -> bytes | None:
    try:
        return BTF.read_bytes()
    except OSError:
        return None


def check_kernel(btf: bytes | None) -> list[Check]:
    out = [Check("kernel", "ok", f"Linux {platform.release()} ({platform.machine()})")]
    if btf is None:
        out.append(Check("btf", "missing", f"no {BTF}",
                         "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y", True))
        return out
    out.append(Check("btf", "ok", f"{BTF} ({len(btf) >> 20} MiB)"))
    absent = [t for t in TRACEPOINTS if b"btf_trace_" + t.encode() + b"\0" not in btf]
    if absent:
        out.append(Check("tracepoints", "missing", "no " + ", ".join(absent),
                         "a kernel with the filemap tracepoints (5.16 or later)", True))
    else:
        out.append(Check("tracepoints", "ok", ", ".join(TRACEPOINTS)))
    return out


def effective_caps(status: str | None = None) -> int:
    """The CapEff bits of this process (from /proc/self/status text)."""
    if status is None:
        status = Path("/proc/self/status").read_text()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_permissions(caps: int) -> Check:
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        which = "CAP_SYS_ADMIN" if has(CAP_SYS_ADMIN) else "CAP_BPF and CAP_PERFMON"
        return Check("bpf permissions", "ok", which)
    return Check("bpf permissions", "missing", "neither CAP_BPF with CAP_PERFMON nor "
                 "CAP_SYS_ADMIN", "run as root, or grant CAP_BPF, CAP_PERFMON (and "
                 "CAP_SYS_RESOURCE for the memlock limit)", True)


def check_sampler() -> Check:
    """The agent's own test (`why_unavailable`, which loads and attaches
    the programs with `sampler --check`), so the two cannot disagree."""
    loader = binaries.sampler()
    if loader is None:
        return Check("sampler", "missing", "the BPF sampler is not built",
                     "make -C bpf (in a checkout) or reinstall the package", True)
    why = why_unavailable(loader)
    if why is not None:
        return Check("sampler", "missing", why, "see the lines above", True)
    return Check("sampler", "ok", f"loads and attaches ({loader})")


def check_cgroups(found) -> Check:
    if found is None:
        return Check("memory cgroup", "missing", "no memory controller under /sys/fs/cgroup",
                     "mount cgroup2 (or the v1 memory controller) at /sys/fs/cgroup", True)
    path, version = found
    return Check("memory cgroup", "ok", f"cgroup v{version}, memory controller at {path}")


def check_cache_ext(found, btf: bytes | None) -> list[Check]:
    """Whether the kernel has cache_ext, and which policy objects load and
    attach on it (each attached to a scratch cgroup and detached again)."""
    if btf is None or not btf_has_cache_ext(btf):
        return [Check("cache_ext", "note", "this kernel has no cache_ext: the agent sets "
                      "limits and the kernel's own policy runs",
                      "boot the cache_ext kernel (make kernel) to swap policies")]
    ctl, policy_dir = binaries.policyctl(), binaries.policy_dir()
    if ctl is None or policy_dir is None:
        return [Check("cache_ext", "missing", "the kernel has cache_ext but the policy "
                      "loader or objects are not built", "make -C bpf")]
    out = [Check("cache_ext", "ok", "the kernel has cache_ext")]
    if found is None:
        return out
    scratch = found[0] / f"cachepilot-doctor-{os.getpid()}"
    try:
        scratch.mkdir()
    except OSError as err:
        return out + [Check("policies", "missing", f"cannot make {scratch}: {err}")]
    # the agent's own actuator: attach, read back what the kernel runs, detach
    act = PolicyActuator([found[0]], "none", policy_dir,
                         Path(f"/sys/fs/bpf/cachepilot-doctor-{os.getpid()}"), ctl)
    loaded, refused = [], []
    try:
        cgid = cgroup_id(scratch)
        for name in act.available():
            try:
                act.apply(str(scratch), name, cgid)
                loaded.append(name)
                act.apply(str(scratch), "none", cgid)
            except PolicyError as err:
                refused.append(f"{name} ({err})")
        try:
            act.forget(cgid)
        except PolicyError:
            pass                    # the pins go with the scratch cgroup's id
    finally:
        scratch.rmdir()
        try:
            act.pin_root.rmdir()
        except OSError:
            pass
    out.append(Check("policies", "ok" if loaded else "missing",
                     "load: " + (", ".join(loaded) or "none")
                     + ("; refused: " + "; ".join(refused) if refused else "")))
    return out


def check_tool(name: str, version_args: list[str], purpose: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, "missing", f"not found ({purpose})",
                     f"apt-get install {'rocksdb-tools' if name == 'db_bench' else name}")
    try:
        r = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=30)
        line = (r.stdout + r.stderr).strip().splitlines()
        version = line[0] if line else ""
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return Check(name, "ok", f"{path} {version}".strip())


def run_checks() -> list[Check]:
    btf = _btf_bytes()
    found = memory_hierarchy()
    checks = check_kernel(btf)
    checks.append(check_permissions(effective_caps()))
    checks.append(check_sampler())
    checks.append(check_cgroups(found))
    checks += check_cache_ext(found, btf)
    checks.append(check_tool("fio", ["--version"], "the experiments' workloads"))
    checks.append(check_tool("db_bench", ["--version"], "the experiments' RocksDB tenant"))
    return checks


def can_sample(checks: list[Check]) -> bool:
    return not any(c.sampling and c.status != "ok" for c in checks)


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<8}{c.name:<{width + 2}}{c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<{width + 10}}-> {c.fix}")
    verdict = ("the agent can sample on this host" if can_sample(checks)
               else "the agent cannot sample on this host (it would run stats-only)")
    return "\n".join(lines + [verdict])


def run_doctor(args) -> int:
    checks = run_checks()
    if args.json:
        print(json.dumps({"can_sample": can_sample(checks),
                          "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render(checks))
    return 0 if can_sample(checks) else 1


def register(sub):
    p = sub.add_parser("doctor", help="check what this host can do for cachepilot",
                       description="Check the kernel, BTF and the filemap tracepoints, BPF "
                                   "permissions, the sampler (loaded and attached for "
                                   "real), the memory cgroup, cache_ext and which policies "
                                   "load, and the experiments' tools.  Exits 1 when the "
                                   "agent cannot sample.")
    p.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    p.set_defaults(func=run_doctor)
