// SPDX-License-Identifier: GPL-2.0
/*
 * highidx: batch scoring test policy.  Score = minus the page index, so
 * cache_ext_list_score() proposes the highest file offsets first; a file
 * read front to back keeps its beginning cached.
 */
#include "cache_ext_policy.h"

CP_ONE_LIST(highidx);

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

CP_POLICY(highidx,
	  .init = (void *)highidx_init,
	  .evict_folios = (void *)highidx_evict_folios,
	  .folio_added = (void *)highidx_folio_added);
