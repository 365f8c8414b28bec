"""cache_ext policies on live cgroups: attach, swap, detach, read back.

The agent never loads BPF itself: it runs bpf/out/policyctl (bpf/policyctl.c)
for every change, with the policy directory and the cgroup roots of its own
config, so only objects from that directory can be loaded and only cgroups
under the roots touched, whatever a directive says.  A directive names a
policy, never a path.

policyctl pins each cgroup's struct_ops link in bpffs
(<pin_root>/<cgroup id>/link, beside the policy's thread-id maps and its
cp_stats), so a policy outlives the agent: after a crash or restart the agent adopts the
pins whose cgroup it watches and drops those whose cgroup is gone.  What
runs is read back from the kernel (the cgroup's memory.cache_ext, v1 and v2
alike), never assumed from what was asked: a refused attach leaves the
cgroup with the policy it had, and the report says so.

A policy's per-page maps are sized when it loads, from the cgroup's memory
limit (policyctl); `stats` reads back that capacity and how many pages the
policy had no room for, and `resize` loads the running policy afresh for
the limit in force (a swap to itself), which the agent does when it raises
a limit past the capacity.
"""
from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cachepilot.agent import binaries, cgroups

log = logging.getLogger("cachepilot.agent")

BPF_OUT = binaries.bpf_dir()
POLICYCTL = BPF_OUT / "policyctl"
POLICY_DIR = BPF_OUT / "policies"
PIN_ROOT = Path("/sys/fs/bpf/cachepilot")
TIMEOUT_S = 60          # a verifier pass of a large policy under load


class PolicyError(Exception):
    """policyctl refused or failed; the message is its one line."""


@dataclass
class PolicyStats:
    capacity_pages: int     # what the policy's maps were sized for
    overflow_pages: int     # pages added that found them full


@dataclass
class Pinned:
    cgroup_id: int
    ops_map: str            # the link's struct_ops map ("<policy>_ops"), "-" or "?"


def running_policy(cgroup: str | os.PathLike, default: str) -> str:
    """The policy the kernel runs for a cgroup: the name memory.cache_ext
    gives, or `default` (the kernel's own policy) when none is attached or
    the kernel has no cache_ext.  A policy still initialising reads as
    "(initialising)"."""
    try:
        with open(Path(cgroup) / "memory.cache_ext") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "policy":
                    value = value.strip()
                    return default if value in ("none", "") else value
    except OSError:
        pass
    return default


