#!/bin/sh
# In-VM tests (cgroup v2) of two policy life-cycle events, run by
# kernel/test as a boot of its own:
#
# 1. A live replacement keeps recency.  Under LRU, an 8 MiB cgroup reads a
#    cold 8 MiB file once, then a hot 2 MiB file three times, so its cache
#    holds about 5.5 MiB of cold pages and the hot set, which LRU keeps.
#    The link is then updated to FIFO, which evicts in the order it was
#    handed its folios, and a 4 MiB file (less than the cold part) is read:
#    when the kernel offers the tracked folios oldest first, only cold
#    pages go and the hot set stays resident; offered in hash order, the
#    evictions fall evenly on hot and cold pages (hot 50 % resident).  The
#    same with LFU and a 1 MiB pass: LFU gives every folio it is offered
#    the same score (no use counted yet) and evicts equal scores in list
#    order, a 512-page window at a time, so the oldest offered go first
#    (hot 100 % resident; 81 % in hash order).
#
# 2. A cgroup removed under its policy: the kernel detaches the policy when
#    the cgroup goes offline, so no registry node is left and the pinned
#    link stays, inert: removing its pin, detaching it or updating it does
#    no harm.  An oops would end the VM (oops=panic).
. /cachepilot/testlib.sh
CG=/sys/fs/cgroup
HOT_MIN=90	# percent of the hot set that must survive the swap

stat_of() { cache_ext_field "$@"; }
resident() { set -- $(cxtest res "$1"); echo "$3"; }	# percent of all

# swap_case TO SCAN_MIB ASSERT: LRU with cold + hot history, swapped to TO,
# then a SCAN_MIB pass; ASSERT=1 checks that the hot set stayed.
swap_case() {
	to=$1 scan=$2 check=$3 c=$CG/sw
	drop_caches
	cxtest attach "$B/lru.bpf.o" $c "$PIN/sw" ||
		{ fail "swap to $to" "attach lru failed"; return; }
	cxtest read /data/cold $c
	for i in 1 2 3; do
		cxtest read /data/hot $c
	done
	hot0=$(resident /data/hot) cold0=$(resident /data/cold)
	t0=$(stat_of $c tracked)
	if ! cxtest update "$PIN/sw" "$B/$to.bpf.o"; then
		fail "swap to $to" "link update refused"
		cxtest detach "$PIN/sw"
		return
	fi
	name=$(stat_of $c policy) t1=$(stat_of $c tracked)
	cxtest read /data/scan$scan $c
	hot1=$(resident /data/hot) cold1=$(resident /data/cold)
	scanres=$(resident /data/scan$scan)
	fig="before the swap hot ${hot0}% cold ${cold0}% (tracked $t0);"
	fig="$fig after the swap to $name (tracked $t1) and a $scan MiB pass"
	fig="$fig (${scanres}% resident): hot ${hot1}% cold ${cold1}%;"
	fig="$fig offered=$(stat_of $c offered) evict_calls=$(stat_of $c evict_calls)"
	fig="$fig accepted=$(stat_of $c accepted)"
	echo "RESULT swap lru -> $to: $fig"
	if [ "$check" = 1 ]; then
		if [ "$name" = "$to" ] && [ "$hot0" -ge 95 ] &&
		   [ "$hot1" -ge $HOT_MIN ] && [ "$cold1" -lt "$cold0" ]; then
			pass "swap lru -> $to keeps recency: $fig"
		else
			fail "swap lru -> $to" "$fig (want hot >= ${HOT_MIN}%)"
		fi
	else
		echo "INFO swap lru -> $to: hot set ${hot1}% resident after the pass"
	fi
	cxtest detach "$PIN/sw"
}

test_swap_order() {
	mkdir -p $CG/sw
	echo 8M >$CG/sw/memory.max
	swap_case fifo 4 1
	swap_case lfu 1 1
}

nodes_all() { stat_of $CG nodes_all_cgroups; }

# wait_nodes N SECONDS: until nodes_all_cgroups is N; echoes what it is
wait_nodes() {
	i=0
	while [ "$(nodes_all)" != "$1" ] && [ $i -lt $(($2 * 10)) ]; do
		sleep 0.1
		i=$((i + 1))
	done
	nodes_all
}

dying() { sed -n 's/^nr_dying_descendants //p' $CG/cgroup.stat; }

