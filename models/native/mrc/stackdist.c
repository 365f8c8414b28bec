// SPDX-License-Identifier: Apache-2.0
/* Mattson stack distances with SHARDS sampling; see stackdist.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cachepilot_hash.h"
#include "cachepilot_hll.h"
#include "stackdist.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MIN_POSITIONS	1024
#define MAX_BINS	(1u << 24)	/* beyond this, bins get coarser */
#define PREFETCH_AHEAD	8

/* ---- key -> position map: linear probing, backward-shift deletion ---- */

static int map_init(struct cp_keymap *m, size_t cap)
{
	m->slots = calloc(cap, sizeof(*m->slots));
	m->mask = cap - 1;
	m->used = 0;
	return m->slots ? 0 : -1;
}

static inline size_t map_slot(const struct cp_keymap *m, uint64_t key)
{
	/* Sampled keys have small hashes, so index with the low bits. */
	return cp_hash64(key ^ 0x5bd1e995ULL) & m->mask;
}

static inline size_t map_find(const struct cp_keymap *m, uint64_t key)
{
	size_t i = map_slot(m, key);

	while (m->slots[i].val && m->slots[i].key != key)
		i = (i + 1) & m->mask;
	return i;
}

static int map_grow(struct cp_keymap *m)
{
	struct cp_keymap bigger;
	size_t i;

	if (map_init(&bigger, (m->mask + 1) * 2))
		return -1;
	for (i = 0; i <= m->mask; i++)
		if (m->slots[i].val)
			bigger.slots[map_find(&bigger, m->slots[i].key)] = m->slots[i];
	bigger.used = m->used;
	free(m->slots);
	*m = bigger;
	return 0;
}

