#!/bin/sh
# In-VM tests of the cache_ext kernel (run by kernel/test through kernel/vm).
#
# A cgroup whose memory.max is a quarter of a test file reads the file
# front to back, one page at a time; mincore() then tells which part stayed
# cached.  "H T A" = percent resident of the first eighth, the last eighth,
# and the whole file.  FIFO, LRU and the kernel default keep the newest
# pages (T high, H low); MRU and the highest-index-first scorer keep the
# oldest (H high, T low).
. /cachepilot/testlib.sh
CG=/sys/fs/cgroup
FILE_MB=32
LIMIT=8M
HIGH=60		# "mostly resident" threshold, percent
LOW=30		# "mostly evicted" threshold, percent

stat_of() {	# stat_of CGROUP FIELD
	cache_ext_field "$CG/$1" "$2"
}

# read_pass CGROUP FILE: read FILE inside CGROUP, then set H T A.
read_pass() {
	cxtest read "$2" "$CG/$1" || return 1
	set -- $(cxtest res "$2")
	H=$1 T=$2 A=$3
}

# expect NAME WHAT: WHAT is "newest" (T high, H low) or "oldest" (H high, T low)
expect() {
	case $2 in
	newest) [ "$T" -ge $HIGH ] && [ "$H" -le $LOW ] ;;
	oldest) [ "$H" -ge $HIGH ] && [ "$T" -le $LOW ] ;;
	esac && pass "$1 (H=$H T=$T A=$A: keeps the $2 pages)" ||
		fail "$1" "H=$H T=$T A=$A, expected the $2 pages to stay"
}

attach() {	# attach CGROUP POLICY
	cxtest attach "$B/$2.bpf.o" "$CG/$1" "$PIN/$1"
}

detach() {
	cxtest detach "$PIN/$1"
}

# One policy, one clean pass: policy_pass CGROUP POLICY EXPECT
policy_pass() {
	drop_caches
	if ! attach "$1" "$2"; then
		fail "$2" "attach failed"
		return
	fi
	if read_pass "$1" /data/f1; then
		expect "$2 on a sequential pass" "$3"
	else
		fail "$2" "read failed"
	fi
	name=$(stat_of "$1" policy)
	acc=$(stat_of "$1" accepted)
	[ "$name" = "$2" ] && [ "${acc:-0}" -gt 0 ] &&
		pass "$2: memory.cache_ext names it and counts accepted=$acc" ||
		fail "$2" "memory.cache_ext: $(tr '\n' ' ' <"$CG/$1/memory.cache_ext")"
	detach "$1"
}

setup() {
	echo +memory >"$CG/cgroup.subtree_control"
	for c in a b; do
		mkdir -p "$CG/$c"
		echo $LIMIT >"$CG/$c/memory.max"
	done
	cxtest mkfile /data/f1 $FILE_MB && cxtest mkfile /data/f2 $FILE_MB &&
		cxtest mkfile /data/s1 2 && cxtest mkfile /data/s2 2 &&
		cxtest mkfile /data/s3 4 && cxtest mkfile /data/s4 4
}

# Page cache pages charged to a cgroup, from memory.stat.
file_pages() {
	echo $(($(sed -n 's/^file //p' "$CG/$1/memory.stat") / 4096))
}

# consistent CGROUP WHAT: the registry holds a node for every page cache
# page of the cgroup (none are left from before the policy), within a few
# pages of memory.stat's count.
consistent() {
	tr=$(stat_of "$1" tracked) by=$(stat_of "$1" bypass)
	fp=$(file_pages "$1")
	d=$((fp - tr - by))
	if [ $d -ge -16 ] && [ $d -le 16 ]; then
		pass "$2: registry consistent (tracked=$tr bypass=$by, memory.stat file pages=$fp)"
	else
		fail "$2" "tracked=$tr bypass=$by but memory.stat has $fp file pages"
	fi
}

nodes_all() {
	stat_of a nodes_all_cgroups
}

test_default() {
	drop_caches
	read_pass a /data/f1 && expect "kernel default" newest
	[ "$(stat_of a policy)" = none ] &&
		pass "memory.cache_ext reports no policy" ||
		fail "memory.cache_ext" "$(cat $CG/a/memory.cache_ext)"
}

