// SPDX-License-Identifier: GPL-2.0
/*
 * TEMPLATE: a complete, small policy to copy when writing your own.  It is
 * CLOCK (second chance): pages sit on one list in insertion order; reclaim
 * walks from the head, gives a page that was read since the hand last
 * passed one more lap (moves it to the tail, clears its bit) and proposes
 * the first page that was not.
 *
 * To make your own:
 *   1. cp bpf/policies/template/policy.bpf.c my_policy.bpf.c
 *   2. rename "clock" in the CP_POLICY line and the clock_ prefixes
 *      (callback names must be unique across the library);
 *   3. cachepilot policy check my_policy.bpf.c
 *      compiles it natively and with clang -target bpf, runs a smoke
 *      simulation and prints its miss-ratio curve beside LRU's;
 *   4. put it in bpf/policies/ to build it into the simulator for good and
 *      make it loadable by the agent; `cachepilot mrc TRACE --policy all`
 *      then draws its curve with the others.
 *
 * Rules of the game (bpf/include/cache_ext_policy.h says more):
 *   - include only cache_ext_policy.h; reach folio fields through its
 *     accessors (cp_folio_id, cp_folio_key, cp_folio_ino, cp_folio_index);
 *   - all global state in ONE struct declared with CP_STATE_DECL and used
 *     as CP_STATE.field: every simulated cache gets its own copy;
 *   - per-page metadata in a CP_PAGE_MAP (the loader sizes it to the
 *     cgroup); other maps with CP_HASH_MAP / CP_LRU_HASH_MAP /
 *     CP_ARRAY_MAP; all used through bpf_map_lookup_elem / update /
 *     delete as in any BPF program (cp_page_of / cp_page_del for a
 *     page's entry);
 *   - stay within the verifier's rules: bounded loops, no signed division,
 *     no pointers stored in maps, no recursion;
 *   - never name a callback parameter `ctx` (BPF_PROG uses that name);
 *   - the read that brings a page in calls folio_added then
 *     folio_accessed, so count reuse from the second access on
 *     (cp_first_access);
 *   - a page whose entry finds the map full (cp_page_add fails) still
 *     needs a place: put it where reclaim looks first;
 *   - evict from the head: iterate/score start there; propose at most
 *     ectx->request pages; the host evicts them, calls folio_evicted and
 *     unlinks them from your list.
 */
#include "cache_ext_policy.h"

/* 1. global state: one struct, per instance */
struct clock_state {
	__u64 list;
};
CP_STATE_DECL(struct clock_state);

/* 2. per-page metadata, keyed by the folio's id, one entry per page */
struct clock_page {
	__u8 referenced;
	__u8 fresh;		/* the access that inserted it is pending */
};
CP_PAGE_MAP(clock_pages, struct clock_page);

/* 3. callbacks */
s32 BPF_STRUCT_OPS_SLEEPABLE(clock_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

/* Called by cache_ext_list_iterate() for each node from the head. */
static int clock_hand(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);
	__u64 id = cp_folio_id(folio);
	struct clock_page *page = bpf_map_lookup_elem(&clock_pages, &id);

	if (page && page->referenced) {
		page->referenced = 0;
		cache_ext_list_move(CP_STATE.list, folio, true);
		return CACHE_EXT_ITER_CONTINUE;
	}
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(clock_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, clock_hand, ectx);
}

void BPF_STRUCT_OPS(clock_folio_added, struct folio *folio)
{
	struct clock_page page = { .fresh = 1 };
	/* no room: the page joins unreferenced, so the hand takes it */
	bool tracked = !cp_page_add(&clock_pages, folio, &page);

	if (cache_ext_list_add_tail(CP_STATE.list, folio) && tracked)
		cp_page_del(&clock_pages, folio);
}

void BPF_STRUCT_OPS(clock_folio_accessed, struct folio *folio)
{
	struct clock_page *page = cp_page_of(&clock_pages, folio);

	if (page && !cp_first_access(&page->fresh))
		page->referenced = 1;
}

void BPF_STRUCT_OPS(clock_folio_evicted, struct folio *folio)
{
	cp_page_del(&clock_pages, folio);
}

/* 4. the ops table: the policy's name and its callbacks */
CP_POLICY(clock,
	  .init = (void *)clock_init,
	  .evict_folios = (void *)clock_evict_folios,
	  .folio_added = (void *)clock_folio_added,
	  .folio_accessed = (void *)clock_folio_accessed,
	  .folio_evicted = (void *)clock_folio_evicted);
