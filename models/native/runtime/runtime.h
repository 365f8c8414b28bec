/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator's "kernel": one simulated memory cgroup (a cache of pages
 * with a capacity) driving one instance of a cache_ext policy compiled
 * natively through bpf/include/cache_ext_policy.h.
 */
#ifndef CP_RUNTIME_H
#define CP_RUNTIME_H

#define CP_RUNTIME_INTERNAL
#include "cache_ext_policy.h"

struct cp_stats {
	__u64 accesses;
	__u64 hits;
	__u64 misses;
	__u64 inserts;
	__u64 evictions;		/* all evictions, policy + fallback */
	__u64 admit_bypassed;		/* misses the policy chose not to cache */
	__u64 requests;			/* evict_folios calls */
	__u64 proposed;			/* candidates the policy returned */
	__u64 accepted;
	__u64 rejected_not_cached;
	__u64 rejected_duplicate;
	__u64 rejected_excess;		/* beyond ctx->request */
	__u64 fallback_evictions;
	__u64 counted_accesses;		/* accesses the caller counts (all */
	__u64 counted_misses;		/* without a mask) and their misses */
};

struct cp_list;
struct cp_chunk;

struct cp_instance {
	/* the policy side: replaced wholesale by a policy swap */
	const struct cp_policy_file *file;
	const char *name;		/* registered name of the policy */
	void *state;
	struct cp_map **maps;
	struct cp_list **lists;
	int nr_lists, cap_lists;
	__u32 serial;			/* tags list handles of this policy */

	/* the host side: the cached pages */
	struct folio **table;		/* key -> folio, open addressing */
	__u64 table_mask;
	__u64 nr_cached;
	__u64 capacity;
	__u64 policy_capacity;		/* fixed size of the policy's per-page
					 * maps; 0: they follow capacity */
	struct folio *oldest, *newest;	/* registry, insertion order */
	struct cp_chunk *chunks;	/* folio pool, sorted by address */
	int nr_chunks, cap_chunks;
	__u64 pool_size;
	struct folio *freelist, *free_tail;	/* queue, see free_push */

	double scale;			/* full-scale pages per page (1/R) */
	__u32 reclaim_batch;		/* least pages one reclaim frees */
	__u64 clock;			/* accesses so far (cp_clock) */
	__u64 rng;			/* bpf_get_prandom_u32's state */
	__u32 tid;			/* tid of the current access */
	__u32 batch_seq;		/* reclaim batch counter */
	int busy;			/* guards against concurrent use */
	int walking;			/* inside iterate/score */
	struct cache_ext_eviction_ctx *evict_ctx;	/* of evict_folios */
	struct cp_stats stats;
};

/* policy registry */
#define CP_POLICY_NAME_MAX 96
void cp_register_policy_file(struct cp_policy_file *file);
/* Register a policy loaded from a shared object; returns the name it is
 * registered under (see runtime.c) or NULL. */
const char *cp_load_policy_file(const struct cp_policy_file *file,
				const char *tag);
const struct cp_policy_file *cp_find_policy(const char *name,
					    const char **reg_name);
int cp_policy_names(const char **names, int max, int include_loaded);

/* instances; *err gets a static message on failure */
/* scale: full-scale pages per simulated page (1/R in a miniature
 * simulation, else 1), what cp_full_pages() multiplies by; policy_capacity:
 * size the policy's per-page maps for that many pages for good (0: they
 * follow the capacity), as a loader does for a cgroup whose limit grows */
struct cp_instance *cp_instance_new(const char *policy, __u64 capacity,
				    double scale, __u64 policy_capacity,
				    const char **err);
void cp_instance_free(struct cp_instance *inst);
int cp_instance_swap(struct cp_instance *inst, const char *policy,
		     const char **err);
/* Returns misses among the n accesses; tids may be NULL.  counted, when
 * not NULL, marks the accesses (nonzero) that counted_accesses and
 * counted_misses count: a tenant's throughput may count some threads'
 * reads only, while every access still moves the cache. */
__u64 cp_instance_access(struct cp_instance *inst, const __u64 *keys,
			 const __u32 *tids, const __u8 *counted, __u64 n);
void cp_instance_set_capacity(struct cp_instance *inst, __u64 capacity);
/* The pool slot of a folio of inst (cached or not), or -1 for a pointer
 * that is no folio of inst; safe for any pointer. */
long cp_instance_folio_slot(const struct cp_instance *inst,
			    const struct folio *folio);
/* The policy's cp_stats entry (pages it had no room for), or NULL. */
const struct cp_policy_stats *
cp_instance_policy_stats(const struct cp_instance *inst);
/* Fills keys (room for nr_cached) oldest first; returns the count. */
__u64 cp_instance_cached_keys(struct cp_instance *inst, __u64 *keys);

#endif /* CP_RUNTIME_H */