static void map_delete_at(struct cp_keymap *m, size_t i)
{
	size_t j = i;

	m->slots[i].val = 0;
	m->used--;
	/* Shift later members of the probe run back into the hole. */
	for (;;) {
		size_t home;

		j = (j + 1) & m->mask;
		if (!m->slots[j].val)
			return;
		home = map_slot(m, m->slots[j].key);
		/* Move j to i unless its home lies cyclically in (i, j]. */
		if ((i <= j) ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		m->slots[i] = m->slots[j];
		m->slots[j].val = 0;
		i = j;
	}
}

/* ---- live positions: bitmap + Fenwick tree over 64-position blocks ---- */

static inline void tree_add(int32_t *tree, size_t nblocks, size_t block, int32_t v)
{
	for (size_t i = block + 1; i <= nblocks; i += i & -i)
		tree[i - 1] += v;
}

/* Live positions in blocks 0..block. */
static inline int64_t tree_prefix(const int32_t *tree, size_t block)
{
	int64_t s = 0;

	for (size_t i = block + 1; i > 0; i -= i & -i)
		s += tree[i - 1];
	return s;
}

static inline void mark(struct cp_stackdist *sd, size_t pos)
{
	sd->alive[pos / 64] |= 1ULL << (pos % 64);
	tree_add(sd->tree, sd->cap / 64, pos / 64, 1);
}

static inline void unmark(struct cp_stackdist *sd, size_t pos)
{
	sd->alive[pos / 64] &= ~(1ULL << (pos % 64));
	tree_add(sd->tree, sd->cap / 64, pos / 64, -1);
}

/* Live positions after pos. */
static inline uint64_t live_after(const struct cp_stackdist *sd, size_t pos)
{
	size_t b = pos / 64, o = pos % 64;
	uint64_t in_block = o == 63 ? 0 : sd->alive[b] >> (o + 1);

	return sd->live - (uint64_t)tree_prefix(sd->tree, b) +
	       (uint64_t)__builtin_popcountll(in_block);
}

/* Renumber live positions densely (in order) into arrays of size new_cap. */
static int compact(struct cp_stackdist *sd, size_t new_cap)
{
	size_t nblocks = new_cap / 64, p, next = 0;
	int32_t *tree = calloc(nblocks, sizeof(*tree));
	uint64_t *owner = malloc(new_cap * sizeof(*owner));
	uint64_t *alive = calloc(nblocks, sizeof(*alive));
	uint32_t *stamp = sd->stamp ? malloc(new_cap * sizeof(*stamp)) : NULL;

	if (!tree || !owner || !alive || (sd->stamp && !stamp)) {
		free(tree);
		free(owner);
		free(alive);
		free(stamp);
		return -1;
	}
	for (p = 0; p < sd->now; p++) {
		if (!(sd->alive[p / 64] >> (p % 64) & 1))
			continue;
		owner[next] = sd->owner[p];
		if (stamp)
			stamp[next] = sd->stamp[p];
		alive[next / 64] |= 1ULL << (next % 64);
		sd->map.slots[map_find(&sd->map, sd->owner[p])].val = next + 1;
		next++;
	}
	/* Linear-time Fenwick build from the per-block counts. */
	for (p = 0; p < nblocks; p++)
		tree[p] = __builtin_popcountll(alive[p]);
	for (p = 1; p <= nblocks; p++) {
		size_t up = p + (p & -p);

		if (up <= nblocks)
			tree[up - 1] += tree[p - 1];
	}
	free(sd->tree);
	free(sd->owner);
	free(sd->alive);
	free(sd->stamp);
	sd->tree = tree;
	sd->owner = owner;
	sd->alive = alive;
	sd->stamp = stamp;
	sd->cap = new_cap;
	sd->now = next;
	return 0;
}

static int make_room(struct cp_stackdist *sd)
{
	size_t want = sd->cap;

	/* Keep at least half the positions free after renumbering. */
	while (want < 2 * (sd->live + 1))
		want *= 2;
	return compact(sd, want);
}

/* ---- histogram ---- */

static int hist_add(struct cp_stackdist *sd, uint64_t bin, double v)
{
	while (bin >= MAX_BINS) {
		/* Coarsen: merge bins (2b-1, 2b) into b. */
		size_t b, n = sd->nbins;

		for (b = 1; b < n; b++) {
			double x = sd->hist[b];

			sd->hist[b] = 0;
			sd->hist[(b + 1) / 2] += x;
		}
		sd->bin_pages *= 2;
		bin = (bin + 1) / 2;
	}
	if (bin >= sd->nbins) {
		size_t n = sd->nbins ? sd->nbins : 1024;
		double *h;

		while (n <= bin)
			n *= 2;
		if (n > MAX_BINS)
			n = MAX_BINS;
		h = realloc(sd->hist, n * sizeof(*h));
		if (!h)
			return -1;
		memset(h + sd->nbins, 0, (n - sd->nbins) * sizeof(*h));
		sd->hist = h;
		sd->nbins = n;
	}
	sd->hist[bin] += v;
	return 0;
}

double cp_sd_rate(const struct cp_stackdist *sd)
{
	if (!sd->filter || sd->threshold == CP_THRESHOLD_ALL)
		return 1.0;
	return (double)sd->threshold / 18446744073709551616.0;
}

static uint64_t scaled_bin(const struct cp_stackdist *sd, uint64_t dist)
{
	double pages;

	if (!sd->filter || sd->threshold == CP_THRESHOLD_ALL)
		pages = (double)dist;
	else
		/*
		 * dist - 1 sampled keys lie between the two references; each
		 * stands for 1/rate keys of the full trace.
		 */
		pages = (double)(dist - 1) / cp_sd_rate(sd) + 1.0;
	if (sd->bin_pages == 1 && pages == floor(pages))
		return (uint64_t)pages;
	/* The rate is threshold / 2^64, a hair off R: do not let that round up. */
	return (uint64_t)ceil(pages / (double)sd->bin_pages - 1e-9);
}

/* ---- fixed-size mode: max-heap of (hash, key) ---- */

static void heap_push(struct cp_stackdist *sd, uint64_t hash, uint64_t key)
{
	struct cp_heap_item *h = sd->heap;
	size_t i = sd->heap_len++;

	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (h[parent].hash >= hash)
			break;
		h[i] = h[parent];
		i = parent;
	}
	h[i].hash = hash;
	h[i].key = key;
}

static struct cp_heap_item heap_pop(struct cp_stackdist *sd)
{
	struct cp_heap_item *h = sd->heap, top = h[0], last;
	size_t i = 0, n = --sd->heap_len;

	if (!n)
		return top;
	last = h[n];
	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && h[c + 1].hash > h[c].hash)
			c++;
		if (h[c].hash <= last.hash)
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = last;
	return top;
}

