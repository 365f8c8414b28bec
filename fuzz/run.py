"""Run every fuzz target for a fixed number of executions.

    .venv/bin/python -m fuzz.run                     # every target, 1,000,000 runs each
    .venv/bin/python -m fuzz.run --runs 20000 csv    # one target, a short run
    .venv/bin/python -m fuzz.run --list
    .venv/bin/python -m fuzz.run --jobs 2             # two targets at a time

Python targets (fuzz/targets.py) run under atheris, coverage-guided over
the readers' bytecode; the native parser (`parse_c`, fuzz/parse_fuzz.c)
under libFuzzer built with clang, ASan and UBSan.  Each target runs in a
process of its own, one after the other, with its corpus kept in
out/fuzz/TARGET/corpus (so a second run goes on from the first) and fresh
seeds written to out/fuzz/TARGET/seeds from ../shared/traces and generated
traces.  A crash leaves its input in out/fuzz/TARGET/crashes/ and the run
fails; every crash fixed becomes a test in tests/test_fuzz_regressions.py.

Writes experiments/results/fuzz.json: per target the executions, seconds,
executions per second, corpus size, coverage and crashes.  Not part of
`make test` (`make fuzz` runs it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "fuzz"
RESULTS = REPO / "experiments" / "results" / "fuzz.json"
NATIVE = "parse_c"
DEFAULT_RUNS = 1_000_000
# libFuzzer's limits for every target: an input that takes longer or makes
# the process grow larger is a crash (a hang, a blow-up) like any other
LIMITS = ["-timeout=20", "-rss_limit_mb=2048", "-max_len=8192", "-print_final_stats=1"]


# -- the child: one target under atheris --------------------------------------------

def child(name: str, argv: list[str]) -> None:
    import atheris
    with atheris.instrument_imports(include=["cachepilot.models.traces", "fuzz.targets"]):
        from fuzz.targets import TARGETS
    t = TARGETS[name]
    scratch_dir = Path(tempfile.mkdtemp(prefix=f"cachepilot-fuzz-{name}-",
                                        dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    scratch = scratch_dir / "input"

    def one(data: bytes) -> None:
        try:
            t.run(data, scratch)
        except t.expected:
            pass

    atheris.Setup([sys.argv[0], *argv], one)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)


# -- the parent ----------------------------------------------------------------------

def native_binary(sanitize: bool = True) -> Path:
    """fuzz/parse_fuzz.c and parse.c, built with libFuzzer, ASan and UBSan."""
    out = OUT / "bin" / "parse_fuzz"
    srcs = [REPO / "fuzz" / "parse_fuzz.c", REPO / "models" / "native" / "mrc" / "parse.c"]
    if out.exists() and all(out.stat().st_mtime > s.stat().st_mtime for s in srcs):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = "fuzzer,address,undefined" if sanitize else "fuzzer"
    cmd = [os.environ.get("FUZZ_CLANG", "clang"), "-g", "-O1", f"-fsanitize={flags}",
           "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
           f"-I{REPO / 'models' / 'native'}", *map(str, srcs), "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def native_seeds() -> list[bytes]:
    from fuzz import seeds as S
    out = []
    for code, fmt in enumerate(("txt", "lis", "csv")):
        for s in S.text_seeds(fmt):
            out.append(bytes([code | 4]) + s)       # | 4: a CSV header may lead
    return out


def target_names() -> list[str]:
    from fuzz.targets import TARGETS
    return [*TARGETS, NATIVE]


def write_seeds(name: str, folder: Path) -> int:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if name == NATIVE:
        seeds = native_seeds()
    else:
        from fuzz.targets import TARGETS
        seeds = TARGETS[name].seeds()
    for i, s in enumerate(seeds):
        (folder / f"seed-{i:03d}").write_bytes(s)
    return len(seeds)


def run_target(name: str, runs: int, seed: int, progress: bool) -> dict:
    base = OUT / name
    corpus, seeds, crashes = base / "corpus", base / "seeds", base / "crashes"
    for d in (corpus, crashes):
        d.mkdir(parents=True, exist_ok=True)
    n_seeds = write_seeds(name, seeds)
    before = set(os.listdir(crashes))
    args = [str(corpus), str(seeds), f"-runs={runs}", f"-seed={seed}",
            f"-artifact_prefix={crashes}/", *LIMITS]
    if name == NATIVE:
        cmd = [str(native_binary()), *args]
    else:
        cmd = [sys.executable, "-m", "fuzz.run", "--child", name, *args]
    # a PYTHONPATH given (make sanitize's build) stays first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p))
    if name == NATIVE:
        env.pop("LD_PRELOAD", None)     # it carries clang's ASan runtime itself
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0" if name != NATIVE else "detect_leaks=1")
    log = base / "log.txt"
    started = time.monotonic()
    last = ""
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True,
                             cwd=REPO, env=env, errors="replace")
        for line in p.stderr:
            out.write(line)
            m = re.match(r"#(\d+)\s", line)
            if m:
                last = line.strip()
                if progress:
                    done = int(m.group(1))
                    bar = "#" * int(30 * min(1.0, done / runs))
                    sys.stderr.write(f"\r  {name:10s} [{bar:30s}] {done:>10,}/{runs:,} "
                                     f"{time.monotonic() - started:6.0f} s")
                    sys.stderr.flush()
        rc = p.wait()
    seconds = time.monotonic() - started
    if progress:
        sys.stderr.write("\n")
    text = log.read_text(errors="replace")
    executed = re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
    done = re.findall(r"Done (\d+) runs in (\d+) second", text)
    runs_done = int(executed[-1]) if executed else (int(done[-1][0]) if done else 0)
    cov = re.search(r"cov: (\d+) ft: (\d+)", last)
    new_crashes = sorted(set(os.listdir(crashes)) - before)
    return {"target": name, "engine": "libFuzzer" if name == NATIVE else "atheris",
            "runs": runs_done, "asked": runs, "seconds": round(seconds, 1),
            "exec_per_s": round(runs_done / seconds) if seconds else None,
            "seeds": n_seeds, "corpus": len(os.listdir(corpus)),
            "coverage": int(cov.group(1)) if cov else None,
            "features": int(cov.group(2)) if cov else None,
            "rc": rc, "crashes": [str(crashes / c) for c in new_crashes],
            "log": str(log)}


def report(r: dict, runs: int) -> None:
    state = "ok" if r["rc"] == 0 and not r["crashes"] and r["runs"] >= runs else "FAILED"
    print(f"{r['target']:10s} {state:6s} {r['runs']:>10,} runs in {r['seconds']:7.1f} s "
          f"({r['exec_per_s'] or 0:>7,}/s), corpus {r['corpus']}, cov {r['coverage']}"
          + (f", crashes: {' '.join(r['crashes'])}" if r["crashes"] else "")
          + (f" (rc {r['rc']}, log {r['log']})" if state != "ok" else ""), flush=True)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help="targets to run (default: all)")
    ap.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                    help=f"executions per target (default {DEFAULT_RUNS:,})")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (1)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="targets run at once, one process each (1)")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    ap.add_argument("--json", type=Path, default=RESULTS,
                    help=f"write results here (default {RESULTS.relative_to(REPO)})")
    args = ap.parse_args(argv)
    names = target_names()
    if args.list:
        print("\n".join(names))
        return 0
    unknown = [t for t in args.targets if t not in names]
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; have: {', '.join(names)}")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    todo = args.targets or names
    if NATIVE in todo:
        native_binary()             # built once, before any job needs it
    results = []
    progress = sys.stderr.isatty() and args.jobs == 1
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda n: run_target(n, args.runs, args.seed, progress), todo):
            report(r, args.runs)
            results.append(r)
    failed = [r["target"] for r in results
              if r["rc"] != 0 or r["crashes"] or r["runs"] < args.runs]
    doc = {"host": platform.node(), "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "runs_per_target": args.runs,
           "targets": results, "failed": failed}
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        if args.targets and old.get("runs_per_target") == args.runs:
            # a partial run updates its targets in the last full record
            keep = [r for r in old.get("targets", []) if r["target"] not in todo]
            doc["targets"] = keep + results
            doc["failed"] = sorted(set(old.get("failed", [])) - set(todo) | set(failed))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(todo) - len(failed)}/{len(todo)} targets ran {args.runs:,} executions "
          f"without a crash" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
