// SPDX-License-Identifier: GPL-2.0
/*
 * Test policy (misbehaving): FIFO order, but proposes up to 32 folios
 * whatever ctx->request says, and then claims 40 candidates, more than
 * the array holds.
 */
#include "cache_ext_policy.h"

struct many_state {
	__u64 list;
};
CP_STATE_DECL(struct many_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(many_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int many_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(many_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	/* raise the request the walk sees; the host keeps its own */
	ectx->request = CACHE_EXT_MAX_CANDIDATES;
	cache_ext_list_iterate(memcg, CP_STATE.list, many_take, ectx);
	ectx->nr_candidates = 40;
}

void BPF_STRUCT_OPS(many_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(bad_too_many,
	  .init = (void *)many_init,
	  .evict_folios = (void *)many_evict_folios,
	  .folio_added = (void *)many_folio_added);
