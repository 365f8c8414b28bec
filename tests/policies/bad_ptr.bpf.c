// SPDX-License-Identifier: GPL-2.0
/*
 * bad_ptr: proposes pointers that are no folio of the cgroup: NULL, a user
 * address, an unaligned kernel address, a direct-map address.  All must be
 * rejected without being dereferenced.
 */
#include "cache_ext_policy.h"

void BPF_STRUCT_OPS(bad_ptr_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u64 bogus[4] = {
		0, 0x400000, 0xffffffff81000003ULL, 0xffff888000001000ULL,
	};
	int i;

	for (i = 0; i < CACHE_EXT_MAX_CANDIDATES; i++)
		ectx->candidates[i] = (struct folio *)(bogus[i & 3] + 64 * (i >> 2));
	ectx->nr_candidates = CACHE_EXT_MAX_CANDIDATES;
}

CP_POLICY(bad_ptr, .evict_folios = (void *)bad_ptr_evict_folios);
