// SPDX-License-Identifier: GPL-2.0
/*
 * LRU: evict the least recently accessed page.  The list runs from least
 * (head) to most (tail) recently used.
 */
#include "cache_ext_policy.h"

struct lru_state {
	__u64 list;
};
CP_STATE_DECL(struct lru_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(lru_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

void BPF_STRUCT_OPS(lru_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, cp_take, ectx);
}

void BPF_STRUCT_OPS(lru_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

void BPF_STRUCT_OPS(lru_folio_accessed, struct folio *folio)
{
	cache_ext_list_move(CP_STATE.list, folio, true);
}

CP_POLICY(lru,
	  .init = (void *)lru_init,
	  .evict_folios = (void *)lru_evict_folios,
	  .folio_added = (void *)lru_folio_added,
	  .folio_accessed = (void *)lru_folio_accessed);
