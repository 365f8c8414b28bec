// SPDX-License-Identifier: GPL-2.0
/*
 * S3-FIFO (Yang et al., SOSP'23): a small FIFO that filters out one-hit
 * wonders, a main FIFO with CLOCK-style reinsertion, and a ghost set of
 * pages recently evicted from the small FIFO.
 *
 * - New pages enter the small list, unless their key is in the ghost set
 *   (evicted from small not long ago): those go straight to main.
 * - Each access bumps the page's count, capped at 3.  The access that
 *   brings a page in does not count.
 * - Reclaim takes from main while main holds more than 90 % of the pages
 *   (or small is empty), else from small.  From small: a page read at least
 *   twice moves to main with its count cleared, any other page is proposed
 *   (and leaves a ghost entry when it goes).  From main: a page with a
 *   non-zero count is moved to the tail with its count decremented, a page
 *   with count zero is proposed.
 * - A reclaim round of several pages re-weighs main against small after
 *   each proposal, as one eviction at a time would, and never proposes a
 *   page twice in a round.
 * - The ghost set is an LRU hash keyed by the page key (device, inode,
 *   offset), which survives eviction; an entry counts only while fewer than
 *   90 % of a cache's worth of pages have been evicted from small since it
 *   was made, which is a FIFO ghost queue of 0.9 x cache size without the
 *   queue.
 *
 * - Until the first reclaim the policy cannot know where 10 % of the cache
 *   is (it does not know the cgroup's limit), so every new page joins one
 *   list.  The first reclaim splits it as if the limit had been known from
 *   the start: the oldest tenth stays small, the rest becomes main.  The
 *   list is renamed main and only that tenth is moved, so the split costs
 *   a tenth of the cache once; pages record which side they joined, and
 *   those that joined before the split are in main unless moved.  Without
 *   the split, small would start at the whole cache and drain one eviction
 *   at a time, a transient as long as a cache's worth of misses.
 *
 * Differences from libCacheSim's S3FIFO: the 10 %/90 % split and the ghost
 * size are taken from the number of pages the policy holds (equal to the
 * limit once the cgroup is full); a page proposed by reclaim but refused
 * by the kernel stays at the head of its list and is proposed again next
 * round; the ghost map holds as many entries as the capacity has pages.
 *
 * A page that finds the per-page map full (more pages than the capacity)
 * joins the overflow list, which reclaim empties first, oldest first.
 */
#include "cache_ext_policy.h"

#define S3_MOVE_TO_MAIN 2	/* accesses in small that earn main */
#define S3_MAX_FREQ 3
#define S3_WALKS 40		/* list walks per reclaim round (<= 32
				 * switches between the lists, + slack) */
#define S3_SPLIT_CALLS 64	/* iterate calls the first reclaim's split may
				 * take: a tenth of 64 x 65,536 pages */

enum s3_side {
	S3_UNSPLIT,		/* joined before the split: main after it */
	S3_SMALL,
	S3_MAIN,
};

struct s3_page {
	__u32 proposed_in;	/* reclaim round that last proposed it */
	__u8 freq;
	__u8 side;		/* enum s3_side */
	__u8 fresh;		/* the access that inserted it is pending */
};

struct s3fifo_state {
	__u64 small, main;
	__u64 overflow;			/* list: pages with no room */
	__s64 nr_small, nr_main;	/* pages held, by list */
	__s64 pend_small, pend_main;	/* proposed this round, not yet gone */
	__u32 walk_proposed;		/* proposed by the current walk */
	__u32 walking_main;		/* the current walk is over main */
	__u32 round;			/* reclaim rounds so far */
	__u64 ghost_seq;		/* pages evicted from small so far */
	__u32 split;			/* the first reclaim's split is done */
	__s64 split_keep;		/* pages the split still leaves in small */
};
CP_STATE_DECL(struct s3fifo_state);

CP_PAGE_MAP(s3_pages, struct s3_page);
/* page key -> ghost_seq when it left small */
CP_GHOST_MAP(s3_ghost, __u64, 1);

