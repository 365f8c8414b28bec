// SPDX-License-Identifier: GPL-2.0
/*
 * bad_many: a FIFO that claims far more candidates than the array holds.
 * The kernel must use at most ectx->request of them and count the rest as
 * rejected.
 */
#include "cache_ext_policy.h"

struct bad_many_state {
	__u64 list;
};
CP_STATE_DECL(struct bad_many_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(bad_many_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int bad_many_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(bad_many_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, bad_many_take, ectx);
	ectx->nr_candidates = 1000;
}

void BPF_STRUCT_OPS(bad_many_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(bad_many,
	  .init = (void *)bad_many_init,
	  .evict_folios = (void *)bad_many_evict_folios,
	  .folio_added = (void *)bad_many_folio_added);
