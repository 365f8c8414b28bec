"""What a node is told about one of its tenants, and the schema of the
thread rules in it.

The controller's config holds the tenants (controller/config.py); at
registration each agent receives its own as NodeTenant objects (on the
wire as this model's JSON, protocol/wire.py), and an agent without a
controller reads the same model from its own config (agent/config.py).
One model on both sides is what keeps the two from disagreeing: there is
nothing to copy between them by hand.

A tenant's `policy_threads` names the threads an application-informed
policy treats specially, by a rule (agent/threads.py matches the rules
among the cgroup's threads).  Its `slo_threads` names, by the same kind
of rule, the threads whose operations its throughput counts (a store's GET
threads beside a scan it also runs): its curves then count their reads'
misses only (models/runtime.py, MiniSim's counted threads).  The roles each policy has, and the rule
schema, live here because both configs carry them.
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, create_model, field_validator,
                      model_validator)

from cachepilot.core.config import Bytes, Strict

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


# -- the tenant -----------------------------------------------------------------

class AccessesThroughput(Strict):
    """Throughput = page-cache accesses per second (the default)."""
    source: Literal["accesses"] = "accesses"


class PrometheusThroughput(Strict):
    """Throughput read from the application's own Prometheus metric: the
    per-second rate of a counter, or a gauge's value."""
    source: Literal["prometheus"]
    url: str = Field(pattern=r"^https?://")
    metric: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    kind: Literal["counter", "gauge"] = "counter"
    timeout_s: float = Field(2.0, gt=0)


Throughput = Union[AccessesThroughput, PrometheusThroughput]


class PodRef(Strict):
    """A Kubernetes pod by name, or the pods whose labels match `selector`,
    in `namespace` (agent/pods.py resolves them to cgroups)."""
    namespace: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1)
    selector: dict[str, str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self):
        if (self.name is None) == (self.selector is None):
            raise ValueError("pod: give exactly one of name and selector")
        return self


class NodeTenant(Strict):
    """One tenant as its node sees it: where it lives (a cgroup under the
    agent's roots, or pods), where its throughput comes from, the bounds
    the agent enforces itself, the policies it builds curves for, and its
    thread rules (for policies, and for what its curves count)."""
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/-]+$")
    cgroup: str | None = Field(None, min_length=1)
    pod: PodRef | None = None
    throughput: Throughput = Field(default_factory=AccessesThroughput)
    floor: Bytes | None = None
    ceiling: Bytes | None = None
    policies: list[str] | None = Field(None, min_length=1)
    policy_threads: PolicyThreads | None = None
    slo_threads: ThreadRule | None = None

    @model_validator(mode="after")
    def _cgroup_or_pod(self):
        if (self.cgroup is None) == (self.pod is None):
            raise ValueError("give exactly one of cgroup and pod")
        return self

    def thread_rules(self) -> dict[str, dict[str, ThreadRule]]:
        """{policy: {role: rule}} of `policy_threads` (empty without it)."""
        return self.policy_threads.rules() if self.policy_threads else {}