test_policies() {
	policy_pass a fifo newest
	policy_pass a lru newest
	policy_pass a mru oldest
	policy_pass a highidx oldest
}

# MRU, then swap to FIFO on the live cgroup: the next pass follows FIFO.
# The control keeps MRU for the second pass.
test_swap() {
	drop_caches
	attach a mru && read_pass a /data/f1 && expect "swap: first pass under mru" oldest
	read_pass a /data/f1 && expect "swap control: second pass still under mru" oldest
	if cxtest update "$PIN/a" "$B/fifo.bpf.o"; then
		[ "$(stat_of a policy)" = fifo ] &&
			pass "swap: link update made fifo the policy" ||
			fail "swap" "policy is $(stat_of a policy) after update"
		read_pass a /data/f1 && expect "swap: next pass under fifo" newest
	else
		fail "swap" "link update refused"
	fi
	detach a
	[ "$(stat_of a policy)" = none ] &&
		pass "detach: memory.cache_ext reports no policy" ||
		fail "detach" "policy is $(stat_of a policy)"
	drop_caches
	read_pass a /data/f1 && expect "detach: default behaviour restored" newest
}

test_two_cgroups() {
	drop_caches
	attach a mru && attach b fifo || { fail "two cgroups" "attach failed"; return; }
	cxtest read /data/f1 $CG/a &
	p1=$!
	cxtest read /data/f2 $CG/b &
	p2=$!
	wait $p1 && wait $p2 || fail "two cgroups" "a reader failed"
	set -- $(cxtest res /data/f1); H=$1 T=$2 A=$3
	expect "two cgroups: a under mru" oldest
	set -- $(cxtest res /data/f2); H=$1 T=$2 A=$3
	expect "two cgroups: b under fifo" newest
	detach a
	detach b
}

# A bad policy must leave the kernel running, the cgroup within its limit,
# and show up in the counters.  bad_check NAME CONDITION-ON-COUNTERS
bad_check() {
	drop_caches
	attach a "$1" || { fail "$1" "attach failed"; return; }
	if ! read_pass a /data/f1; then
		fail "$1" "read failed"
	fi
	prop=$(stat_of a proposed) acc=$(stat_of a accepted)
	rej=$(stat_of a rejected) fb=$(stat_of a fallbacks)
	cur=$(cat $CG/a/memory.current)
	max=$(cat $CG/a/memory.max)
	if eval "$2" && [ "$cur" -le "$max" ]; then
		pass "$1: survived, proposed=$prop accepted=$acc rejected=$rej fallbacks=$fb"
	else
		fail "$1" "proposed=$prop accepted=$acc rejected=$rej fallbacks=$fb current=$cur max=$max"
	fi
	detach a
}

test_bad_policies() {
	bad_check bad_ptr '[ "$acc" = 0 ] && [ "$rej" -gt 0 ] && [ "$fb" -gt 0 ]'
	# bad_claims breaks two rules at once; each check holds one of them
	# (with a request of r: 1000 - r claims beyond it, r - 1 copies)
	bad_check bad_claims '[ "$prop" -ge 1000 ] && [ "$rej" -ge 968 ] && [ "$acc" -gt 0 ]'
	bad_check bad_claims '[ "$acc" -gt 0 ] && [ "$rej" -ge $((acc * 999)) ]'
	bad_check noop '[ "$prop" = 0 ] && [ "$acc" = 0 ] && [ "$fb" -gt 0 ]'
}

test_verifier() {
	cxtest load "$B/bad_oob.bpf.o" 2>/tmp/oob.log &&
		fail "verifier" "bad_oob (write past the eviction context) was accepted" ||
		{ grep -q "outside the candidates of the eviction context\|access beyond struct" /tmp/oob.log &&
		  pass "verifier refuses a write past the eviction context" ||
		  fail "verifier" "bad_oob refused for another reason: $(tail -3 /tmp/oob.log)"; }
	cxtest load "$B/noop.bpf.o" && pass "verifier accepts the same shape in bounds (noop)" ||
		fail "verifier" "noop refused"
}

