#!/bin/sh
# In-VM part of experiments/bench_policy_reclaim.py: each library policy
# attached (by the host's policyctl, sized for the cgroup) to a cgroup whose
# memory.max is a quarter of a file that fio reads at random, 4 KiB at a
# time, readahead off: nearly every read evicts a page.  With the kernel's
# BPF statistics on, every policy program's run time and run count are read
# at the end of each run, beside the cgroup's memory.cache_ext counters and
# fio's CPU figures.  "none" runs the same reads under the kernel's own
# policy (nothing attached): fio's CPU per read there is what every policy's
# is read against.  Policies rotate order over the rounds.
#   bench-reclaim.sh REPO ROUNDS SECONDS [POLICY...]
REPO=$1
ROUNDS=${2:-3}
RUNTIME=${3:-10}
shift 3 2>/dev/null
POLICIES=${*:-"none fifo lru mru linux lfu s3fifo lhd mglru hyperbolic get_scan admit_filter"}
. /cachepilot/testlib.sh
. /cachepilot/hostroot.sh
CG=/sys/fs/cgroup
FILE=/data/rr

hostroot_mount || { echo "FAIL hostroot: cannot mount the host's root"; exit 1; }
policyctl() { in_host "$REPO" bpf/out/policyctl --pin-root /sys/fs/bpf/bench "$@"; }

echo 1 >/proc/sys/kernel/bpf_stats_enabled
echo +memory >$CG/cgroup.subtree_control
mkdir -p $CG/bench
echo 16M >$CG/bench/memory.max
cxtest mkfile $FILE 64 || exit 1
fio --version || exit 1

run() {	# run POLICY ROUND
	drop_caches
	# "none": the kernel's own policy, nothing attached and nothing to read back
	[ "$1" = none ] || policyctl attach $CG/bench "$1" || return 1
	fio_randread $CG/bench $FILE $RUNTIME "$1 $2" || return 1
	[ "$1" = none ] && return 0
	echo "STATS $1 $2 $(tr '\n' ' ' <$CG/bench/memory.cache_ext)"
	echo "PROGS $1 $2 $(in_host / bpftool -j prog show | tr -d '\n')"
	policyctl detach $CG/bench >/dev/null
}

i=0
while [ $i -lt "$ROUNDS" ]; do
	# rotate the order so no policy always runs first
	set -- $POLICIES
	k=0
	while [ $k -lt $((i % $#)) ]; do
		first=$1
		shift
		set -- "$@" "$first"
		k=$((k + 1))
	done
	for p in "$@"; do
		run "$p" $i || { echo "FAIL $p: run $i failed"; exit 1; }
	done
	i=$((i + 1))
done
echo "bench-reclaim: done"
