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

/* watch map value, keyed by the memcg's cgroup id (kernfs id == dir inode) */
struct cp_watch {
	__u64 threshold;	/* sample a key when hash(key) < threshold */
	__u32 slot;		/* index into the counters array */
	__u32 flags;
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
};

#define CP_NR_COUNTERS (sizeof(struct cp_counters) / sizeof(__u64))

struct cp_record {
	__u64 key;
	__u64 time_ns;
	__u64 cgroup_id;
	__u32 tid;
	__u16 op;
	__u16 folio_order;
};

#endif /* CACHEPILOT_SAMPLER_H */
