// SPDX-License-Identifier: GPL-2.0
/*
 * Test policy: LFU through batch scoring, ties broken by least recent
 * access (cp_clock); exercises hash maps, cache_ext_list_score and the
 * per-instance clock.
 */
#include "cache_ext_policy.h"

struct slfu_state {
	__u64 list;
};
CP_STATE_DECL(struct slfu_state);

struct slfu_meta {
	__u64 count;
	__u64 last;
};
CP_HASH_MAP(slfu_meta, __u64, struct slfu_meta, 1 << 20);

s32 BPF_STRUCT_OPS_SLEEPABLE(slfu_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static __s64 slfu_score(int idx, struct cache_ext_list_node *node)
{
	__u64 id = cp_folio_id(cache_ext_node_folio(node));
	struct slfu_meta *m = bpf_map_lookup_elem(&slfu_meta, &id);

	if (!m)
		return 0;
	return (__s64)(m->count << 40 | (m->last & ((1ULL << 40) - 1)));
}

void BPF_STRUCT_OPS(slfu_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cache_ext_list_score(memcg, CP_STATE.list, slfu_score, ectx, 1 << 20);
}

void BPF_STRUCT_OPS(slfu_folio_added, struct folio *folio)
{
	struct slfu_meta m = { 0, 0 };
	__u64 id = cp_folio_id(folio);

	bpf_map_update_elem(&slfu_meta, &id, &m, BPF_NOEXIST);
	cache_ext_list_add_tail(CP_STATE.list, folio);
}

void BPF_STRUCT_OPS(slfu_folio_accessed, struct folio *folio)
{
	struct slfu_meta *m = cp_page_of(&slfu_meta, folio);

	if (m) {
		m->count++;
		m->last = cp_clock();
	}
}

void BPF_STRUCT_OPS(slfu_folio_evicted, struct folio *folio)
{
	cp_page_del(&slfu_meta, folio);
}

CP_POLICY(score_lfu,
	  .init = (void *)slfu_init,
	  .evict_folios = (void *)slfu_evict_folios,
	  .folio_added = (void *)slfu_folio_added,
	  .folio_accessed = (void *)slfu_folio_accessed,
	  .folio_evicted = (void *)slfu_folio_evicted);