class PolicyActuator:
    """One node's cache_ext policies, through policyctl."""

    def __init__(self, roots, default_policy: str, policy_dir: Path = POLICY_DIR,
                 pin_root: Path = PIN_ROOT, loader: Path = POLICYCTL):
        self.roots = [str(r) for r in roots]
        self.default = default_policy
        self.policy_dir = Path(policy_dir)
        self.pin_root = Path(pin_root)
        self.loader = Path(loader)

    # -- what can run ------------------------------------------------------------
    def available(self) -> list[str]:
        """Policies the policy directory holds an object for."""
        try:
            return sorted(p.name[:-len(".bpf.o")] for p in self.policy_dir.iterdir()
                          if p.name.endswith(".bpf.o"))
        except OSError:
            return []

    def why_unavailable(self) -> str | None:
        if not self.loader.exists():
            return f"the policy loader is not built ({self.loader}; run `make -C bpf`)"
        if not self.policy_dir.is_dir():
            return f"no policy directory {self.policy_dir}"
        return None

    # -- the loader ----------------------------------------------------------------
    def _run(self, *args: str) -> str:
        cmd = [str(self.loader), "--policy-dir", str(self.policy_dir),
               "--pin-root", str(self.pin_root)]
        for r in self.roots:
            cmd += ["--root", r]
        try:
            proc = subprocess.run([*cmd, *args], capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise PolicyError(f"policyctl {args[0]}: {err}") from None
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
            raise PolicyError(lines[-1].removeprefix("policyctl: "))
        return proc.stdout.strip()

    def pinned(self) -> list[Pinned]:
        out = self._run("list")
        pins = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                pins.append(Pinned(int(parts[0]), parts[1]))
        return pins

    # -- actuation -------------------------------------------------------------------
    def apply(self, cgroup: str, policy: str, cgroup_id: int,
              tids: dict[str, list[int]] | None = None) -> str:
        """Make `policy` the cgroup's policy; returns what was done, in one
        line, or raises PolicyError (the cgroup keeps what it ran).  The
        default policy means no cache_ext policy: detach."""
        before = running_policy(cgroup, self.default)
        if policy == before:
            if tids:
                self.set_tids(cgroup, tids)
            return f"{policy} already runs"
        pin = self.pin_root / str(cgroup_id) / "link"
        if policy == self.default:
            if not pin.exists():
                raise PolicyError(f"{before} runs on {cgroup} but no link of ours is "
                                  f"pinned for it; not detached")
            verb, done = "detach", f"{before} detached; the kernel's own policy runs"
            self._run(verb, cgroup)
        else:
            config = [f"{m}={','.join(str(t) for t in ts)}"
                      for m, ts in (tids or {}).items() if ts]
            verb = "swap" if pin.exists() else "attach"
            done = f"{before} -> {policy} ({'swapped live' if verb == 'swap' else 'attached'})"
            self._run(verb, cgroup, policy, *config)
        after = running_policy(cgroup, self.default)
        if after != policy:
            raise PolicyError(f"policyctl {verb} said ok but {cgroup} runs {after}")
        return done

    def stats(self, cgroup: str) -> PolicyStats | None:
        """The running policy's capacity and overflow, or None where no
        policy of ours runs (or one loaded before policies counted)."""
        try:
            out = self._run("stats", cgroup)
        except PolicyError:
            return None
        values = dict(line.split(None, 1) for line in out.splitlines() if " " in line)
        try:
            return PolicyStats(int(values["capacity"]), int(values["overflow"]))
        except (KeyError, ValueError):
            return None

    def resize(self, cgroup: str, policy: str,
               tids: dict[str, list[int]] | None = None) -> str:
        """Load `policy`, which runs on the cgroup, afresh for its limit in
        force: a live swap to itself.  Raises PolicyError; on refusal the
        old instance keeps running."""
        config = [f"{m}={','.join(str(t) for t in ts)}"
                  for m, ts in (tids or {}).items() if ts]
        return self._run("swap", cgroup, policy, *config)

    def set_tids(self, cgroup: str, tids: dict[str, list[int]]) -> None:
        """Replace the thread ids in the pinned tid maps of the cgroup's policy."""
        for name, ts in tids.items():
            self._run("tids", cgroup, name, *(str(t) for t in ts))

    def adopt(self, watched: dict[int, str]) -> list[str]:
        """At start: say which pinned policies are adopted (their cgroup is
        watched) and drop the pins of cgroups that no longer exist under the
        roots.  Returns one line per pin for the log."""
        try:
            pins = self.pinned()
        except PolicyError as err:
            return [f"cannot list pinned policies: {err}"]
        lines = []
        alive = None
        for p in pins:
            if p.cgroup_id in watched:
                path = watched[p.cgroup_id]
                lines.append(f"adopted the pinned policy of {path}: "
                             f"{running_policy(path, self.default)} runs")
                continue
            if alive is None:
                alive = cgroup_ids_under(self.roots)
            if p.cgroup_id in alive:
                lines.append(f"left the pinned policy of {alive[p.cgroup_id]} alone: "
                             f"not watched")
                continue
            try:
                self._run("drop", str(p.cgroup_id))
                lines.append(f"dropped the pins of cgroup id {p.cgroup_id}: "
                             f"the cgroup is gone")
            except PolicyError as err:
                lines.append(f"cgroup id {p.cgroup_id} is gone but its pins stay: {err}")
        return lines

    def forget(self, cgroup_id: int) -> str:
        """Drop the pins of a cgroup that was deleted (the kernel detached
        its policy when it went)."""
        if not (self.pin_root / str(cgroup_id)).exists():
            return ""
        return self._run("drop", str(cgroup_id))


def cgroup_ids_under(roots) -> dict[int, str]:
    """Every cgroup directory under the roots, by id."""
    found = {}
    for root in roots:
        for dirpath, _, _ in os.walk(root):
            try:
                found[cgroups.cgroup_id(dirpath)] = dirpath
            except cgroups.CgroupGone:
                continue
    return found
