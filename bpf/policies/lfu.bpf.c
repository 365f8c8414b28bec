// SPDX-License-Identifier: GPL-2.0
/*
 * LFU: evict the least frequently used pages, approximately, by batch
 * scoring as the cache_ext paper does.
 *
 * One list in insertion order.  Each reclaim round scores the first
 * LFU_NR_SCORE pages from the head by their access count and proposes the
 * lowest; the pages of that window that survive are rotated to the tail at
 * the start of the next round, so successive rounds sweep the whole list
 * like a clock hand and every page is looked at once per lap.
 *
 * Differences from libCacheSim's LFU (exact LFU, FIFO among equal counts):
 * the minimum is taken over a window of LFU_NR_SCORE pages, not the whole
 * cache, so with a cache larger than the window a page is evicted when it
 * is the least used of its window, not of the cache.  Counts are kept only
 * while a page is cached (libCacheSim does the same) and saturate at
 * 2^32 - 1.  Equal counts are evicted in list order, which is insertion
 * order within a lap.
 */
#include "cache_ext_policy.h"

/* How many pages one round scores (cache_ext's paper uses 512). */
#define LFU_NR_SCORE 512
#define LFU_MAX_PAGES (1 << 22)
#define LFU_TIME_BITS 40
#define LFU_MAX_FREQ ((1U << 23) - 1)

struct lfu_page {
	__u64 stamp;		/* time of the last access */
	__u32 freq;		/* accesses since the page was cached */
	__u8 fresh;		/* the access that inserted it is pending */
};

struct lfu_state {
	__u64 list;
	__u64 now;
	__u32 to_rotate;	/* survivors of the last scored window */
	__u32 rotated;
};
CP_STATE_DECL(struct lfu_state);

CP_HASH_MAP(lfu_pages, __u64, struct lfu_page, LFU_MAX_PAGES);

s32 BPF_STRUCT_OPS_SLEEPABLE(lfu_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	return CP_STATE.list ? 0 : -1;
}

static __s64 lfu_score(int idx, struct cache_ext_list_node *node)
{
	__u64 id = cp_folio_id(cache_ext_node_folio(node));
	struct lfu_page *page = bpf_map_lookup_elem(&lfu_pages, &id);

	/* a page the policy never saw (added before it was loaded) goes first */
	if (!page)
		return -1;
	return (__s64)((__u64)page->freq << LFU_TIME_BITS |
		       (page->stamp & ((1ULL << LFU_TIME_BITS) - 1)));
}

static int lfu_rotate(int idx, struct cache_ext_list_node *node)
{
	if (CP_STATE.rotated >= CP_STATE.to_rotate)
		return CACHE_EXT_ITER_STOP;
	CP_STATE.rotated++;
	cache_ext_list_move(CP_STATE.list, cache_ext_node_folio(node), true);
	return CACHE_EXT_ITER_CONTINUE;
}

void BPF_STRUCT_OPS(lfu_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	int scored;

	/* move last round's survivors out of the way: the hand advances */
	if (CP_STATE.to_rotate) {
		CP_STATE.rotated = 0;
		cache_ext_list_iterate(memcg, CP_STATE.list, lfu_rotate, ectx);
	}
	scored = cache_ext_list_score(memcg, CP_STATE.list, lfu_score, ectx,
				      LFU_NR_SCORE);
	CP_STATE.to_rotate = scored > (int)ectx->nr_candidates ?
			     scored - ectx->nr_candidates : 0;
}

void BPF_STRUCT_OPS(lfu_folio_added, struct folio *folio)
{
	struct lfu_page page = { .stamp = CP_STATE.now, .fresh = 1 };
	__u64 id = cp_folio_id(folio);

	if (bpf_map_update_elem(&lfu_pages, &id, &page, BPF_ANY))
		return;
	if (cache_ext_list_add_tail(CP_STATE.list, folio))
		bpf_map_delete_elem(&lfu_pages, &id);
}

void BPF_STRUCT_OPS(lfu_folio_accessed, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct lfu_page *page = bpf_map_lookup_elem(&lfu_pages, &id);

	CP_STATE.now++;
	if (!page)
		return;
	page->stamp = CP_STATE.now;
	if (page->fresh) {
		/* the read that brought the page in is not a reuse */
		page->fresh = 0;
		return;
	}
	if (page->freq < LFU_MAX_FREQ)
		page->freq++;
}

void BPF_STRUCT_OPS(lfu_folio_evicted, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);

	bpf_map_delete_elem(&lfu_pages, &id);
}

CP_POLICY(lfu,
	  .init = (void *)lfu_init,
	  .evict_folios = (void *)lfu_evict_folios,
	  .folio_added = (void *)lfu_folio_added,
	  .folio_accessed = (void *)lfu_folio_accessed,
	  .folio_evicted = (void *)lfu_folio_evicted);
