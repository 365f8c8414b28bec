// SPDX-License-Identifier: GPL-2.0
/*
 * linux: the kernel's default page-cache policy for file pages (the classic
 * active/inactive two-list LRU, not MGLRU), so "keep the default" has its
 * own curve.  Modelled on Linux 6.12:
 *
 *  - A new page enters the inactive list (mm/swap.c folio_add_lru), unless
 *    it refaults: its shadow entry (mm/workingset.c) says it was evicted at
 *    non-resident age E, and if the age now minus E is at most the active
 *    list's size, the page would have stayed cached with that much more
 *    memory, so it enters the active list directly (workingset_refault).
 *  - Access (folio_mark_accessed): the first sets PG_referenced; a second
 *    one on an inactive page activates it and clears PG_referenced; on an
 *    active page it only sets PG_referenced.  The read that brings a page
 *    in counts as its first access.
 *  - The non-resident age ticks on every eviction (the shadow records the
 *    age before the tick) and on every activation.
 *  - Reclaim deactivates pages from the cold end of the active list while
 *    the inactive list is low (inactive * ratio < active, ratio =
 *    int_sqrt(10 * GiB of the lists) or 1; mm/vmscan.c inactive_is_low)
 *    and, when pages refaulted into the active list since the last
 *    reclaim, about request * active / inactive more (prepare_scan_control
 *    and get_scan_count), keeping PG_referenced; then it evicts from the
 *    cold end of the inactive list.  Clean, unmapped page-cache pages
 *    are reclaimed there whatever PG_referenced says
 *    (folio_check_references), so no second chance.
 *
 * Simplifications: deactivation moves exactly enough pages to restore the
 * balance (plus the refault share) instead of scanning SWAP_CLUSTER_MAX
 * batches at falling priorities; there are no mapped, dirty or executable
 * pages; shadows live in an LRU map of as many entries as the capacity has
 * pages instead of the xarray with its shadow shrinker.  It keeps the
 * shadows of the last `capacity` evictions: an older one has a refault
 * distance beyond any active list, so none that could activate is lost.
 *
 * A page that finds the per-page map full (more pages than the capacity)
 * joins the overflow list, which reclaim empties first, oldest first.
 *
 * List heads are the cold ends (kernel list tails): evict from the head,
 * add and activate at the tail.
 */
#include "cache_ext_policy.h"

struct linux_state {
	__u64 inactive, active;		/* list ids */
	__u64 overflow;			/* list: pages with no room */
	__u64 nr_inactive, nr_active;
	__u64 nonresident_age;
	__u64 refault_activations;	/* WORKINGSET_ACTIVATE_FILE */
	__u64 refaults_snapshot;	/* ... at the last reclaim */
	__u64 to_deactivate;		/* budget of the current walk */
};
CP_STATE_DECL(struct linux_state);

struct linux_folio {
	__u8 active;
	__u8 referenced;
};

/* per cached folio */
CP_PAGE_MAP(linux_folios, struct linux_folio);
/* shadow entries of evicted pages: page key -> age at eviction */
CP_GHOST_MAP(linux_shadows, __u64, 1);

/* 1 if a < b, else 0, without a branch; exact while a, b < 2^63 */
static __always_inline __u64 linux_below(__u64 a, __u64 b)
{
	return (a - b) >> 63;
}

/*
 * Bit-by-bit square root, floor(sqrt(x)) for x < 2^63 (here x = 10 * GiB,
 * below 2^50), as the kernel's int_sqrt computes it: every step halves r
 * and, when r + bit still fits in what is left of x, takes the bit.  While
 * bit is above x, r is 0 and stays 0, so no search for the first bit is
 * needed; `started` marks the steps from the first bit that fits on.
 *
 * Written without branches: the verifier walks every path of a loop, and
 * a data-dependent branch in each of 32 steps is 2^32 paths with r and
 * bit known on each, so nothing prunes them (inlined into
 * linux_evict_folios and its walk callback, the branching form passed 1M
 * processed instructions).  The comparison becomes a 0/1 from the sign of
 * a difference and the choice a mask, so the 32 steps are one straight
 * path.  Not static, so that the verifier checks it once as a global
 * function for any x instead of once per caller state.
 */
__attribute__((noinline)) __u64 linux_int_sqrt(__u64 x)
{
	__u64 r = 0, bit = 1ULL << 62, started = 0;
	int i;

	for (i = 0; i < 32; i++) {
		/* ~0 from the first step whose bit fits in x on */
		started |= linux_below(x, bit) - 1;
		__u64 take = (linux_below(x, r + bit) - 1) & started;

		x -= (r + bit) & take;
		r = (r & ~started) | (((r >> 1) + (bit & take)) & started);
		bit >>= 2;
	}
	return r;
}

static bool linux_inactive_is_low(void)
{
	__u64 inactive = CP_STATE.nr_inactive, active = CP_STATE.nr_active;
	/* in GiB at full scale, so a miniature simulation balances as the
	 * cache it stands for would */
	__u64 gb = cp_full_pages(inactive + active) >> (30 - 12);
	__u64 ratio = gb ? linux_int_sqrt(10 * gb) : 1;

	return inactive * ratio < active;
}