static void forget_key(struct cp_stackdist *sd, uint64_t key)
{
	size_t slot = map_find(&sd->map, key);
	size_t pos;

	if (!sd->map.slots[slot].val)
		return;
	pos = sd->map.slots[slot].val - 1;
	unmark(sd, pos);
	map_delete_at(&sd->map, slot);
	sd->live--;
}

/* Drop the largest-hash keys until at most max_keys remain. */
static void shrink_sample(struct cp_stackdist *sd)
{
	while (sd->live > sd->max_keys && sd->heap_len) {
		double old_rate = cp_sd_rate(sd);
		struct cp_heap_item top = heap_pop(sd);

		forget_key(sd, top.key);
		sd->evicted++;
		sd->threshold = top.hash;
		/* Everything with hash >= the new threshold leaves too. */
		while (sd->heap_len && sd->heap[0].hash >= sd->threshold) {
			top = heap_pop(sd);
			forget_key(sd, top.key);
			sd->evicted++;
		}
		sd->gain *= cp_sd_rate(sd) / old_rate;
	}
	if (sd->gain < 1e-200) {
		/* Renormalise before the factor underflows. */
		for (size_t b = 0; b < sd->nbins; b++)
			sd->hist[b] *= sd->gain;
		sd->cold *= sd->gain;
		sd->gain = 1.0;
	}
}

/* ---- records for the "stack" estimator ---- */

static int record(struct cp_stackdist *sd, uint32_t prev_slice, uint64_t between)
{
	if (sd->nrec == sd->rec_cap) {
		size_t cap = sd->rec_cap ? 2 * sd->rec_cap : 1024;
		struct cp_sd_record *r = realloc(sd->rec, cap * sizeof(*r));

		if (!r)
			return -1;
		sd->rec = r;
		sd->rec_cap = cap;
	}
	sd->rec[sd->nrec].prev_slice = prev_slice;
	sd->rec[sd->nrec].slice = sd->slice;
	sd->rec[sd->nrec].between = between;
	sd->nrec++;
	return 0;
}

/*
 * A slice's sketch starts empty, so whether a reference raises a register
 * is a coin toss for much of the slice, and a branch on it mispredicts.
 * With slices on, hashes are batched and counted in a tight loop that
 * stores the maximum whether it rose or not.
 */
void cp_sd_sync_hll(struct cp_stackdist *sd)
{
	unsigned int bits = sd->hll_bits;
	unsigned char *regs = sd->hll;

	if (!sd->hll_batch)
		return;

	for (size_t k = 0; k < sd->hll_nbatch; k++) {
		cp_u64 m = cp_hll_mix(sd->hll_batch[k]);
		unsigned int i = (unsigned int)(m >> (64 - bits));
		unsigned char r = (unsigned char)(cp_clz64((m << bits) |
							   (1ULL << (bits - 1))) + 1);
		unsigned char cur = regs[i];

		regs[i] = cur > r ? cur : r;
	}
	if (sd->slice_refs)
		sd->slice_fill += sd->hll_nbatch;
	sd->hll_nbatch = 0;
}

int cp_sd_slices_init(struct cp_stackdist *sd, uint64_t slice_refs,
		      size_t max_slices)
{
	size_t m = (size_t)1 << sd->hll_bits;

	if (!sd->hll || sd->stamp || max_slices < 2 || slice_refs % CP_SD_SLICE_UNIT)
		return -1;
	sd->hll_batch = malloc(CP_SD_SLICE_UNIT * sizeof(*sd->hll_batch));
	sd->stamp = calloc(sd->cap, sizeof(*sd->stamp));
	sd->slice_hll = malloc(max_slices * m);
	sd->slice_accesses = calloc(max_slices, sizeof(*sd->slice_accesses));
	sd->slice_first = calloc(max_slices, sizeof(*sd->slice_first));
	if (!sd->hll_batch || !sd->stamp || !sd->slice_hll || !sd->slice_accesses ||
	    !sd->slice_first)
		return -1;	/* cp_sd_free releases what was allocated */
	sd->slice_refs = slice_refs;
	sd->max_slices = max_slices;
	return 0;
}

