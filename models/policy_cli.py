"""`cachepilot policy ...`: the policy library seen from the command line.

    policy list                  every policy this build can run, where its
                                 source is, and what it does
    policy check FILE.bpf.c      compile a policy both ways (natively into the
                                 simulator, with clang -target bpf for the
                                 kernel), run a smoke simulation and print
                                 its miss-ratio curve
    policy register-tids TID...  tell an application-informed policy
                                 (get_scan, admit_filter) which threads are
                                 special: in the kernel through the policy's
                                 pinned tid map, in the simulator by
                                 annotating a trace

Registered threads in the simulator: the trace's tid field of a registered
thread's accesses carries bit 31 (CP_TID_REGISTERED).  Kernel tids are below
2^22 (PID_MAX_LIMIT), so the bit never occurs on a live host, and the
policies test it before looking the tid up in their map: one policy source,
both builds.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from cachepilot.core.errors import UserError
from cachepilot.models import runtime
from cachepilot.models.exact import parse_sizes
from cachepilot.models.runtime import TID_REGISTERED as CP_TID_REGISTERED

REPO_ROOT = Path(__file__).resolve().parents[1]
POLICY_DIR = REPO_ROOT / "bpf" / "policies"
POLICY_INCLUDE = REPO_ROOT / "bpf" / "include"
BPF_DIR = REPO_ROOT / "bpf"
POLICY_VMLINUX_H = BPF_DIR / "out" / "policies" / "vmlinux.h"
BPFFS_ROOT = Path("/sys/fs/bpf/cachepilot")

PID_MAX_LIMIT = 1 << 22        # the kernel's upper bound on pid_max

# Smoke workload of `policy check`: hot set, uniform background, a scan and
# a loop, so every kind of policy meets something it handles well or badly.
SMOKE_KEYS = 20000
SMOKE_ACCESSES = 200000
SMOKE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
# A policy that leaves more than this share of evictions to the host's
# fallback, or has this share of its candidates refused, fails the check.
MAX_FALLBACK_SHARE = 0.05


# -- registered threads in the simulator -------------------------------------

def mark_registered(tids, registered) -> np.ndarray:
    """The trace annotation of registered threads: a copy of `tids` (uint32,
    one per access) with CP_TID_REGISTERED set on every access made by a tid
    in `registered`."""
    tids = np.asarray(tids)
    if tids.ndim != 1:
        raise UserError("tids must be one per access (a 1-D array)")
    reg = np.asarray(sorted({check_tid(t) for t in registered}),
                     dtype=np.uint32)
    return runtime.mark_registered(tids, reg)


def check_tid(tid) -> int:
    try:
        value = int(tid)
    except (TypeError, ValueError):
        raise UserError(f"{tid!r} is not a thread id") from None
    if not 0 < value < PID_MAX_LIMIT:
        raise UserError(f"thread id {value} is out of range "
                        f"(1..{PID_MAX_LIMIT - 1})")
    return value


def annotate_trace(src: Path, dst: Path, registered, remove=False) -> dict:
    """Copy a CPACCESS trace, setting (or with remove=True clearing) the
    registered bit on the accesses of the given threads."""
    from cachepilot.models.traces import records
    from cachepilot.models.traces.readers import open_binary

    reg = np.asarray(sorted({check_tid(t) for t in registered}),
                     dtype=np.uint32)
    if src.resolve() == dst.resolve():
        raise UserError("--out must differ from --trace")
    marked = total = 0
    try:
        with open_binary(src) as fin:
            header = records.read_header(fin)
            with open(dst, "wb") as fout:
                records.write_header(fout, header.threshold, header.flags)
                for chunk in records.iter_records(fin, name=str(src)):
                    chunk = chunk.copy()
                    plain = chunk["tid"] & np.uint32(CP_TID_REGISTERED - 1)
                    hit = np.isin(plain, reg)
                    if remove:
                        chunk["tid"][hit] = plain[hit]
                    else:
                        chunk["tid"][hit] = plain[hit] | np.uint32(
                            CP_TID_REGISTERED)
                    marked += int(np.count_nonzero(
                        hit & (chunk["op"] == records.OP_ACCESS)))
                    total += len(chunk)
                    records.write_records(fout, chunk, header=False)
    except records.RecordFormatError as err:
        raise UserError(f"{src}: {err}") from None
    except OSError as err:
        raise UserError(f"{err.filename or src}: {err.strerror}") from None
    return {"records": total, "accesses_marked": marked}


# -- the library ------------------------------------------------------------

def policy_source(name: str) -> Path | None:
    path = POLICY_DIR / f"{name}.bpf.c"
    return path if path.is_file() else None


def describe(path: Path, width: int = 110) -> str:
    """First sentence of the policy file's header comment, shortened to
    `width` characters."""
    text = path.read_text(errors="replace")
    m = re.search(r"/\*(.*?)\*/", text, re.S)
    if not m:
        return ""
    lines = [ln.strip().lstrip("*").strip() for ln in m.group(1).splitlines()]
    para = " ".join(ln for ln in lines if ln)
    # a full stop that ends a sentence, not "et al." or "e.g."
    end = re.search(r"(?<!\bal)(?<!e\.g)(?<!i\.e)\.(\s|$)", para)
    sentence = para[:end.start() + 1] if end else para
    if len(sentence) > width:
        sentence = sentence[:width - 1].rstrip() + "\u2026"
    return sentence


def tid_maps(path: Path) -> list[str]:
    """Names of the policy's tid maps (u32 keys named *tids)."""
    text = path.read_text(errors="replace")
    return re.findall(r"CP_(?:LRU_)?HASH_MAP\(\s*(\w*tids)\s*,\s*__u32", text)


