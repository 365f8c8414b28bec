#!/bin/sh
# In-VM part of kernel/bench: fio 4 KiB random reads from a cgroup whose
# memory.max is a quarter of the file, with no policy, the no-op policy and
# FIFO, interleaved over several rounds.  Prints fio's JSON between markers.
B=/cachepilot/bpf
CG=/sys/fs/cgroup
ROUNDS=${1:-3}
RUNTIME=${2:-15}

echo +memory >$CG/cgroup.subtree_control
mkdir -p $CG/bench
echo 16M >$CG/bench/memory.max
dd if=/dev/zero of=/data/fio bs=1M count=64 2>/dev/null
sync

run() {	# run CONFIG
	sync
	echo 3 >/proc/sys/vm/drop_caches
	case $1 in
	none) ;;
	*) cxtest attach $B/$1.bpf.o $CG/bench /sys/fs/bpf/bench || return 1 ;;
	esac
	echo "FIO-BEGIN $1"
	sh -c "echo \$\$ >$CG/bench/cgroup.procs; exec fio --name=randread \
		--filename=/data/fio --rw=randread --bs=4k --size=64M \
		--ioengine=psync --runtime=$RUNTIME --time_based \
		--randrepeat=0 --output-format=json"
	echo "FIO-END $1"
	[ $1 = none ] || { echo "STATS $1 $(tr '\n' ' ' <$CG/bench/memory.cache_ext)";
			   cxtest detach /sys/fs/bpf/bench; }
}

i=0
while [ $i -lt $ROUNDS ]; do
	run none; run noop; run fifo
	i=$((i + 1))
done
