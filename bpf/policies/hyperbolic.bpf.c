// SPDX-License-Identifier: GPL-2.0
/*
 * Hyperbolic caching (Blankstein et al., ATC'17; PageFlex's example policy):
 * a page's priority is its hit count divided by the time since it was
 * brought in, and the page of lowest priority goes.  New pages start with
 * one hit, so a page that is never read again sinks as 1/age while a page
 * read often keeps its priority as it ages.
 *
 * Time is the policy's access count (cp_clock() runs in nanoseconds in the
 * kernel; counting accesses keeps the two builds alike).  Eviction scores
 * HYP_NR_SCORE pages at the head of a list kept in insertion order and
 * proposes the lowest; the window's survivors are rotated to the tail at
 * the start of the next round, so successive rounds sweep the cache like a
 * clock hand.  The priority is fixed point (hits << 24) / age.
 *
 * Differences from libCacheSim's Hyperbolic: libCacheSim samples 64 random
 * objects per eviction; here the sample is the next HYP_NR_SCORE pages of
 * the sweep, and hit counts saturate at 2^32 - 1.
 */
#include "cache_ext_policy.h"

#define HYP_NR_SCORE 64
#define HYP_SHIFT 24
#define HYP_MAX_PAGES (1 << 22)

struct hyp_page {
	__u64 born;		/* access count when the page came in */
	__u32 hits;
	__u8 fresh;		/* the access that inserted it is pending */
};

struct hyperbolic_state {
	__u64 list;
	__u64 now;
	__u32 to_rotate;
	__u32 rotated;
};
CP_STATE_DECL(struct hyperbolic_state);

CP_HASH_MAP(hyp_pages, __u64, struct hyp_page, HYP_MAX_PAGES);

s32 BPF_STRUCT_OPS_SLEEPABLE(hyperbolic_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static __s64 hyperbolic_score(int idx, struct cache_ext_list_node *node)
{
	__u64 id = cp_folio_id(cache_ext_node_folio(node));
	struct hyp_page *page = bpf_map_lookup_elem(&hyp_pages, &id);
	__u64 age;

	if (!page)
		return -1;
	age = CP_STATE.now - page->born + 1;
	return (__s64)(((__u64)page->hits << HYP_SHIFT) / age);
}

static int hyperbolic_rotate(int idx, struct cache_ext_list_node *node)
{
	if (CP_STATE.rotated >= CP_STATE.to_rotate)
		return CACHE_EXT_ITER_STOP;
	CP_STATE.rotated++;
	cache_ext_list_move(CP_STATE.list, cache_ext_node_folio(node), true);
	return CACHE_EXT_ITER_CONTINUE;
}

void BPF_STRUCT_OPS(hyperbolic_evict_folios,
		    struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	int scored;

	if (CP_STATE.to_rotate) {
		CP_STATE.rotated = 0;
		cache_ext_list_iterate(memcg, CP_STATE.list, hyperbolic_rotate,
				       ectx);
	}
	scored = cache_ext_list_score(memcg, CP_STATE.list, hyperbolic_score,
				      ectx, HYP_NR_SCORE);
	CP_STATE.to_rotate = scored > (int)ectx->nr_candidates ?
			     scored - ectx->nr_candidates : 0;
}

void BPF_STRUCT_OPS(hyperbolic_folio_added, struct folio *folio)
{
	struct hyp_page page = { .born = CP_STATE.now, .hits = 1, .fresh = 1 };
	__u64 id = cp_folio_id(folio);

	if (bpf_map_update_elem(&hyp_pages, &id, &page, BPF_ANY))
		return;
	if (cache_ext_list_add_tail(CP_STATE.list, folio))
		bpf_map_delete_elem(&hyp_pages, &id);
}

void BPF_STRUCT_OPS(hyperbolic_folio_accessed, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct hyp_page *page = bpf_map_lookup_elem(&hyp_pages, &id);

	CP_STATE.now++;
	if (!page)
		return;
	if (page->fresh) {
		page->fresh = 0;
		return;
	}
	if (page->hits != (__u32)-1)
		page->hits++;
}

void BPF_STRUCT_OPS(hyperbolic_folio_evicted, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);

	bpf_map_delete_elem(&hyp_pages, &id);
}

CP_POLICY(hyperbolic,
	  .init = (void *)hyperbolic_init,
	  .evict_folios = (void *)hyperbolic_evict_folios,
	  .folio_added = (void *)hyperbolic_folio_added,
	  .folio_accessed = (void *)hyperbolic_folio_accessed,
	  .folio_evicted = (void *)hyperbolic_folio_evicted);