/* dst = register-wise maximum of dst and src */
static void sketch_max(unsigned char *dst, const unsigned char *src, size_t m)
{
	size_t r = 0;

#ifdef __SSE2__
	for (; r + 16 <= m; r += 16) {
		__m128i a = _mm_loadu_si128((const __m128i *)(dst + r));
		__m128i b = _mm_loadu_si128((const __m128i *)(src + r));

		_mm_storeu_si128((__m128i *)(dst + r), _mm_max_epu8(a, b));
	}
#endif
	for (; r < m; r++)
		if (src[r] > dst[r])
			dst[r] = src[r];
}

/* Halve the kept slices: neighbours 2k and 2k + 1 become slice k. */
static void merge_slice_pairs(struct cp_stackdist *sd)
{
	size_t m = (size_t)1 << sd->hll_bits, k;

	for (k = 0; 2 * k < sd->nslices; k++) {
		unsigned char *dst = sd->slice_hll + k * m;
		const unsigned char *a = sd->slice_hll + 2 * k * m;

		memmove(dst, a, m);
		sd->slice_accesses[k] = sd->slice_accesses[2 * k];
		sd->slice_first[k] = sd->slice_first[2 * k];
		if (2 * k + 1 < sd->nslices) {
			sketch_max(dst, a + m, m);
			sd->slice_accesses[k] += sd->slice_accesses[2 * k + 1];
		}
	}
	sd->nslices = k;
	if (sd->slice_refs)
		sd->slice_refs *= 2;
}

int cp_sd_close_slice(struct cp_stackdist *sd, const unsigned char *hll,
		      uint64_t accesses)
{
	size_t m = (size_t)1 << sd->hll_bits;

	if (!sd->slice_hll)
		return -1;
	if (sd->slice == UINT32_MAX)
		return -1;	/* slice numbers are spent */
	if (sd->nslices == sd->max_slices)
		merge_slice_pairs(sd);
	cp_sd_sync_hll(sd);
	memcpy(sd->slice_hll + sd->nslices * m, hll ? hll : sd->hll, m);
	sd->slice_accesses[sd->nslices] = accesses;
	sd->slice_first[sd->nslices] = sd->slice;
	sd->nslices++;
	sd->slice++;
	sd->slice_fill = 0;
	memset(sd->hll, 0, m);
	return 0;
}

void cp_sd_slices_reset(struct cp_stackdist *sd)
{
	sd->nslices = 0;
	sd->nrec = 0;
	sd->slice_fill = 0;
}

/* ---- the reference path ---- */

static int reference(struct cp_stackdist *sd, uint64_t key)
{
	struct cp_slot *e;

	if (sd->now == sd->cap && make_room(sd))
		return -1;
	/* Load factor at most 1/2 keeps probe runs short. */
	if ((sd->map.used + 1) * 2 > sd->map.mask + 1 && map_grow(&sd->map))
		return -1;

	e = &sd->map.slots[map_find(&sd->map, key)];
	sd->sampled++;
	if (e->val) {
		size_t pos = e->val - 1;
		uint64_t dist = live_after(sd, pos) + 1;

		if (hist_add(sd, scaled_bin(sd, dist), 1.0 / sd->gain))
			return -1;
		if (sd->stamp && record(sd, sd->stamp[pos], dist - 1))
			return -1;
		unmark(sd, pos);
	} else {
		sd->cold += 1.0 / sd->gain;
		if (sd->stamp && record(sd, CP_SD_COLD, 0))
			return -1;
		e->key = key;
		sd->map.used++;
		sd->live++;
	}
	e->val = sd->now + 1;
	sd->owner[sd->now] = key;
	if (sd->stamp)
		sd->stamp[sd->now] = sd->slice;
	mark(sd, sd->now);
	sd->now++;
	return 0;
}

