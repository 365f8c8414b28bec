// SPDX-License-Identifier: Apache-2.0
/*
 * The simulator's host side: a memory cgroup of `capacity` pages whose
 * eviction is driven by a cache_ext policy, the eviction-list kfuncs, and
 * reclaim exactly as the kernel contract describes (batches of at most 32
 * candidates, every candidate validated, fallback to the oldest page).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "maps.h"
#include "age_list.h"

/* An eviction list: circular, around a sentinel node. */
struct cp_list {
	struct cache_ext_list_node head;
	__u64 len;
};

/* A block of folios; folios never move, so stale pointers stay checkable. */
struct cp_chunk {
	struct folio *base;
	__u64 count;
	__u64 first;		/* pool slot of base[0] */
};

/* The instance whose policy callbacks run on this thread right now. */
static __thread struct cp_instance *cur;

/* ---- policy registry ---------------------------------------------------- */

/*
 * Built-in policies (linked into the runtime) register from constructors;
 * policies loaded later from shared objects never replace a built-in: one
 * whose name is taken by a built-in is registered as "<name>@<tag>".  A
 * loaded policy does replace an earlier loaded one of the same name.
 * Entries are never freed, so names and files stay valid for instances.
 */
struct cp_reg {
	char name[CP_POLICY_NAME_MAX];
	const struct cp_policy_file *file;
	int builtin;
	struct cp_reg *next;
};

static struct cp_reg *registry;

static struct cp_reg *reg_find(const char *name)
{
	struct cp_reg *r;

	for (r = registry; r; r = r->next)
		if (!strcmp(r->name, name))
			return r;
	return NULL;
}

