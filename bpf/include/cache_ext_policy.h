/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cache_ext_policy.h - write a page-cache eviction policy once, run it twice.
 *
 * A policy lives in bpf/policies/<name>.bpf.c and includes only this header.
 * The same file builds two ways:
 *
 *   clang -target bpf -I bpf/include ...   -> struct_ops object for the
 *       cache_ext kernel (needs the patched kernel's vmlinux.h);
 *   cc -I bpf/include ...                  -> the user-space simulator
 *       (models/native/runtime), where one process runs many independent
 *       instances of the policy (one per miniature simulation / cgroup).
 *
 * This comment is the contract.  The policy guide, docs/policies.md, says
 * what each library policy does and the conventions they share, and how
 * to check a new one (`cachepilot policy check`); the runnable example is
 * bpf/policies/template/policy.bpf.c.
 *
 * HOW TO WRITE A POLICY (bpf/policies/lru.bpf.c is the smallest, on the
 * one-list skeleton CP_ONE_LIST below; the template spells everything out)
 *
 *   #include "cache_ext_policy.h"
 *
 *   // 1. Per-instance global state: ONE struct, declared with CP_STATE_DECL
 *   //    (required, exactly once) and reached as CP_STATE.field.  BPF: plain global data.  Native:
 *   //    every instance has its own zero-initialised copy.
 *   struct lru_state { __u64 list; };
 *   CP_STATE_DECL(struct lru_state);
 *
 *   // 2. Maps, declared at file scope.  BPF: real SEC(".maps") maps.  Native:
 *   //    per-instance maps behind bpf_map_lookup_elem/update_elem/delete_elem
 *   //    (same flags and return values: BPF_ANY/BPF_NOEXIST/BPF_EXIST,
 *   //    -ENOENT, -EEXIST, -E2BIG when max_entries is reached).
 *   //    Maps that grow with the cgroup are sized when the policy is
 *   //    loaded, from its capacity in pages (see CAPACITY below):
 *   CP_PAGE_MAP(meta, struct my_meta);        // key: cp_folio_id(), one
 *                                             // entry per page of capacity
 *   CP_GHOST_MAP(ghosts, __u64, 1);           // key: cp_folio_key(); LRU,
 *                                             // 1 entry per page of capacity
 *   CP_PAGE_ARRAY(table, struct my_entry);    // one slot per page of capacity
 *   //    and maps of a fixed size, given in entries:
 *   CP_HASH_MAP(tids, __u32, __u8, 4096);
 *   CP_ARRAY_MAP(hist, __u32, __u64, 64);     // zero-filled
 *   CP_LRU_HASH_MAP(lru, __u64, __u64, 1 << 16);  // full: drops the least
 *                                                 // recently used
 *   // (ghost / shadow entries: key them with cp_folio_key(), which survives
 *   // eviction; cp_folio_id() does not: it is the folio's address.)
 *
 *   // 3. Callbacks.  Name them <policy>_<op> so names stay unique when all
 *   //    policies link into one simulator; make helpers `static`.
 *   s32 BPF_STRUCT_OPS_SLEEPABLE(lru_init, struct mem_cgroup *memcg)
 *   {
 *           CP_STATE.list = cache_ext_list_create(memcg);
 *           return CP_STATE.list ? 0 : -1;
 *   }
 *   void BPF_STRUCT_OPS(lru_evict_folios, struct cache_ext_eviction_ctx *ectx,
 *                       struct mem_cgroup *memcg) { ... }
 *   // NB: never name a callback parameter `ctx`: BPF_PROG uses that name.
 *   ...
 *
 *   // 4. The ops table.  BPF: the SEC(".struct_ops.link") map named
 *   //    <name>_ops.  Native: registers the policy under <name>.
 *   CP_POLICY(lru,
 *           .init = (void *)lru_init,
 *           .evict_folios = (void *)lru_evict_folios,
 *           .folio_added = (void *)lru_folio_added,
 *           .folio_accessed = (void *)lru_folio_accessed,
 *           .folio_evicted = (void *)lru_folio_evicted);
 *
 * WHAT THE HOST (KERNEL OR SIMULATOR) DOES AROUND THE CALLBACKS
 *
 *   - A read that misses first asks admit_folio (if set; false = the page
 *     is read but not cached), then reclaims if the cgroup is full
 *     (evict-before-insert), then inserts the folio and calls folio_added,
 *     then folio_accessed: the read that brings a page in also marks it
 *     accessed, exactly as filemap_read() does in the kernel.  A read that
 *     hits calls folio_accessed only.
 *   - Reclaim asks evict_folios for ctx->request (1..32) candidates.  Every
 *     candidate is validated: ones not cached, duplicates and those beyond
 *     ctx->request are ignored and counted; if fewer than requested remain,
 *     the host evicts its oldest cached pages instead (fallback).
 *   - Evicting a folio calls folio_evicted, then the host unlinks the folio
 *     from whatever eviction list holds it; the policy need not list_del.
 *   - Eviction lists are ordered head -> tail; iterate and score start at
 *     the head, so evict from the head.  FIFO/LRU add at the tail
 *     (cache_ext_list_add_tail) and move accessed folios to the tail.
 *   - cache_ext_list_iterate() walks from the head, continuing from the
 *     node that followed the one just visited: a node the callback moves to
 *     the tail is met again later (CLOCK-style second chances work).  It
 *     stops at the end of the list, on CACHE_EXT_ITER_STOP, once ctx holds
 *     ctx->request candidates, or after CACHE_EXT_ITER_MAX_NODES nodes.
 *     The callback may move or delete the node it was given, nothing else.
 *   - cache_ext_list_score() scores the first nr_score nodes (at most
 *     CACHE_EXT_SCORE_MAX_NODES) and proposes the lowest ones, ascending;
 *     equal scores keep list order.  The score callback must not move
 *     nodes.
 *   - iterate and score work only inside evict_folios, on its ctx and
 *     memcg (-EINVAL otherwise).  cache_ext_list_move also puts a folio
 *     that is on no list onto one; add on a listed folio is -EEXIST; a
 *     folio the host does not track is -ENOENT; a bad list id -EINVAL.
 *
 * CAPACITY
 *
 *   A policy's capacity is the number of pages its cgroup can hold: in the
 *   kernel the loader (bpf/policyctl) takes it from the cgroup's memory
 *   limit, or the host's memory when there is none, and sizes every
 *   CP_PAGE_MAP, CP_GHOST_MAP and CP_PAGE_ARRAY from it before loading; a
 *   loader that does not size them gets CP_DEFAULT_PAGES.  In the
 *   simulator it is the cache's size (scaled, in a miniature simulation).
 *   A page the policy has no room for (its per-page map is full: the
 *   cgroup holds more pages than the capacity, after a limit was raised)
 *   is a defined case: cp_page_add() counts it in the policy's cp_stats
 *   map, which the loader reads back (policyctl stats) and the simulator
 *   reports, and the policy puts the page where its reclaim looks first.
 *
 * ACCESSORS AND HELPERS (use these, never folio fields)
 *
 *   cp_folio_id(f)     64-bit id while cached (the folio's address, in both
 *                      builds): key your per-page maps with it
 *   cp_folio_of(id)    the folio of an id, to propose as a candidate (the
 *                      host checks every candidate, so a stale id is safe)
 *   cp_folio_ino(f)    inode number      (simulator: 0)
 *   cp_folio_index(f)  page index        (simulator: the trace key)
 *   cp_folio_key(f)    the page key of cachepilot_hash.h: stays the same
 *                      after eviction, so key ghost/shadow maps with it
 *   cp_clock()         monotonic per-instance clock: ktime ns in the kernel,
 *                      the instance's access counter in the simulator
 *   cp_current_tid()   thread id of the reader (simulator: the trace's tid)
 *   cp_full_pages(n)   n pages of this cache expressed at full scale: n in
 *                      the kernel; n / R in a miniature simulation at rate
 *                      R.  Use it where a policy compares against absolute
 *                      sizes (e.g. linux's "1 GiB" balance rule).
 *   cp_capacity_pages()  the policy's capacity (above)
 *   cache_ext_node_folio(node)   folio of an eviction-list node
 *   bpf_get_prandom_u32()  random numbers (simulator: a seeded generator
 *                      per instance, so simulations repeat exactly)
 *   bpf_loop(n, cb, data, 0)   n calls of cb(i, data), until it returns 1
 *   cp_first_access(&fresh)   the insertion's access (below)
 *   cp_page_add(map, folio, value)  a new page's entry; counts a full map
 *   cp_page_of(map, folio), cp_page_del(map, folio)  find, drop that entry
 *   cp_count_reuse(), cp_count_use(), cp_use_score()  a page's use count:
 *                      an access's step, and a score from it
 *   CP_COUNT_LISTS(p, n), cp_count_list(), cp_evict_by_count(),
 *   CP_USE_SCORER      one list per use count (lfu, get_scan): the state,
 *                      where a page goes, reclaim
 *   cp_lists_create(memcg, lists, n)  n eviction lists at init
 *   cp_take            walk callback proposing every page it is shown
 *   cp_propose(ectx, folio)  propose one folio outside a walk
 *   cp_sample_*(), CP_SAMPLER  random samples of the pages a policy holds
 *   CP_ONE_LIST(p), CP_ONE_LIST_OPS(p), CP_TAKE_HEAD(p),
 *   CP_TAIL_ON_ACCESS(p)  the skeleton of a one-list policy (fifo, lru)
 *
 *   The read that brings a page in reaches the policy twice (folio_added,
 *   then folio_accessed: see the host, above).  A policy that counts reuse
 *   keeps a `__u8 fresh` in its per-page value, sets it in folio_added and
 *   begins folio_accessed with `if (cp_first_access(&page->fresh)) return;`.
 *
 * Only the native build runs in the simulator: keep the policy's logic
 * inside the verifier's rules (bounded loops, no pointers kept in maps).
 */
#ifndef CACHE_EXT_POLICY_H
#define CACHE_EXT_POLICY_H

#define CACHE_EXT_ITER_CONTINUE 0
#define CACHE_EXT_ITER_EVICT 1
#define CACHE_EXT_ITER_STOP 2
/* Upper bounds on the nodes one iterate / score call visits. */
#define CACHE_EXT_ITER_MAX_NODES 65536
#define CACHE_EXT_SCORE_MAX_NODES 16384

/* Capacity of a policy whose loader does not size its maps: 1 GiB. */
#ifndef CP_DEFAULT_PAGES
#define CP_DEFAULT_PAGES (1 << 18)
#endif

/*
 * v & mask, with the mask kept even where the compiler can prove it
 * redundant: an array index the verifier must see bounded (a clamp alone
 * may compile to code whose bound the verifier does not follow).
 */
#define cp_mask(v, mask) ({					\
	__typeof__(v) __cp_v = (v);				\
	asm volatile("" : "+r"(__cp_v));			\
	__cp_v & (mask);					\
})

#ifdef __BPF__
/* ------------------------------------------------------------------------
 * BPF build: the kernel defines the types (vmlinux.h); we only declare the
 * kfuncs and map the header's macros onto libbpf's.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "cachepilot_hash.h"

#ifndef CACHE_EXT_MAX_CANDIDATES
#define CACHE_EXT_MAX_CANDIDATES 32
#endif
#ifndef E2BIG
#define E2BIG 7		/* vmlinux.h has no errno values */
#endif

__u64 cache_ext_list_create(struct mem_cgroup *memcg) __ksym;
int cache_ext_list_add(__u64 list, struct folio *folio) __ksym;
int cache_ext_list_add_tail(__u64 list, struct folio *folio) __ksym;
int cache_ext_list_move(__u64 list, struct folio *folio, bool tail) __ksym;
int cache_ext_list_del(struct folio *folio) __ksym;
int cache_ext_list_iterate(struct mem_cgroup *memcg, __u64 list,
			   int (*cb)(int idx, struct cache_ext_list_node *node),
			   struct cache_ext_eviction_ctx *ctx) __ksym;
int cache_ext_list_score(struct mem_cgroup *memcg, __u64 list,
			 __s64 (*score)(int idx, struct cache_ext_list_node *node),
			 struct cache_ext_eviction_ctx *ctx, __u32 nr_score) __ksym;
struct folio *cache_ext_node_folio(struct cache_ext_list_node *node) __ksym;

/*
 * Keep the contract's structs complete in every object's BTF.  clang emits
 * a struct that an object only reaches through pointers as a forward
 * declaration, and libbpf then finds a kfunc's prototype (a FWD folio or
 * list node) incompatible with the kernel's complete one ("func_proto
 * incompatible with vmlinux").  One unused global holding them by value,
 * in a section libbpf ignores, makes clang emit them in full.
 */
struct cp_btf_anchor {
	struct folio folio;
	struct cache_ext_list_node node;
	struct mem_cgroup memcg;
	struct cache_ext_eviction_ctx ectx;
	struct cache_ext_admit_ctx actx;
};
struct cp_btf_anchor cp_btf_anchor
	__attribute__((unused, section(".cp_btf_anchor")));

#define BPF_STRUCT_OPS(name, args...) \
	SEC("struct_ops/" #name) BPF_PROG(name, ##args)
#define BPF_STRUCT_OPS_SLEEPABLE(name, args...) \
	SEC("struct_ops.s/" #name) BPF_PROG(name, ##args)

#define CP_STATE_DECL(type) type cp_state_data
#define CP_STATE cp_state_data

/* A map of type mtype; the optional last argument adds fields (flags). */
#define CP_BPF_MAP(name, mtype, ktype, vtype, max, ...)		\
	struct {						\
		__uint(type, mtype);				\
		__VA_ARGS__					\
		__uint(max_entries, max);			\
		__type(key, ktype);				\
		__type(value, vtype);				\
	} name SEC(".maps")
/* Hash maps allocate on demand: max_entries is a bound, not a cost. */
#define CP_HASH_MAP(name, ktype, vtype, max)				\
	CP_BPF_MAP(name, BPF_MAP_TYPE_HASH, ktype, vtype, max,		\
		   __uint(map_flags, BPF_F_NO_PREALLOC);)
#define CP_LRU_HASH_MAP(name, ktype, vtype, max) \
	CP_BPF_MAP(name, BPF_MAP_TYPE_LRU_HASH, ktype, vtype, max)
#define CP_ARRAY_MAP(name, ktype, vtype, max) \
	CP_BPF_MAP(name, BPF_MAP_TYPE_ARRAY, ktype, vtype, max)

/*
 * Maps sized from the capacity.  Each carries a read-only marker,
 * cp_per_page__<map> = entries per page of capacity, which the loader
 * finds in the object's BTF and scales the map's max_entries by; the
 * compiled-in size is what a loader that does not know the convention
 * gets.  cp_capacity is set by the same loader.
 */
#define CP_PER_PAGE(name, n) const volatile __u32 cp_per_page__##name = (n)
#define CP_PAGE_MAP(name, vtype)					\
	CP_HASH_MAP(name, __u64, vtype, CP_DEFAULT_PAGES);		\
	CP_PER_PAGE(name, 1)
#define CP_GHOST_MAP(name, vtype, per_page)				\
	CP_LRU_HASH_MAP(name, __u64, vtype, (per_page) * CP_DEFAULT_PAGES); \
	CP_PER_PAGE(name, per_page)
#define CP_PAGE_ARRAY(name, vtype)					\
	CP_ARRAY_MAP(name, __u32, vtype, CP_DEFAULT_PAGES);		\
	CP_PER_PAGE(name, 1)

const volatile __u64 cp_capacity = CP_DEFAULT_PAGES;

#define CP_POLICY(pname, ...)					\
	char _license[] SEC("license") = "GPL";			\
	SEC(".struct_ops.link")					\
	struct cache_ext_ops pname##_ops = {			\
		__VA_ARGS__,					\
		.name = #pname,					\
	}

static __always_inline __u64 cp_folio_id(struct folio *folio)
{
	return (__u64)folio;
}

static __always_inline struct folio *cp_folio_of(__u64 id)
{
	return (struct folio *)id;
}

static __always_inline __u64 cp_folio_ino(struct folio *folio)
{
	return BPF_CORE_READ(folio, mapping, host, i_ino);
}

static __always_inline __u64 cp_folio_index(struct folio *folio)
{
	return BPF_CORE_READ(folio, index);
}

static __always_inline __u64 cp_folio_key(struct folio *folio)
{
	__u64 dev = BPF_CORE_READ(folio, mapping, host, i_sb, s_dev);

	return cp_page_key(dev, cp_folio_ino(folio), cp_folio_index(folio));
}

static __always_inline __u64 cp_clock(void)
{
	return bpf_ktime_get_ns();
}

static __always_inline __u32 cp_current_tid(void)
{
	return (__u32)bpf_get_current_pid_tgid();
}

static __always_inline __u64 cp_full_pages(__u64 pages)
{
	return pages;
}

static __always_inline __u64 cp_capacity_pages(void)
{
	return cp_capacity;
}

/* See the native build's; the kernel has nothing to do. */
static __always_inline void cp_prefetch(void *map, const void *key)
{
}

#else /* !__BPF__ */
/* ------------------------------------------------------------------------
 * Native build: the simulator runtime (models/native/runtime) provides the
 * "kernel".  Types below are the runtime's; policies must not touch their
 * fields.  Kfuncs and map operations reach the runtime through a table of
 * function pointers the runtime hands to each policy file when it registers,
 * so a policy compiled later into its own shared object (dlopen) works the
 * same as one linked into the runtime.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <linux/types.h>	/* __u64 and friends, as the kernel spells them */
#include "cachepilot_hash.h"

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;

#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#define SEC(name)
#define bpf_printk(fmt, ...) ((void)0)

/* Intrusive doubly linked list node of the simulator. */
struct cache_ext_list_node {
	struct cache_ext_list_node *prev, *next;
	__u64 list;		/* handle of the list holding it, 0 = none */
};

/* One simulated page.  Policies: accessors only. */
struct folio {
	__u64 key;		/* page key (trace block number) */
	__u64 ino;
	__u64 index;
	struct cache_ext_list_node node;	/* policy eviction list */
	struct folio *older, *newer;	/* host registry, insertion order */
	struct folio *hnext;		/* freelist link */
	__u64 slot;		/* index in the instance's folio pool */
	__u32 cached;		/* 1 while in the cache */
	__u32 batch;		/* reclaim batch that last proposed it */
	void *owner;		/* instance the folio belongs to */
};

struct mem_cgroup;	/* the runtime's instance; opaque to policies */

#include "cache_ext_types.h"

/*
 * Map types: the BPF ones, and CP_MAP_PAGE, the simulator's form of a
 * CP_PAGE_MAP: a hash map keyed by folio id whose values live beside the
 * folios, so a lookup is an index, not a probe.
 */
enum cp_map_type {
	CP_MAP_HASH = 1, CP_MAP_ARRAY = 2, CP_MAP_LRU_HASH = 9,
	CP_MAP_PAGE = 100,
};

/* A map declaration; the runtime creates one map per instance from it. */
struct cp_map_def {
	enum cp_map_type type;
	__u32 key_size, value_size, max_entries;
	__u32 per_page;		/* >0: max_entries = per_page x capacity */
	int slot;		/* index into the instance's map table */
	const char *name;
	struct cp_map_def *next;
};

struct cp_map;

/*
 * How every native map begins: what the inline lookup below reads, so an
 * array lookup is an index and a bound check, as the BPF JIT makes it.
 */
struct cp_map_head {
	enum cp_map_type type;
	__u32 value_size, max_entries;
	char *array;		/* CP_MAP_ARRAY: the elements */
};

/* What the runtime offers policies (the "kfuncs" and map helpers). */
struct cp_runtime_api {
	__u64 (*list_create)(struct mem_cgroup *memcg);
	int (*list_add)(__u64 list, struct folio *folio, bool tail);
	int (*list_move)(__u64 list, struct folio *folio, bool tail);
	int (*list_del)(struct folio *folio);
	int (*list_iterate)(struct mem_cgroup *memcg, __u64 list,
			    int (*cb)(int, struct cache_ext_list_node *),
			    struct cache_ext_eviction_ctx *ctx);
	int (*list_score)(struct mem_cgroup *memcg, __u64 list,
			  __s64 (*score)(int, struct cache_ext_list_node *),
			  struct cache_ext_eviction_ctx *ctx, __u32 nr_score);
	void *(*map_lookup)(struct cp_map *map, const void *key);
	long (*map_update)(struct cp_map *map, const void *key,
			   const void *value, __u64 flags);
	long (*map_delete)(struct cp_map *map, const void *key);
	__u64 (*clock)(void);
	__u32 (*current_tid)(void);
	__u64 (*full_pages)(__u64 pages);
	__u64 (*capacity)(void);
};

/* Everything the runtime needs to know about one policy file. */
struct cp_policy_file {
	const struct cache_ext_ops *ops;
	__u32 state_size;
	struct cp_map_def *maps;
	int nr_maps;
	const struct cp_runtime_api **api;	/* runtime fills *api */
	/* make `state`, `maps` and the random generator's state current for
	 * this thread's callbacks */
	void (*enter)(void *state, struct cp_map **maps, __u64 *rng);
	struct cp_policy_file *next;
};

static inline struct folio *
cache_ext_node_folio(struct cache_ext_list_node *node)
{
	return (struct folio *)((char *)node - offsetof(struct folio, node));
}

#ifndef CP_RUNTIME_INTERNAL	/* the runtime's own sources stop here */
/*
 * Per translation unit (= per policy file): its registration record, the
 * runtime's table, and this thread's current instance.  Static, so many
 * policies link side by side into one simulator.
 */
static const struct cp_runtime_api *cp_api;
static __thread void *cp_cur_state __attribute__((tls_model("initial-exec")));
static __thread struct cp_map **cp_cur_maps
	__attribute__((tls_model("initial-exec")));
static __thread __u64 *cp_cur_rng __attribute__((tls_model("initial-exec")));

static void cp_enter(void *state, struct cp_map **maps, __u64 *rng)
{
	cp_cur_state = state;
	cp_cur_maps = maps;
	cp_cur_rng = rng;
}

static struct cp_policy_file cp_this_file = {
	.api = &cp_api,
	.enter = cp_enter,
};

#define BPF_STRUCT_OPS(name, args...) name(args)
#define BPF_STRUCT_OPS_SLEEPABLE(name, args...) name(args)

#define CP_STATE_DECL(type) typedef type cp_state_t
#define CP_STATE (*(cp_state_t *)cp_cur_state)

/* Maps register themselves with this file's record before main/dlopen
 * returns; priority 101 runs before the policy's own constructor. */
#define CP_DECLARE_MAP(mname, mtype, ktype, vtype, max, per)		\
	static struct cp_map_def mname = {				\
		.type = mtype, .key_size = sizeof(ktype),		\
		.value_size = sizeof(vtype), .max_entries = (max),	\
		.per_page = (per), .name = #mname,			\
	};								\
	__attribute__((constructor(101))) static void			\
	cp_add_map_##mname(void)					\
	{								\
		mname.slot = cp_this_file.nr_maps++;			\
		mname.next = cp_this_file.maps;				\
		cp_this_file.maps = &mname;				\
	}
#define CP_HASH_MAP(name, ktype, vtype, max) \
	CP_DECLARE_MAP(name, CP_MAP_HASH, ktype, vtype, max, 0)
#define CP_ARRAY_MAP(name, ktype, vtype, max) \
	CP_DECLARE_MAP(name, CP_MAP_ARRAY, ktype, vtype, max, 0)
#define CP_LRU_HASH_MAP(name, ktype, vtype, max) \
	CP_DECLARE_MAP(name, CP_MAP_LRU_HASH, ktype, vtype, max, 0)
#define CP_PAGE_MAP(name, vtype) \
	CP_DECLARE_MAP(name, CP_MAP_PAGE, __u64, vtype, 0, 1)
#define CP_GHOST_MAP(name, vtype, per_page) \
	CP_DECLARE_MAP(name, CP_MAP_LRU_HASH, __u64, vtype, 0, per_page)
#define CP_PAGE_ARRAY(name, vtype) \
	CP_DECLARE_MAP(name, CP_MAP_ARRAY, __u32, vtype, 0, 1)

/*
 * Registration.  Linked into the runtime, the policy calls
 * cp_register_policy_file() from a constructor.  Built as its own shared
 * object, that (weak) symbol is absent and the runtime finds the record
 * through the exported cp_policy_entry() after dlopen().
 */
void cp_register_policy_file(struct cp_policy_file *file)
	__attribute__((weak));
struct cp_policy_file *cp_policy_entry(void)
	__attribute__((weak, visibility("default")));

#define CP_POLICY(pname, ...)						\
	static const struct cache_ext_ops pname##_ops = {		\
		__VA_ARGS__,						\
		.name = #pname,						\
	};								\
	struct cp_policy_file *cp_policy_entry(void)			\
	{								\
		return &cp_this_file;					\
	}								\
	__attribute__((constructor(102))) static void			\
	cp_register_##pname(void)					\
	{								\
		cp_this_file.ops = &pname##_ops;			\
		cp_this_file.state_size = sizeof(cp_state_t);		\
		if (cp_register_policy_file)				\
			cp_register_policy_file(&cp_this_file);		\
	}

static inline __u64 cache_ext_list_create(struct mem_cgroup *memcg)
{
	return cp_api->list_create(memcg);
}

static inline int cache_ext_list_add(__u64 list, struct folio *folio)
{
	return cp_api->list_add(list, folio, false);
}

static inline int cache_ext_list_add_tail(__u64 list, struct folio *folio)
{
	return cp_api->list_add(list, folio, true);
}

static inline int cache_ext_list_move(__u64 list, struct folio *folio,
				      bool tail)
{
	return cp_api->list_move(list, folio, tail);
}

static inline int cache_ext_list_del(struct folio *folio)
{
	return cp_api->list_del(folio);
}

static inline int
cache_ext_list_iterate(struct mem_cgroup *memcg, __u64 list,
		       int (*cb)(int idx, struct cache_ext_list_node *node),
		       struct cache_ext_eviction_ctx *ctx)
{
	return cp_api->list_iterate(memcg, list, cb, ctx);
}

static inline int
cache_ext_list_score(struct mem_cgroup *memcg, __u64 list,
		     __s64 (*score)(int idx, struct cache_ext_list_node *node),
		     struct cache_ext_eviction_ctx *ctx, __u32 nr_score)
{
	return cp_api->list_score(memcg, list, score, ctx, nr_score);
}

static __always_inline void *bpf_map_lookup_elem(void *map, const void *key)
{
	struct cp_map *m = cp_cur_maps[((struct cp_map_def *)map)->slot];
	const struct cp_map_head *h = (const struct cp_map_head *)m;

	if (h->type == CP_MAP_ARRAY) {
		__u32 i = *(const __u32 *)key;

		return i < h->max_entries ?
		       h->array + (size_t)i * h->value_size : NULL;
	}
	return cp_api->map_lookup(m, key);
}

static inline long bpf_map_update_elem(void *map, const void *key,
				       const void *value, __u64 flags)
{
	return cp_api->map_update(cp_cur_maps[((struct cp_map_def *)map)->slot],
				  key, value, flags);
}

static inline long bpf_map_delete_elem(void *map, const void *key)
{
	return cp_api->map_delete(cp_cur_maps[((struct cp_map_def *)map)->slot],
				  key);
}

static inline __u64 bpf_get_current_pid_tgid(void)
{
	__u64 tid = cp_api->current_tid();

	return tid << 32 | tid;
}

static inline __u64 cp_folio_id(struct folio *folio)
{
	return (__u64)(uintptr_t)folio;
}

static inline struct folio *cp_folio_of(__u64 id)
{
	return (struct folio *)(uintptr_t)id;
}

static inline __u64 cp_folio_ino(struct folio *folio)
{
	return folio->ino;
}

static inline __u64 cp_folio_index(struct folio *folio)
{
	return folio->index;
}

static inline __u64 cp_folio_key(struct folio *folio)
{
	return folio->key;
}

static inline __u64 cp_clock(void)
{
	return cp_api->clock();
}

static inline __u32 cp_current_tid(void)
{
	return cp_api->current_tid();
}

static inline __u64 cp_full_pages(__u64 pages)
{
	return cp_api->full_pages(pages);
}

static inline __u64 cp_capacity_pages(void)
{
	return cp_api->capacity();
}

/*
 * Start fetching an array map's element that will be read soon: a batch of
 * random draws followed by their reads then overlaps their cache misses
 * (the simulator's tables are far larger than its caches).
 */
static __always_inline void cp_prefetch(void *map, const void *key)
{
	const struct cp_map_head *h = (const struct cp_map_head *)
		cp_cur_maps[((struct cp_map_def *)map)->slot];
	__u32 i = *(const __u32 *)key;

	if (h->type == CP_MAP_ARRAY && i < h->max_entries)
		__builtin_prefetch(h->array + (size_t)i * h->value_size);
}

/* xorshift64*, one state per instance: the same run, the same draws */
static __always_inline __u32 bpf_get_prandom_u32(void)
{
	__u64 x = *cp_cur_rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*cp_cur_rng = x;
	return (__u32)((x * 0x2545F4914F6CDD1DULL) >> 32);
}

static __always_inline long bpf_loop(__u32 nr, void *callback, void *data,
				      __u64 flags)
{
	long (*cb)(__u32, void *) = (long (*)(__u32, void *))callback;
	__u32 i;

	for (i = 0; i < nr; i++)
		if (cb(i, data))
			return i + 1;
	return nr;
}

#endif /* !CP_RUNTIME_INTERNAL */
#endif /* __BPF__ */

/*
 * Pages a policy had no room for: every policy object has a one-entry map
 * cp_stats of this; cp_page_add() counts, the loader writes the capacity
 * and pins the map beside the policy's link (policyctl stats reads it),
 * the simulator reports it with a cache's counters.
 */
struct cp_policy_stats {
	__u64 capacity;		/* pages, as the maps were sized */
	__u64 overflow;		/* pages added that found a per-page map full */
};

#if defined(__BPF__) || !defined(CP_RUNTIME_INTERNAL)
/* ------------------------------------------------------------------------
 * Both builds: what every policy shares.
 */
CP_ARRAY_MAP(cp_stats, __u32, struct cp_policy_stats, 1);

/*
 * The read that brings a page in reaches the policy twice (folio_added,
 * then folio_accessed): true, once, for that second call of a page whose
 * `fresh` byte folio_added set, so that reuse counts from the second read.
 */
static __always_inline bool cp_first_access(__u8 *fresh)
{
	if (!*fresh)
		return false;
	*fresh = 0;
	return true;
}

static __always_inline void cp_count_overflow(void)
{
	__u32 zero = 0;
	struct cp_policy_stats *st = bpf_map_lookup_elem(&cp_stats, &zero);

	if (st)
		st->overflow++;
}

/*
 * A new page's entry in a per-page map (CP_PAGE_MAP): 0 when it got one.
 * When the map is full the page is counted as overflow, and the caller
 * puts it where its reclaim looks first (each policy says where).
 */
static __always_inline int cp_page_add(void *map, struct folio *folio,
				       const void *value)
{
	__u64 id = cp_folio_id(folio);
	long err = bpf_map_update_elem(map, &id, value, BPF_ANY);

	if (err == -E2BIG)
		cp_count_overflow();
	return err ? -1 : 0;
}

/*
 * Propose one folio outside a list walk (a policy that draws its victims
 * from a table, not a list): 0 when it went in, -1 when the context holds
 * ctx->request candidates already.  The verifier refuses a store into the
 * context at a variable offset, and the compiler turns a chain of stores
 * at constant offsets back into one such store; so in the kernel each
 * slot has its own store, written in assembly, and a test of the count.
 */
#ifdef __BPF__
#define CP_CANDIDATE_SLOT(k)							if (n == (k)) {									asm volatile("*(u64 *)(%[c] + %[off]) = %[f]"					     : : [c] "r"(ectx), [f] "r"(folio),					       [off] "i"(__builtin_offsetof(						struct cache_ext_eviction_ctx,						candidates) + 8 * (k))						     : "memory");							goto stored;							}
#define CP_CANDIDATE_SLOTS4(k)							CP_CANDIDATE_SLOT(k) CP_CANDIDATE_SLOT((k) + 1)				CP_CANDIDATE_SLOT((k) + 2) CP_CANDIDATE_SLOT((k) + 3)

static __noinline __attribute__((unused)) int
cp_propose(struct cache_ext_eviction_ctx *ectx, struct folio *folio)
{
	__u32 n = ectx->nr_candidates;

	_Static_assert(CACHE_EXT_MAX_CANDIDATES == 32,
		       "cp_propose writes 32 slots");
	if (n >= ectx->request)
		return -1;
	CP_CANDIDATE_SLOTS4(0) CP_CANDIDATE_SLOTS4(4)
	CP_CANDIDATE_SLOTS4(8) CP_CANDIDATE_SLOTS4(12)
	CP_CANDIDATE_SLOTS4(16) CP_CANDIDATE_SLOTS4(20)
	CP_CANDIDATE_SLOTS4(24) CP_CANDIDATE_SLOTS4(28)
	return -1;
stored:
	ectx->nr_candidates = n + 1;
	return 0;
}
#else
static inline __attribute__((unused)) int
cp_propose(struct cache_ext_eviction_ctx *ectx, struct folio *folio)
{
	__u32 n = ectx->nr_candidates;

	if (n >= ectx->request || n >= CACHE_EXT_MAX_CANDIDATES)
		return -1;
	ectx->candidates[n] = folio;
	ectx->nr_candidates = n + 1;
	return 0;
}
#endif

/*
 * A list walk's callback that proposes every page it is shown, in list
 * order: cache_ext_list_iterate(memcg, list, cp_take, ectx) evicts from
 * the head until the request is met.
 */
static int __attribute__((unused)) cp_take(int idx, struct cache_ext_list_node *node)
{
	return CACHE_EXT_ITER_EVICT;
}

/*
 * The skeleton of a one-list policy (FIFO, LRU, and the test policies that
 * misbehave on top of them): CP_ONE_LIST(p) declares the state, one list
 * in CP_STATE.list, and the callbacks p_init, which creates it, and
 * p_folio_added, which adds each new page at its tail; CP_TAKE_HEAD(p)
 * adds p_evict_folios, which proposes pages from the head, and
 * CP_TAIL_ON_ACCESS(p) p_folio_accessed, which moves a page read to the
 * tail (LRU order).  A policy with more state declares its own, with a
 * `__u64 list`, and takes the callbacks alone from CP_ONE_LIST_OPS(p).
 * The policy writes what differs and names every callback in its
 * CP_POLICY.
 */
#define CP_ONE_LIST(p)							\
	struct p##_state {						\
		__u64 list;						\
	};								\
	CP_STATE_DECL(struct p##_state);				\
	CP_ONE_LIST_OPS(p)
#define CP_ONE_LIST_OPS(p)						\
	s32 BPF_STRUCT_OPS_SLEEPABLE(p##_init, struct mem_cgroup *memcg) \
	{								\
		CP_STATE.list = cache_ext_list_create(memcg);		\
		return CP_STATE.list ? 0 : -1;				\
	}								\
	void BPF_STRUCT_OPS(p##_folio_added, struct folio *folio)	\
	{								\
		cache_ext_list_add_tail(CP_STATE.list, folio);		\
	}
#define CP_TAKE_HEAD(p)							\
	void BPF_STRUCT_OPS(p##_evict_folios,				\
			    struct cache_ext_eviction_ctx *ectx,	\
			    struct mem_cgroup *memcg)			\
	{								\
		cache_ext_list_iterate(memcg, CP_STATE.list, cp_take, ectx); \
	}
#define CP_TAIL_ON_ACCESS(p)						\
	void BPF_STRUCT_OPS(p##_folio_accessed, struct folio *folio)	\
	{								\
		cache_ext_list_move(CP_STATE.list, folio, true);	\
	}

/* A page's entry in a per-page map (CP_PAGE_MAP), or NULL. */
static __always_inline void *cp_page_of(void *map, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);

	return bpf_map_lookup_elem(map, &id);
}

/* Drop a page's entry from a per-page map (folio_evicted's usual work). */
static __always_inline void cp_page_del(void *map, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);

	bpf_map_delete_elem(map, &id);
}

/* Create n eviction lists into lists[]: 0, or -1 when one fails. */
static __always_inline int cp_lists_create(struct mem_cgroup *memcg,
					   __u64 *lists, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		lists[i] = cache_ext_list_create(memcg);
		if (!lists[i])
			return -1;
	}
	return 0;
}

/*
 * A page's access, in a policy that counts reuse: page is a per-page
 * value with a `fresh` byte (see cp_first_access) and a counter field
 * `count`.  False for the read that brought the page in; otherwise
 * page->count grows, saturating at max, and true.  Macros here keep each
 * policy's own layout and names of its value.
 */
#define cp_count_reuse(page, count, max) ({				\
	bool __cp_reuse = !cp_first_access(&(page)->fresh);		\
	if (__cp_reuse && (page)->count < (max))			\
		(page)->count++;					\
	__cp_reuse;							\
})

