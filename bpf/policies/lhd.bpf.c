// SPDX-License-Identifier: GPL-2.0
/*
 * LHD, least hit density (Beckmann et al., NSDI'18): evict the page whose
 * expected hits per unit of cache space-time are lowest, as the paper's
 * reference implementation (which libCacheSim ships) does it.
 *
 * Time counts accesses.  A page's age is the time since its last access in
 * units of 2^shift accesses, LHD_MAX_AGE units at most (older: "overflow",
 * evicted first).  Pages fall into LHD_CLASSES classes by the sum of their
 * last two hit ages (about log2(LHD_MAX_AGE / sum); never hit: class 0).
 * For every (class, age) the policy counts hits and evictions; the hit
 * density at age a is
 *
 *     hits at ages >= a  /  sum over ages >= a of the events still pending
 *
 * the chance of a hit over the expected space-time still to spend.
 *
 * - Until the first reconfiguration the density is the prior
 *   (class + 1) / (age + 1), and shift is 10.
 * - Every LHD_RECONFIG accesses the counts decay by a tenth and every
 *   density is recomputed; at the 5th and 25th reconfiguration the age unit
 *   is set to the number of pages held / (LHD_MAX_AGE / 100), rounded up to
 *   a power of two, and the counts stretched or compressed to it.  The
 *   access path only raises a flag; the work is done one class per reclaim
 *   round, which keeps each round within the verifier's budget.
 * - A victim is the lowest density among LHD_EARLY_SAMPLES pages drawn at
 *   random from all the pages held (LHD_SAMPLES after 50
 *   reconfigurations) and the last LHD_ADMISSIONS pages admitted with a
 *   density below the running average of victims' densities.  The pages
 *   sit in a dense table besides the lists so that any can be drawn
 *   (cp_sample_* in the policy header).
 * - Explorers: until 50 reconfigurations, each access makes its page an
 *   explorer with probability 1/32, while explorers hold less than 1 % of
 *   the capacity; an explorer's density counts one more, so it stays long
 *   enough to show what a page of its class does at high ages.
 *
 * Time is counted at full scale: in a miniature simulation at rate R an
 * access advances the clock by 1/R accesses (cp_full_pages), so ages and
 * the age unit mean what they mean in the cache the miniature stands for.
 *
 * A page that finds the policy's maps full (more pages than the capacity)
 * joins the overflow list, which reclaim empties first, oldest first.
 *
 * Differences from the reference: integer arithmetic (counts in 1/16
 * events, densities in 2^-40), ranks compared as fractions; the hit-age
 * classes only (the reference multiplies them by 16 application classes,
 * of which a page cache has one); reconfiguration one class per reclaim
 * round instead of at the access that makes it due; a victim past the age
 * limit counts as density 0 in the running average.
 */
#include "cache_ext_policy.h"

#define LHD_CLASSES 16
#define LHD_PRIOR_CLASS 16	/* the reference's class number of class 0 */
#define LHD_MAX_AGE 20000
#define LHD_FIRST_SHIFT 10
#define LHD_RECONFIG (1ULL << 20)	/* accesses between reconfigurations */
#define LHD_EARLY_SAMPLES 8
#define LHD_SAMPLES 32
#define LHD_EARLY_RECONFIGS 50
#define LHD_ADMISSIONS 8
#define LHD_EXPLORE_ONE_IN 32
#define LHD_ONE_EVENT 16		/* fixed point of the counts */
#define LHD_DENSITY_SHIFT 40		/* fixed point of the densities */
#define LHD_TICK_SHIFT 8		/* 1/256 access: time at full scale */
#define LHD_MAX_SHIFT 40

struct lhd_entry {
	__u64 id;		/* first, for cp_sample_* */
	__u64 stamp;		/* time of the last access */
	__u16 last_hit_age;	/* ages of the last two hits (age units) */
	__u16 last_last_hit_age;
	__u8 class;
	__u8 explorer;
	__u8 fresh;		/* the access that inserted it is pending */
	__u32 proposed_in;	/* reclaim round that last proposed it */
};

/* One (class, age) cell of the model. */
struct lhd_cell {
	__u32 hits, evictions;	/* LHD_ONE_EVENT per event */
	__u64 density;		/* 2^LHD_DENSITY_SHIFT = one hit per unit */
};

