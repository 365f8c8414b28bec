/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mattson stack distances in O(log M) per reference, with SHARDS sampling.
 *
 * Every live key owns one position ("timestamp"); a bitmap marks the live
 * positions and a Fenwick tree counts them per block of 64.  The LRU stack
 * distance of a re-reference is the number of live keys touched after the
 * key's previous reference, plus one: a popcount inside the block plus one
 * prefix query over blocks (a tree 64 times smaller stays in cache).  Positions only grow, so when they run out
 * the live keys are renumbered densely in order: memory stays O(M) for an
 * endless stream and the amortised cost per reference stays O(log M).
 *
 * Sampling (SHARDS): a reference is processed only if cp_hash64(key) is
 * below the threshold; its distance among sampled keys is scaled by
 * 1/rate.  In fixed-size mode at most max_keys keys are tracked; a new key
 * beyond that evicts the key with the largest hash, the threshold drops to
 * that hash and the histogram is rescaled by new_rate/old_rate (lazily,
 * through one global factor, so a rescale is O(1)).
 *
 * In sampling mode every reference, sampled or not, also goes into a
 * HyperLogLog sketch (cachepilot_hll.h) of the distinct keys of the current
 * window: what the "keys" estimator compares the sample's key count with.
 *
 * With slices on (the "stack" estimator, models/stack.py), time is cut
 * into numbered slices: every slice_refs references, or whenever the caller
 * closes one with a sketch of its own (the kernel's).  Each closed slice
 * keeps its sketch and its reference count; at most max_slices are kept,
 * and when they are full neighbours merge in pairs (register maximum) and
 * automatic slices grow twice as long.  Every key remembers the slice
 * number of its latest reference, and every sampled reference is written
 * out as (slice number of the previous reference or CP_SD_COLD, slice
 * number now, sampled keys between).  Slice numbers count every slice ever
 * opened; a kept slice covers a run of them from its `first` number on.
 */
#ifndef CP_STACKDIST_H
#define CP_STACKDIST_H

#include <stddef.h>
#include <stdint.h>

/* One slot of the key map; key and value share a cache line. */
struct cp_slot {
	uint64_t key;
	uint64_t val;		/* position + 1; 0 = empty slot */
};

struct cp_keymap {
	struct cp_slot *slots;
	size_t mask;		/* capacity - 1, capacity a power of two */
	size_t used;
};

struct cp_heap_item {
	uint64_t hash;
	uint64_t key;
};

/* Hashes batched before they reach the open slice's sketch; automatic
 * slices are a multiple of it, so they end on batch boundaries. */
#define CP_SD_SLICE_UNIT 256

/* A sampled reference, for the "stack" estimator. */
#define CP_SD_COLD UINT32_MAX	/* prev_slice of a key's first reference */

struct cp_sd_record {
	uint32_t prev_slice;	/* slice of the key's previous reference */
	uint32_t slice;		/* slice of this one */
	uint64_t between;	/* distinct sampled keys referenced in between */
};

struct cp_stackdist {
	uint64_t threshold;	/* keep keys with hash < threshold */
	int filter;		/* 0: every key (exact LRU), skip the compare */
	size_t max_keys;	/* fixed-size SHARDS bound; 0 = fixed rate */

	struct cp_keymap map;	/* key -> position + 1 */
	uint64_t *alive;	/* bit p set: position p is a key's latest */
	int32_t *tree;		/* Fenwick tree of live counts per 64-position block */
	uint64_t *owner;	/* key at each position */
	size_t cap;		/* positions available (a multiple of 64) */
	size_t now;		/* next free position */
	size_t live;		/* live keys (= tracked keys) */

	struct cp_heap_item *heap; /* max-heap on hash (fixed-size mode) */
	size_t heap_len;

	/*
	 * Histogram of scaled stack distances.  Bin b >= 1 holds references
	 * whose scaled distance is in ((b-1)*bin_pages, b*bin_pages].  Stored
	 * values times `gain` are the counts at the current rate.
	 */
	double *hist;
	size_t nbins;
	uint64_t bin_pages;
	double cold;		/* first references (infinite distance) */
	double gain;

	unsigned char *hll;	/* 1 << hll_bits registers; NULL in exact mode */
	unsigned int hll_bits;

	uint32_t *stamp;	/* slice of each position's reference; NULL = no slices */
	uint32_t slice;		/* number of the open slice */
	struct cp_sd_record *rec;
	size_t nrec, rec_cap;
	uint64_t *hll_batch;	/* hashes not yet counted into the sketch (slices on) */
	size_t hll_nbatch;
	uint64_t slice_refs;	/* automatic slice length; 0 = the caller closes */
	uint64_t slice_fill;	/* references in the open slice, batch aside */
	unsigned char *slice_hll; /* max_slices sketches of the closed slices */
	uint64_t *slice_accesses; /* references each closed slice stands for */
	uint32_t *slice_first;	/* first slice number each closed slice covers */
	size_t nslices, max_slices;

	uint64_t seen;		/* keys offered */
	uint64_t sampled;	/* references processed */
	uint64_t evicted;	/* keys dropped by fixed-size mode */
};

int cp_sd_init(struct cp_stackdist *sd, uint64_t threshold, int filter,
	       size_t max_keys);
void cp_sd_free(struct cp_stackdist *sd);
/* Returns 0, or -1 when out of memory (state stays consistent). */
int cp_sd_feed(struct cp_stackdist *sd, const uint64_t *keys, size_t n);
double cp_sd_rate(const struct cp_stackdist *sd);
/* Copy the histogram in current-rate units; optionally zero it and the
 * distinct-key sketch (a new window). */
void cp_sd_hist(struct cp_stackdist *sd, double *out, int reset);
/* Turn slices on (sampling mode, before the first reference): automatic
 * ones of slice_refs references (a multiple of CP_SD_SLICE_UNIT), or only
 * those the caller closes when 0.  Returns 0, or -1 when out of memory or
 * when slice_refs is not such a multiple. */
int cp_sd_slices_init(struct cp_stackdist *sd, uint64_t slice_refs,
		      size_t max_slices);
/* Close the open slice: its sketch is `hll` if given (the sketch replaces
 * the engine's own, which restarts either way) and it stands for
 * `accesses` references.  Returns 0, or -1 when out of memory. */
int cp_sd_close_slice(struct cp_stackdist *sd, const unsigned char *hll,
		      uint64_t accesses);
/* Forget the closed slices and the records (a new window). */
void cp_sd_slices_reset(struct cp_stackdist *sd);
/* Count the references still batched into the open slice's sketch
 * (before reading sd->hll). */
void cp_sd_sync_hll(struct cp_stackdist *sd);
/* Forget every tracked key and the histogram (threshold is kept). */
void cp_sd_clear_keys(struct cp_stackdist *sd);

#endif /* CP_STACKDIST_H */