/*
 * The same for LFU-like policies: ticks the policy's access clock `now`;
 * a page with an entry (page may be NULL) gets `stamp` set to it and
 * `freq` counted by cp_count_reuse.  True when the access was a reuse.
 */
#define cp_count_use(page, now, max) ({					\
	bool __cp_used = false;						\
	(now)++;							\
	if ((page)) {							\
		(page)->stamp = (now);					\
		__cp_used = cp_count_reuse(page, freq, max);		\
	}								\
	__cp_used;							\
})

/*
 * A score for cache_ext_list_score from such a page: its use count, then
 * the older last access, in one __s64 (the low time_bits of the stamp);
 * -1, evicted first, for a page with no entry.
 */
#define cp_use_score(page, time_bits)					\
	((page) ? (__s64)((__u64)(page)->freq << (time_bits) |		\
			  ((page)->stamp & ((1ULL << (time_bits)) - 1))) : -1)

/*
 * CP_USE_SCORER(name, map, type, time_bits) defines name, a score callback
 * for cache_ext_list_score: cp_use_score of the node's page, a `type` in
 * the per-page map `map`.
 */
#define CP_USE_SCORER(name, map, type, time_bits)			\
	static __s64 name(int idx, struct cache_ext_list_node *node)	\
	{								\
		type *page = cp_page_of(&map, cache_ext_node_folio(node)); \
									\
		return cp_use_score(page, time_bits);			\
	}

