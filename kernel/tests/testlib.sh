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

# summary NAME: the "NAME: X passed, Y failed" line; true when none failed
summary() {
	echo "$1: $passes passed, $fails failed"
	[ $fails = 0 ]
}
