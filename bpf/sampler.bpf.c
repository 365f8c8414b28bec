// SPDX-License-Identifier: GPL-2.0
/*
 * cachepilot access sampler.
 *
 * Three tp_btf programs on the filemap tracepoints count every page-cache
 * access, insertion and removal of each watched memory cgroup, and hand
 * the accesses whose page key hashes under the cgroup's SHARDS threshold
 * to user space through a ring buffer.
 *
 * A cgroup is named by its memcg's kernfs id, which is the inode number of
 * the cgroup directory in both cgroup v1 and v2; user space fills the
 * watch maps with those ids.  An event from a cgroup nobody watches costs
 * one array lookup (see sampler.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "cachepilot_hash.h"
#include "sampler.h"

char LICENSE[] SEC("license") = "GPL";

/* Longest access range sampled page by page; longer ranges are counted. */
#define CP_MAX_RANGE (1 << 20)
/* Ranges up to this many pages are sampled inline, longer ones in bpf_loop. */
#define CP_INLINE_RANGE 4

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_INDEX_SIZE);
	__type(key, __u32);
	__type(value, struct cp_watch);
} watch_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_WATCHED);
	__type(key, __u64);
	__type(value, struct cp_watch);
} watch_overflow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CP_MAX_WATCHED);
	__type(key, __u32);
	__type(value, struct cp_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);	/* resized by the loader before load */
} records SEC(".maps");

/*
 * memcg_data's low bits are flags (below __NR_MEMCG_DATA_FLAGS); the rest is
 * a struct mem_cgroup *.  Older kernels without the enum use the same bits.
 */
static __always_inline unsigned long memcg_data_flags_mask(void)
{
	if (bpf_core_enum_value_exists(enum page_memcg_data_flags, __NR_MEMCG_DATA_FLAGS))
		return bpf_core_enum_value(enum page_memcg_data_flags, __NR_MEMCG_DATA_FLAGS) - 1;
	return 3UL;
}

static __always_inline __u64 css_cgroup_id(struct cgroup_subsys_state *css)
{
	if (!css)
		return 0;
	return BPF_CORE_READ(css, cgroup, kn, id);
}

/*
 * The memory cgroup of the running task (v1 and v2 alike).  This runs on
 * every page-cache read of every task, watched or not, so it walks the
 * pointers with plain BTF loads (faulting loads are caught by the
 * verifier's exception table) instead of probe-read helper calls.
 */
static __always_inline __u64 task_memcg_id(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	int id = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
	struct cgroup_subsys_state *css;
	struct css_set *cset;

	if (id < 0 || id >= CGROUP_SUBSYS_COUNT)
		return 0;
	cset = task->cgroups;
	if (!cset)
		return 0;
	css = cset->subsys[id];
	if (!css || !css->cgroup || !css->cgroup->kn)
		return 0;
	return css->cgroup->kn->id;
}

/* The memory cgroup a folio is charged to. */
static __always_inline __u64 folio_memcg_id(struct folio *folio)
{
	unsigned long data = BPF_CORE_READ(folio, memcg_data);
	struct mem_cgroup *memcg;

	memcg = (struct mem_cgroup *)(data & ~memcg_data_flags_mask());
	if (!memcg)
		return 0;
	return css_cgroup_id(&memcg->css);
}

static __always_inline __u32 folio_order_of(struct folio *folio)
{
	int head = bpf_core_enum_value(enum pageflags, PG_head);
	unsigned long flags = 0;

	/* page flags are the first word of a folio in every layout */
	bpf_probe_read_kernel(&flags, sizeof(flags), folio);
	if (!(flags & (1UL << head)))
		return 0;
	return BPF_CORE_READ(folio, _flags_1) & 0xff;
}

static __always_inline __u64 mapping_file_id(struct address_space *mapping)
{
	struct inode *host = mapping->host;
	__u64 dev, ino;

	if (!host)
		return 0;
	dev = host->i_sb ? host->i_sb->s_dev : 0;
	ino = host->i_ino;
	/* cp_page_key(dev, ino, index) == file id ^ index */
	return cp_hash64(cp_hash64(dev) ^ ino);
}

