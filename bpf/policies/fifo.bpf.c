// SPDX-License-Identifier: GPL-2.0
/*
 * FIFO: evict pages in the order they entered the cache; accesses change
 * nothing.
 */
#include "cache_ext_policy.h"

struct fifo_state {
	__u64 list;
};
CP_STATE_DECL(struct fifo_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(fifo_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

void BPF_STRUCT_OPS(fifo_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, cp_take, ectx);
}

void BPF_STRUCT_OPS(fifo_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(fifo,
	  .init = (void *)fifo_init,
	  .evict_folios = (void *)fifo_evict_folios,
	  .folio_added = (void *)fifo_folio_added);
