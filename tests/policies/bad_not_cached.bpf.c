// SPDX-License-Identifier: GPL-2.0
/*
 * Test policy (misbehaving): proposes the folio it saw evicted last (no
 * longer cached) and a pointer that is no folio of the cache at all.
 */
#include "cache_ext_policy.h"

struct nc_state {
	struct folio *last_evicted;
	struct folio fake;
};
CP_STATE_DECL(struct nc_state);

void BPF_STRUCT_OPS(nc_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u32 n = 0;

	if (CP_STATE.last_evicted)
		ectx->candidates[n++] = CP_STATE.last_evicted;
	if (n < ectx->request)
		ectx->candidates[n++] = &CP_STATE.fake;
	ectx->nr_candidates = n;
}

void BPF_STRUCT_OPS(nc_folio_evicted, struct folio *folio)
{
	CP_STATE.last_evicted = folio;
}

CP_POLICY(bad_not_cached,
	  .evict_folios = (void *)nc_evict_folios,
	  .folio_evicted = (void *)nc_folio_evicted);
