// SPDX-License-Identifier: GPL-2.0
/*
 * bad_oob: writes past the end of the eviction context.  The verifier must
 * refuse to load it.
 */
#include "cache_ext_policy.h"

void BPF_STRUCT_OPS(bad_oob_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	/* candidates[32] is one past the array: byte 8 + 32 * 8 */
	((volatile __u64 *)ectx)[1 + CACHE_EXT_MAX_CANDIDATES] = 0;
}

CP_POLICY(bad_oob, .evict_folios = (void *)bad_oob_evict_folios);
