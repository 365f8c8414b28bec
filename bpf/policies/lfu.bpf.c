// SPDX-License-Identifier: GPL-2.0
/*
 * LFU: evict the least frequently used page; among pages used equally
 * often, the one whose last access is oldest.
 *
 * A page's count is the number of times it was read while cached, not
 * counting the read that brought it in.  Pages are kept on one list per
 * count, each list in the order its pages reached that count (their last
 * access), so the least used page is the head of the lowest non-empty
 * list: an access is one move to the tail of the next list, a reclaim
 * walks at most every list's head.  A cgroup has at most 16 lists, so
 * counts from LFU_CLASSES - 1 up share the last list, where a reclaim
 * scores a window of LFU_NR_SCORE pages from the head by (count, last
 * access).  The choice is exact LFU whenever some cached page has been
 * read fewer than LFU_CLASSES - 1 times, which is whenever the cache is
 * smaller than the set of pages read that often.
 *
 * libCacheSim's LFU makes the same choice (its ties go in the order pages
 * reached their count); counts are dropped on eviction in both.
 *
 * A page that finds the per-page map full (more pages than the capacity)
 * joins the count-0 list and never leaves it: the least used pages go
 * first, and it is among them.
 */
#include "cache_ext_policy.h"

#define LFU_CLASSES 16		/* lists: counts 0..14, and 15 or more */
#define LFU_NR_SCORE 512	/* window scored in the last list */
#define LFU_TIME_BITS 40
#define LFU_MAX_FREQ ((1U << 23) - 1)

struct lfu_page {
	__u64 stamp;		/* time of the last access */
	__u32 freq;		/* reads since the page was cached */
	__u8 fresh;		/* the access that inserted it is pending */
};

CP_COUNT_LISTS(lfu, LFU_CLASSES);
CP_PAGE_MAP(lfu_pages, struct lfu_page);

static __u64 lfu_list(__u32 freq)
{
	return cp_count_list(CP_STATE.lists, LFU_CLASSES - 1, 0, LFU_CLASSES,
			     freq);
}

CP_USE_SCORER(lfu_score, lfu_pages, struct lfu_page, LFU_TIME_BITS)

void BPF_STRUCT_OPS(lfu_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	cp_evict_by_count(ectx, memcg, CP_STATE.lists, LFU_CLASSES - 1, 0,
			  LFU_CLASSES, lfu_score, LFU_NR_SCORE);
}

void BPF_STRUCT_OPS(lfu_folio_added, struct folio *folio)
{
	struct lfu_page page = { .stamp = CP_STATE.now, .fresh = 1 };
	bool tracked = !cp_page_add(&lfu_pages, folio, &page);

	if (cache_ext_list_add_tail(CP_STATE.lists[0], folio) && tracked)
		cp_page_del(&lfu_pages, folio);
}

void BPF_STRUCT_OPS(lfu_folio_accessed, struct folio *folio)
{
	struct lfu_page *page = cp_page_of(&lfu_pages, folio);

	if (cp_count_use(page, CP_STATE.now, LFU_MAX_FREQ))
		cache_ext_list_move(lfu_list(page->freq), folio, true);
}

void BPF_STRUCT_OPS(lfu_folio_evicted, struct folio *folio)
{
	cp_page_del(&lfu_pages, folio);
}

CP_POLICY(lfu,
	  .init = (void *)lfu_init,
	  .evict_folios = (void *)lfu_evict_folios,
	  .folio_added = (void *)lfu_folio_added,
	  .folio_accessed = (void *)lfu_folio_accessed,
	  .folio_evicted = (void *)lfu_folio_evicted);
