"""Which of a tenant's threads an application-informed cache_ext policy
treats specially, found by a rule instead of by hand.

The application-informed policies (bpf/policies/get_scan.bpf.c and
admit_filter.bpf.c) know their special threads as the keys of a tid hash map:
get_scan evicts the pages its *scan threads* (`gs_tids`) bring in before
any page a point lookup needs; admit_filter keeps the reads of its *bypass
threads* (`af_tids`, e.g. an LSM store's compaction) out of the page cache.
`cachepilot policy register-tids` fills those maps with thread ids an
operator looked up by hand, which go stale as soon as the application
restarts or its thread pool grows.  Here the operator names the threads by
a rule in the tenant's config (`policy_threads`: in the controller's
config, which sends it to the node, or a stand-alone agent's; the schema
is in protocol/tenant.py, an example in docs/internals.md#agent-threads),
which `policy_tids` matches among the tasks of the tenant's cgroup; the
linux backend runs it every interval so the maps follow the application.
How a rule matches: `match`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from cachepilot.agent.cgroups import CgroupError, CgroupGone, _read
# the rule schema is shared with the controller's config
from cachepilot.protocol.tenant import (COMM_MAX, POLICY_ROLES, PolicyThreads,  # noqa: F401
                                        ThreadRule, unknown_key_message)

def check_against_sources() -> list[str]:
    """Disagreements between POLICY_ROLES and the policies' sources (each
    role's map must be one of its policy's tid maps, and every tid map
    must have a role); empty when they agree."""
    from cachepilot.models.policy_cli import policy_source, tid_maps

    problems = []
    for policy, roles in POLICY_ROLES.items():
        src = policy_source(policy)
        if src is None:
            problems.append(f"{policy}: no policy source")
            continue
        maps = set(tid_maps(src))
        for role, name in roles.items():
            if name not in maps:
                problems.append(f"{policy}.{role}: {src.name} has no tid map "
                                f"{name} (its tid maps: {sorted(maps) or 'none'})")
        for name in sorted(maps - set(roles.values())):
            problems.append(f"{policy}: tid map {name} of {src.name} has no role")
    return problems


# -- matching ----------------------------------------------------------------

def threads_in(cgroup_path) -> list[int]:
    """Sorted ids of the threads in the cgroup (its own, not its
    descendants'): v2 `cgroup.threads`, v1 `tasks`.  Raises CgroupGone when
    the directory does not exist, CgroupError when it is not a cgroup."""
    p = Path(cgroup_path)
    if not p.is_dir():
        raise CgroupGone(f"{p} is not a cgroup directory (it does not exist)")
    for name in ("cgroup.threads", "tasks"):
        f = p / name
        if f.exists():
            text = _read(f)
            break
    else:
        raise CgroupError(f"{p} is not a cgroup (no cgroup.threads or tasks)")
    tids = set()
    for word in text.split():
        try:
            tids.add(int(word))
        except ValueError:
            raise CgroupError(f"{f} holds {word!r}, not a thread id") from None
    return sorted(tids)


class _Vanished(Exception):
    """The thread exited while it was being looked at."""


class _Proc:
    """Reads of one /proc tree, with each process's command line read once."""

    def __init__(self, root):
        self.root = Path(root)
        self._cmdlines: dict[int, str] = {}

    def _bytes(self, *parts) -> bytes:
        try:
            return self.root.joinpath(*map(str, parts)).read_bytes()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            raise _Vanished from None

    def tgid(self, tid: int) -> int:
        for line in self._bytes(tid, "status").splitlines():
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
        raise _Vanished         # a status without Tgid: not a live task

    def comm(self, tgid: int, tid: int) -> str:
        raw = self._bytes(tgid, "task", tid, "comm")
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        return raw.decode("utf-8", "surrogateescape")

    def cmdline(self, tgid: int) -> str:
        if tgid not in self._cmdlines:
            raw = self._bytes(tgid, "cmdline").rstrip(b"\0")
            self._cmdlines[tgid] = raw.replace(b"\0", b" ").decode(
                "utf-8", "surrogateescape")
        return self._cmdlines[tgid]

    def matches(self, tid: int, rule: ThreadRule) -> bool:
        """Raises _Vanished when the thread is gone."""
        tgid = self.tgid(tid)
        comm = self.comm(tgid, tid) if rule.comm is not None else ""
        cmdline = self.cmdline(tgid) if rule.cmdline is not None else None
        return rule.matches(comm, cmdline)


def _rule(rule) -> ThreadRule:
    return rule if isinstance(rule, ThreadRule) else ThreadRule.model_validate(rule)


def _match(tids, rule: ThreadRule, proc: _Proc) -> list[int]:
    out = []
    for tid in tids:
        try:
            if proc.matches(tid, rule):
                out.append(tid)
        except _Vanished:
            continue
    return sorted(set(out))


def match(cgroup_path, rule, proc_root="/proc") -> list[int]:
    """Sorted ids of the cgroup's threads that `rule` (a ThreadRule or its
    mapping) matches; threads that exit meanwhile are left out.

    A rule has `comm`, an fnmatch glob matched against the thread's name
    (/proc/PID/task/TID/comm: at most 15 bytes, the kernel truncates longer
    names), and/or `cmdline`, a glob matched against its process's command
    line (/proc/PID/cmdline, NULs turned into spaces, the trailing one
    dropped).  With both, a thread must match both.  Matching is
    case-sensitive.

    Only the cgroup's own threads are candidates (threads_in), not those of
    its descendants, as the sampler attributes accesses to the leaf cgroup.
    A cgroup that is gone raises `cgroups.CgroupGone`.  The cgroup
    directory and the /proc root are arguments, so tests can point them at
    file trees laid out like the kernel's."""
    return _match(threads_in(cgroup_path), _rule(rule), _Proc(proc_root))


def policy_tids(cgroup_path, policy: str, rules: Mapping[str, Any],
                proc_root="/proc") -> dict[str, list[int]]:
    """One tenant's threads for one policy: {tid map: sorted tids} for
    each role of `rules` ({role: ThreadRule or mapping}); a role without a
    rule has no entry, so a map nobody gave a rule for is left alone."""
    if policy not in POLICY_ROLES:
        raise ValueError(f"unknown policy {policy!r}; expected one of "
                         + ", ".join(sorted(POLICY_ROLES)))
    roles = POLICY_ROLES[policy]
    unknown = sorted(set(rules) - set(roles))
    if unknown:
        raise ValueError(f"{policy}: unknown role(s) {', '.join(unknown)}; "
                         f"expected {' or '.join(roles)}")
    checked = {role: _rule(r) for role, r in rules.items() if r is not None}
    if not checked:
        return {}
    tids = threads_in(cgroup_path)
    proc = _Proc(proc_root)
    return {roles[role]: _match(tids, rule, proc) for role, rule in checked.items()}
