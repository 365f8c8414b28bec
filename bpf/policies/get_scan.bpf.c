// SPDX-License-Identifier: GPL-2.0
/*
 * GET-SCAN, application-informed eviction (cache_ext paper, section 5.5):
 * a key-value store tells the policy which of its threads serve scans, and
 * pages those threads bring in are evicted before any page a point lookup
 * (GET) needs.
 *
 * Pages a registered scan thread brings in are scan pages, all others GET
 * pages; each side is an LFU (as lfu.bpf.c: one list per access count,
 * the least used page with the oldest last access goes first), with
 * GS_SCAN_CLASSES lists for scan pages and GS_GET_CLASSES for GET pages,
 * the 16 a cgroup may have.  Counts from a side's last class up share its
 * last list, where a window of GS_NR_SCORE pages is scored.  Reclaim
 * proposes scan pages first and takes GET pages only when the scan side
 * cannot give enough.  A scan page that a non-scan thread reads becomes a
 * GET page of its count.
 *
 * Registered threads: their tids are keys of the `gs_tids` map, filled by
 * `cachepilot policy register-tids` (through the map pinned by the loader)
 * or by the application.  In the simulator the trace annotates a
 * registered thread's accesses by setting bit 31 of their tid
 * (CP_TID_REGISTERED; kernel tids never have it), so a simulation needs no
 * map writes.
 *
 * Difference from the paper: the paper's list choice is made only at
 * insertion; promotion of re-read scan pages to the GET list is ours.
 *
 * A page that finds the per-page map full (more pages than the capacity)
 * joins the scan side's count-0 list and stays there: it goes first.
 */
#include "cache_ext_policy.h"

#define GS_NR_SCORE 512		/* window scored in a side's last list */
#define GS_SCAN_CLASSES 4	/* scan pages: counts 0..2, and 3 or more */
#define GS_GET_CLASSES 12	/* GET pages: counts 0..10, and 11 or more */
#define GS_LISTS 16		/* the scan side's lists, then the GET side's */
#define GS_MAX_TIDS 4096
#define CP_TID_REGISTERED (1U << 31)
#define GS_TIME_BITS 40
#define GS_MAX_FREQ ((1U << 23) - 1)

struct gs_page {
	__u64 stamp;		/* time of the last access */
	__u32 freq;
	__u8 scan;		/* a scan page */
	__u8 fresh;		/* the access that inserted it is pending */
};

CP_COUNT_LISTS(get_scan, GS_LISTS);
CP_PAGE_MAP(gs_pages, struct gs_page);
/* tid of a registered scan thread -> 1 */
CP_HASH_MAP(gs_tids, __u32, __u8, GS_MAX_TIDS);

static bool gs_scan_thread(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	if (tid & CP_TID_REGISTERED)
		return true;
	return bpf_map_lookup_elem(&gs_tids, &tid) != NULL;
}

/* The list of a page of `freq` accesses on its side. */
static __u64 gs_list(bool scan, __u32 freq)
{
	return cp_count_list(CP_STATE.lists, GS_LISTS - 1,
			     scan ? 0 : GS_SCAN_CLASSES,
			     scan ? GS_SCAN_CLASSES : GS_GET_CLASSES, freq);
}

/* count first, then the older access (as lfu.bpf.c) */
CP_USE_SCORER(gs_score, gs_pages, struct gs_page, GS_TIME_BITS)

void BPF_STRUCT_OPS(get_scan_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	/* scan pages first, then GET pages */
	cp_evict_by_count(ectx, memcg, CP_STATE.lists, GS_LISTS - 1, 0,
			  GS_SCAN_CLASSES, gs_score, GS_NR_SCORE);
	cp_evict_by_count(ectx, memcg, CP_STATE.lists, GS_LISTS - 1,
			  GS_SCAN_CLASSES, GS_GET_CLASSES, gs_score, GS_NR_SCORE);
}

void BPF_STRUCT_OPS(get_scan_folio_added, struct folio *folio)
{
	struct gs_page page = { .stamp = CP_STATE.now, .fresh = 1 };

	page.scan = gs_scan_thread();
	if (cp_page_add(&gs_pages, folio, &page)) {
		cache_ext_list_add_tail(gs_list(true, 0), folio);
		return;
	}
	if (cache_ext_list_add_tail(gs_list(page.scan, 0), folio))
		cp_page_del(&gs_pages, folio);
}

void BPF_STRUCT_OPS(get_scan_folio_accessed, struct folio *folio)
{
	struct gs_page *page = cp_page_of(&gs_pages, folio);

	if (!cp_count_use(page, CP_STATE.now, GS_MAX_FREQ))
		return;
	/* read by a GET: a GET page from now on */
	if (page->scan && !gs_scan_thread())
		page->scan = 0;
	cache_ext_list_move(gs_list(page->scan, page->freq), folio, true);
}

void BPF_STRUCT_OPS(get_scan_folio_evicted, struct folio *folio)
{
	cp_page_del(&gs_pages, folio);
}

CP_POLICY(get_scan,
	  .init = (void *)get_scan_init,
	  .evict_folios = (void *)get_scan_evict_folios,
	  .folio_added = (void *)get_scan_folio_added,
	  .folio_accessed = (void *)get_scan_folio_accessed,
	  .folio_evicted = (void *)get_scan_folio_evicted);
