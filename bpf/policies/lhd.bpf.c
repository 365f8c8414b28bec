// SPDX-License-Identifier: GPL-2.0
/*
 * LHD, least hit density (Beckmann et al., NSDI'18): evict the page whose
 * expected hits per unit of cache space-time are lowest.
 *
 * Time is the count of page accesses.  A page's age is the time since its
 * last access, in coarse units of 2^shift accesses, LHD_AGES units in all
 * (older pages share the last one).  Pages fall into LHD_CLASSES classes by
 * how recently they were hit before (the sum of their last two hit ages, on
 * a log scale; never hit = class 0).  For every (class, age) the policy
 * counts hits and evictions; hit density at age a is
 *
 *     hits at ages >= a  /  sum over ages >= a of events still pending
 *
 * i.e. the chance of a future hit over the expected remaining lifetime.
 *
 * Reconfiguration: every LHD_RECONFIG accesses the access path only raises
 * a flag; the reclaim rounds that follow (not the access or insert path)
 * do the work, one class per round (LHD_CLASSES slices, which keeps every
 * round short and within the verifier's budget): it decays the counts by 1/10 (an EWMA), moves the age unit one
 * step (x2 or /2) towards the number of pages held / LHD_AGES_PER_LIFE
 * (LHD_AGES units then span ~8 cache lifetimes), and
 * recomputes every density.  All arithmetic is integer: counts are fixed
 * point with 8 fractional bits, densities with 20.  Until the first
 * reconfiguration densities follow the prior (class + 1) / (age + 1).
 *
 * Eviction scores LHD_NR_SCORE pages at the head of a list kept in
 * insertion order and proposes the lowest densities (pages past the last
 * age unit go first); the window's survivors are rotated to the tail at the
 * start of the next round, so successive rounds sweep the cache like a
 * clock hand and the candidates are a sample of pages of every age, as
 * LHD's random sampling intends, rather than the least recently used ones.
 *
 * Differences from libCacheSim's LHD: libCacheSim ranks 8 random resident
 * objects (32 after 50 reconfigurations) plus the 8 latest admissions; here
 * the candidates are the sweep's next LHD_NR_SCORE pages.  libCacheSim has
 * 20000 age units and 16 x 16 classes (an application dimension), sets
 * some "explorer" objects aside, and reconfigures every 2^20 accesses, so
 * on traces shorter than that it never leaves its prior; here 16 classes of
 * 128 units, no explorers, and a reconfiguration every LHD_RECONFIG
 * accesses, so the model is learnt on page-cache-sized runs.  Fixed point
 * instead of float throughout.
 */
#include "cache_ext_policy.h"

#define LHD_CLASSES 16
#define LHD_AGES 128
#define LHD_AGES_PER_LIFE 16	/* age units per cache's worth of accesses */
#define LHD_RECONFIG (1 << 14)	/* accesses between reconfigurations */
#define LHD_NR_SCORE 64		/* pages scored per reclaim round */
#define LHD_ONE 256		/* one event in the fixed-point counts */
#define LHD_DENSITY_SHIFT 20
#define LHD_MAX_SHIFT 30
#define LHD_MAX_PAGES (1 << 22)

struct lhd_page {
	__u64 stamp;		/* time of the last access */
	__u32 last_hit_age;	/* ages of the last two hits (age units) */
	__u32 prev_hit_age;
	__u8 fresh;		/* the access that inserted it is pending */
};

struct lhd_state {
	__u64 list;
	__u64 now;
	__u64 next_reconfig;
	__u64 reconfigs;
	__s64 held;
	__u32 shift;
	__u32 reconfig_due;	/* raised by the access path */
	__u32 reconfig_active;	/* slices under way */
	__u32 reconfig_class;	/* next class to reconfigure */
	__u32 reconfig_coarser, reconfig_finer;
	__u32 to_rotate;	/* survivors of the last scored window */
	__u32 rotated;
	__u64 hits[LHD_CLASSES][LHD_AGES];
	__u64 evictions[LHD_CLASSES][LHD_AGES];
	__s64 density[LHD_CLASSES][LHD_AGES];
};
CP_STATE_DECL(struct lhd_state);

CP_HASH_MAP(lhd_pages, __u64, struct lhd_page, LHD_MAX_PAGES);

static void lhd_prior(void)
{
	__u32 c, a;

	for (c = 0; c < LHD_CLASSES; c++)
		for (a = 0; a < LHD_AGES; a++)
			CP_STATE.density[c][a] =
				(__s64)(((__u64)(c + 1) << LHD_DENSITY_SHIFT) /
					(a + 1));
}

