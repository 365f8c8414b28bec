#!/bin/sh
# In-VM part of kernel/bench: 4 KiB random reads (psync, readahead off)
# from a cgroup whose memory.max is a quarter of the file, with no policy,
# the no-op policy and FIFO, interleaved over several rounds.
#   bench-randread.sh ROUNDS SECONDS
B=/cachepilot/bpf
CG=/sys/fs/cgroup
ROUNDS=${1:-3}
RUNTIME=${2:-15}

echo +memory >$CG/cgroup.subtree_control
mkdir -p $CG/bench
echo 16M >$CG/bench/memory.max
cxtest mkfile /data/rr 64 || exit 1

# fio needs System V shared memory, which this kernel does not have.
if fio --name=probe --filename=/data/rr --size=4k --rw=read --bs=4k \
	--output-format=terse >/dev/null 2>&1; then
	echo "NOTE fio works in this guest"
else
	echo "NOTE fio unavailable (no CONFIG_SYSVIPC): using cxtest randread"
fi

run() {	# run CONFIG
	sync
	echo 3 >/proc/sys/vm/drop_caches
	if [ $1 != none ]; then
		cxtest attach $B/$1.bpf.o $CG/bench /sys/fs/bpf/bench 2>/dev/null || return 1
	fi
	echo "RR-RESULT $1 $(cxtest randread /data/rr $RUNTIME $CG/bench)"
	if [ $1 != none ]; then
		echo "STATS $1 $(tr '\n' ' ' <$CG/bench/memory.cache_ext)"
		cxtest detach /sys/fs/bpf/bench
	fi
}

i=0
while [ $i -lt $ROUNDS ]; do
	run none; run noop; run fifo
	i=$((i + 1))
done