static const char *reg_add(const struct cp_policy_file *file,
			   const char *name, int builtin)
{
	extern const struct cp_runtime_api cp_runtime_api;
	struct cp_reg *r = reg_find(name), **p;

	*file->api = &cp_runtime_api;
	if (r && !r->builtin && !builtin) {
		r->file = file;
		return r->name;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	snprintf(r->name, sizeof(r->name), "%s", name);
	r->file = file;
	r->builtin = builtin;
	for (p = &registry; *p; p = &(*p)->next)
		;
	*p = r;
	return r->name;
}

void cp_register_policy_file(struct cp_policy_file *file)
{
	reg_add(file, file->ops->name, 1);
}

const char *cp_load_policy_file(const struct cp_policy_file *file,
				const char *tag)
{
	struct cp_reg *r = reg_find(file->ops->name);
	char alias[CP_POLICY_NAME_MAX];

	if (r && r->builtin) {
		snprintf(alias, sizeof(alias), "%s@%s", file->ops->name, tag);
		return reg_add(file, alias, 0);
	}
	return reg_add(file, file->ops->name, 0);
}

const struct cp_policy_file *cp_find_policy(const char *name,
					    const char **reg_name)
{
	struct cp_reg *r = reg_find(name);

	if (r && reg_name)
		*reg_name = r->name;
	return r ? r->file : NULL;
}

int cp_policy_names(const char **names, int max, int include_loaded)
{
	const struct cp_reg *r;
	int n = 0;

	for (r = registry; r; r = r->next) {
		if (!r->builtin && !include_loaded)
			continue;
		if (n < max)
			names[n] = r->name;
		n++;
	}
	return n;
}

/* ---- lists -------------------------------------------------------------- */

static struct cp_list *list_get(__u64 handle)
{
	__u32 idx = (__u32)handle;

	if (!cur || !handle || (__u32)(handle >> 32) != cur->serial ||
	    idx == 0 || idx > (__u32)cur->nr_lists)
		return NULL;
	return cur->lists[idx - 1];
}

static int folio_ok(struct folio *folio)
{
	return folio && cur && folio->owner == cur && folio->cached;
}

static void node_unlink(struct folio *folio)
{
	struct cache_ext_list_node *n = &folio->node;
	struct cp_list *l = list_get(n->list);

	n->prev->next = n->next;
	n->next->prev = n->prev;
	if (l)
		l->len--;
	n->prev = n->next = NULL;
	n->list = 0;
}

static void node_link(struct cp_list *l, __u64 handle, struct folio *folio,
		      bool tail)
{
	struct cache_ext_list_node *n = &folio->node;
	struct cache_ext_list_node *at = tail ? l->head.prev : &l->head;

	n->prev = at;
	n->next = at->next;
	at->next->prev = n;
	at->next = n;
	n->list = handle;
	l->len++;
}

static __u64 k_list_create(struct mem_cgroup *memcg)
{
	struct cp_list *l, **lists;

	if (!cur)
		return 0;
	if (cur->nr_lists == cur->cap_lists) {
		int cap = cur->cap_lists ? cur->cap_lists * 2 : 4;

		lists = realloc(cur->lists, sizeof(*lists) * cap);
		if (!lists)
			return 0;
		cur->lists = lists;
		cur->cap_lists = cap;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return 0;
	l->head.prev = l->head.next = &l->head;
	cur->lists[cur->nr_lists++] = l;
	return (__u64)cur->serial << 32 | (__u32)cur->nr_lists;
}

/* Add (or, with move, re-place) a folio on a list; -EINVAL for a bad
 * list, -ENOENT for a folio the host does not track, -EEXIST for an add of
 * a folio already on a list. */
static int place(__u64 list, struct folio *folio, bool tail, bool move)
{
	struct cp_list *l = list_get(list);

	if (!l)
		return -EINVAL;
	if (!folio_ok(folio))
		return -ENOENT;
	if (folio->node.list) {
		if (!move)
			return -EEXIST;
		node_unlink(folio);
	}
	node_link(l, list, folio, tail);
	return 0;
}

static int k_list_add(__u64 list, struct folio *folio, bool tail)
{
	return place(list, folio, tail, false);
}

static int k_list_move(__u64 list, struct folio *folio, bool tail)
{
	return place(list, folio, tail, true);
}

static int k_list_del(struct folio *folio)
{
	if (!folio_ok(folio))
		return -ENOENT;
	if (folio->node.list)
		node_unlink(folio);
	return 0;
}

/* Walks take only the context of the running evict_folios, like the
 * kernel; returns the list or NULL. */
static struct cp_list *walk_begin(struct mem_cgroup *memcg, __u64 list,
				  struct cache_ext_eviction_ctx *ctx,
				  __u32 *limit)
{
	if (!cur || memcg != (struct mem_cgroup *)cur || !ctx ||
	    ctx != cur->evict_ctx || cur->walking)
		return NULL;
	*limit = ctx->request < CACHE_EXT_MAX_CANDIDATES ?
		 ctx->request : CACHE_EXT_MAX_CANDIDATES;
	return list_get(list);
}

/*
 * The walk continues from the node that followed the one just visited, so
 * a node the callback moves to the tail is met again later (CLOCK-style
 * second chances work); CACHE_EXT_ITER_MAX_NODES bounds it.
 */
static int k_list_iterate(struct mem_cgroup *memcg, __u64 list,
			  int (*cb)(int, struct cache_ext_list_node *),
			  struct cache_ext_eviction_ctx *ctx)
{
	struct cache_ext_list_node *node, *next;
	struct cp_list *l;
	__u32 limit;
	int visited = 0, r;

	l = walk_begin(memcg, list, ctx, &limit);
	if (!l || !cb)
		return -EINVAL;
	cur->walking = 1;
	for (node = l->head.next;
	     node != &l->head && visited < CACHE_EXT_ITER_MAX_NODES;
	     node = next) {
		if (ctx->nr_candidates >= limit)
			break;
		next = node->next;
		r = cb(visited++, node);
		if (r == CACHE_EXT_ITER_EVICT)
			ctx->candidates[ctx->nr_candidates++] =
				cache_ext_node_folio(node);
		else if (r == CACHE_EXT_ITER_STOP)
			break;
	}
	cur->walking = 0;
	return visited;
}

static int k_list_score(struct mem_cgroup *memcg, __u64 list,
			__s64 (*score)(int, struct cache_ext_list_node *),
			struct cache_ext_eviction_ctx *ctx, __u32 nr_score)
{
	struct cache_ext_list_node *node, *next;
	struct folio *best[CACHE_EXT_MAX_CANDIDATES];
	__s64 best_s[CACHE_EXT_MAX_CANDIDATES];
	__u32 limit, want, n = 0, i;
	struct cp_list *l;
	int scored = 0;

	l = walk_begin(memcg, list, ctx, &limit);
	if (!l || !score)
		return -EINVAL;
	if (ctx->nr_candidates >= limit)
		return 0;
	want = limit - ctx->nr_candidates;
	if (nr_score > CACHE_EXT_SCORE_MAX_NODES)
		nr_score = CACHE_EXT_SCORE_MAX_NODES;
	cur->walking = 1;
	for (node = l->head.next; node != &l->head && (__u32)scored < nr_score;
	     node = next) {
		__s64 s;

		next = node->next;
		s = score(scored++, node);
		/* keep the `want` lowest, ascending; ties keep list order */
		if (n == want && s >= best_s[n - 1])
			continue;
		i = n < want ? n++ : n - 1;
		while (i > 0 && best_s[i - 1] > s) {
			best_s[i] = best_s[i - 1];
			best[i] = best[i - 1];
			i--;
		}
		best_s[i] = s;
		best[i] = cache_ext_node_folio(node);
	}
	cur->walking = 0;
	for (i = 0; i < n && ctx->nr_candidates < limit; i++)
		ctx->candidates[ctx->nr_candidates++] = best[i];
	return scored;
}

static void *k_map_lookup(struct cp_map *m, const void *key)
{
	return cp_map_lookup(m, key);
}

static __u64 k_clock(void)
{
	return cur ? cur->clock : 0;
}

static __u32 k_current_tid(void)
{
	return cur ? cur->tid : 0;
}

static __u64 k_full_pages(__u64 pages)
{
	return cur ? (__u64)((double)pages * cur->scale + 0.5) : pages;
}

/* What the policy's per-page maps are sized for. */
static __u64 map_capacity(const struct cp_instance *inst)
{
	return inst->policy_capacity ? inst->policy_capacity : inst->capacity;
}

static __u64 k_capacity(void)
{
	return cur ? map_capacity(cur) : 0;
}

const struct cp_runtime_api cp_runtime_api = {
	.list_create = k_list_create,
	.list_add = k_list_add,
	.list_move = k_list_move,
	.list_del = k_list_del,
	.list_iterate = k_list_iterate,
	.list_score = k_list_score,
	.map_lookup = k_map_lookup,
	.map_update = cp_map_update,
	.map_delete = cp_map_delete,
	.clock = k_clock,
	.current_tid = k_current_tid,
	.full_pages = k_full_pages,
	.capacity = k_capacity,
};

/* ---- the folio pool and the key table ----------------------------------- */

static void enter(struct cp_instance *inst)
{
	cur = inst;
	inst->file->enter(inst->state, inst->maps, &inst->rng);
}

/*
 * Free folios queue up and are reused oldest first, so a stale pointer a
 * policy keeps to an evicted folio keeps pointing at a free folio for a
 * long while and is caught as "not cached" instead of silently hitting
 * the page that reused it.
 */
static void free_push(struct cp_instance *inst, struct folio *f)
{
	f->hnext = NULL;
	if (inst->free_tail)
		inst->free_tail->hnext = f;
	else
		inst->freelist = f;
	inst->free_tail = f;
}

static struct folio *free_pop(struct cp_instance *inst)
{
	struct folio *f = inst->freelist;

	inst->freelist = f->hnext;
	if (!inst->freelist)
		inst->free_tail = NULL;
	return f;
}

/* Sized to the cache (plus a margin of free folios, see free_push) and
 * doubling, so the many tiny caches of miniature simulations stay small;
 * never past the capacity and that margin, which is all a full cache
 * uses (a doubling would leave up to half the pool idle for good). */
static int pool_grow(struct cp_instance *inst)
{
	__u64 count = inst->pool_size ? inst->pool_size :
		      (inst->capacity < 4096 ? inst->capacity : 4096) + 64;
	__u64 enough = inst->capacity + 64;
	struct folio *base;
	int i;

	if (inst->pool_size < enough && count > enough - inst->pool_size)
		count = enough - inst->pool_size;

	if (inst->nr_chunks == inst->cap_chunks) {
		int cap = inst->cap_chunks ? inst->cap_chunks * 2 : 8;
		struct cp_chunk *c = realloc(inst->chunks, sizeof(*c) * cap);

		if (!c)
			return -ENOMEM;
		inst->chunks = c;
		inst->cap_chunks = cap;
	}
	base = calloc(count, sizeof(*base));
	if (!base)
		return -ENOMEM;
	/* keep chunks sorted by address for the candidate check */
	for (i = inst->nr_chunks; i > 0 && inst->chunks[i - 1].base > base; i--)
		inst->chunks[i] = inst->chunks[i - 1];
	inst->chunks[i].base = base;
	inst->chunks[i].count = count;
	inst->chunks[i].first = inst->pool_size;
	inst->nr_chunks++;
	for (i = 0; (__u64)i < count; i++) {
		base[i].slot = inst->pool_size + i;
		free_push(inst, &base[i]);
	}
	inst->pool_size += count;
	/* page maps keep a value slot per folio */
	if (inst->maps && inst->file)
		for (i = 0; i < inst->file->nr_maps; i++)
			if (cp_map_pool_resize(inst->maps[i], inst->pool_size))
				return -ENOMEM;
	return 0;
}

static const struct cp_chunk *chunk_of(const struct cp_instance *inst,
				       const struct folio *p)
{
	int lo = 0, hi = inst->nr_chunks - 1;
	uintptr_t a = (uintptr_t)p;

	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		const struct cp_chunk *c = &inst->chunks[mid];
		uintptr_t b = (uintptr_t)c->base;

		if (a < b)
			hi = mid - 1;
		else if (a >= b + c->count * sizeof(struct folio))
			lo = mid + 1;
		else
			return (a - b) % sizeof(struct folio) ? NULL : c;
	}
	return NULL;
}

long cp_instance_folio_slot(const struct cp_instance *inst,
			    const struct folio *folio)
{
	const struct cp_chunk *c = inst ? chunk_of(inst, folio) : NULL;

	return c ? (long)(c->first + (__u64)(folio - c->base)) : -1;
}

/* Is p one of this instance's folios, and cached?  Safe for any pointer. */
static int folio_cached_here(struct cp_instance *inst, struct folio *p)
{
	return chunk_of(inst, p) && p->cached && p->owner == inst;
}

static struct folio *table_find(struct cp_instance *inst, __u64 key)
{
	__u64 i = cp_hash64(key) & inst->table_mask;
	struct folio *f;

	while ((f = inst->table[i])) {
		if (f->key == key)
			return f;
		i = (i + 1) & inst->table_mask;
	}
	return NULL;
}

static void table_put(struct folio **table, __u64 mask, struct folio *f)
{
	__u64 i = cp_hash64(f->key) & mask;

	while (table[i])
		i = (i + 1) & mask;
	table[i] = f;
}

static int table_insert(struct cp_instance *inst, struct folio *f)
{
	if ((inst->nr_cached + 1) * 2 > inst->table_mask + 1) {
		__u64 n = (inst->table_mask + 1) * 2, i;
		struct folio **t = calloc(n, sizeof(*t));

		if (!t)
			return -ENOMEM;
		for (i = 0; i <= inst->table_mask; i++)
			if (inst->table[i])
				table_put(t, n - 1, inst->table[i]);
		free(inst->table);
		inst->table = t;
		inst->table_mask = n - 1;
	}
	table_put(inst->table, inst->table_mask, f);
	return 0;
}

static void table_remove(struct cp_instance *inst, struct folio *f)
{
	__u64 mask = inst->table_mask;
	__u64 i = cp_hash64(f->key) & mask, j;

	while (inst->table[i] != f)
		i = (i + 1) & mask;
	j = i;
	for (;;) {
		__u64 home;

		j = (j + 1) & mask;
		if (!inst->table[j])
			break;
		home = cp_hash64(inst->table[j]->key) & mask;
		if (((j - home) & mask) >= ((j - i) & mask)) {
			inst->table[i] = inst->table[j];
			i = j;
		}
	}
	inst->table[i] = NULL;
}

/* ---- eviction and reclaim ----------------------------------------------- */

static void evict(struct cp_instance *inst, struct folio *f)
{
	if (inst->file->ops->folio_evicted)
		inst->file->ops->folio_evicted(f);
	/* the host owns the list node: unlink whatever the policy left */
	if (f->node.list)
		node_unlink(f);
	table_remove(inst, f);
	CP_AGE_UNLINK(inst, f);
	f->cached = 0;
	free_push(inst, f);
	inst->nr_cached--;
	inst->stats.evictions++;
}

/* Evict `need` pages (fewer only when the cache runs empty). */
static void reclaim(struct cp_instance *inst, __u64 need)
{
	const struct cache_ext_ops *ops = inst->file->ops;
	struct cache_ext_eviction_ctx ctx;
	struct folio *victims[CACHE_EXT_MAX_CANDIDATES];
	struct cp_stats *st = &inst->stats;

	while (need > 0 && inst->nr_cached > 0) {
		__u32 req = need < CACHE_EXT_MAX_CANDIDATES ?
			    (__u32)need : CACHE_EXT_MAX_CANDIDATES;
		__u32 seen, accepted = 0, batch, i;

		if (req > inst->nr_cached)
			req = (__u32)inst->nr_cached;
		ctx.request = req;
		ctx.nr_candidates = 0;
		st->requests++;
		batch = ++inst->batch_seq;
		if (ops->evict_folios) {
			inst->evict_ctx = &ctx;
			ops->evict_folios(&ctx, (struct mem_cgroup *)inst);
			inst->evict_ctx = NULL;
		}

		st->proposed += ctx.nr_candidates;
		seen = ctx.nr_candidates < req ? ctx.nr_candidates : req;
		st->rejected_excess += ctx.nr_candidates - seen;
		for (i = 0; i < seen; i++) {
			struct folio *f = ctx.candidates[i];

			if (!folio_cached_here(inst, f)) {
				st->rejected_not_cached++;
			} else if (f->batch == batch) {
				st->rejected_duplicate++;
			} else {
				f->batch = batch;
				victims[accepted++] = f;
			}
		}
		for (i = 0; i < accepted; i++)
			evict(inst, victims[i]);
		st->accepted += accepted;
		need -= accepted;
		/* too few usable candidates: the kernel's own LRU steps in */
		for (i = accepted; i < req && need > 0 && inst->oldest; i++) {
			evict(inst, inst->oldest);
			st->fallback_evictions++;
			need--;
		}
	}
}

static int insert(struct cp_instance *inst, __u64 key)
{
	const struct cache_ext_ops *ops = inst->file->ops;
	struct folio *f;
	__u64 slot;

	if (!inst->freelist && pool_grow(inst))
		return -ENOMEM;
	f = free_pop(inst);
	slot = f->slot;
	memset(f, 0, sizeof(*f));
	f->slot = slot;
	f->key = key;
	if (table_insert(inst, f)) {
		free_push(inst, f);
		return -ENOMEM;
	}
	f->index = key;
	f->cached = 1;
	f->owner = inst;
	CP_AGE_PUSH(inst, f);
	inst->nr_cached++;
	inst->stats.inserts++;
	if (ops->folio_added)
		ops->folio_added(f);
	/* the read that faulted the page in marks it accessed (filemap_read) */
	if (ops->folio_accessed)
		ops->folio_accessed(f);
	return 0;
}

/*
 * Pages to free so one more fits.  The kernel frees at least
 * SWAP_CLUSTER_MAX (32) pages once a memcg hits its limit; a cache built
 * with reclaim_batch 1 (the default, libCacheSim's semantics) frees one.
 */
static __u64 reclaim_target(struct cp_instance *inst)
{
	__u64 need = inst->nr_cached - inst->capacity + 1;

	if (need < inst->reclaim_batch)
		need = inst->reclaim_batch;
	return need < inst->nr_cached ? need : inst->nr_cached;
}

__u64 cp_instance_access(struct cp_instance *inst, const __u64 *keys,
			 const __u32 *tids, const __u8 *counted, __u64 n)
{
	const struct cache_ext_ops *ops = inst->file->ops;
	__u64 misses = 0, counted_acc = 0, counted_miss = 0, i;

	enter(inst);
	for (i = 0; i < n; i++) {
		__u64 key = keys[i];
		int counts = !counted || counted[i];
		struct folio *f;

		inst->clock++;
		if (tids)
			inst->tid = tids[i];
		counted_acc += counts;
		f = table_find(inst, key);
		if (f) {
			if (ops->folio_accessed)
				ops->folio_accessed(f);
			continue;
		}
		misses++;
		counted_miss += counts;
		if (ops->admit_folio) {
			struct cache_ext_admit_ctx actx = { .ino = 0,
							    .index = key };

			if (!ops->admit_folio(&actx)) {
				inst->stats.admit_bypassed++;
				continue;
			}
		}
		if (inst->capacity == 0)
			continue;
		if (inst->nr_cached >= inst->capacity)
			reclaim(inst, reclaim_target(inst));
		if (insert(inst, key))
			break;	/* out of memory: stop this batch */
	}
	inst->stats.accesses += i;
	inst->stats.misses += misses;
	inst->stats.counted_accesses += counted_acc;
	inst->stats.counted_misses += counted_miss;
	inst->stats.hits += i - misses;
	cur = NULL;
	return misses;
}

/* Maps sized per page of capacity follow it (between callbacks). */
static void maps_follow_capacity(struct cp_instance *inst)
{
	struct cp_policy_stats *st;
	int i;

	if (!inst->maps)
		return;
	for (i = 0; i < inst->file->nr_maps; i++)
		cp_map_set_capacity(inst->maps[i], map_capacity(inst));
	st = (struct cp_policy_stats *)cp_instance_policy_stats(inst);
	if (st)
		st->capacity = map_capacity(inst);
}

void cp_instance_set_capacity(struct cp_instance *inst, __u64 capacity)
{
	if (capacity > inst->capacity) {
		inst->capacity = capacity;
		maps_follow_capacity(inst);
		return;
	}
	inst->capacity = capacity;
	if (inst->nr_cached > capacity) {
		enter(inst);
		reclaim(inst, inst->nr_cached - capacity);
		cur = NULL;
	}
	maps_follow_capacity(inst);
}

const struct cp_policy_stats *
cp_instance_policy_stats(const struct cp_instance *inst)
{
	const struct cp_map_def *def;
	__u32 zero = 0;

	if (!inst->maps || !inst->file)
		return NULL;
	for (def = inst->file->maps; def; def = def->next)
		if (!strcmp(def->name, "cp_stats") &&
		    def->value_size == sizeof(struct cp_policy_stats))
			return cp_map_lookup(inst->maps[def->slot], &zero);
	return NULL;
}

__u64 cp_instance_cached_keys(struct cp_instance *inst, __u64 *keys)
{
	struct folio *f;
	__u64 n = 0;

	for (f = inst->oldest; f; f = f->newer)
		keys[n++] = f->key;
	return n;
}

/* ---- policy instances --------------------------------------------------- */

static void policy_teardown(struct cp_instance *inst)
{
	int i;

	if (inst->maps && inst->file)
		for (i = 0; i < inst->file->nr_maps; i++)
			cp_map_free(inst->maps[i]);
	free(inst->maps);
	for (i = 0; i < inst->nr_lists; i++)
		free(inst->lists[i]);
	free(inst->lists);
	free(inst->state);
	inst->maps = NULL;
	inst->lists = NULL;
	inst->state = NULL;
	inst->nr_lists = inst->cap_lists = 0;
}

/* Give inst a fresh instance of `file` and run its init. */
static int policy_setup(struct cp_instance *inst,
			const struct cp_policy_file *file, const char **err)
{
	const struct cp_map_def *def;
	int ret;

	inst->file = file;
	inst->serial++;
	inst->state = calloc(1, file->state_size ? file->state_size : 1);
	inst->maps = calloc(file->nr_maps ? file->nr_maps : 1,
			    sizeof(*inst->maps));
	if (!inst->state || !inst->maps) {
		*err = "out of memory";
		return -ENOMEM;
	}
	for (def = file->maps; def; def = def->next) {
		inst->maps[def->slot] = cp_map_new(def, inst,
						   map_capacity(inst));
		if (!inst->maps[def->slot]) {
			*err = "out of memory creating a policy map";
			return -ENOMEM;
		}
	}
	maps_follow_capacity(inst);
	if (file->ops->init) {
		enter(inst);
		ret = file->ops->init((struct mem_cgroup *)inst);
		cur = NULL;
		if (ret) {
			*err = "the policy's init callback failed";
			return -EINVAL;
		}
	}
	return 0;
}

struct cp_instance *cp_instance_new(const char *policy, __u64 capacity,
				    double scale, __u64 policy_capacity,
				    const char **err)
{
	const char *reg_name = NULL;
	const struct cp_policy_file *file = cp_find_policy(policy, &reg_name);
	struct cp_instance *inst;

	if (!file) {
		*err = "unknown policy";
		return NULL;
	}
	inst = calloc(1, sizeof(*inst));
	if (!inst) {
		*err = "out of memory";
		return NULL;
	}
	inst->name = reg_name;
	inst->scale = scale;
	inst->rng = 0x9e3779b97f4a7c15ULL;
	inst->reclaim_batch = 1;
	inst->capacity = capacity;
	inst->policy_capacity = policy_capacity;
	inst->table_mask = 63;
	inst->table = calloc(inst->table_mask + 1, sizeof(*inst->table));
	if (!inst->table || policy_setup(inst, file, err)) {
		if (!inst->table)
			*err = "out of memory";
		cp_instance_free(inst);
		return NULL;
	}
	return inst;
}

void cp_instance_free(struct cp_instance *inst)
{
	int i;

	if (!inst)
		return;
	policy_teardown(inst);
	for (i = 0; i < inst->nr_chunks; i++)
		free(inst->chunks[i].base);
	free(inst->chunks);
	free(inst->table);
	free(inst);
}

/* Replace inst's policy instance by a fresh one of `file` and hand it
 * every cached folio with folio_added, oldest first. */
static int attach(struct cp_instance *inst, const struct cp_policy_file *file,
		  const char **err)
{
	struct folio *f;

	policy_teardown(inst);
	for (f = inst->oldest; f; f = f->newer) {
		f->node.prev = f->node.next = NULL;
		f->node.list = 0;
	}
	if (policy_setup(inst, file, err))
		return -EINVAL;
	if (file->ops->folio_added) {
		enter(inst);
		for (f = inst->oldest; f; f = f->newer)
			file->ops->folio_added(f);
		cur = NULL;
	}
	return 0;
}

/*
 * Live policy swap, as the kernel does on a struct_ops link update: the old
 * instance goes away, a fresh one is initialised, and every cached folio is
 * handed to it with folio_added, oldest first.
 */
int cp_instance_swap(struct cp_instance *inst, const char *policy,
		     const char **err)
{
	const char *reg_name = NULL;
	const struct cp_policy_file *file = cp_find_policy(policy, &reg_name);
	const struct cp_policy_file *old = inst->file;
	const char *ignored;

	if (!file) {
		*err = "unknown policy";
		return -ENOENT;
	}
	if (!attach(inst, file, err)) {
		inst->name = reg_name;
		return 0;
	}
	/* the new policy failed to start: the old one comes back, fresh */
	if (attach(inst, old, &ignored))
		return -EIO;
	return -EINVAL;
}
