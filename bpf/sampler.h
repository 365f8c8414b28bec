/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the access sampler (sampler.bpf.c) and its loader (sampler.c) share:
 * the per-cgroup watch entry, the per-cgroup per-CPU counters and the
 * sampled-access record that crosses the ring buffer.
 *
 * The record is the 32-byte record of the sampled-access trace format
 * (models/record_format.md), so the loader can stream it to user space
 * unchanged.
 */
#ifndef CACHEPILOT_SAMPLER_H
#define CACHEPILOT_SAMPLER_H

#ifndef __BPF__
#include <linux/types.h>
#endif

/* How many cgroups one sampler can watch at once. */
#define CP_MAX_WATCHED 1024

/* Record ops: what happened to the page. */
enum cp_op {
	CP_OP_ACCESS = 0,
	CP_OP_INSERT = 1,
	CP_OP_REMOVE = 2,
};

/*
 * Watched cgroups are found through an array indexed by the low bits of the
 * cgroup id, so an event from a cgroup nobody watches costs one inlined
 * array lookup.  Two watched ids with the same low bits are rare; the later
 * one goes to an overflow hash map and the array entry is marked collided.
 */
#define CP_INDEX_BITS 16
#define CP_INDEX_SIZE (1U << CP_INDEX_BITS)
#define CP_WATCH_COLLIDED 1U

struct cp_watch {
	__u64 cgroup_id;	/* memcg kernfs id == cgroup directory inode; 0 = free */
	__u64 threshold;	/* sample a key when hash(key) < threshold */
	__u32 slot;		/* index into the counters array */
	__u32 flags;		/* CP_WATCH_COLLIDED */
};

/*
 * Counters of one watched cgroup on one CPU.  Pages, not events: an access
 * range of n pages adds n, a folio of order k adds 1 << k.
 */
struct cp_counters {
	__u64 accesses;		/* pages read through the page cache */
	__u64 inserts;		/* pages added to the page cache (misses) */
	__u64 removals;		/* pages removed from the page cache */
	__u64 sampled;		/* access records handed to the ring buffer */
	__u64 drops;		/* sampled accesses lost to a full ring buffer */
	__u64 access_events;	/* mm_filemap_get_pages calls */
	__u64 insert_events;	/* folios added */
	__u64 removal_events;	/* folios removed */
	__u64 sampled_inserts;	/* insert records handed to the ring buffer */
	__u64 insert_drops;	/* sampled inserts lost to a full ring buffer */
};

#define CP_NR_COUNTERS (sizeof(struct cp_counters) / sizeof(__u64))

/* A watched cgroup's distinct-page sketch (bpf/include/cachepilot_hll.h). */
struct cp_sketch {
	__u8 reg[1U << 12];	/* CP_HLL_REGS */
};

struct cp_record {
	__u64 key;
	__u64 time_ns;
	__u64 cgroup_id;
	__u32 tid;
	__u16 op;
	__u16 folio_order;
};

#endif /* CACHEPILOT_SAMPLER_H */