int cp_sd_feed(struct cp_stackdist *sd, const uint64_t *keys, size_t n)
{
	size_t i;

	sd->seen += n;
	if (!sd->filter) {
		for (i = 0; i < n; i++) {
			/* Hide the key map's cache miss for a later key. */
			if (i + PREFETCH_AHEAD < n)
				__builtin_prefetch(&sd->map.slots[map_slot(&sd->map,
						   keys[i + PREFETCH_AHEAD])]);
			if (reference(sd, keys[i]))
				return -1;
		}
		return 0;
	}
	for (i = 0; i < n; i++) {
		uint64_t h = cp_hash64(keys[i]);

		if (sd->hll_batch) {
			sd->hll_batch[sd->hll_nbatch++] = h;
		} else {
			cp_hll_add(sd->hll, h, sd->hll_bits);
		}
		if (h < sd->threshold) {
			size_t before = sd->live;

			if (reference(sd, keys[i]))
				return -1;
			if (sd->max_keys && sd->live > before) {
				heap_push(sd, h, keys[i]);
				shrink_sample(sd);
			}
		}
		/* slices end on batch boundaries (a reader may have flushed a
		 * part batch: then a slice runs a little long); the reference
		 * that fills a slice belongs to it */
		if (sd->hll_nbatch == CP_SD_SLICE_UNIT) {
			cp_sd_sync_hll(sd);
			if (sd->slice_refs && sd->slice_fill >= sd->slice_refs &&
			    cp_sd_close_slice(sd, NULL, sd->slice_fill))
				return -1;
		}
	}
	return 0;
}

/* A new window: the histogram and the window's sketch start from zero. */
static void cp_sd_clear_counts(struct cp_stackdist *sd)
{
	if (sd->nbins)
		memset(sd->hist, 0, sd->nbins * sizeof(*sd->hist));
	sd->cold = 0;
	sd->gain = 1.0;
	if (sd->hll)
		memset(sd->hll, 0, (size_t)1 << sd->hll_bits);
	sd->hll_nbatch = 0;
}

void cp_sd_hist(struct cp_stackdist *sd, double *out, int reset)
{
	out[0] = sd->cold * sd->gain;
	for (size_t b = 1; b < sd->nbins; b++)
		out[b] = sd->hist[b] * sd->gain;
	if (reset)
		cp_sd_clear_counts(sd);
}

int cp_sd_init(struct cp_stackdist *sd, uint64_t threshold, int filter,
	       size_t max_keys)
{
	memset(sd, 0, sizeof(*sd));
	sd->threshold = threshold;
	sd->filter = filter;
	sd->max_keys = max_keys;
	sd->bin_pages = 1;
	sd->gain = 1.0;
	sd->cap = MIN_POSITIONS;
	sd->tree = calloc(sd->cap / 64, sizeof(*sd->tree));
	sd->owner = malloc(sd->cap * sizeof(*sd->owner));
	sd->alive = calloc(sd->cap / 64, sizeof(*sd->alive));
	if (max_keys)
		sd->heap = malloc((max_keys + 2) * sizeof(*sd->heap));
	if (filter) {
		sd->hll_bits = CP_HLL_BITS;
		sd->hll = calloc(CP_HLL_REGS, 1);
	}
	if (!sd->tree || !sd->owner || !sd->alive || (max_keys && !sd->heap) ||
	    (filter && !sd->hll) ||
	    map_init(&sd->map, 1024)) {
		cp_sd_free(sd);
		return -1;
	}
	return 0;
}

void cp_sd_clear_keys(struct cp_stackdist *sd)
{
	memset(sd->map.slots, 0, (sd->map.mask + 1) * sizeof(*sd->map.slots));
	sd->map.used = 0;
	memset(sd->tree, 0, sd->cap / 64 * sizeof(*sd->tree));
	memset(sd->alive, 0, sd->cap / 64 * sizeof(*sd->alive));
	sd->now = 0;
	sd->live = 0;
	sd->heap_len = 0;
	cp_sd_clear_counts(sd);
	cp_sd_slices_reset(sd);
}

void cp_sd_free(struct cp_stackdist *sd)
{
	/* every buffer the struct owns (all from malloc/calloc, any may be NULL) */
	void *owned[] = { sd->map.slots, sd->tree, sd->owner, sd->alive, sd->heap,
			  sd->hist, sd->hll, sd->stamp, sd->rec, sd->hll_batch,
			  sd->slice_hll, sd->slice_accesses, sd->slice_first };
	size_t i;

	for (i = 0; i < sizeof(owned) / sizeof(owned[0]); i++)
		free(owned[i]);
	memset(sd, 0, sizeof(*sd));
}
