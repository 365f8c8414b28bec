// SPDX-License-Identifier: GPL-2.0
/*
 * Test policy: LRU that does not cache pages read by thread 7 (admission
 * through bpf_get_current_pid_tgid), and counts admissions per thread in
 * an array map.
 */
#include "cache_ext_policy.h"

struct atid_state {
	__u64 list;
};
CP_STATE_DECL(struct atid_state);
CP_ARRAY_MAP(atid_seen, __u32, __u64, 16);

s32 BPF_STRUCT_OPS_SLEEPABLE(atid_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static int atid_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(atid_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_iterate(memcg, CP_STATE.list, atid_take, ectx);
}

void BPF_STRUCT_OPS(atid_folio_added, struct folio *folio)
{
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

void BPF_STRUCT_OPS(atid_folio_accessed, struct folio *folio)
{
	cache_ext_list_move(CP_STATE.list, folio, true);
}

bool BPF_STRUCT_OPS(atid_admit_folio, struct cache_ext_admit_ctx *actx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 slot = tid & 15;
	__u64 *seen = bpf_map_lookup_elem(&atid_seen, &slot);

	if (tid == 7)
		return false;
	if (seen)
		(*seen)++;
	return true;
}

CP_POLICY(admit_tid,
	  .init = (void *)atid_init,
	  .evict_folios = (void *)atid_evict_folios,
	  .folio_added = (void *)atid_folio_added,
	  .folio_accessed = (void *)atid_folio_accessed,
	  .admit_folio = (void *)atid_admit_folio);
