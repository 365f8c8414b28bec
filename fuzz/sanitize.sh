#!/bin/bash
# make sanitize: the native core and the BPF loaders under AddressSanitizer
# and UndefinedBehaviorSanitizer, then the sampler loader under valgrind.
#
#  1. A copy of the checkout in out/sanitize/src is built with
#     -fsanitize=address,undefined: the Python extensions (_mrc, _runtime
#     with every policy compiled natively) and the user-space loaders
#     (bpf/sampler.c, bpf/policyctl.c, and the libbpf they link).  It is
#     installed into out/sanitize/site, so the checkout's own build is
#     left alone.
#  2. The tests that exercise the native core and the loaders run against
#     that build (PYTHONPATH first, libasan preloaded into Python).
#  3. A short fuzz of the readers through the sanitized extension
#     (fuzz/run.py, SANITIZE_FUZZ_RUNS executions a target; the native
#     parser's libFuzzer target is built with both sanitizers anyway).
#  4. valgrind runs the (unsanitized) sampler loader through one agent
#     interval over fio in a real memory cgroup (fuzz/valgrind_sampler.py).
#
# Every sanitizer report is written to out/sanitize/reports/; the script
# fails when there is one, when a test fails, or when valgrind finds an
# error or a definite leak.  Not part of make test.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=$REPO/.venv/bin/python
OUT=$REPO/out/sanitize
REPORTS=$OUT/reports
TESTS=${SANITIZE_TESTS:-"tests/test_exact.py tests/test_shards.py tests/test_stack.py
	tests/test_hll.py tests/test_hash.py tests/test_runtime.py tests/test_minisim.py
	tests/test_fullsim.py tests/test_builder.py tests/test_mruchain.py tests/test_traces.py
	tests/test_mrc_cli.py tests/test_fuzz_regressions.py tests/test_policies_behaviour.py
	tests/test_policies_vs_libcachesim.py tests/test_policy_cli.py tests/test_sim_backend.py
	tests/test_agent_prediction.py tests/test_sampler_live.py tests/test_doctor.py
	tests/test_cache_ext_agent.py tests/test_cache_ext_live.py"}
FUZZ_RUNS=${SANITIZE_FUZZ_RUNS:-50000}
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1"

step() { printf '\n== %s\n' "$*"; }
fail=0

[ -x "$PY" ] || { echo "sanitize: run make build first" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT/src" "$REPORTS"

step "1. build with ASan and UBSan (gcc $(gcc -dumpversion)) into $OUT"
# the sources as they are in the work tree, tracked or new, not ignored
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$OUT/src"
make -s -C "$OUT/src/bpf" CC=gcc CFLAGS="$SAN -Wall" >"$OUT/build-bpf.log" 2>&1 || {
	tail -20 "$OUT/build-bpf.log"; exit 1; }
CC=gcc CFLAGS="$SAN" LDSHARED="gcc -shared $SAN" \
	"$PY" -m pip install -q --no-deps --no-build-isolation --target "$OUT/site" "$OUT/src" \
	>"$OUT/build-py.log" 2>&1 || { tail -20 "$OUT/build-py.log"; exit 1; }
# `cachepilot policy check` and friends build through bpf/Makefile: the
# installed package reads the copy's whole bpf tree, not the sources alone
rm -rf "$OUT/site/cachepilot/bpf" && ln -s "$OUT/src/bpf" "$OUT/site/cachepilot/bpf"
for so in "$OUT"/site/cachepilot/models/_*.so "$OUT"/site/cachepilot/agent/bpf/sampler \
	  "$OUT"/site/cachepilot/agent/bpf/policyctl; do
	nm -D "$so" 2>/dev/null | grep -q __asan_init ||
		nm "$so" 2>/dev/null | grep -q __asan_init ||
		ldd "$so" 2>/dev/null | grep -q libasan ||
		{ echo "sanitize: $so is not built with ASan" >&2; exit 1; }
	echo "  $(basename "$so"): ASan+UBSan"
done

LIBASAN=$(gcc -print-file-name=libasan.so)
# alloc_dealloc_mismatch off: our native code is C (malloc and free only),
# and libcachesim's Python binding, which the policy tests compare with,
# frees with free() what it allocated with operator new at exit
# libstdc++ preloaded after it: a C++ extension loaded later (matplotlib's
# ft2font throws on a lookup) finds no real __cxa_throw for ASan's
# interceptor otherwise, and ASan aborts in its own CHECK
LIBSTDCXX=$(gcc -print-file-name=libstdc++.so)
san_env=(env PYTHONPATH="$OUT/site" LD_PRELOAD="$LIBASAN $LIBSTDCXX"
	ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:log_path=$REPORTS/asan:abort_on_error=0"
	UBSAN_OPTIONS="print_stacktrace=1:log_path=$REPORTS/ubsan")

step "2. the native tests against the sanitized build"
# shellcheck disable=SC2086
"${san_env[@]}" "$PY" -m pytest -q -rfE -p no:cacheprovider $TESTS 2>&1 | tee "$OUT/tests.log" |
	grep -E "passed|failed|error" | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { echo "sanitize: tests failed (see $OUT/tests.log)"; fail=1; }
"${san_env[@]}" "$PY" -c "import cachepilot.models._mrc as m, sys; print('  loaded', m.__file__)"

step "3. a short fuzz through the sanitized extension ($FUZZ_RUNS runs a target)"
"$PY" -c "import atheris" 2>/dev/null || .venv/bin/pip install -q 'atheris>=2.3'
"${san_env[@]}" "$PY" -m fuzz.run --runs "$FUZZ_RUNS" --json "$OUT/fuzz.json" \
	txt csv lis detect zstd parse_c || fail=1

step "4. valgrind: the sampler loader through one agent interval"
"$PY" -m fuzz.valgrind_sampler --log "$OUT/valgrind.log" || fail=1

step "reports"
n=$(find "$REPORTS" -type f | wc -l)
if [ "$n" != 0 ]; then
	echo "sanitize: $n sanitizer report(s):"
	for f in "$REPORTS"/*; do echo "--- $f"; head -30 "$f"; done
	fail=1
else
	echo "0 ASan/UBSan reports"
fi
exit $fail
