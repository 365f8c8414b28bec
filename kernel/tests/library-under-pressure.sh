#!/bin/sh
# The cachepilot policy library on the cache_ext kernel: every policy of
# bpf/policies loads on a memory-limited cgroup and runs a read workload
# under pressure (a hot file read again and again around a sequential
# pass over a file 4x the limit); the reclaim counters of memory.cache_ext say how many
# candidates it proposed and how many the kernel rejected.
#
# Run as `kernel/vm -t 1500 kernel/tests/library-under-pressure.sh`;
# policy names as arguments (-a NAME) run only those.
. /cachepilot/testlib.sh
CG=/sys/fs/cgroup
MAX_REJECTED_PCT=5
POLICIES=${*:-"lfu s3fifo lhd mglru hyperbolic get_scan admit_filter linux fifo lru mru"}

stat_of() { cache_ext_field "$CG/$1" "$2"; }

echo +memory >"$CG/cgroup.subtree_control"
mkdir -p "$CG/lib"
echo 8M >"$CG/lib/memory.max"
cxtest mkfile /data/lib 32 && cxtest mkfile /data/hot 4 ||
	{ echo "FAIL mkfile"; exit 1; }

for p in $POLICIES; do
	[ -f "$B/$p.bpf.o" ] || { fail "$p" "no $B/$p.bpf.o"; continue; }
	drop_caches
	if ! cxtest attach "$B/$p.bpf.o" "$CG/lib" "$PIN/lib" 2>/tmp/attach.err; then
		fail "$p" "attach refused: $(tail -n 8 /tmp/attach.err | tr '\n' ' ')"
		continue
	fi
	# a hot 4 MiB file read again and again around a 32 MiB one: reuse
	# and pressure (limit 8 MiB)
	for i in 1 2 3; do
		cxtest read /data/hot "$CG/lib" || fail "$p" "hot read failed"
	done
	cxtest read /data/lib "$CG/lib" || fail "$p" "sequential read failed"
	cxtest read /data/hot "$CG/lib" || fail "$p" "hot read failed"
	name=$(stat_of lib policy)
	prop=$(stat_of lib proposed) acc=$(stat_of lib accepted)
	rej=$(stat_of lib rejected) fb=$(stat_of lib fallbacks)
	cur=$(cat "$CG/lib/memory.current") max=$(cat "$CG/lib/memory.max")
	echo "RESULT $p proposed=$prop accepted=$acc rejected=$rej fallbacks=$fb current=$cur max=$max"
	if [ "$name" = "$p" ] && [ "${acc:-0}" -gt 0 ] &&
	   [ $((${rej:-0} * 100)) -le $((${prop:-0} * MAX_REJECTED_PCT)) ] &&
	   [ "$cur" -le "$max" ]; then
		pass "$p under pressure: proposed=$prop accepted=$acc rejected=$rej fallbacks=$fb"
	else
		fail "$p" "policy=$name proposed=$prop accepted=$acc rejected=$rej fallbacks=$fb current=$cur max=$max"
	fi
	cxtest detach "$PIN/lib"
done
summary library
