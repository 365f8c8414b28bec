// SPDX-License-Identifier: GPL-2.0
/* Test policy (misbehaving): proposes the coldest folio `request` times. */
#include "cache_ext_policy.h"

struct dup_state {
	__u64 list;
	struct folio *first;
};
CP_STATE_DECL(struct dup_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(dup_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int dup_first(int idx, struct cache_ext_list_node *node)
{
	CP_STATE.first = cache_ext_node_folio(node);
	return CACHE_EXT_ITER_STOP;
}

void BPF_STRUCT_OPS(dup_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u32 i;

	CP_STATE.first = NULL;
	cache_ext_list_iterate(memcg, CP_STATE.list, dup_first, ectx);
	if (!CP_STATE.first)
		return;
	for (i = 0; i < ectx->request; i++)
		ectx->candidates[i] = CP_STATE.first;
	ectx->nr_candidates = ectx->request;
}

void BPF_STRUCT_OPS(dup_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(bad_duplicate,
	  .init = (void *)dup_init,
	  .evict_folios = (void *)dup_evict_folios,
	  .folio_added = (void *)dup_folio_added);