/*
 * One list per use count (lfu, and each side of get_scan): a group of n
 * lists, lists[first] .. lists[first + n - 1], holds the pages of count
 * 0, 1, ..., its last list every count from its own up.  mask, the lists
 * array's size - 1 (a power of two - 1), bounds each index for the
 * verifier.
 */

/*
 * The skeleton of such a policy: CP_COUNT_LISTS(p, n) declares the state,
 * n lists in CP_STATE.lists (its groups, one or more) and the access
 * clock CP_STATE.now of cp_count_use, and the callback p_init, which
 * creates the lists.
 */
#define CP_COUNT_LISTS(p, n)						\
	struct p##_state {						\
		__u64 lists[n];						\
		__u64 now;						\
	};								\
	CP_STATE_DECL(struct p##_state);				\
	s32 BPF_STRUCT_OPS_SLEEPABLE(p##_init, struct mem_cgroup *memcg) \
	{								\
		return cp_lists_create(memcg, CP_STATE.lists, n);	\
	}

/* The group's list for a page of count freq. */
static __always_inline __u64 cp_count_list(const __u64 *lists, __u32 mask,
					   __u32 first, __u32 n, __u32 freq)
{
	__u32 top = n - 1;

	return lists[cp_mask(first + (freq < top ? freq : top), mask)];
}

/*
 * Reclaim from the group: the lists but the last give pages from their
 * heads, least used first; the last, whose pages differ in count, has a
 * window of nr_score pages from its head scored by `score` (one of
 * CP_USE_SCORER's).  Stops once ectx holds its request.
 */
static __always_inline void
cp_evict_by_count(struct cache_ext_eviction_ctx *ectx, struct mem_cgroup *memcg,
		  const __u64 *lists, __u32 mask, __u32 first, __u32 n,
		  __s64 (*score)(int idx, struct cache_ext_list_node *node),
		  __u32 nr_score)
{
	__u32 i;

	for (i = 0; i + 1 < n; i++) {
		if (ectx->nr_candidates >= ectx->request)
			return;
		cache_ext_list_iterate(memcg, lists[cp_mask(first + i, mask)],
				       cp_take, ectx);
	}
	if (ectx->nr_candidates < ectx->request)
		cache_ext_list_score(memcg, lists[cp_mask(first + n - 1, mask)],
				     score, ectx, nr_score);
}

/*
 * Random samples of the pages a policy holds, as libCacheSim's sampled
 * policies (LHD, Hyperbolic) draw them from their hash table: a list can
 * only be walked from its head, so the pages also sit in a dense table,
 * a CP_PAGE_ARRAY of the policy's entries (each beginning with the page's
 * __u64 id), with a CP_PAGE_MAP of __u32 from page to slot.  A page
 * leaving moves the last entry into its slot.  `count` is the policy's
 * (in CP_STATE): the pages in the table.
 */
static __always_inline void *cp_sample_entry(void *slots, void *table,
					     struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	__u32 *slot = bpf_map_lookup_elem(slots, &id);
	__u64 *entry;

	if (!slot)
		return NULL;
	entry = bpf_map_lookup_elem(table, slot);
	return entry && *entry == id ? entry : NULL;
}

/* Add a page whose entry (its id first) is *entry; 0 on success. */
static __always_inline int cp_sample_add(void *slots, void *table,
					 __u32 *count, struct folio *folio,
					 void *entry)
{
	__u32 slot = *count;

	*(__u64 *)entry = cp_folio_id(folio);
	if (cp_page_add(slots, folio, &slot))
		return -1;
	if (bpf_map_update_elem(table, &slot, entry, BPF_ANY)) {
		/* no slot that far: the table is full like the map */
		__u64 id = cp_folio_id(folio);

		bpf_map_delete_elem(slots, &id);
		cp_count_overflow();
		return -1;
	}
	*count = slot + 1;
	return 0;
}

/* Remove a page; -1 when it was not in the table. */
static __always_inline int cp_sample_remove(void *slots, void *table,
					    __u32 *count, struct folio *folio)
{
	__u64 id = cp_folio_id(folio);
	__u32 *slot = bpf_map_lookup_elem(slots, &id);
	__u32 hole, last;
	__u64 *moved, moved_id;

	if (!slot || !*count)
		return -1;
	hole = *slot;
	last = *count - 1;
	bpf_map_delete_elem(slots, &id);
	*count = last;
	if (hole == last)
		return 0;
	moved = bpf_map_lookup_elem(table, &last);
	if (!moved)
		return 0;
	moved_id = *moved;
	if (bpf_map_update_elem(table, &hole, moved, BPF_ANY))
		return 0;
	bpf_map_update_elem(slots, &moved_id, &hole, BPF_EXIST);
	return 0;
}

/*
 * A slot drawn uniformly at random (with replacement) from a table of
 * count > 0 entries.  Draw a batch of them first and read their entries
 * after (cp_prefetch has started fetching each): a policy's sampling loop
 * then waits for memory once, not once per sample.
 */
static __always_inline __u32 cp_sample_pick(void *table, __u32 count)
{
	/* r * count / 2^32: the modulo's spread without its division */
	__u32 slot = ((__u64)bpf_get_prandom_u32() * count) >> 32;

	cp_prefetch(table, &slot);
	return slot;
}

/*
 * CP_SAMPLER(name, table, type, max, consider) defines name(draw, n): n
 * slots (n <= max, a power of two) drawn into draw->slots[] with
 * cp_sample_pick, then consider(draw, entry, slot) called on the entry of
 * each, in two bpf_loop passes so that the reads follow the draws (above).
 * `draw` is a `type *`, whose slots[max] keeps the draw and whose other
 * fields are consider's.  `table` is the policy's CP_PAGE_ARRAY, its page
 * count CP_STATE.count.
 */
#define CP_SAMPLER(name, table, type, max, consider)			\
	static long name##_draw(__u32 i, void *data)			\
	{								\
		type *draw = data;					\
									\
		draw->slots[i & ((max) - 1)] =				\
			cp_sample_pick(&table, CP_STATE.count);		\
		return 0;						\
	}								\
	static long name##_visit(__u32 i, void *data)			\
	{								\
		type *draw = data;					\
		__u32 slot = draw->slots[i & ((max) - 1)];		\
		void *e = bpf_map_lookup_elem(&table, &slot);		\
									\
		if (e)							\
			consider(draw, e, slot);			\
		return 0;						\
	}								\
	static __always_inline void name(type *draw, __u32 n)		\
	{								\
		bpf_loop(n, name##_draw, draw, 0);			\
		bpf_loop(n, name##_visit, draw, 0);			\
	}
#endif

#endif /* CACHE_EXT_POLICY_H */