struct lhd_state {
	__u64 overflow;			/* list: pages with no room */
	__u64 now;			/* time in 1/256 accesses */
	__u64 tick;			/* time one access stands for */
	__u64 next_reconfig;
	__u32 count;			/* pages in the table */
	__u32 round;
	__u32 shift;			/* age unit: 2^shift accesses */
	__u32 reconfigs;
	__u32 modelled;			/* classes whose densities are learnt */
	__u32 reconfig_due;		/* reconfigurations waiting */
	__u32 reconfig_class;		/* next class of the one under way */
	__s32 reconfig_delta;		/* its step of the age unit */
	__s64 explorer_budget;		/* pages */
	__u64 victim_density;		/* running average of the victims' */
	__u64 objects_avg, objects_mass;	/* pages held, averaged */
	__u64 admitted[LHD_ADMISSIONS];	/* ids of low-density admissions */
	__u32 admitted_next;
};
CP_STATE_DECL(struct lhd_state);

CP_PAGE_MAP(lhd_slots, __u32);
CP_PAGE_ARRAY(lhd_table, struct lhd_entry);
CP_ARRAY_MAP(lhd_model, __u32, struct lhd_cell, LHD_CLASSES * LHD_MAX_AGE);

/* A rank num / den: lower goes first.  den is 0 for a page in the last
 * age unit, which goes before any other. */
struct lhd_rank {
	__u64 num, den;
};

s32 BPF_STRUCT_OPS_SLEEPABLE(lhd_init, struct mem_cgroup *memcg)
{
	CP_STATE.overflow = cache_ext_list_create(memcg);
	CP_STATE.tick = cp_full_pages(1 << LHD_TICK_SHIFT);
	if (!CP_STATE.tick)
		CP_STATE.tick = 1;
	CP_STATE.shift = LHD_FIRST_SHIFT;
	CP_STATE.next_reconfig = LHD_RECONFIG << LHD_TICK_SHIFT;
	CP_STATE.explorer_budget = cp_capacity_pages() / 100;
	return CP_STATE.overflow ? 0 : -1;
}

/* About log2(LHD_MAX_AGE / sum): recent re-hits give high classes. */
static __u8 lhd_class(__u32 sum)
{
	__u8 class = 0;
	int i;

	if (sum == 0)
		return LHD_CLASSES - 1;
	for (i = 0; i < LHD_CLASSES - 1; i++) {
		if (sum >= LHD_MAX_AGE)
			break;
		sum <<= 1;
		class++;
	}
	return class;
}

/* Age units since the last access; the last unit holds all older ages. */
static __u32 lhd_age(const struct lhd_entry *e)
{
	__u64 age = (CP_STATE.now - e->stamp) >>
		    ((CP_STATE.shift + LHD_TICK_SHIFT) & 63);

	return age < LHD_MAX_AGE - 1 ? age : LHD_MAX_AGE - 1;
}

static struct lhd_cell *lhd_cell(__u32 class, __u32 age)
{
	__u32 key = (class & (LHD_CLASSES - 1)) * LHD_MAX_AGE +
		    (age < LHD_MAX_AGE - 1 ? age : LHD_MAX_AGE - 1);

	return bpf_map_lookup_elem(&lhd_model, &key);
}

static void lhd_rank_of(const struct lhd_entry *e, struct lhd_rank *r)
{
	__u32 age = lhd_age(e);
	struct lhd_cell *cell;

	r->num = 0;
	r->den = 0;
	if (age == LHD_MAX_AGE - 1)
		return;
	if (CP_STATE.modelled & (1U << (e->class & (LHD_CLASSES - 1)))) {
		cell = lhd_cell(e->class, age);
		r->num = cell ? cell->density : 0;
		r->den = 1;
	} else {
		r->num = (__u64)(LHD_PRIOR_CLASS + e->class + 1) <<
			 LHD_DENSITY_SHIFT;
		r->den = age + 1;
	}
	if (e->explorer)
		r->num += r->den << LHD_DENSITY_SHIFT;
}

static bool lhd_below(const struct lhd_rank *a, const struct lhd_rank *b)
{
	if (!b->den)
		return false;
	if (!a->den)
		return true;
	return a->num * b->den < b->num * a->den;
}

/* ---- choosing victims ---------------------------------------------------- */

struct lhd_pick {
	__u32 slots[LHD_SAMPLES];	/* the draw, first */
	struct lhd_rank best;
	__u32 slot;
	bool found;
};

static void lhd_consider(struct lhd_pick *pick, struct lhd_entry *e,
			 __u32 slot)
{
	struct lhd_rank r;

	if (e->proposed_in == CP_STATE.round)
		return;
	lhd_rank_of(e, &r);
	if (!pick->found || lhd_below(&r, &pick->best)) {
		pick->best = r;
		pick->slot = slot;
		pick->found = true;
	}
}

