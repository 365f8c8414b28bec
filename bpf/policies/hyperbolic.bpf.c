// SPDX-License-Identifier: GPL-2.0
/*
 * Hyperbolic caching (Blankstein et al., ATC'17; PageFlex's example policy):
 * a page's priority is its hit count divided by the time since it was
 * brought in, and the page of lowest priority goes.  New pages start with
 * one hit, so a page that is never read again sinks as 1/age while a page
 * read often keeps its priority as it ages.
 *
 * Time is the policy's access count (cp_clock() runs in nanoseconds in the
 * kernel; counting accesses keeps the two builds alike).  Each page to
 * evict is the lowest of HYP_SAMPLES pages drawn at random from every page
 * the policy holds, as the paper's sampled eviction (and libCacheSim's
 * Hyperbolic) does: the pages sit in a dense table besides the eviction
 * lists (cp_sample_* in the policy header), so any of them can be drawn,
 * not only those at a list's head.  Priorities are compared as fractions,
 * hits x age' < hits' x age, with no division.  A page proposed in a
 * reclaim round is not drawn again in that round.
 *
 * A page that finds the policy's maps full (more pages than the capacity)
 * joins the overflow list, which reclaim empties first, oldest first.
 *
 * Difference from libCacheSim's Hyperbolic: hit counts saturate at
 * HYP_MAX_HITS and ages at HYP_MAX_AGE, so that the products fit in 64 bits.
 */
#include "cache_ext_policy.h"

#define HYP_SAMPLES 64
#define HYP_MAX_HITS ((1U << 24) - 1)
#define HYP_MAX_AGE (1ULL << 39)

struct hyp_entry {
	__u64 id;		/* first, for cp_sample_* */
	__u64 born;		/* access count when the page came in */
	__u32 hits;
	__u32 proposed_in;	/* reclaim round that last proposed it */
	__u8 fresh;		/* the access that inserted it is pending */
};

struct hyperbolic_state {
	__u64 overflow;		/* list: pages with no room in the table */
	__u64 now;
	__u32 count;		/* pages in the table */
	__u32 round;
};
CP_STATE_DECL(struct hyperbolic_state);

CP_PAGE_MAP(hyp_slots, __u32);
CP_PAGE_ARRAY(hyp_table, struct hyp_entry);

/* One draw of HYP_SAMPLES pages: their slots, then the lowest priority
 * among them. */
struct hyp_draw {
	__u32 slots[HYP_SAMPLES];
	__u64 hits, age;
	__u32 slot;
	bool found;
};

s32 BPF_STRUCT_OPS_SLEEPABLE(hyperbolic_init, struct mem_cgroup *memcg)
{
	CP_STATE.overflow = cache_ext_list_create(memcg);
	return CP_STATE.overflow ? 0 : -1;
}

static void hyperbolic_consider(struct hyp_draw *draw, struct hyp_entry *e,
				__u32 slot)
{
	__u64 age;

	if (e->proposed_in == CP_STATE.round)
		return;
	age = CP_STATE.now - e->born + 1;
	if (age > HYP_MAX_AGE)
		age = HYP_MAX_AGE;
	if (!draw->found || (__u64)e->hits * draw->age < draw->hits * age) {
		draw->hits = e->hits;
		draw->age = age;
		draw->slot = slot;
		draw->found = true;
	}
}

CP_SAMPLER(hyperbolic_sample, hyp_table, struct hyp_draw, HYP_SAMPLES,
	   hyperbolic_consider)

void BPF_STRUCT_OPS(hyperbolic_evict_folios,
		    struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u32 i;

	CP_STATE.round++;
	cache_ext_list_iterate(memcg, CP_STATE.overflow, cp_take, ectx);
	for (i = 0; i < CACHE_EXT_MAX_CANDIDATES; i++) {
		__u32 n = ectx->nr_candidates;
		struct hyp_draw draw = {};
		struct hyp_entry *e;

		if (n >= ectx->request || n >= CACHE_EXT_MAX_CANDIDATES ||
		    !CP_STATE.count)
			break;
		hyperbolic_sample(&draw, HYP_SAMPLES);
		e = draw.found ? bpf_map_lookup_elem(&hyp_table, &draw.slot) :
				 NULL;
		if (!e)
			break;
		e->proposed_in = CP_STATE.round;
		if (cp_propose(ectx, cp_folio_of(e->id)))
			break;
	}
}

void BPF_STRUCT_OPS(hyperbolic_folio_added, struct folio *folio)
{
	struct hyp_entry e = { .born = CP_STATE.now, .hits = 1, .fresh = 1 };

	if (cp_sample_add(&hyp_slots, &hyp_table, &CP_STATE.count, folio, &e))
		cache_ext_list_add_tail(CP_STATE.overflow, folio);
}

void BPF_STRUCT_OPS(hyperbolic_folio_accessed, struct folio *folio)
{
	struct hyp_entry *e = cp_sample_entry(&hyp_slots, &hyp_table, folio);

	CP_STATE.now++;
	if (e)
		cp_count_reuse(e, hits, HYP_MAX_HITS);
}

void BPF_STRUCT_OPS(hyperbolic_folio_evicted, struct folio *folio)
{
	cp_sample_remove(&hyp_slots, &hyp_table, &CP_STATE.count, folio);
}

CP_POLICY(hyperbolic,
	  .init = (void *)hyperbolic_init,
	  .evict_folios = (void *)hyperbolic_evict_folios,
	  .folio_added = (void *)hyperbolic_folio_added,
	  .folio_accessed = (void *)hyperbolic_folio_accessed,
	  .folio_evicted = (void *)hyperbolic_folio_evicted);