struct sample_ctx {
	__u64 file_id;
	__u64 first;
	__u64 threshold;
	__u64 cgroup_id;
	__u64 sampled;
	__u64 drops;
};

static __always_inline void sample_page(struct sample_ctx *s, __u64 index)
{
	__u64 key = s->file_id ^ index;
	struct cp_record *r;

	if (!cp_sampled(key, s->threshold))
		return;
	r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r) {
		s->drops++;
		return;
	}
	r->key = key;
	r->time_ns = bpf_ktime_get_ns();
	r->cgroup_id = s->cgroup_id;
	r->tid = (__u32)bpf_get_current_pid_tgid();
	r->op = CP_OP_ACCESS;
	r->folio_order = 0;
	/*
	 * Waking the reader for every record would cost more than the
	 * sampling itself; the loader polls on a short timeout and is only
	 * woken early, once the buffer is half full.
	 */
	if (bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA) >
	    bpf_ringbuf_query(&records, BPF_RB_RING_SIZE) / 2)
		bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	else
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	s->sampled++;
}

static long sample_page_cb(__u64 i, void *data)
{
	struct sample_ctx *s = data;

	sample_page(s, s->first + i);
	return 0;
}

static __always_inline struct cp_watch *find_watch(__u64 cgid)
{
	__u32 i = cgid & (CP_INDEX_SIZE - 1);
	struct cp_watch *w = bpf_map_lookup_elem(&watch_index, &i);

	if (!w || !cgid)
		return NULL;
	if (w->cgroup_id == cgid)
		return w;
	if (!(w->flags & CP_WATCH_COLLIDED))
		return NULL;
	return bpf_map_lookup_elem(&watch_overflow, &cgid);
}

static __always_inline struct cp_counters *watched(__u64 cgid, struct cp_watch **w)
{
	__u32 slot;

	*w = find_watch(cgid);
	if (!*w)
		return NULL;
	slot = (*w)->slot;
	return bpf_map_lookup_elem(&counters, &slot);
}

SEC("tp_btf/mm_filemap_get_pages")
int BPF_PROG(on_get_pages, struct address_space *mapping, unsigned long index,
	     unsigned long last_index)
{
	struct sample_ctx s = {};
	struct cp_counters *c;
	struct cp_watch *w;
	__u64 n;

	s.cgroup_id = task_memcg_id();
	c = watched(s.cgroup_id, &w);
	if (!c)
		return 0;
	if (last_index < index)
		return 0;
	n = last_index - index + 1;
	c->accesses += n;
	c->access_events++;

	s.threshold = w->threshold;
	if (!s.threshold)
		return 0;
	s.file_id = mapping_file_id(mapping);
	s.first = index;
	if (n <= CP_INLINE_RANGE) {
		for (int i = 0; i < CP_INLINE_RANGE; i++) {
			if (i >= n)
				break;
			sample_page(&s, index + i);
		}
	} else {
		if (n > CP_MAX_RANGE)
			n = CP_MAX_RANGE;
		bpf_loop(n, sample_page_cb, &s, 0);
	}
	c->sampled += s.sampled;
	c->drops += s.drops;
	return 0;
}

SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(on_add_folio, struct folio *folio)
{
	struct cp_counters *c;
	struct cp_watch *w;

	c = watched(folio_memcg_id(folio), &w);
	if (!c)
		return 0;
	c->inserts += 1ULL << folio_order_of(folio);
	c->insert_events++;
	return 0;
}

SEC("tp_btf/mm_filemap_delete_from_page_cache")
int BPF_PROG(on_delete_folio, struct folio *folio)
{
	struct cp_counters *c;
	struct cp_watch *w;

	c = watched(folio_memcg_id(folio), &w);
	if (!c)
		return 0;
	c->removals += 1ULL << folio_order_of(folio);
	c->removal_events++;
	return 0;
}
