// SPDX-License-Identifier: GPL-2.0
/*
 * bad_dup: proposes the same folio in every slot.  The kernel must take it
 * once and reject the copies.
 */
#include "cache_ext_policy.h"

struct bad_dup_state {
	__u64 list;
};
CP_STATE_DECL(struct bad_dup_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(bad_dup_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int bad_dup_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(bad_dup_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	struct folio *first;
	int i;

	cache_ext_list_iterate(memcg, CP_STATE.list, bad_dup_take, ectx);
	if (!ectx->nr_candidates)
		return;
	first = ectx->candidates[0];
	for (i = 1; i < CACHE_EXT_MAX_CANDIDATES; i++)
		ectx->candidates[i] = first;
	ectx->nr_candidates = CACHE_EXT_MAX_CANDIDATES;
}

void BPF_STRUCT_OPS(bad_dup_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(bad_dup,
	  .init = (void *)bad_dup_init,
	  .evict_folios = (void *)bad_dup_evict_folios,
	  .folio_added = (void *)bad_dup_folio_added);