s32 BPF_STRUCT_OPS_SLEEPABLE(s3fifo_init, struct mem_cgroup *memcg)
{
	CP_STATE.small = cache_ext_list_create(memcg);
	CP_STATE.main = cache_ext_list_create(memcg);
	CP_STATE.overflow = cache_ext_list_create(memcg);
	return CP_STATE.small && CP_STATE.main && CP_STATE.overflow ? 0 : -1;
}

static struct s3_page *s3_page_of(struct folio *folio)
{
	return cp_page_of(&s3_pages, folio);
}

static bool s3_in_main(const struct s3_page *page)
{
	return page->side == S3_MAIN ||
	       (page->side == S3_UNSPLIT && CP_STATE.split);
}

/* The split: the oldest pages, now at the head of main, go back to small. */
static int s3_split_walk(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);
	struct s3_page *page = s3_page_of(folio);

	if (CP_STATE.split_keep <= 0)
		return CACHE_EXT_ITER_STOP;
	if (cache_ext_list_move(CP_STATE.small, folio, true))
		return CACHE_EXT_ITER_STOP;
	if (page)
		page->side = S3_SMALL;
	CP_STATE.split_keep--;
	CP_STATE.nr_small++;
	CP_STATE.nr_main--;
	return CACHE_EXT_ITER_CONTINUE;
}

/*
 * At the first reclaim every page is on the one list, in the order it came
 * in: that list becomes main, and its oldest tenth moves to a small list.
 */
static void s3_split(struct mem_cgroup *memcg, struct cache_ext_eviction_ctx *ectx)
{
	__u64 list = CP_STATE.small;
	int call;

	CP_STATE.split = 1;
	CP_STATE.small = CP_STATE.main;
	CP_STATE.main = list;
	CP_STATE.nr_main = CP_STATE.nr_small;
	CP_STATE.nr_small = 0;
	/* BPF has no signed division */
	CP_STATE.split_keep = CP_STATE.nr_main > 0 ?
			      (__s64)((__u64)CP_STATE.nr_main / 10) : 0;
	for (call = 0; call < S3_SPLIT_CALLS && CP_STATE.split_keep > 0; call++)
		if (cache_ext_list_iterate(memcg, CP_STATE.main, s3_split_walk,
					   ectx) < 0)
			break;
}

static __u64 s3_ninety_percent(__u64 pages)
{
	return pages - pages / 10;
}

/* Main is over its 90 % share (of the pages not already on their way out). */
static bool s3_main_over(void)
{
	__s64 small = CP_STATE.nr_small - CP_STATE.pend_small;
	__s64 main = CP_STATE.nr_main - CP_STATE.pend_main;

	if (small <= 0)
		return true;
	if (main <= 0)
		return false;
	/* BPF has no signed division: both are positive here */
	return (__u64)main > s3_ninety_percent((__u64)(small + main));
}

/*
 * One callback for both lists (the walk of main or of small): a single
 * call site keeps the verifier's work small.
 */
static int s3_walk(int idx, struct cache_ext_list_node *node)
{
	struct folio *folio = cache_ext_node_folio(node);
	struct s3_page *page = s3_page_of(folio);
	bool walking_main = CP_STATE.walking_main;

	/* a batch: once the balance turns, walk the other list */
	if (CP_STATE.walk_proposed && s3_main_over() != walking_main)
		return CACHE_EXT_ITER_STOP;
	if (!page) {
		CP_STATE.walk_proposed++;
		return CACHE_EXT_ITER_EVICT;
	}
	if (page->proposed_in == CP_STATE.round)
		return CACHE_EXT_ITER_CONTINUE;	/* met again in this round */
	if (walking_main && page->freq) {
		/* CLOCK in main: one more lap, one count less */
		page->freq = (page->freq > S3_MAX_FREQ ? S3_MAX_FREQ :
			      page->freq) - 1;
		cache_ext_list_move(CP_STATE.main, folio, true);
		return CACHE_EXT_ITER_CONTINUE;
	}
	if (!walking_main && !s3_in_main(page) &&
	    page->freq >= S3_MOVE_TO_MAIN) {
		/* read twice while in small: promote, count cleared */
		if (cache_ext_list_move(CP_STATE.main, folio, true))
			return CACHE_EXT_ITER_CONTINUE;
		page->side = S3_MAIN;
		page->freq = 0;
		CP_STATE.nr_small--;
		CP_STATE.nr_main++;
		return CACHE_EXT_ITER_CONTINUE;
	}
	page->proposed_in = CP_STATE.round;
	if (walking_main)
		CP_STATE.pend_main++;
	else
		CP_STATE.pend_small++;
	CP_STATE.walk_proposed++;
	return CACHE_EXT_ITER_EVICT;
}

