// SPDX-License-Identifier: GPL-2.0
/*
 * noop: every callback present and empty.  Measures what the hooks cost;
 * proposing nothing, it makes every reclaim fall back to the kernel LRU.
 */
#include "cache_ext_policy.h"

s32 BPF_STRUCT_OPS_SLEEPABLE(noop_init, struct mem_cgroup *memcg)
{
	return 0;
}

void BPF_STRUCT_OPS(noop_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
}

void BPF_STRUCT_OPS(noop_folio_added, struct folio *folio)
{
}

void BPF_STRUCT_OPS(noop_folio_accessed, struct folio *folio)
{
}

void BPF_STRUCT_OPS(noop_folio_evicted, struct folio *folio)
{
}

CP_POLICY(noop,
	  .init = (void *)noop_init,
	  .evict_folios = (void *)noop_evict_folios,
	  .folio_added = (void *)noop_folio_added,
	  .folio_accessed = (void *)noop_folio_accessed,
	  .folio_evicted = (void *)noop_folio_evicted);
