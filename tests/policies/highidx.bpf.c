// SPDX-License-Identifier: GPL-2.0
/*
 * highidx: batch scoring test policy.  Score = minus the page index, so
 * cache_ext_list_score() proposes the highest file offsets first; a file
 * read front to back keeps its beginning cached.
 */
#include "cache_ext_policy.h"

struct highidx_state {
	__u64 list;
};
CP_STATE_DECL(struct highidx_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(highidx_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static __s64 highidx_score(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);

	if (!folio)
		return 0;
	/* beyond the s32 range on purpose: scores are 64-bit */
	return -(__s64)cp_folio_index(folio) - (1LL << 40);
}

void BPF_STRUCT_OPS(highidx_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_score(memcg, CP_STATE.list, highidx_score, ectx, 16384);
}

void BPF_STRUCT_OPS(highidx_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

CP_POLICY(highidx,
	  .init = (void *)highidx_init,
	  .evict_folios = (void *)highidx_evict_folios,
	  .folio_added = (void *)highidx_folio_added);