CP_SAMPLER(lhd_sample, lhd_table, struct lhd_pick, LHD_SAMPLES, lhd_consider)

static long lhd_recent(__u32 i, void *data)
{
	__u64 id = CP_STATE.admitted[i & (LHD_ADMISSIONS - 1)];
	__u32 *slot = bpf_map_lookup_elem(&lhd_slots, &id);
	struct lhd_entry *e;

	if (!slot)
		return 0;
	e = bpf_map_lookup_elem(&lhd_table, slot);
	if (e && e->id == id)
		lhd_consider(data, e, *slot);
	return 0;
}

/* The next victim, marked as proposed in this round; NULL if none. */
static struct lhd_entry *lhd_victim(void)
{
	__u32 samples = CP_STATE.reconfigs > LHD_EARLY_RECONFIGS ?
			LHD_SAMPLES : LHD_EARLY_SAMPLES;
	struct lhd_pick pick = {};
	struct lhd_entry *e;
	__u64 density;

	if (CP_STATE.count)
		lhd_sample(&pick, samples);
	bpf_loop(LHD_ADMISSIONS, lhd_recent, &pick, 0);
	if (!pick.found)
		return NULL;
	e = bpf_map_lookup_elem(&lhd_table, &pick.slot);
	if (!e)
		return NULL;
	e->proposed_in = CP_STATE.round;
	density = pick.best.den ? pick.best.num / pick.best.den : 0;
	CP_STATE.victim_density = CP_STATE.victim_density -
				  CP_STATE.victim_density / 10 + density / 10;
	return e;
}

/* ---- reconfiguration ------------------------------------------------------ */

/* Decay one cell's counts by a tenth. */
static long lhd_decay(__u32 a, void *data)
{
	struct lhd_cell *cell = lhd_cell(*(__u32 *)data, a);

	if (cell) {
		cell->hits -= cell->hits / 10;
		cell->evictions -= cell->evictions / 10;
	}
	return 0;
}

/* A coarser age unit (2^delta times): cell a gathers cells a << delta ..
 * (a << delta) + 2^delta - 1, walking forward so each is read before it
 * is overwritten; the cells past the last full group are cleared, but the
 * last, which keeps everything too old to tell apart. */
struct lhd_rescale {
	__u32 class, delta;
	__u32 hits, evictions;
};

static long lhd_compress(__u32 j, void *data)
{
	struct lhd_rescale *rs = data;
	__u32 d = rs->delta & 31, groups = LHD_MAX_AGE >> d;
	struct lhd_cell *src = lhd_cell(rs->class, j), *dst;

	if (!src)
		return 1;
	if (j < groups << d) {
		if (!(j & ((1U << d) - 1))) {
			rs->hits = 0;
			rs->evictions = 0;
		}
		rs->hits += src->hits;
		rs->evictions += src->evictions;
		dst = lhd_cell(rs->class, j >> d);
		if (dst) {
			dst->hits = rs->hits;
			dst->evictions = rs->evictions;
		}
	}
	return 0;
}

static long lhd_clear_tail(__u32 j, void *data)
{
	struct lhd_rescale *rs = data;
	__u32 a = (LHD_MAX_AGE >> (rs->delta & 31)) + j;
	struct lhd_cell *cell = a < LHD_MAX_AGE - 1 ? lhd_cell(rs->class, a) :
				NULL;

	if (!cell)
		return 1;
	cell->hits = 0;
	cell->evictions = 0;
	return 0;
}

/* A finer unit (2^-delta times): the last cell first takes in every cell
 * beyond the new range, then cell a takes a share of cell a >> delta,
 * walking backward so each source is read before it is overwritten. */
static long lhd_fold_tail(__u32 j, void *data)
{
	struct lhd_rescale *rs = data;
	__u32 a = (LHD_MAX_AGE >> (rs->delta & 31)) + j;
	struct lhd_cell *cell, *last;

	if (a >= LHD_MAX_AGE - 1)
		return 1;
	cell = lhd_cell(rs->class, a);
	last = lhd_cell(rs->class, LHD_MAX_AGE - 1);
	if (cell && last) {
		last->hits += cell->hits;
		last->evictions += cell->evictions;
	}
	return 0;
}

