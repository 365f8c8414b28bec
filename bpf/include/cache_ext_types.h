/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cache_ext_types.h - the types of the cache_ext contract, as the kernel
 * built from kernel/ defines them (include/linux/cache_ext.h there).
 *
 * Two builds need them from us rather than from the kernel: the native
 * (simulator) build of every policy, through cache_ext_policy.h, and the
 * BPF build on a host whose kernel has no cache_ext, where bpf/Makefile's
 * stand-in vmlinux.h appends this file to the running kernel's own types so
 * policies still compile.  u32, u64, s32 and bool come from the includer.
 */
#ifndef CACHE_EXT_TYPES_H
#define CACHE_EXT_TYPES_H

#ifndef CACHE_EXT_MAX_CANDIDATES
#define CACHE_EXT_MAX_CANDIDATES 32
#endif
#ifndef CACHE_EXT_OPS_NAME_LEN
#define CACHE_EXT_OPS_NAME_LEN 32
#endif

struct folio;
struct mem_cgroup;
struct cache_ext_list_node;

struct cache_ext_eviction_ctx {
	u32 request;		/* candidates reclaim wants this round, 1..32 */
	u32 nr_candidates;	/* filled by the policy */
	struct folio *candidates[CACHE_EXT_MAX_CANDIDATES];
};

struct cache_ext_admit_ctx {
	u64 ino;		/* inode number of the file */
	u64 index;		/* page index in the file */
};

struct cache_ext_ops {
	s32 (*init)(struct mem_cgroup *memcg);
	void (*evict_folios)(struct cache_ext_eviction_ctx *ctx,
			     struct mem_cgroup *memcg);
	void (*folio_added)(struct folio *folio);
	void (*folio_accessed)(struct folio *folio);
	void (*folio_evicted)(struct folio *folio);
	bool (*admit_folio)(struct cache_ext_admit_ctx *ctx);
	char name[CACHE_EXT_OPS_NAME_LEN];
};

#endif /* CACHE_EXT_TYPES_H */
