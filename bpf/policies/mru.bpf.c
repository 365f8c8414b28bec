// SPDX-License-Identifier: GPL-2.0
/*
 * MRU: evict the most recently accessed page; good for loops larger than
 * the cache.  Accessed pages go to the head, where eviction starts.  A new
 * page waits at the tail until it is first read: in the kernel, readahead
 * inserts pages ahead of the reader, and evicting those first would throw
 * away the very pages about to be read.  A read that misses inserts and
 * then accesses its page, so a trace-driven simulation sees no difference.
 */
#include "cache_ext_policy.h"

struct mru_state {
	__u64 list;
};
CP_STATE_DECL(struct mru_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(mru_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int mru_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(mru_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, mru_take, ectx);
}

void BPF_STRUCT_OPS(mru_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

void BPF_STRUCT_OPS(mru_folio_accessed, struct folio *folio)
{
	cache_ext_list_move(CP_STATE.list, folio, false);
}

CP_POLICY(mru,
	  .init = (void *)mru_init,
	  .evict_folios = (void *)mru_evict_folios,
	  .folio_added = (void *)mru_folio_added,
	  .folio_accessed = (void *)mru_folio_accessed);
