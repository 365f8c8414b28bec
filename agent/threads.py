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
a rule in the tenant's config (`policy_threads`, agent/config.py):

    tenants:
      - name: kv
        cgroup: kv
        policy_threads:
          get_scan: {scan_threads: {comm: "db_scan*"}}
          admit_filter: {bypass_threads: {comm: "rocksdb:low*"}}

which `policy_tids` matches among the tasks of the tenant's cgroup, to be
run every interval so the maps follow the application (the linux backend
does not yet call it nor write the pinned maps).

A rule (`ThreadRule`) has `comm`, an fnmatch glob matched against the
thread's name (/proc/PID/task/TID/comm: at most 15 bytes, the kernel
truncates longer names), and/or `cmdline`, a glob matched against its
process's command line (/proc/PID/cmdline, NULs turned into spaces, the
trailing one dropped).  With both, a thread must match both.  Matching is
case-sensitive.

Only the cgroup's own threads are candidates (v2 `cgroup.threads`, v1
`tasks`), not those of its descendants, as the sampler attributes accesses
to the leaf cgroup.  Threads that exit while they are being looked at are
skipped; a cgroup that is gone raises `cgroups.CgroupGone`.  The cgroup
directory and the /proc root are arguments, so tests can point them at file
trees laid out like the kernel's.
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Mapping

from pydantic import (BaseModel, ConfigDict, create_model, field_validator,
                      model_validator)

from cachepilot.agent.cgroups import CgroupError, CgroupGone, _read

# policy -> {role: the tid map (in the policy's source) the role's threads
# are the keys of}.  The one table of roles: the config's `policy_threads`
# keys and `policy_tids` follow it; tests check it against the sources
# (`check_against_sources`).
POLICY_ROLES: dict[str, dict[str, str]] = {
    # threads that serve scans: the pages they bring in are evicted first
    "get_scan": {"scan_threads": "gs_tids"},
    # threads whose reads are not admitted to the page cache
    "admit_filter": {"bypass_threads": "af_tids"},
}

COMM_MAX = 15       # TASK_COMM_LEN - 1: the longest name a thread can have


def _min_len(glob: str) -> int:
    """Fewest bytes a string matching the fnmatch glob can have."""
    n, i = 0, 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            i += 1
            continue
        if c == "[":
            j = i + 1
            if j < len(glob) and glob[j] == "!":
                j += 1
            if j < len(glob) and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j >= 0:          # a set: one character
                n, i = n + 1, j + 1
                continue
        n += len(c.encode("utf-8", "surrogateescape"))
        i += 1
    return n


class ThreadRule(BaseModel):
    """Which threads a role takes: `comm` and/or `cmdline` globs."""
    model_config = ConfigDict(extra="forbid", strict=True)

    comm: str | None = None
    cmdline: str | None = None

    @field_validator("comm", "cmdline")
    @classmethod
    def _glob(cls, value, info):
        if value is None:
            return value
        if not value:
            raise ValueError("expected a non-empty glob")
        if "\0" in value:
            raise ValueError("a glob cannot contain NUL")
        if info.field_name == "comm" and _min_len(value) > COMM_MAX:
            raise ValueError(
                f"can never match: a thread name has at most "
                f"{COMM_MAX} bytes (the kernel truncates longer ones); glob "
                f"the first {COMM_MAX}")
        return value

    @model_validator(mode="after")
    def _something(self):
        if self.comm is None and self.cmdline is None:
            raise ValueError("a thread rule needs `comm` (a glob of the thread "
                             "name) and/or `cmdline` (a glob of the command line)")
        return self

    def matches(self, comm: str, cmdline: str | None) -> bool:
        """Whether a thread of this name in a process of this command line
        matches (`cmdline` may be None when the rule has no cmdline glob)."""
        if self.comm is not None and not fnmatchcase(comm, self.comm):
            return False
        if self.cmdline is not None and not fnmatchcase(cmdline or "", self.cmdline):
            return False
        return True


# -- the config's `policy_threads`: models made from POLICY_ROLES -------------

class _Roles(BaseModel):
    """One policy's roles -> rules; at least one role."""
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _some_role(self):
        if not self.rules():
            raise ValueError("expected a rule for at least one role: "
                             + ", ".join(type(self).model_fields))
        return self

    def rules(self) -> dict[str, ThreadRule]:
        return {role: getattr(self, role) for role in type(self).model_fields
                if getattr(self, role) is not None}


class _Policies(BaseModel):
    """Policy -> its roles' rules (the tenant's `policy_threads`)."""
    model_config = ConfigDict(extra="forbid")

    def rules(self) -> dict[str, dict[str, ThreadRule]]:
        """{policy: {role: rule}} of the policies given."""
        return {p: getattr(self, p).rules() for p in type(self).model_fields
                if getattr(self, p) is not None}


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


PolicyThreads = create_model(
    "PolicyThreads", __base__=_Policies,
    **{policy: (create_model(f"{_camel(policy)}Roles", __base__=_Roles,
                             **{role: (ThreadRule | None, None) for role in roles})
                | None, None)
       for policy, roles in POLICY_ROLES.items()})


def unknown_key_message(loc: tuple) -> str | None:
    """What `policy_threads` expected at `loc` (a pydantic error location
    ending in an unknown key), or None when `loc` is not inside it."""
    keys = [k for k in loc if not isinstance(k, int)]
    if "policy_threads" not in keys:
        return None
    depth = len(keys) - keys.index("policy_threads") - 1
    if depth == 1:
        return "unknown policy; expected one of " + ", ".join(sorted(POLICY_ROLES))
    if depth == 2 and keys[-2] in POLICY_ROLES:
        return (f"unknown role of {keys[-2]}; expected "
                + " or ".join(POLICY_ROLES[keys[-2]]))
    if depth == 3:
        return "unknown key; expected `comm` and/or `cmdline`"
    return None


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
    mapping) matches; threads that exit meanwhile are left out."""
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