void BPF_STRUCT_OPS(s3fifo_evict_folios, struct cache_ext_eviction_ctx *ectx,
		    struct mem_cgroup *memcg)
{
	int walk;

	cache_ext_list_iterate(memcg, CP_STATE.overflow, cp_take, ectx);
	if (!CP_STATE.split)
		s3_split(memcg, ectx);
	CP_STATE.pend_small = 0;
	CP_STATE.pend_main = 0;
	CP_STATE.round++;
	for (walk = 0; walk < S3_WALKS; walk++) {
		if (ectx->nr_candidates >= ectx->request)
			break;
		CP_STATE.walk_proposed = 0;
		CP_STATE.walking_main = s3_main_over();
		cache_ext_list_iterate(memcg, CP_STATE.walking_main ?
				       CP_STATE.main : CP_STATE.small,
				       s3_walk, ectx);
	}
}

void BPF_STRUCT_OPS(s3fifo_folio_added, struct folio *folio)
{
	struct s3_page page = { .fresh = 1,
				.side = CP_STATE.split ? S3_SMALL : S3_UNSPLIT };
	__u64 key = cp_folio_key(folio);
	__u64 *left_at = bpf_map_lookup_elem(&s3_ghost, &key);
	__s64 held = CP_STATE.nr_small + CP_STATE.nr_main;

	/* a ghost counts while it would still be in a 0.9 x cache FIFO */
	if (left_at && held > 0 && CP_STATE.ghost_seq - *left_at <=
	    s3_ninety_percent((__u64)held))
		page.side = S3_MAIN;
	if (left_at)
		bpf_map_delete_elem(&s3_ghost, &key);
	if (cp_page_add(&s3_pages, folio, &page)) {
		cache_ext_list_add_tail(CP_STATE.overflow, folio);
		return;
	}
	if (cache_ext_list_add_tail(page.side == S3_MAIN ? CP_STATE.main :
				    CP_STATE.small, folio)) {
		cp_page_del(&s3_pages, folio);
		return;
	}
	if (page.side == S3_MAIN)
		CP_STATE.nr_main++;
	else
		CP_STATE.nr_small++;
}

void BPF_STRUCT_OPS(s3fifo_folio_accessed, struct folio *folio)
{
	struct s3_page *page = s3_page_of(folio);

	if (page)
		cp_count_reuse(page, freq, S3_MAX_FREQ);
}

void BPF_STRUCT_OPS(s3fifo_folio_evicted, struct folio *folio)
{
	struct s3_page *page = s3_page_of(folio);
	__u64 key;

	if (!page)
		return;
	if (s3_in_main(page)) {
		CP_STATE.nr_main--;
	} else {
		CP_STATE.nr_small--;
		key = cp_folio_key(folio);
		CP_STATE.ghost_seq++;
		bpf_map_update_elem(&s3_ghost, &key, &CP_STATE.ghost_seq,
				    BPF_ANY);
	}
	cp_page_del(&s3_pages, folio);
}

CP_POLICY(s3fifo,
	  .init = (void *)s3fifo_init,
	  .evict_folios = (void *)s3fifo_evict_folios,
	  .folio_added = (void *)s3fifo_folio_added,
	  .folio_accessed = (void *)s3fifo_folio_accessed,
	  .folio_evicted = (void *)s3fifo_folio_evicted);