static long lhd_stretch(__u32 j, void *data)
{
	struct lhd_rescale *rs = data;
	__u32 d = rs->delta & 31, a = LHD_MAX_AGE - 2 - j;
	struct lhd_cell *src = lhd_cell(rs->class, a >> d);
	struct lhd_cell *dst = lhd_cell(rs->class, a);

	if (src && dst) {
		dst->hits = src->hits >> d;
		dst->evictions = src->evictions >> d;
	}
	return 0;
}

/* hits / lifetime in 2^-LHD_DENSITY_SHIFT, both scaled down as far as
 * the shift needs (hits <= lifetime). */
static __u64 lhd_ratio(__u64 hits, __u64 lifetime)
{
	int k;

	for (k = 0; k < 64 && hits >= (1ULL << (63 - LHD_DENSITY_SHIFT)); k++) {
		hits >>= 1;
		lifetime >>= 1;
	}
	return lifetime ? (hits << LHD_DENSITY_SHIFT) / lifetime : 0;
}

/* Densities of one class, from the oldest age down. */
struct lhd_model_pass {
	__u32 class;
	__u64 hits, events, lifetime;
};

static long lhd_density(__u32 j, void *data)
{
	struct lhd_model_pass *mp = data;
	__u32 a = LHD_MAX_AGE - 1 - j;
	struct lhd_cell *cell = lhd_cell(mp->class, a);

	if (!cell)
		return 1;
	mp->hits += cell->hits;
	mp->events += cell->hits + cell->evictions;
	mp->lifetime += mp->events;
	/* the oldest cell only starts the sums; its pages go first anyway */
	if (a < LHD_MAX_AGE - 1)
		cell->density = mp->events ?
			lhd_ratio(mp->hits, mp->lifetime) : 0;
	return 0;
}

/*
 * Start a reconfiguration: average the pages held, and at the 5th and
 * 25th choose the age unit that spreads them over a hundredth of
 * LHD_MAX_AGE units (the smallest power of two of at least held / 200).
 */
static void lhd_start_reconfig(void)
{
	__u64 objects;
	__u32 want = 1;

	CP_STATE.reconfig_due--;
	CP_STATE.reconfig_class = 0;
	CP_STATE.reconfig_delta = 0;
	/* running average of the pages held (at full scale), 1/256 units */
	CP_STATE.objects_avg = CP_STATE.objects_avg - CP_STATE.objects_avg / 10 +
			       (cp_full_pages(CP_STATE.count) << 8);
	CP_STATE.objects_mass = CP_STATE.objects_mass -
				CP_STATE.objects_mass / 10 + (1 << 8);
	if (CP_STATE.reconfigs != 5 && CP_STATE.reconfigs != 25)
		return;
	/* pages held, in 1/256 */
	objects = CP_STATE.objects_mass ?
		  (CP_STATE.objects_avg << 8) / CP_STATE.objects_mass : 0;
	while (want < LHD_MAX_SHIFT &&
	       ((__u64)(LHD_MAX_AGE / 100) << (want + 8)) < objects)
		want++;
	CP_STATE.reconfig_delta = (__s32)want - (__s32)CP_STATE.shift;
	/* weigh the average more, to delay another step */
	CP_STATE.objects_avg *= 8;
	CP_STATE.objects_mass *= 8;
}

static void lhd_reconfigure_class(__u32 class)
{
	struct lhd_rescale rs = { .class = class };
	struct lhd_model_pass mp = { .class = class };
	__s32 delta = CP_STATE.reconfig_delta;

	bpf_loop(LHD_MAX_AGE, lhd_decay, &class, 0);
	if (delta > 0) {
		rs.delta = delta;
		bpf_loop(LHD_MAX_AGE, lhd_compress, &rs, 0);
		bpf_loop(LHD_MAX_AGE, lhd_clear_tail, &rs, 0);
	} else if (delta < 0) {
		rs.delta = -delta;
		bpf_loop(LHD_MAX_AGE, lhd_fold_tail, &rs, 0);
		bpf_loop(LHD_MAX_AGE - 1, lhd_stretch, &rs, 0);
	}
	bpf_loop(LHD_MAX_AGE, lhd_density, &mp, 0);
	CP_STATE.modelled |= 1U << (class & (LHD_CLASSES - 1));
}

/* One class of a reconfiguration per reclaim round. */
static void lhd_reconfigure_step(void)
{
	if (!CP_STATE.reconfig_class) {
		if (!CP_STATE.reconfig_due)
			return;
		lhd_start_reconfig();
	}
	lhd_reconfigure_class(CP_STATE.reconfig_class);
	if (++CP_STATE.reconfig_class < LHD_CLASSES)
		return;
	CP_STATE.shift = (__u32)((__s32)CP_STATE.shift + CP_STATE.reconfig_delta);
	CP_STATE.reconfig_class = 0;
	CP_STATE.reconfigs++;
}