s32 BPF_STRUCT_OPS_SLEEPABLE(lhd_init, struct mem_cgroup *memcg)
{
	CP_STATE.list = cache_ext_list_create(memcg);
	CP_STATE.next_reconfig = LHD_RECONFIG;
	lhd_prior();
	return CP_STATE.list ? 0 : -1;
}

static __u32 lhd_age(const struct lhd_page *page)
{
	__u64 age = (CP_STATE.now - page->stamp) >> (CP_STATE.shift & 63);

	return age < LHD_AGES ? age : LHD_AGES - 1;
}

/* Recently re-hit pages get high classes, never-hit pages class 0. */
static __u32 lhd_class(const struct lhd_page *page)
{
	__u64 sum = (__u64)page->last_hit_age + page->prev_hit_age;
	__u32 class = 0;
	int i;

	if (sum == 0)
		return LHD_CLASSES - 1;
	for (i = 0; i < LHD_CLASSES - 1; i++) {
		if (sum >= LHD_AGES)
			break;
		sum <<= 1;
		class++;
	}
	return class;
}

/* Smallest shift whose age unit is at least held / LHD_AGES_PER_LIFE. */
static __u32 lhd_fit_shift(void)
{
	__u64 unit = CP_STATE.held > 0 ?
		     (__u64)CP_STATE.held / LHD_AGES_PER_LIFE : 0;
	__u32 shift = 0;

	while (shift < LHD_MAX_SHIFT && ((__u64)1 << shift) < unit)
		shift++;
	return shift;
}

/*
 * Double (coarser) or halve (finer) the age unit of one class, merging or
 * splitting age buckets.  One step at a time, by constant shifts, so the
 * verifier can bound every index.
 */
static void lhd_rescale(__u32 class, bool coarser)
{
	__u64 *hits = CP_STATE.hits[class & (LHD_CLASSES - 1)];
	__u64 *evs = CP_STATE.evictions[class & (LHD_CLASSES - 1)];
	__u32 a;

	if (coarser) {
		/* bucket a collects old buckets 2a and 2a + 1 */
		for (a = 0; a < LHD_AGES / 2; a++) {
			hits[a] = hits[2 * a] + hits[2 * a + 1];
			evs[a] = evs[2 * a] + evs[2 * a + 1];
		}
		for (a = LHD_AGES / 2; a < LHD_AGES - 1; a++) {
			hits[a] = 0;
			evs[a] = 0;
		}
		/* the last bucket keeps everything too old to tell apart */
	} else {
		/* spread each of the younger half's buckets over two */
		for (a = LHD_AGES - 1; a-- > 0;) {
			hits[a] = hits[a / 2] / 2;
			evs[a] = evs[a / 2] / 2;
		}
	}
}

/*
 * One slice of a reconfiguration: class c's buckets follow the age unit's
 * step, decay by 1/10, and its densities are recomputed.  A
 * reconfiguration is LHD_CLASSES slices, one per reclaim round, so no round
 * does (and the verifier never has to follow) more than one class's work.
 */
static void lhd_reconfigure_class(__u32 c, bool coarser, bool finer)
{
	__u64 total_hits = 0, total_events = 0, lifetime = 0;
	__u32 a;

	c &= LHD_CLASSES - 1;
	if (coarser || finer)
		lhd_rescale(c, coarser);
	for (a = LHD_AGES; a-- > 0;) {
		__u64 *h = &CP_STATE.hits[c][a];
		__u64 *e = &CP_STATE.evictions[c][a];

		*h -= *h / 10;
		*e -= *e / 10;
		total_hits += *h;
		total_events += *h + *e;
		lifetime += total_events;
		CP_STATE.density[c][a] = lifetime ?
			(__s64)((total_hits << LHD_DENSITY_SHIFT) / lifetime) :
			0;
	}
}

static void lhd_reconfigure_step(void)
{
	__u32 want;

	if (CP_STATE.reconfig_due && !CP_STATE.reconfig_active) {
		/* start: decide the age unit's step for every class */
		want = lhd_fit_shift();
		CP_STATE.reconfig_due = 0;
		CP_STATE.reconfig_active = 1;
		CP_STATE.reconfig_class = 0;
		CP_STATE.reconfig_coarser = want > CP_STATE.shift;
		CP_STATE.reconfig_finer = want < CP_STATE.shift;
	}
	if (!CP_STATE.reconfig_active)
		return;
	lhd_reconfigure_class(CP_STATE.reconfig_class,
			      CP_STATE.reconfig_coarser,
			      CP_STATE.reconfig_finer);
	if (++CP_STATE.reconfig_class < LHD_CLASSES)
		return;
	if (CP_STATE.reconfig_coarser)
		CP_STATE.shift++;
	else if (CP_STATE.reconfig_finer)
		CP_STATE.shift--;
	CP_STATE.reconfig_active = 0;
	CP_STATE.reconfigs++;
}

