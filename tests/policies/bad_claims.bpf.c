// SPDX-License-Identifier: GPL-2.0
/*
 * bad_claims: a FIFO that fills every slot of the eviction context with
 * its first candidate and claims 1000 candidates.  The host must look at
 * no more than ctx->request of them, take the folio once and reject the
 * copies and the surplus, counting both.
 */
#include "cache_ext_policy.h"

CP_ONE_LIST(bad_claims);

void BPF_STRUCT_OPS(bad_claims_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	struct folio *first;
	int i;

	cache_ext_list_iterate(memcg, CP_STATE.list, cp_take, ectx);
	if (!ectx->nr_candidates)
		return;
	first = ectx->candidates[0];
	for (i = 1; i < CACHE_EXT_MAX_CANDIDATES; i++)
		ectx->candidates[i] = first;
	ectx->nr_candidates = 1000;
}

CP_POLICY(bad_claims,
	  .init = (void *)bad_claims_init,
	  .evict_folios = (void *)bad_claims_evict_folios,
	  .folio_added = (void *)bad_claims_folio_added);
