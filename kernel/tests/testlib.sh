# Sourced by the in-VM test scripts (kernel/vm installs it as
# /cachepilot/testlib.sh): their counters of passed and failed checks, the
# fields of a cgroup's memory.cache_ext, dropping the page cache, and the
# closing summary line whose status kernel/test reads.
B=/cachepilot/bpf
PIN=/sys/fs/bpf
passes=0
fails=0

pass() { echo "PASS $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

# cache_ext_field DIR FIELD: FIELD's value in DIR/memory.cache_ext
cache_ext_field() { sed -n "s/^$2 //p" "$1/memory.cache_ext"; }

drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

# release_percpu FILE: each CPU in turn reads FILE (uncached) in a cgroup of
# its own.  An idle CPU's per-CPU LRU batch still holds the last folios it
# added and its memcg stock the last cgroup it charged; both pin a removed
# cgroup until that CPU charges something else, which this forces.  On one
# CPU the test's own commands did that; with two it is left to chance.
release_percpu() {
	mkdir -p /sys/fs/cgroup/percpu-flush
	drop_caches
	for cpu in $(seq 0 $(($(nproc) - 1))); do
		taskset -c "$cpu" cxtest read "$1" /sys/fs/cgroup/percpu-flush
		drop_caches
	done
}

# fio_randread CGDIR FILE SECONDS TAG: fio's 4 KiB random reads of FILE
# (psync, readahead off through --fadvise_hint=random) from inside CGDIR
# (fio and the job it forks) for SECONDS; its JSON goes to the log between
# "FIO-BEGIN TAG" and "FIO-END", where the host's benchmark reads it
fio_randread() {
	sh -c "echo \$\$ >$1/cgroup.procs && exec fio --name=rr \
		--filename=$2 --rw=randread --bs=4k --ioengine=psync \
		--fadvise_hint=random --time_based --runtime=$3 --eta=never \
		--output-format=json --output=/tmp/fio.json" || return 1
	echo "FIO-BEGIN $4"
	cat /tmp/fio.json
	echo "FIO-END"
}

# summary NAME: the "NAME: X passed, Y failed" line; true when none failed
summary() {
	echo "$1: $passes passed, $fails failed"
	[ $fails = 0 ]
}