test_attach_errors() {
	attach a fifo || fail "attach errors" "first attach failed"
	attach a mru 2>/dev/null && fail "attach errors" "second policy on one cgroup accepted" ||
		pass "a second link on the same cgroup is refused"
	detach a
	cxtest attach "$B/fifo.bpf.o" /data "$PIN/x" 2>/dev/null &&
		fail "attach errors" "a non-cgroup target was accepted" ||
		pass "a target that is not a cgroup is refused"
}

# Admission: admit_filter refuses the pages a registered thread brings in.
# They must not stay cached once read (the read bypasses the cache), the
# data read must be right, and another reader's pages must stay.
test_bypass() {
	drop_caches
	if ! cxtest bypass "$B/admit_filter.bpf.o" "$CG/a" "$PIN/a" /data/s3 >/tmp/bp.log; then
		fail "bypass" "registered reader failed: $(cat /tmp/bp.log)"
		detach a
		return
	fi
	pass "bypass: registered reader read correct data ($(cat /tmp/bp.log))"
	cxtest verify /data/s4 "$CG/a" >/dev/null || fail "bypass" "other reader failed"
	set -- $(cxtest res /data/s3); bypassed=$3
	set -- $(cxtest res /data/s4); kept=$3
	ref=$(stat_of a admit_refused) drop=$(stat_of a bypass_dropped)
	if [ "$bypassed" = 0 ] && [ "$kept" -ge 90 ] && [ "$ref" -ge 1000 ] &&
	   [ "$drop" -ge 1000 ]; then
		pass "bypass: registered reader's file ${bypassed}% resident, other reader's ${kept}% (refused=$ref dropped=$drop)"
	else
		fail "bypass" "registered reader's file ${bypassed}% resident, other ${kept}%, refused=$ref dropped=$drop"
	fi
	cxtest verify /data/s3 "$CG/a" >/dev/null &&
		pass "bypass: the file reads correctly again from disk" ||
		fail "bypass" "re-read of the bypassed file failed"
	consistent a "bypass"
	detach a
}

# Folios cached before the policy came have no node: reclaim must still
# get rid of the cold ones and the ones accessed again are adopted by the
# policy.  The LRU reclaims alone while more than a batch, 32 pages, is
# counted left; the count is held to the cgroup's file LRU size, which
# misses the folios a reclaim has isolated or a CPU has not yet added (a
# few dozen on two CPUs), so up to some 80 pages, 15 % of the cold 2 MiB
# file, may stay.
test_preexisting() {
	drop_caches
	cxtest read /data/s1 "$CG/a" && cxtest read /data/s2 "$CG/a"
	attach a fifo || { fail "pre-existing" "attach failed"; return; }
	un0=$(stat_of a untracked_pages)
	cxtest read /data/s1 "$CG/a"	# hits: adopted
	ad=$(stat_of a adopted)
	read_pass a /data/f1 && expect "pre-existing: fifo on the pass after attach" newest
	set -- $(cxtest res /data/s2); cold=$3
	un1=$(stat_of a untracked_pages) fb=$(stat_of a fallbacks)
	cur=$(cat $CG/a/memory.current) max=$(cat $CG/a/memory.max)
	if [ "$un0" -ge 900 ] && [ "$ad" -ge 450 ] && [ "$un1" -le 32 ] &&
	   [ "$cold" -le 15 ] && [ "$fb" -gt 0 ] && [ "$cur" -le "$max" ]; then
		pass "pre-existing: untracked at attach=$un0, adopted=$ad, left=$un1, cold file ${cold}% resident, fallbacks=$fb"
	else
		fail "pre-existing" "untracked at attach=$un0 adopted=$ad left=$un1 cold file ${cold}% fallbacks=$fb current=$cur max=$max"
	fi
	detach a
}