# -- compiling for the kernel -------------------------------------------------

def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise UserError(f"{name} not found; install it (see the Makefile's "
                        f"APT_PKGS)")
    return path


def _make_bpf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("make"), "-s", "-C", str(BPF_DIR), *args],
                          capture_output=True, text=True)


def bpf_types() -> str:
    """Have bpf/Makefile choose the types policies compile against (the
    running kernel's if it has cache_ext, else the patched tree's, else a
    compile-only stand-in) and say which it chose."""
    proc = _make_bpf("out/policies/vmlinux.h")
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or "failed").splitlines()
        raise UserError(f"no types to compile policies against: {lines[-1]}")
    return POLICY_VMLINUX_H.with_name("vmlinux.h.source").read_text().strip()


def compile_bpf(path: Path, out: Path, vmlinux_h: Path | None = None) -> Path:
    """Compile a policy source into a struct_ops object through bpf/Makefile's
    `object` target, the recipe every policy object is built with; returns
    the object file.  `vmlinux_h` overrides the types (a file named
    vmlinux.h)."""
    extra = []
    if vmlinux_h is not None:
        vmlinux_h = Path(vmlinux_h)
        if vmlinux_h.name != "vmlinux.h" or not vmlinux_h.is_file():
            raise UserError(f"{vmlinux_h}: --vmlinux must name an existing "
                            f"file called vmlinux.h")
        extra.append(f"VMLINUX_DIR={vmlinux_h.resolve().parent}")
    proc = _make_bpf("object", f"SRC={Path(path).resolve()}",
                     f"OBJ={Path(out).resolve()}", *extra)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        errors = [ln for ln in lines if "error" in ln and "make" not in ln]
        first = (errors or lines or ["clang failed"])[0]
        raise UserError(f"{path}: does not compile for BPF: {first}")
    return Path(out)