/* ---- callbacks -------------------------------------------------------------- */

void BPF_STRUCT_OPS(lhd_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	__u32 i;

	lhd_reconfigure_step();
	CP_STATE.round++;
	cache_ext_list_iterate(memcg, CP_STATE.overflow, cp_take, ectx);
	for (i = 0; i < CACHE_EXT_MAX_CANDIDATES; i++) {
		__u32 n = ectx->nr_candidates;
		struct lhd_entry *e;

		if (n >= ectx->request || n >= CACHE_EXT_MAX_CANDIDATES)
			break;
		e = lhd_victim();
		if (!e)
			break;
		if (cp_propose(ectx, cp_folio_of(e->id)))
			break;
	}
}

void BPF_STRUCT_OPS(lhd_folio_added, struct folio *folio)
{
	struct lhd_entry e = {
		.stamp = CP_STATE.now,
		.last_last_hit_age = LHD_MAX_AGE,	/* never hit: class 0 */
		.class = lhd_class(LHD_MAX_AGE),
		.fresh = 1,
	};

	if (cp_sample_add(&lhd_slots, &lhd_table, &CP_STATE.count, folio, &e))
		cache_ext_list_add_tail(CP_STATE.overflow, folio);
}

/* Explorers: one access in LHD_EXPLORE_ONE_IN, within the budget. */
static bool lhd_explore(struct lhd_entry *e)
{
	bool roll = bpf_get_prandom_u32() % LHD_EXPLORE_ONE_IN == 0;

	if (roll && CP_STATE.explorer_budget > 0 &&
	    CP_STATE.reconfigs < LHD_EARLY_RECONFIGS) {
		e->explorer = 1;
		CP_STATE.explorer_budget--;
	} else {
		e->explorer = 0;
	}
	return roll;
}

/*
 * A hit (or an eviction) of e, counted at the page's age in its class; an
 * explorer gives its budget back.  Returns that age.
 */
static __u32 lhd_count_event(struct lhd_entry *e, bool hit)
{
	__u32 age = lhd_age(e);
	struct lhd_cell *cell = lhd_cell(e->class, age);

	if (cell) {
		if (hit)
			cell->hits += LHD_ONE_EVENT;
		else
			cell->evictions += LHD_ONE_EVENT;
	}
	if (e->explorer)
		CP_STATE.explorer_budget++;
	return age;
}

void BPF_STRUCT_OPS(lhd_folio_accessed, struct folio *folio)
{
	struct lhd_entry *e = cp_sample_entry(&lhd_slots, &lhd_table, folio);
	struct lhd_rank r;
	bool inserted;
	__u32 age;

	if (e) {
		inserted = cp_first_access(&e->fresh);
		if (!inserted) {
			age = lhd_count_event(e, true);
			e->last_last_hit_age = e->last_hit_age;
			e->last_hit_age = age;
			e->class = lhd_class(e->last_hit_age +
					     e->last_last_hit_age);
		}
		e->stamp = CP_STATE.now;
		/* a new page that looks like a victim is a candidate too */
		if (!lhd_explore(e) && inserted) {
			lhd_rank_of(e, &r);
			if (r.den && r.num < CP_STATE.victim_density * r.den)
				CP_STATE.admitted[CP_STATE.admitted_next++ &
						  (LHD_ADMISSIONS - 1)] = e->id;
		}
	}
	CP_STATE.now += CP_STATE.tick;
	if (CP_STATE.now >= CP_STATE.next_reconfig) {
		/* only flag it: the work happens in the next reclaim rounds */
		CP_STATE.next_reconfig = CP_STATE.now +
					 (LHD_RECONFIG << LHD_TICK_SHIFT);
		CP_STATE.reconfig_due++;
	}
}

void BPF_STRUCT_OPS(lhd_folio_evicted, struct folio *folio)
{
	struct lhd_entry *e = cp_sample_entry(&lhd_slots, &lhd_table, folio);

	if (!e)
		return;
	lhd_count_event(e, false);
	cp_sample_remove(&lhd_slots, &lhd_table, &CP_STATE.count, folio);
}

CP_POLICY(lhd,
	  .init = (void *)lhd_init,
	  .evict_folios = (void *)lhd_evict_folios,
	  .folio_added = (void *)lhd_folio_added,
	  .folio_accessed = (void *)lhd_folio_accessed,
	  .folio_evicted = (void *)lhd_folio_evicted);