# A policy attached to a full cache does not evict the working set it is
# still learning: s3 (4 MiB) cached and left cold, s1 (2 MiB) cached and
# read again after FIFO is attached (adopted), then 4 MiB more (s4)
# through the 8 MiB limit.  The LRU reclaims while s3's untouched pages
# are there, so they go and s1 stays; asked first, FIFO would have
# evicted s1, its oldest pages.
test_handover() {
	drop_caches
	cxtest read /data/s3 "$CG/a" && cxtest read /data/s1 "$CG/a"
	attach a fifo || { fail "handover" "attach failed"; return; }
	cxtest read /data/s1 "$CG/a"	# hits: adopted
	cxtest read /data/s4 "$CG/a"	# pressure
	set -- $(cxtest res /data/s1); hot=$3
	set -- $(cxtest res /data/s3); cold=$3
	fb=$(stat_of a fallbacks)
	if [ "$hot" -ge 90 ] && [ "$cold" -le 60 ] && [ "$fb" -gt 0 ]; then
		pass "handover: adopted file ${hot}% resident, untouched file ${cold}%, fallbacks=$fb"
	else
		fail "handover" "adopted file ${hot}% resident, untouched file ${cold}%, fallbacks=$fb"
	fi
	detach a
}

# Removal on every path takes the folio out of the registry.
test_removal() {
	drop_caches
	attach a fifo || { fail "removal" "attach failed"; return; }
	cxtest read /data/s3 "$CG/a"
	t0=$(stat_of a tracked)
	truncate -s 1M /data/s3
	t1=$(stat_of a tracked)
	[ "$t0" -ge 1000 ] && [ $((t0 - t1)) -ge 760 ] &&
		pass "truncate to a quarter: tracked $t0 -> $t1" ||
		fail "truncate" "tracked $t0 -> $t1"
	consistent a "after truncate"
	cxtest read /data/s4 "$CG/a"
	t2=$(stat_of a tracked)
	cxtest dontneed /data/s4
	t3=$(stat_of a tracked)
	[ $((t2 - t3)) -ge 1000 ] &&
		pass "POSIX_FADV_DONTNEED: tracked $t2 -> $t3" ||
		fail "fadvise" "tracked $t2 -> $t3"
	consistent a "after POSIX_FADV_DONTNEED"
	cxtest read /data/s4 "$CG/a"
	t4=$(stat_of a tracked)
	drop_caches
	t5=$(stat_of a tracked)
	[ "$t4" -ge 1000 ] && [ "$t5" -le 16 ] &&
		pass "drop_caches: tracked $t4 -> $t5" ||
		fail "drop_caches" "tracked $t4 -> $t5"
	consistent a "after drop_caches"
	detach a
	n=$(nodes_all)
	[ "$n" = 0 ] && pass "removal: no registry node left after detach" ||
		fail "removal" "$n registry nodes left after detach"
	cxtest mkfile /data/s3 4
}

# Detach while a reader works under the limit: the folios were never off
# the kernel LRU, so reclaim and drop_caches handle all of them afterwards,
# and no registry node is left.
test_detach_under_pressure() {
	drop_caches
	attach a fifo || { fail "detach under pressure" "attach failed"; return; }
	(cxtest read /data/f1 "$CG/a" && cxtest read /data/f2 "$CG/a" &&
	 cxtest read /data/f1 "$CG/a" && cxtest read /data/f2 "$CG/a") &
	rd=$!
	sleep 1
	tr=$(stat_of a tracked)
	kill -0 $rd 2>/dev/null && running=yes || running=no
	detach a
	wait $rd && rc=0 || rc=$?
	n=$(nodes_all)
	cur=$(cat $CG/a/memory.current) max=$(cat $CG/a/memory.max)
	if [ $running = yes ] && [ $rc = 0 ] && [ "$tr" -gt 0 ] && [ "$n" = 0 ] &&
	   [ "$cur" -le "$max" ]; then
		pass "detach under pressure: tracked=$tr at detach, reader finished, $n nodes left, within the limit"
	else
		fail "detach under pressure" "reader running at detach: $running, rc=$rc, tracked=$tr, nodes left=$n, current=$cur max=$max"
	fi
	read_pass a /data/f2 && expect "after detach under pressure: kernel LRU" newest
	drop_caches
	set -- $(cxtest res /data/f1); r1=$3
	set -- $(cxtest res /data/f2); r2=$3
	[ "$r1" = 0 ] && [ "$r2" = 0 ] &&
		pass "after detach under pressure: drop_caches frees every folio" ||
		fail "after detach" "f1 ${r1}% and f2 ${r2}% still resident after drop_caches"
}

