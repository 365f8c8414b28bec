// SPDX-License-Identifier: GPL-2.0
/*
 * MGLRU, the kernel's multi-generational LRU (mm/vmscan.c), for page-cache
 * pages read through file descriptors.
 *
 * Generations: MG_NR_GENS eviction lists used as a ring, generation number
 * seq living on list seq % MG_NR_GENS, from min_seq (oldest) to max_seq
 * (youngest).  A new page joins generation max(max_seq - 3, min_seq), a
 * page that refaults soon after eviction one generation younger, as
 * lru_gen_folio_seq() places file pages.  Reclaim always takes from
 * min_seq; when fewer than three generations remain it first creates a new
 * one (aging: max_seq++), and when the oldest is empty it retires it
 * (min_seq++).
 *
 * Tiers: a page's reads after the one that brought it in (refs, capped at
 * MG_MAX_REFS) put it in tier order_base_2(refs + 1), 0..3.  The PID
 * controller of get_tier_idx() compares each tier's refault rate,
 * refaulted / (evicted + protected), with tier 0's (gains 3 and 2, as the
 * kernel): the first tier that refaults clearly more than tier 0 and all
 * above it are protected.  Reclaim walks the oldest generation from its
 * head: a protected page (or one with saturated refs) moves to generation
 * min_seq + 1 with its refs cleared (folio_inc_gen()), any other page is
 * proposed for eviction.  Statistics are folded into a running average
 * each time min_seq advances, as reset_ctrl_pos() does.
 *
 * Refaults: an evicted page leaves a ghost entry (min_seq and its tier)
 * keyed by its page key; a page whose ghost carries the current min_seq is
 * a refault: it counts for its old tier and is placed as a workingset page.
 *
 * Differences from the kernel: one page type (file), no page-table walks
 * (mapped accesses are out of scope for the page cache), one history
 * window instead of two, MG_MIN_BATCH refaults before a tier's rate counts
 * (the kernel's 64 would never be reached by small simulated caches), and
 * the ghost set is an LRU hash of as many entries as the capacity has
 * pages instead of shadow entries in the page-cache xarray.
 *
 * A page that finds the per-page map full (more pages than the capacity)
 * joins the overflow list, which reclaim empties first, oldest first.
 */
#include "cache_ext_policy.h"

#define MG_NR_GENS 4
#define MG_NR_TIERS 4
#define MG_MIN_GENS 2
#define MG_MAX_REFS 7
#define MG_MIN_BATCH 16
#define MG_ROUNDS 8

struct mg_page {
	__u64 seq;		/* generation */
	__u8 refs;		/* reads since insertion, capped */
	__u8 fresh;		/* the access that inserted it is pending */
};

struct mg_ghost {
	__u64 min_seq;		/* oldest generation when the page went */
	__u32 tier;
};

struct mglru_state {
	__u64 lists[MG_NR_GENS];
	__u64 overflow;			/* list: pages with no room */
	__s64 nr_pages[MG_NR_GENS];
	__s64 pending[MG_NR_GENS];	/* proposed this round */
	__u64 min_seq, max_seq;
	__u32 tier_idx;			/* tiers above it are protected */
	/* PID controller inputs, per tier: this window and the average */
	__u64 refaulted[MG_NR_TIERS], evicted[MG_NR_TIERS];
	__u64 protected[MG_NR_TIERS];
	__u64 avg_refaulted[MG_NR_TIERS], avg_total[MG_NR_TIERS];
};
CP_STATE_DECL(struct mglru_state);

CP_PAGE_MAP(mg_pages, struct mg_page);
CP_GHOST_MAP(mg_ghosts, struct mg_ghost, 1);

static __u32 mg_tier(__u32 refs)
{
	/* order_base_2(refs + 1) */
	if (refs == 0)
		return 0;
	if (refs == 1)
		return 1;
	if (refs <= 3)
		return 2;
	return 3;
}

static __u64 mg_list(__u64 seq)
{
	return CP_STATE.lists[seq % MG_NR_GENS];
}

s32 BPF_STRUCT_OPS_SLEEPABLE(mglru_init, struct mem_cgroup *memcg)
{
	if (cp_lists_create(memcg, CP_STATE.lists, MG_NR_GENS))
		return -1;
	CP_STATE.min_seq = 0;
	CP_STATE.max_seq = MG_MIN_GENS + 1;
	CP_STATE.tier_idx = MG_NR_TIERS - 1;
	CP_STATE.overflow = cache_ext_list_create(memcg);
	return CP_STATE.overflow ? 0 : -1;
}

/* true: the tier refaults no more than tier 0 would allow, evict it */
static bool mg_tier_evictable(__u32 tier)
{
	__u64 sp_ref = CP_STATE.avg_refaulted[0] + CP_STATE.refaulted[0];
	__u64 sp_total = CP_STATE.avg_total[0] + CP_STATE.evicted[0] +
			 CP_STATE.protected[0];
	__u64 pv_ref, pv_total;

	tier &= MG_NR_TIERS - 1;
	pv_ref = CP_STATE.avg_refaulted[tier] + CP_STATE.refaulted[tier];
	pv_total = CP_STATE.avg_total[tier] + CP_STATE.evicted[tier] +
		   CP_STATE.protected[tier];
	return pv_ref < MG_MIN_BATCH ||
	       pv_ref * (sp_total + MG_MIN_BATCH) * 2 <=
	       (sp_ref + 1) * pv_total * 3;
}

