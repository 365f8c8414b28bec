// SPDX-License-Identifier: GPL-2.0
/*
 * GET-SCAN, application-informed eviction (cache_ext paper, section 5.5):
 * a key-value store tells the policy which of its threads serve scans, and
 * pages those threads bring in are evicted before any page a point lookup
 * (GET) needs.
 *
 * Two lists, each an approximate LFU (batch scoring of a window at the
 * head, the window's survivors rotated to the tail, as lfu.bpf.c): pages a
 * registered scan thread brings in go to the scan list, all others to the
 * GET list.  Reclaim proposes from the scan list first and takes from the
 * GET list only what the scan list cannot give.  A scan page that a
 * non-scan thread reads is moved to the GET list: it has become a GET page.
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
 */
#include "cache_ext_policy.h"

#define GS_NR_SCORE 512
#define GS_MAX_PAGES (1 << 22)
#define GS_MAX_TIDS 4096
#define CP_TID_REGISTERED (1U << 31)
#define GS_TIME_BITS 40
#define GS_MAX_FREQ ((1U << 23) - 1)

struct gs_page {
	__u64 stamp;		/* time of the last access */
	__u32 freq;
	__u8 scan;		/* on the scan list */
	__u8 fresh;		/* the access that inserted it is pending */
};

struct gs_list {
	__u64 id;
	__u32 to_rotate;
};

enum { GS_GET, GS_SCAN, GS_NR_LISTS };

struct get_scan_state {
	struct gs_list lists[GS_NR_LISTS];
	__u64 now;
	__u32 walking;		/* index of the list being rotated */
	__u32 rotated;
};
CP_STATE_DECL(struct get_scan_state);

CP_HASH_MAP(gs_pages, __u64, struct gs_page, GS_MAX_PAGES);
/* tid of a registered scan thread -> 1 */
CP_HASH_MAP(gs_tids, __u32, __u8, GS_MAX_TIDS);

static bool gs_scan_thread(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	if (tid & CP_TID_REGISTERED)
		return true;
	return bpf_map_lookup_elem(&gs_tids, &tid) != NULL;
}

s32 BPF_STRUCT_OPS_SLEEPABLE(get_scan_init, struct mem_cgroup *memcg)
{
	CP_STATE.lists[GS_GET].id = cache_ext_list_create(memcg);
	CP_STATE.lists[GS_SCAN].id = cache_ext_list_create(memcg);
	return CP_STATE.lists[GS_GET].id && CP_STATE.lists[GS_SCAN].id ? 0 : -1;
}

static __s64 gs_score(int idx, struct cache_ext_list_node *node)
{
	__u64 id = cp_folio_id(cache_ext_node_folio(node));
	struct gs_page *page = bpf_map_lookup_elem(&gs_pages, &id);

	/* count first, then the older access (as lfu.bpf.c) */
	if (!page)
		return -1;
	return (__s64)((__u64)page->freq << GS_TIME_BITS |
		       (page->stamp & ((1ULL << GS_TIME_BITS) - 1)));
}

static int gs_rotate(int idx, struct cache_ext_list_node *node)
{
	/* an index, not a pointer: BPF global data cannot hold pointers */
	struct gs_list *l = &CP_STATE.lists[CP_STATE.walking & 1];

	if (CP_STATE.rotated >= l->to_rotate)
		return CACHE_EXT_ITER_STOP;
	CP_STATE.rotated++;
	cache_ext_list_move(l->id, cache_ext_node_folio(node), true);
	return CACHE_EXT_ITER_CONTINUE;
}

/* One approximate-LFU round on one list: advance the hand, then score. */
static void gs_evict_from(__u32 which, struct cache_ext_eviction_ctx *ectx,
			  struct mem_cgroup *memcg)
{
	struct gs_list *l = &CP_STATE.lists[which & 1];
	__u32 before = ectx->nr_candidates;
	int scored;

	if (ectx->nr_candidates >= ectx->request)
		return;
	if (l->to_rotate) {
		CP_STATE.walking = which;
		CP_STATE.rotated = 0;
		cache_ext_list_iterate(memcg, l->id, gs_rotate, ectx);
	}
	scored = cache_ext_list_score(memcg, l->id, gs_score, ectx,
				      GS_NR_SCORE);
	l->to_rotate = scored > (int)(ectx->nr_candidates - before) ?
		       scored - (ectx->nr_candidates - before) : 0;
}

void BPF_STRUCT_OPS(get_scan_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	gs_evict_from(GS_SCAN, ectx, memcg);
	gs_evict_from(GS_GET, ectx, memcg);
}

void BPF_STRUCT_OPS(get_scan_folio_added, struct folio *folio)
{
	struct gs_page page = { .stamp = CP_STATE.now, .fresh = 1 };
	__u64 id = cp_folio_id(folio);

	page.scan = gs_scan_thread();
	if (bpf_map_update_elem(&gs_pages, &id, &page, BPF_ANY))
		return;
	if (cache_ext_list_add_tail(CP_STATE.lists[page.scan ? GS_SCAN :
						     GS_GET].id, folio))
		bpf_map_delete_elem(&gs_pages, &id);
}

void BPF_STRUCT_OPS(get_scan_folio_accessed, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct gs_page *page = bpf_map_lookup_elem(&gs_pages, &id);

	CP_STATE.now++;
	if (!page)
		return;
	page->stamp = CP_STATE.now;
	if (page->fresh) {
		page->fresh = 0;
		return;
	}
	if (page->freq < GS_MAX_FREQ)
		page->freq++;
	if (page->scan && !gs_scan_thread() &&
	    !cache_ext_list_move(CP_STATE.lists[GS_GET].id, folio, true))
		page->scan = 0;
}

void BPF_STRUCT_OPS(get_scan_folio_evicted, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);

	bpf_map_delete_elem(&gs_pages, &id);
}

CP_POLICY(get_scan,
	  .init = (void *)get_scan_init,
	  .evict_folios = (void *)get_scan_evict_folios,
	  .folio_added = (void *)get_scan_folio_added,
	  .folio_accessed = (void *)get_scan_folio_accessed,
	  .folio_evicted = (void *)get_scan_folio_evicted);