static __s64 lhd_score(int idx, struct cache_ext_list_node *node)
{
	__u64 id = cp_folio_id(cache_ext_node_folio(node));
	struct lhd_page *page = bpf_map_lookup_elem(&lhd_pages, &id);
	__u32 age;

	if (!page)
		return -1;
	age = lhd_age(page);
	if (age == LHD_AGES - 1)
		return -1;
	return CP_STATE.density[lhd_class(page) & (LHD_CLASSES - 1)]
			       [age & (LHD_AGES - 1)];
}

static int lhd_rotate(int idx, struct cache_ext_list_node *node)
{
	if (CP_STATE.rotated >= CP_STATE.to_rotate)
		return CACHE_EXT_ITER_STOP;
	CP_STATE.rotated++;
	cache_ext_list_move(CP_STATE.list, cache_ext_node_folio(node), true);
	return CACHE_EXT_ITER_CONTINUE;
}

void BPF_STRUCT_OPS(lhd_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	int scored;

	if (CP_STATE.reconfig_due || CP_STATE.reconfig_active) {
		lhd_reconfigure_step();
	} else if (!CP_STATE.reconfigs && !CP_STATE.shift) {
		/* first reclaim: the cgroup is full, size the age unit */
		CP_STATE.shift = lhd_fit_shift();
	}
	/* the hand advances past last round's window */
	if (CP_STATE.to_rotate) {
		CP_STATE.rotated = 0;
		cache_ext_list_iterate(memcg, CP_STATE.list, lhd_rotate, ectx);
	}
	scored = cache_ext_list_score(memcg, CP_STATE.list, lhd_score, ectx,
				      LHD_NR_SCORE);
	CP_STATE.to_rotate = scored > (int)ectx->nr_candidates ?
			     scored - ectx->nr_candidates : 0;
}

void BPF_STRUCT_OPS(lhd_folio_added, struct folio *folio)
{
	struct lhd_page page = {
		.stamp = CP_STATE.now,
		.prev_hit_age = LHD_AGES,	/* never hit: class 0 */
		.fresh = 1,
	};
	__u64 id = cp_folio_id(folio);

	if (bpf_map_update_elem(&lhd_pages, &id, &page, BPF_ANY))
		return;
	if (cache_ext_list_add_tail(CP_STATE.list, folio)) {
		bpf_map_delete_elem(&lhd_pages, &id);
		return;
	}
	CP_STATE.held++;
}

void BPF_STRUCT_OPS(lhd_folio_accessed, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct lhd_page *page = bpf_map_lookup_elem(&lhd_pages, &id);
	__u32 age;

	CP_STATE.now++;
	if (CP_STATE.now >= CP_STATE.next_reconfig) {
		/* only flag it: the work happens in the next reclaim round */
		CP_STATE.next_reconfig = CP_STATE.now + LHD_RECONFIG;
		CP_STATE.reconfig_due = 1;
	}
	if (!page)
		return;
	if (page->fresh) {
		page->fresh = 0;
		page->stamp = CP_STATE.now;
		return;
	}
	age = lhd_age(page);
	__sync_fetch_and_add(&CP_STATE.hits[lhd_class(page) &
					    (LHD_CLASSES - 1)]
					   [age & (LHD_AGES - 1)], LHD_ONE);
	page->prev_hit_age = page->last_hit_age;
	page->last_hit_age = age;
	page->stamp = CP_STATE.now;
}

void BPF_STRUCT_OPS(lhd_folio_evicted, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	struct lhd_page *page = bpf_map_lookup_elem(&lhd_pages, &id);

	if (!page)
		return;
	__sync_fetch_and_add(&CP_STATE.evictions[lhd_class(page) &
						 (LHD_CLASSES - 1)]
						[lhd_age(page) & (LHD_AGES - 1)],
			     LHD_ONE);
	CP_STATE.held--;
	bpf_map_delete_elem(&lhd_pages, &id);
}

CP_POLICY(lhd,
	  .init = (void *)lhd_init,
	  .evict_folios = (void *)lhd_evict_folios,
	  .folio_added = (void *)lhd_folio_added,
	  .folio_accessed = (void *)lhd_folio_accessed,
	  .folio_evicted = (void *)lhd_folio_evicted);