static __u32 mg_tier_idx(void)
{
	__u32 tier;

	for (tier = 1; tier < MG_NR_TIERS; tier++)
		if (!mg_tier_evictable(tier))
			break;
	return tier - 1;
}

/* The oldest generation is empty: retire it and fold the statistics. */
static void mg_inc_min_seq(void)
{
	int t;

	CP_STATE.min_seq++;
	for (t = 0; t < MG_NR_TIERS; t++) {
		CP_STATE.avg_refaulted[t] =
			(CP_STATE.avg_refaulted[t] + CP_STATE.refaulted[t]) / 2;
		CP_STATE.avg_total[t] =
			(CP_STATE.avg_total[t] + CP_STATE.evicted[t] +
			 CP_STATE.protected[t]) / 2;
		CP_STATE.refaulted[t] = 0;
		CP_STATE.evicted[t] = 0;
		CP_STATE.protected[t] = 0;
	}
}

static int mg_walk_oldest(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);
	struct mg_page *page = cp_page_of(&mg_pages, folio);
	__u64 next = CP_STATE.min_seq + 1;
	__u32 tier;

	if (!page || page->seq < CP_STATE.min_seq)
		return CACHE_EXT_ITER_EVICT;
	tier = mg_tier(page->refs);
	if (tier > CP_STATE.tier_idx || page->refs >= MG_MAX_REFS) {
		/* protected: one generation younger, refs spent */
		if (cache_ext_list_move(mg_list(next), folio, true))
			return CACHE_EXT_ITER_CONTINUE;
		CP_STATE.nr_pages[page->seq % MG_NR_GENS]--;
		CP_STATE.nr_pages[next % MG_NR_GENS]++;
		CP_STATE.protected[tier & (MG_NR_TIERS - 1)]++;
		page->seq = next;
		page->refs = 0;
		return CACHE_EXT_ITER_CONTINUE;
	}
	CP_STATE.pending[page->seq % MG_NR_GENS]++;
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(mglru_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	int round, i;

	cache_ext_list_iterate(memcg, CP_STATE.overflow, cp_take, ectx);
	for (i = 0; i < MG_NR_GENS; i++)
		CP_STATE.pending[i] = 0;
	CP_STATE.tier_idx = mg_tier_idx();
	for (round = 0; round < MG_ROUNDS; round++) {
		__u32 gen;

		if (ectx->nr_candidates >= ectx->request)
			break;
		/* aging: keep at least MG_MIN_GENS + 1 generations */
		if (CP_STATE.max_seq - CP_STATE.min_seq < MG_MIN_GENS)
			CP_STATE.max_seq++;
		gen = CP_STATE.min_seq % MG_NR_GENS;
		if (CP_STATE.nr_pages[gen] - CP_STATE.pending[gen] <= 0) {
			mg_inc_min_seq();
			continue;
		}
		cache_ext_list_iterate(memcg, CP_STATE.lists[gen],
				       mg_walk_oldest, ectx);
	}
}

void BPF_STRUCT_OPS(mglru_folio_added, struct folio *folio)
{
	struct mg_page page = { .fresh = 1 };
	__u64 key = cp_folio_key(folio);
	struct mg_ghost *ghost = bpf_map_lookup_elem(&mg_ghosts, &key);
	__u64 gens_back = MG_NR_GENS - 1;	/* lru_gen_folio_seq() */

	if (ghost) {
		if (ghost->min_seq == CP_STATE.min_seq) {
			/* a recent refault: workingset, one generation up */
			CP_STATE.refaulted[ghost->tier & (MG_NR_TIERS - 1)]++;
			gens_back--;
		}
		bpf_map_delete_elem(&mg_ghosts, &key);
	}
	page.seq = CP_STATE.max_seq - gens_back;
	if (page.seq < CP_STATE.min_seq)
		page.seq = CP_STATE.min_seq;
	if (cp_page_add(&mg_pages, folio, &page)) {
		cache_ext_list_add_tail(CP_STATE.overflow, folio);
		return;
	}
	if (cache_ext_list_add_tail(mg_list(page.seq), folio)) {
		cp_page_del(&mg_pages, folio);
		return;
	}
	CP_STATE.nr_pages[page.seq % MG_NR_GENS]++;
}

void BPF_STRUCT_OPS(mglru_folio_accessed, struct folio *folio)
{
	struct mg_page *page = cp_page_of(&mg_pages, folio);

	if (page)
		cp_count_reuse(page, refs, MG_MAX_REFS);
}

void BPF_STRUCT_OPS(mglru_folio_evicted, struct folio *folio)
{
	struct mg_page *page = cp_page_of(&mg_pages, folio);
	struct mg_ghost ghost;
	__u64 key;

	if (!page)
		return;
	ghost.min_seq = CP_STATE.min_seq;
	ghost.tier = mg_tier(page->refs);
	CP_STATE.evicted[ghost.tier & (MG_NR_TIERS - 1)]++;
	CP_STATE.nr_pages[page->seq % MG_NR_GENS]--;
	key = cp_folio_key(folio);
	bpf_map_update_elem(&mg_ghosts, &key, &ghost, BPF_ANY);
	cp_page_del(&mg_pages, folio);
}

CP_POLICY(mglru,
	  .init = (void *)mglru_init,
	  .evict_folios = (void *)mglru_evict_folios,
	  .folio_added = (void *)mglru_folio_added,
	  .folio_accessed = (void *)mglru_folio_accessed,
	  .folio_evicted = (void *)mglru_folio_evicted);