s32 BPF_STRUCT_OPS_SLEEPABLE(linux_init, struct mem_cgroup *memcg)
{
	CP_STATE.inactive = cache_ext_list_create(memcg);
	CP_STATE.active = cache_ext_list_create(memcg);
	CP_STATE.overflow = cache_ext_list_create(memcg);
	return CP_STATE.inactive && CP_STATE.active && CP_STATE.overflow ?
	       0 : -1;
}

/* Move pages from the cold end of the active list to the inactive one:
 * until the lists are balanced, or a budget runs out. */
static int linux_deactivate(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);
	__u64 id = cp_folio_id(folio);
	struct linux_folio *lf;

	if (!CP_STATE.to_deactivate && !linux_inactive_is_low())
		return CACHE_EXT_ITER_STOP;
	if (CP_STATE.to_deactivate)
		CP_STATE.to_deactivate--;
	lf = bpf_map_lookup_elem(&linux_folios, &id);
	if (!lf)
		return CACHE_EXT_ITER_CONTINUE;
	if (cache_ext_list_move(CP_STATE.inactive, folio, true))
		return CACHE_EXT_ITER_CONTINUE;
	lf->active = 0;
	CP_STATE.nr_active--;
	CP_STATE.nr_inactive++;
	return CACHE_EXT_ITER_CONTINUE;
}

void BPF_STRUCT_OPS(linux_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u64 inactive = CP_STATE.nr_inactive, active = CP_STATE.nr_active;

	/*
	 * Refault activations since the last reclaim mean a new working set
	 * is forming: the kernel then deactivates even with a long inactive
	 * list (prepare_scan_control), scanning both lists in proportion to
	 * their sizes (get_scan_count) -- about request * active / inactive
	 * active pages for the request reclaimed.
	 */
	CP_STATE.to_deactivate = 0;
	if (CP_STATE.refault_activations != CP_STATE.refaults_snapshot && active)
		CP_STATE.to_deactivate = inactive ?
			(ectx->request * active + inactive - 1) / inactive :
			ectx->request;
	CP_STATE.refaults_snapshot = CP_STATE.refault_activations;
	cache_ext_list_iterate(memcg, CP_STATE.overflow, cp_take, ectx);
	if (CP_STATE.to_deactivate || linux_inactive_is_low())
		cache_ext_list_iterate(memcg, CP_STATE.active, linux_deactivate,
				       ectx);
	CP_STATE.to_deactivate = 0;
	cache_ext_list_iterate(memcg, CP_STATE.inactive, cp_take, ectx);
	/* An inactive list shorter than the request: the kernel would
	 * deactivate more and reclaim those, i.e. the coldest active pages. */
	if (ectx->nr_candidates < ectx->request)
		cache_ext_list_iterate(memcg, CP_STATE.active, cp_take, ectx);
}

void BPF_STRUCT_OPS(linux_folio_added, struct folio *folio)
{
	struct linux_folio lf = {};
	__u64 key = cp_folio_key(folio);
	__u64 *evicted_at = bpf_map_lookup_elem(&linux_shadows, &key);

	if (evicted_at) {
		__u64 distance = CP_STATE.nonresident_age - *evicted_at;

		bpf_map_delete_elem(&linux_shadows, &key);
		if (distance <= CP_STATE.nr_active) {
			lf.active = 1;
			CP_STATE.nonresident_age++;
			CP_STATE.refault_activations++;
		}
	}
	if (cp_page_add(&linux_folios, folio, &lf)) {
		cache_ext_list_add_tail(CP_STATE.overflow, folio);
		return;
	}
	if (lf.active) {
		cache_ext_list_add_tail(CP_STATE.active, folio);
		CP_STATE.nr_active++;
	} else {
		cache_ext_list_add_tail(CP_STATE.inactive, folio);
		CP_STATE.nr_inactive++;
	}
}

void BPF_STRUCT_OPS(linux_folio_accessed, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct linux_folio *lf = bpf_map_lookup_elem(&linux_folios, &id);

	if (!lf)
		return;
	if (!lf->referenced) {
		lf->referenced = 1;
	} else if (!lf->active) {
		if (cache_ext_list_move(CP_STATE.active, folio, true))
			return;
		lf->active = 1;
		lf->referenced = 0;
		CP_STATE.nr_inactive--;
		CP_STATE.nr_active++;
		CP_STATE.nonresident_age++;
	}
}

void BPF_STRUCT_OPS(linux_folio_evicted, struct folio *folio)
{
	__u64 key = cp_folio_key(folio), id = cp_folio_id(folio);
	struct linux_folio *lf = bpf_map_lookup_elem(&linux_folios, &id);

	if (!lf)
		return;
	if (lf->active)
		CP_STATE.nr_active--;
	else
		CP_STATE.nr_inactive--;
	bpf_map_delete_elem(&linux_folios, &id);
	bpf_map_update_elem(&linux_shadows, &key, &CP_STATE.nonresident_age,
			    BPF_ANY);
	CP_STATE.nonresident_age++;
}

CP_POLICY(linux,
	  .init = (void *)linux_init,
	  .evict_folios = (void *)linux_evict_folios,
	  .folio_added = (void *)linux_folio_added,
	  .folio_accessed = (void *)linux_folio_accessed,
	  .folio_evicted = (void *)linux_folio_evicted);
