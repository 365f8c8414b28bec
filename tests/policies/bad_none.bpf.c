// SPDX-License-Identifier: GPL-2.0
/* Test policy (misbehaving): never proposes a candidate. */
#include "cache_ext_policy.h"

struct none_state {
	__u64 calls;
};
CP_STATE_DECL(struct none_state);

void BPF_STRUCT_OPS(none_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	CP_STATE.calls++;
}

CP_POLICY(bad_none, .evict_folios = (void *)none_evict_folios);