def elf_sections(path: Path) -> list[str]:
    """Section names of a little-endian ELF64 object (enough to see that a
    policy object carries its struct_ops map and maps)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise UserError(f"{path}: not an ELF64 object")
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    shstrndx = int.from_bytes(data[0x3E:0x40], "little")

    def header(i):
        base = shoff + i * shentsize
        return (int.from_bytes(data[base:base + 4], "little"),
                int.from_bytes(data[base + 0x18:base + 0x20], "little"))

    _, str_off = header(shstrndx)
    names = []
    for i in range(shnum):
        name_off, _ = header(i)
        start = str_off + name_off
        names.append(data[start:data.index(b"\0", start)].decode())
    return names


# -- smoke simulation ---------------------------------------------------------

def smoke_stream(seed: int = 1, n_keys: int = SMOKE_KEYS,
                 accesses: int = SMOKE_ACCESSES) -> np.ndarray:
    """Hot zipf set + uniform background, then a scan, then a loop."""
    rng = np.random.default_rng(seed)
    a = accesses // 2
    hot = rng.zipf(1.1, a) % (n_keys // 2)
    background = rng.integers(0, n_keys, a // 2)
    mixed = np.where(rng.random(a) < 0.8, hot, rng.integers(0, n_keys, a))
    scan = n_keys + np.arange(accesses // 4)
    loop = np.tile(np.arange(n_keys // 10), max(1, (accesses - a - a // 2 -
                                                    len(scan)) // (n_keys // 10)))
    return np.concatenate([mixed, background, scan, loop]).astype(np.uint64)


def smoke_check(name: str, sizes, stream) -> dict:

    curve = runtime.full_mrc(stream, name, sizes)
    lru = runtime.full_mrc(stream, "lru", sizes)
    totals = dict.fromkeys(("evictions", "proposed", "accepted",
                            "rejected_not_cached", "rejected_duplicate",
                            "rejected_excess", "fallback_evictions"), 0)
    for size in sizes:
        cache = runtime.Cache(name, int(size))
        cache.access(stream)
        cache.capacity_pages = max(1, int(size) // 2)   # batched reclaim too
        st = cache.stats
        for k in totals:
            totals[k] += int(st[k])
    return {"curve": curve, "lru": lru, "stats": totals}


# -- commands -----------------------------------------------------------------

def run_list(args) -> int:

    rows = []
    for name in runtime.available_policies():
        src = policy_source(name)
        rows.append({
            "name": name,
            "source": str(src.relative_to(REPO_ROOT)) if src else None,
            "description": describe(src) if src else "",
            "tid_maps": tid_maps(src) if src else [],
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        extra = f" [tids: {', '.join(r['tid_maps'])}]" if r["tid_maps"] else ""
        print(f"{r['name']:<{width}}  {r['description']}{extra}")
    return 0


def smoke_sizes(text: str | None, n_keys: int) -> list[int]:
    """--sizes, or sizes at SMOKE_FRACTIONS of the keys."""
    sizes = parse_sizes(text)
    if sizes is None:
        return sorted({max(1, int(f * n_keys)) for f in SMOKE_FRACTIONS})
    return sizes.tolist()


def run_check(args) -> int:

    path = Path(args.file)
    if not path.is_file():
        raise UserError(f"{path}: no such policy file")
    if not path.name.endswith(".c"):
        raise UserError(f"{path}: a policy source is a .bpf.c file")
    report = {"file": str(path)}

    name = runtime.load_policy_source(str(path))
    report["name"] = name
    print(f"native build: ok (policy {name!r})")

    if args.no_bpf:
        report["bpf"] = "skipped"
        print("bpf build: skipped (--no-bpf)")
    else:
        btf_desc = f"{args.vmlinux} (given)" if args.vmlinux else bpf_types()
        with tempfile.TemporaryDirectory() as tmp:
            obj = compile_bpf(path, Path(tmp) / "policy.bpf.o", args.vmlinux)
            sections = elf_sections(obj)
            if ".struct_ops.link" not in sections:
                raise UserError(f"{path}: the BPF object has no "
                                f".struct_ops.link section (missing CP_POLICY?)")
            size = obj.stat().st_size
        report["bpf"] = {"btf": btf_desc, "object_bytes": size}
        print(f"bpf build: ok ({size} bytes; BTF: {btf_desc})")

    stream = smoke_stream(args.seed, args.keys, args.accesses)
    sizes = smoke_sizes(args.sizes, args.keys)
    result = smoke_check(name, sizes, stream)
    curve, lru, st = result["curve"], result["lru"], result["stats"]
    evictions = max(1, st["evictions"])
    refused = (st["rejected_not_cached"] + st["rejected_duplicate"] +
               st["rejected_excess"])
    fallback_share = st["fallback_evictions"] / evictions
    refused_share = refused / max(1, st["proposed"])
    report.update(curve=curve.to_dict(), lru=lru.to_dict(), stats=st,
                  fallback_share=fallback_share, refused_share=refused_share)

    print(f"smoke simulation: {len(stream)} accesses over "
          f"{len(np.unique(stream))} pages (hot set, scan, loop)")
    print(f"{'size (pages)':>12}  {name:>10}  {'lru':>8}")
    for s, m, l in zip(curve.sizes.tolist(), curve.miss_ratio.tolist(),
                       lru.miss_ratio.tolist()):
        print(f"{s:>12}  {m:>10.4f}  {l:>8.4f}")
    print(f"reclaim: {st['proposed']} candidates proposed, {refused} refused "
          f"({refused_share:.2%}), {st['fallback_evictions']} fallback "
          f"evictions ({fallback_share:.2%} of {st['evictions']})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    ok = fallback_share <= MAX_FALLBACK_SHARE and \
        refused_share <= MAX_FALLBACK_SHARE
    if not ok:
        print(f"check failed: the policy leaves more than "
              f"{MAX_FALLBACK_SHARE:.0%} of evictions to the fallback or "
              f"proposes pages the host refuses", file=sys.stderr)
        return 1
    print("check passed")
    return 0


def _bpftool_json(args: list[str]):
    proc = subprocess.run([_tool("bpftool"), "-j", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        try:
            msg = json.loads(proc.stdout)["error"]
        except (ValueError, KeyError, TypeError):
            msg = (proc.stderr.strip() or proc.stdout.strip() or "failed")
        raise UserError(f"bpftool {' '.join(args[:3])}: {msg}")
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def pinned_tid_map(args) -> Path:
    """The pinned tid map to fill: --policy-map, or the one policyctl (and
    so the agent) pins for the policy attached to --cgroup:
    <bpffs>/cachepilot/<cgroup id>/<map>."""
    if args.policy_map:
        return Path(args.policy_map)
    if not (args.cgroup and args.policy):
        raise UserError("say which map: --policy-map PATH, or --cgroup DIR "
                        "with --policy NAME, or --trace/--out for a "
                        "simulator trace")
    src = policy_source(args.policy)
    if src is None:
        raise UserError(f"unknown policy {args.policy!r}")
    maps = tid_maps(src)
    if not maps:
        raise UserError(f"policy {args.policy!r} takes no thread ids")
    try:
        cgroup_id = os.stat(args.cgroup).st_ino
    except OSError as err:
        raise UserError(f"--cgroup {args.cgroup}: {err.strerror} (give the "
                        f"cgroup's directory)") from None
    return BPFFS_ROOT / str(cgroup_id) / maps[0]


def register_in_kernel(map_path: Path, tids, remove=False) -> int:
    if not map_path.exists():
        raise UserError(f"{map_path}: no such pinned map (is the policy "
                        f"attached, and did its loader pin its maps there?)")
    info = _bpftool_json(["map", "show", "pinned", str(map_path)])
    if info.get("bytes_key") != 4 or info.get("bytes_value", 0) < 1:
        raise UserError(f"{map_path}: not a tid map (want 4-byte keys, "
                        f"found {info.get('bytes_key')}-byte keys)")
    value = ["1"] + ["0"] * (int(info["bytes_value"]) - 1)
    for tid in tids:
        key = [str(b) for b in int(tid).to_bytes(4, "little")]
        if remove:
            proc = subprocess.run([_tool("bpftool"), "map", "delete", "pinned",
                                   str(map_path), "key", *key],
                                  capture_output=True, text=True)
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                raise UserError(f"{map_path}: could not remove tid {tid}: "
                                f"{proc.stderr.strip()}")
        else:
            _bpftool_json(["map", "update", "pinned", str(map_path),
                           "key", *key, "value", *value])
    return len(tids)


def threads_of(pid) -> list[int]:
    """The thread ids of a running process (its /proc/PID/task)."""
    pid = check_tid(pid)
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise UserError(f"no process {pid}") from None


def run_register_tids(args) -> int:
    tids = [check_tid(t) for t in args.tids]
    for pid in args.threads_of or []:
        tids.extend(threads_of(pid))
    tids = sorted(set(tids))
    if not tids:
        raise UserError("give at least one thread id (TID... or "
                        "--threads-of PID)")
    if args.trace or args.out:
        if not (args.trace and args.out):
            raise UserError("--trace and --out go together")
        src = Path(args.trace)
        if not src.is_file():
            raise UserError(f"{src}: no such trace")
        res = annotate_trace(src, Path(args.out), tids, args.remove)
        verb = "unmarked" if args.remove else "marked"
        print(f"{args.out}: {res['accesses_marked']} accesses of "
              f"{len(tids)} thread(s) {verb} as registered "
              f"({res['records']} records)")
        return 0
    map_path = pinned_tid_map(args)
    n = register_in_kernel(map_path, tids, args.remove)
    print(f"{map_path}: {'removed' if args.remove else 'registered'} "
          f"{n} thread id(s)")
    return 0


def register(subparsers):
    p = subparsers.add_parser(
        "policy", help="the cache_ext policy library: list, check, "
        "register-tids",
        description="The cache_ext policy library (bpf/policies).")
    sub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    sub.required = True

    q = sub.add_parser("list", help="policies this build can run")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=run_list)

    q = sub.add_parser(
        "check", help="compile a policy both ways, smoke-simulate it, "
        "print its curve",
        description="Compile FILE natively (into the simulator) and with "
        "clang -target bpf (for the cache_ext kernel), run a smoke "
        "simulation on a generated workload and print the policy's "
        "miss-ratio curve beside LRU's.  Fails when the policy leaves "
        "evictions to the host's fallback or proposes pages the host "
        "refuses.")
    q.add_argument("file", metavar="FILE.bpf.c")
    q.add_argument("--vmlinux", help="vmlinux.h to compile against (default: "
                   "the patched kernel's, else a stand-in)")
    q.add_argument("--no-bpf", action="store_true",
                   help="skip the clang -target bpf build")
    q.add_argument("--sizes", help="cache sizes in pages, comma-separated")
    q.add_argument("--keys", type=int, default=SMOKE_KEYS,
                   help="distinct pages of the smoke workload")
    q.add_argument("--accesses", type=int, default=SMOKE_ACCESSES,
                   help="accesses of the smoke workload")
    q.add_argument("--seed", type=int, default=1)
    q.add_argument("--json", metavar="OUT", help="write the report as JSON")
    q.set_defaults(func=run_check)

    q = sub.add_parser(
        "register-tids",
        help="register threads with an application-informed policy",
        description="Kernel: add the thread ids to the policy's pinned tid "
        "map (--policy-map PATH, or --cgroup DIR with --policy for the pin "
        f"policyctl and the agent make, {BPFFS_ROOT}/<cgroup id>/<map>).  Simulator: copy a CPACCESS trace "
        "marking the threads' accesses as registered (--trace IN --out OUT).")
    q.add_argument("tids", nargs="*", metavar="TID")
    q.add_argument("--threads-of", action="append", metavar="PID",
                   help="also every current thread of process PID "
                   "(repeatable)")
    q.add_argument("--policy-map", help="pinned tid map in bpffs")
    q.add_argument("--cgroup", help="directory of the cgroup the policy is "
                   "attached to")
    q.add_argument("--policy", help="policy name (with --cgroup)")
    q.add_argument("--trace", help="simulator: CPACCESS trace to annotate")
    q.add_argument("--out", help="simulator: annotated copy to write")
    q.add_argument("--remove", action="store_true",
                   help="unregister instead")
    q.set_defaults(func=run_register_tids)
