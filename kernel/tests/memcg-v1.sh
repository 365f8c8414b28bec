#!/bin/sh
# In-VM test of cache_ext on the cgroup v1 memory controller, run by
# kernel/test as a boot of its own: the memory controller can be mounted
# on a v1 hierarchy only while no v2 cgroup uses it, and once it is there
# it cannot be enabled in v2 (the other in-VM scripts need that).
#
# A v1 memory cgroup with memory.limit_in_bytes = 8 MiB gets MRU through
# its directory fd, memory.cache_ext (a v1 file too) names it, and a
# 32 MiB pass keeps the oldest pages, as run-tests.sh checks on v2.
# Detaching gives "policy none"; a v1 cgroup removed under its policy
# leaves no registry node behind.
. /cachepilot/testlib.sh
V1=/tmp/v1
stat_of() { cache_ext_field "$@"; }

echo "cache_ext on the cgroup v1 memory controller, $(uname -r)"
mkdir -p $V1
if ! mount -t cgroup -o memory none $V1; then
	echo "FAIL v1: cannot mount a v1 memory hierarchy"
	exit 1
fi
cxtest mkfile /data/f1 32 || { echo "FAIL mkfile"; exit 1; }
mkdir $V1/a
echo 8M >$V1/a/memory.limit_in_bytes

if [ -f $V1/a/memory.cache_ext ] && [ "$(stat_of $V1/a policy)" = none ]; then
	pass "v1: memory.cache_ext exists and says policy none"
else
	fail "v1" "memory.cache_ext: $(cat $V1/a/memory.cache_ext 2>&1 | tr '\n' ' ')"
fi

drop_caches
if cxtest attach "$B/mru.bpf.o" $V1/a "$PIN/v1a"; then
	pass "v1: mru attached through a v1 memory cgroup's directory fd"
	name=$(stat_of $V1/a policy)
	[ "$name" = mru ] && pass "v1: memory.cache_ext says policy $name" ||
		fail "v1" "memory.cache_ext says policy '$name'"
	cxtest read /data/f1 $V1/a
	set -- $(cxtest res /data/f1)
	acc=$(stat_of $V1/a accepted) rej=$(stat_of $V1/a rejected)
	use=$(cat $V1/a/memory.usage_in_bytes)
	lim=$(cat $V1/a/memory.limit_in_bytes)
	[ "$1" -ge 60 ] && [ "$2" -le 30 ] && [ "${acc:-0}" -gt 0 ] &&
		[ "$use" -le "$lim" ] &&
		pass "v1: mru keeps the oldest pages of a 32 MiB pass (H=$1 T=$2 A=$3, accepted=$acc rejected=$rej)" ||
		fail "v1" "H=$1 T=$2 A=$3 accepted=$acc rejected=$rej usage=$use limit=$lim"
	cxtest detach "$PIN/v1a"
	name=$(stat_of $V1/a policy)
	[ "$name" = none ] && pass "v1: detached, memory.cache_ext says policy none" ||
		fail "v1" "after detach memory.cache_ext says policy '$name'"
else
	fail "v1" "attach through a v1 cgroup refused"
fi

# A v1 cgroup removed under its policy.
mkdir $V1/b
echo 8M >$V1/b/memory.limit_in_bytes
drop_caches
if cxtest attach "$B/fifo.bpf.o" $V1/b "$PIN/v1b"; then
	cxtest read /data/f1 $V1/b
	tr=$(stat_of $V1/b tracked)
	rmdir $V1/b
	i=0
	while [ "$(stat_of $V1/a nodes_all_cgroups)" != 0 ] && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	n=$(stat_of $V1/a nodes_all_cgroups)
	[ "$tr" -gt 0 ] && [ "$n" = 0 ] &&
		pass "v1: cgroup removed under fifo (tracked=$tr): no registry node left" ||
		fail "v1" "cgroup removed under fifo (tracked=$tr): nodes_all_cgroups=$n"
	rm "$PIN/v1b" && pass "v1: the removed cgroup's pinned link unpinned" ||
		fail "v1" "rm of the pin failed"
else
	fail "v1" "attach to the second v1 cgroup refused"
fi
rmdir $V1/a
dmesg | grep -e "WARNING" -e "BUG" -e "cache_ext" | tail -5
summary memcg-v1
