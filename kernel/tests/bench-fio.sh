#!/bin/sh
# In-VM part of kernel/bench: fio 4 KiB random reads (psync, readahead off
# through --fadvise_hint=random) from a cgroup whose memory.max is a quarter
# of the file, with no policy, the no-op policy and FIFO, interleaved over
# several rounds.  Each run's fio JSON goes to the log between markers.
#   bench-fio.sh ROUNDS SECONDS
. /cachepilot/testlib.sh
CG=/sys/fs/cgroup
ROUNDS=${1:-3}
RUNTIME=${2:-15}
FILE=/data/rr

echo +memory >$CG/cgroup.subtree_control
mkdir -p $CG/bench
echo 16M >$CG/bench/memory.max
cxtest mkfile $FILE 64 || exit 1

run() {	# run CONFIG ROUND
	drop_caches
	if [ $1 != none ]; then
		cxtest attach $B/$1.bpf.o $CG/bench /sys/fs/bpf/bench || return 1
	fi
	fio_randread $CG/bench $FILE $RUNTIME "$1 $2" || return 1
	echo "MEMORY $1 current=$(cat $CG/bench/memory.current) max=$(cat $CG/bench/memory.max)"
	if [ $1 != none ]; then
		echo "STATS $1 $(tr '\n' ' ' <$CG/bench/memory.cache_ext)"
		cxtest detach /sys/fs/bpf/bench
	fi
}

fio --version || exit 1
i=0
while [ $i -lt $ROUNDS ]; do
	# rotate the order so no configuration always runs first
	case $((i % 3)) in
	0) order="none noop fifo" ;;
	1) order="noop fifo none" ;;
	2) order="fifo none noop" ;;
	esac
	for c in $order; do
		run $c $i || { echo "run $c failed"; exit 1; }
	done
	i=$((i + 1))
done
