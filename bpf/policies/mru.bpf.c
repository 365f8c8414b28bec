// SPDX-License-Identifier: GPL-2.0
/*
 * MRU: evict the most recently accessed page; good for loops larger than
 * the cache.  Accessed pages go to the head of the used list, where
 * eviction starts.
 *
 * A new page waits on the fresh list until it is first read: in the
 * kernel, readahead inserts pages ahead of the reader, and evicting those
 * first would throw away the very pages about to be read.  But not every
 * page inserted is ever read through a hook that reports it: readahead
 * past what the reader wants, and above all pages reached only through
 * mmap (a program's own binary and libraries), whose accesses no hook
 * reports.  Left waiting, such pages would never be evicted (eviction
 * would never get past the used list) and would take the cache from the
 * loop.  So a fresh page that has not been read while more than
 * an eighth of the cache has been inserted after it is stale, an unused
 * prefetch, and goes first.  A read that misses inserts and then
 * accesses its page, so a trace-driven simulation never sees a fresh
 * page at reclaim and is exact MRU.
 *
 * A fresh page that finds the map full (more pages than the capacity) is
 * counted and taken for stale: it goes first unless read.
 */
#include "cache_ext_policy.h"

#define MRU_MIN_WINDOW 64	/* pages inserted before an unread one is stale */

struct mru_state {
	__u64 fresh, used;
	__u64 inserted;		/* pages inserted so far: the fresh clock */
	__s64 nr_cached;	/* pages held */
	__u64 window;		/* staleness window of the running reclaim */
	__u32 fill;		/* the last walk proposes fresh pages too */
};
CP_STATE_DECL(struct mru_state);

/* fresh page -> CP_STATE.inserted when it came in */
CP_PAGE_MAP(mru_fresh, __u64);

s32 BPF_STRUCT_OPS_SLEEPABLE(mru_init, struct mem_cgroup *memcg)
{
	CP_STATE.fresh = cache_ext_list_create(memcg);
	CP_STATE.used = cache_ext_list_create(memcg);
	return CP_STATE.fresh && CP_STATE.used ? 0 : -1;
}

/* A fresh page nobody has read while CP_STATE.window pages came in after. */
static bool mru_stale(struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	__u64 *seq = bpf_map_lookup_elem(&mru_fresh, &id);

	/* not in the map (full): nothing says it is about to be read */
	return !seq || CP_STATE.inserted - *seq > CP_STATE.window;
}

static int mru_take_stale(int idx, struct cache_ext_list_node *node)
{
	/* The fresh list is in insertion order: the rest are newer. */
	return mru_stale(cache_ext_node_folio(node)) ? CACHE_EXT_ITER_EVICT :
						       CACHE_EXT_ITER_STOP;
}

static int mru_take(int idx, struct cache_ext_list_node *node)
{
	/* On the fresh list, the last resort: the ones not proposed yet. */
	if (CP_STATE.fill && mru_stale(cache_ext_node_folio(node)))
		return CACHE_EXT_ITER_CONTINUE;
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(mru_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u64 window = CP_STATE.nr_cached > 0 ? (__u64)CP_STATE.nr_cached / 8 : 0;

	CP_STATE.window = window > MRU_MIN_WINDOW ? window : MRU_MIN_WINDOW;
	/* unused prefetches first, then the most recently read pages */
	cache_ext_list_iterate(memcg, CP_STATE.fresh, mru_take_stale, ectx);
	CP_STATE.fill = 0;
	cache_ext_list_iterate(memcg, CP_STATE.used, mru_take, ectx);
	/* only pages still waiting for their reader are left */
	CP_STATE.fill = 1;
	cache_ext_list_iterate(memcg, CP_STATE.fresh, mru_take, ectx);
}

void BPF_STRUCT_OPS(mru_folio_added, struct folio *folio)
{
	__u64 seq = ++CP_STATE.inserted;

	CP_STATE.nr_cached++;
	cp_page_add(&mru_fresh, folio, &seq);
	cache_ext_list_add_tail(CP_STATE.fresh, folio);
}

void BPF_STRUCT_OPS(mru_folio_accessed, struct folio *folio)
{
	cp_page_del(&mru_fresh, folio);
	cache_ext_list_move(CP_STATE.used, folio, false);
}

void BPF_STRUCT_OPS(mru_folio_evicted, struct folio *folio)
{
	CP_STATE.nr_cached--;
	cp_page_del(&mru_fresh, folio);
}

CP_POLICY(mru,
	  .init = (void *)mru_init,
	  .evict_folios = (void *)mru_evict_folios,
	  .folio_added = (void *)mru_folio_added,
	  .folio_accessed = (void *)mru_folio_accessed,
	  .folio_evicted = (void *)mru_folio_evicted);