# Compaction migrates page cache folios: their nodes follow them, so the
# policy's candidates stay valid (nothing rejected) and no node goes stale.
# Which folios compaction moves depends on where they sit, so: fill most
# free memory (tmpfs), cache the files in what is left, free the filler and
# compact; up to four times until some tracked folio has moved.
test_migration() {
	attach a fifo || { fail "migration" "attach failed"; return; }
	mig=0 try=0
	while [ "$mig" = 0 ] && [ $try -lt 4 ]; do
		drop_caches
		avail=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
		dd if=/dev/zero of=/tmp/fill bs=1M count=$((avail * 85 / 100 / 1024)) 2>/dev/null
		cxtest read /data/s3 "$CG/a" && cxtest read /data/s4 "$CG/a"
		rm -f /tmp/fill
		t0=$(stat_of a tracked)
		echo 1 >/proc/sys/vm/compact_memory
		mig=$(stat_of a migrated) t1=$(stat_of a tracked)
		try=$((try + 1))
	done
	[ "$mig" -gt 0 ] && [ "$t1" = "$t0" ] &&
		pass "compaction migrated $mig tracked folios (attempt $try); tracked $t0 -> $t1" ||
		fail "migration" "migrated=$mig after $try attempts, tracked $t0 -> $t1"
	consistent a "after compaction"
	cxtest verify /data/s3 "$CG/a" >/dev/null && cxtest verify /data/s4 "$CG/a" >/dev/null &&
		pass "migration: data read correctly from migrated folios" ||
		fail "migration" "verify after compaction failed"
	read_pass a /data/f1 && expect "migration: fifo after compaction" newest
	rej=$(stat_of a rejected) acc=$(stat_of a accepted)
	[ "$rej" = 0 ] && [ "$acc" -gt 0 ] &&
		pass "migration: no candidate rejected (accepted=$acc)" ||
		fail "migration" "rejected=$rej accepted=$acc"
	drop_caches
	tr=$(stat_of a tracked) fp=$(file_pages a)
	[ "$tr" -le "$fp" ] &&
		pass "migration: no stale node after drop_caches (tracked=$tr, file pages=$fp)" ||
		fail "migration" "tracked=$tr after drop_caches, only $fp file pages"
	detach a
	n=$(nodes_all)
	[ "$n" = 0 ] && pass "migration: no registry node left after detach" ||
		fail "migration" "$n registry nodes left after detach"
}

# Informational: does every policy of the library (bpf/policies) load here?
# fifo, lru and mru are tested above; the others belong to the policy
# library issue, so a refusal is reported, not counted.
report_library() {
	for o in "$B"/*.bpf.o; do
		n=$(basename "$o" .bpf.o)
		[ -f "/cachepilot/library/$n" ] || continue
		if cxtest load "$o" 2>/tmp/lib.log; then
			echo "INFO library policy $n: loads"
		else
			echo "INFO library policy $n: REFUSED: $(grep -v '^libbpf: -- \|^processed' /tmp/lib.log | tail -3 | tr '\n' ' ')"
		fi
	done
}

# The agent's access sampler (bpf/sampler.bpf.c, built for the host's
# kernel) passes the verifier and attaches on this kernel as well.
test_sampler() {
	if [ ! -x /cachepilot/sampler ]; then
		fail sampler "not in the initramfs (build bpf/ first: make bpf)"
		return
	fi
	if /cachepilot/sampler --check 2>/tmp/sampler.log; then
		pass "sampler: loads and attaches its tp_btf programs"
	else
		fail sampler "$(tail -3 /tmp/sampler.log | tr '\n' ' ')"
	fi
}

echo "cache_ext in-VM tests on $(uname -r)"
setup || { echo "FAIL setup"; exit 1; }
test_default
test_policies
test_swap
test_two_cgroups
test_bad_policies
test_verifier
test_attach_errors
test_bypass
test_preexisting
test_handover
test_removal
test_detach_under_pressure
test_migration
test_sampler
report_library
summary in-VM