# removed_case NAME HOW: a cgroup with FIFO and a reader streaming through
# its 8 MiB limit; the reader moves to the root, the cgroup is removed;
# HOW = rm | detach | update is what is then done to the pinned link.
removed_case() {
	c=$CG/$1 how=$2
	mkdir -p $c
	echo 8M >$c/memory.max
	drop_caches
	dy0=$(dying)
	cxtest attach "$B/fifo.bpf.o" $c "$PIN/$1" ||
		{ fail "removed cgroup ($how)" "attach failed"; return; }
	cxtest read /data/f1 $c &
	rd=$!
	sleep 1
	echo $rd >$CG/cgroup.procs
	tr=$(stat_of $c tracked) n0=$(nodes_all)
	if ! rmdir $c; then
		fail "removed cgroup ($how)" "rmdir failed"
		wait $rd
		return
	fi
	dyr=$(dying)
	n1=$(wait_nodes 0 5)
	wait $rd && rdrc=0 || rdrc=$?
	[ "$tr" -gt 0 ] && [ "$n1" = 0 ] && [ $rdrc = 0 ] &&
		pass "removed cgroup ($how): tracked=$tr, nodes_all_cgroups $n0 -> $n1 after rmdir, the reader (moved out) finished" ||
		fail "removed cgroup ($how)" "tracked=$tr, nodes_all_cgroups $n0 -> $n1 within 5 s of rmdir, reader rc=$rdrc"
	# Nothing else holds the dead memcg once its page cache is gone, not
	# even the pinned link.
	release_percpu /data/hot
	i=0
	while [ "$(dying)" -gt "$dy0" ] && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	dy1=$(dying)
	[ "$dy1" -le "$dy0" ] &&
		pass "removed cgroup ($how): no dying cgroup left after drop_caches, link still pinned (dying: $dy0 before, $dyr after rmdir, $dy1 after drop_caches)" ||
		fail "removed cgroup ($how)" "dying cgroups: $dy0 before, $dyr after rmdir, $dy1 after drop_caches (link still pinned)"
	case $how in
	rm)
		rm "$PIN/$1" && pass "removed cgroup: its pinned link's pin removed" ||
			fail "removed cgroup" "rm of the pin failed" ;;
	detach)
		cxtest detach "$PIN/$1" &&
			pass "removed cgroup: its inert link detached and unpinned" ||
			fail "removed cgroup" "detach of the inert link failed" ;;
	update)
		cxtest update "$PIN/$1" "$B/lru.bpf.o" 2>/tmp/upd.err &&
			fail "removed cgroup" "update of the inert link succeeded" ||
			pass "removed cgroup: update of the inert link refused ($(tr '\n' ' ' </tmp/upd.err))"
		rm "$PIN/$1" ;;
	esac
}

test_removed_cgroup() {
	removed_case gone1 rm
	removed_case gone2 detach
	removed_case gone3 update
	# The kernel goes on as usual: a policy on another cgroup works.
	mkdir -p $CG/after
	echo 8M >$CG/after/memory.max
	drop_caches
	cxtest attach "$B/mru.bpf.o" $CG/after "$PIN/after" &&
		cxtest read /data/f1 $CG/after &&
		set -- $(cxtest res /data/f1) &&
		[ "$1" -ge 60 ] && [ "$2" -le 30 ] &&
		pass "after the removals: mru on a new cgroup keeps the oldest pages (H=$1 T=$2)" ||
		fail "after the removals" "mru on a new cgroup: $*"
	cxtest detach "$PIN/after"
	n=$(nodes_all)
	[ "$n" = 0 ] && pass "after the removals: no registry node left" ||
		fail "after the removals" "$n registry nodes left"
}

echo "cache_ext swap order and removed cgroups on $(uname -r)"
echo +memory >$CG/cgroup.subtree_control
cxtest mkfile /data/cold 8 && cxtest mkfile /data/hot 2 &&
	cxtest mkfile /data/scan4 4 && cxtest mkfile /data/scan1 1 &&
	cxtest mkfile /data/f1 32 || { echo "FAIL mkfile"; exit 1; }
test_swap_order
test_removed_cgroup
dmesg | grep -e "WARNING" -e "BUG" -e "cache_ext" | tail -5
summary swap-and-removal
