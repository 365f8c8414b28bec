// SPDX-License-Identifier: Apache-2.0
/*
 * Per-instance BPF maps for natively built policies: hash maps and arrays
 * with the semantics of bpf_map_{lookup,update,delete}_elem.
 *
 * Value pointers handed to a policy must stay valid while the map grows
 * (BPF guarantees that for the element's lifetime), so every element lives
 * in its own block from a slab that never moves; the table only points to
 * the blocks.
 *
 * LRU hash maps (BPF_MAP_TYPE_LRU_HASH) make room for a new element when
 * full by dropping the least recently used one; lookups and updates count
 * as uses.  The kernel's LRU is approximate; this one is exact.
 *
 * Page maps (CP_PAGE_MAP) are hash maps keyed by folio id, which is the
 * folio's address; their values sit in an array beside the instance's
 * folio pool, one slot per folio, so a lookup is a bounds check and an
 * index instead of a probe through a table much larger than the caches.
 * Folios never move and pool slots are only added, between callbacks, so
 * value pointers stay valid for a callback's duration as BPF promises.
 * Keys that are no folio of the instance are refused, never followed.
 *
 * Maps declared per page of capacity (per_page > 0) take their
 * max_entries from the cache's capacity and follow it when it changes.
 */
#include <stdlib.h>
#include <string.h>

#include "age_list.h"
#include "maps.h"
#include "runtime.h"

/* Every element: LRU links (an age list, age_list.h, in LRU hash maps;
 * the freelist reuses `older`), then the key bytes, then the value
 * bytes. */
struct cp_elem {
	struct cp_elem *older, *newer;
};

#define ELEM_KEY(e) ((char *)(e) + sizeof(struct cp_elem))

struct cp_slot {
	__u64 hash;
	struct cp_elem *elem;	/* NULL = empty */
};

/* Begins as struct cp_map_head, which the policy header reads inline. */
struct cp_map {
	enum cp_map_type type;
	__u32 value_size, max_entries;
	char *array;		/* array: the elements */
	__u32 key_size;
	__u32 per_page;
	struct cp_instance *inst;
	/* page map: values and presence by folio pool slot */
	char *values;
	__u8 *present;
	__u64 nslots;
	/* hash */
	struct cp_slot *slots;
	__u64 mask;		/* slots - 1 */
	__u64 count;
	struct cp_elem *free_elems;
	struct cp_elem *oldest, *newest;	/* LRU hash: use order */
	char **slabs;
	int nr_slabs;
	__u32 elem_size;
	__u64 array_entries;	/* array: elements allocated */
};

_Static_assert(offsetof(struct cp_map, type) == offsetof(struct cp_map_head, type) &&
	       offsetof(struct cp_map, value_size) ==
	       offsetof(struct cp_map_head, value_size) &&
	       offsetof(struct cp_map, max_entries) ==
	       offsetof(struct cp_map_head, max_entries) &&
	       offsetof(struct cp_map, array) == offsetof(struct cp_map_head, array),
	       "struct cp_map must begin as struct cp_map_head");

#define SLAB_BLOCKS 4096

static __u64 key_hash(const void *key, __u32 size)
{
	const unsigned char *p = key;
	__u64 h = size;
	__u64 word;

	if (size == 8) {
		memcpy(&word, key, 8);
		return cp_hash64(word);
	}
	while (size >= 8) {
		memcpy(&word, p, 8);
		h = cp_hash64(h ^ word);
		p += 8;
		size -= 8;
	}
	word = 0;
	memcpy(&word, p, size);
	return cp_hash64(h ^ word);
}

static __u64 scaled_entries(__u32 per_page, __u64 capacity)
{
	__u64 n = per_page * capacity;

	return n < UINT32_MAX ? n : UINT32_MAX;
}

/* Arrays grow with the capacity (calloc'd memory is only committed when
 * touched, so a large table that is never filled costs little). */
static int array_reserve(struct cp_map *m, __u64 entries)
{
	size_t vsize = m->value_size ? m->value_size : 1;
	char *a;

	if (entries <= m->array_entries && m->array)
		return 0;
	if (!m->array) {
		a = calloc(entries ? entries : 1, vsize);
	} else {
		a = realloc(m->array, entries * vsize);
		if (a)
			memset(a + m->array_entries * vsize, 0,
			       (entries - m->array_entries) * vsize);
	}
	if (!a)
		return -ENOMEM;
	m->array = a;
	m->array_entries = entries ? entries : 1;
	return 0;
}

struct cp_map *cp_map_new(const struct cp_map_def *def,
			  struct cp_instance *inst, __u64 capacity)
{
	struct cp_map *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->type = def->type;
	m->key_size = def->key_size;
	m->value_size = def->value_size;
	m->per_page = def->per_page;
	m->inst = inst;
	m->max_entries = def->per_page ?
			 scaled_entries(def->per_page, capacity) :
			 def->max_entries;
	if (m->type == CP_MAP_ARRAY) {
		if (array_reserve(m, m->max_entries)) {
			free(m);
			return NULL;
		}
		return m;
	}
	if (m->type == CP_MAP_PAGE) {
		if (cp_map_pool_resize(m, inst->pool_size)) {
			free(m);
			return NULL;
		}
		return m;
	}
	/* elements are 8-byte aligned so values can hold __u64s */
	m->elem_size = (sizeof(struct cp_elem) + def->key_size +
			def->value_size + 7) & ~7u;
	m->mask = 15;
	m->slots = calloc(m->mask + 1, sizeof(*m->slots));
	if (!m->slots) {
		free(m);
		return NULL;
	}
	return m;
}

void cp_map_free(struct cp_map *m)
{
	int i;

	if (!m)
		return;
	for (i = 0; i < m->nr_slabs; i++)
		free(m->slabs[i]);
	free(m->slabs);
	free(m->slots);
	free(m->array);
	free(m->values);
	free(m->present);
	free(m);
}

int cp_map_pool_resize(struct cp_map *m, __u64 nslots)
{
	char *values;
	__u8 *present;

	if (m->type != CP_MAP_PAGE || nslots <= m->nslots)
		return 0;
	values = realloc(m->values, nslots * m->value_size + 1);
	if (!values)
		return -ENOMEM;
	m->values = values;
	present = realloc(m->present, nslots);
	if (!present)
		return -ENOMEM;
	memset(present + m->nslots, 0, nslots - m->nslots);
	m->present = present;
	m->nslots = nslots;
	return 0;
}

static void lru_drop_oldest(struct cp_map *m);

int cp_map_set_capacity(struct cp_map *m, __u64 capacity)
{
	if (!m->per_page)
		return 0;
	m->max_entries = scaled_entries(m->per_page, capacity);
	if (m->type == CP_MAP_ARRAY)
		return array_reserve(m, m->max_entries);
	while (m->type == CP_MAP_LRU_HASH && m->count > m->max_entries)
		lru_drop_oldest(m);
	return 0;
}

/* The pool slot of the folio whose id is *key, or -1. */
static long page_slot(struct cp_map *m, const void *key)
{
	__u64 id;

	memcpy(&id, key, sizeof(id));
	return cp_instance_folio_slot(m->inst, (struct folio *)(uintptr_t)id);
}

static struct cp_elem *elem_alloc(struct cp_map *m)
{
	struct cp_elem *e;
	char *slab, **slabs;
	int i, n;

	if (!m->free_elems) {
		/* slabs double from 32 elements: small maps stay small */
		n = m->nr_slabs < 7 ? 32 << m->nr_slabs : SLAB_BLOCKS;
		slab = malloc((size_t)m->elem_size * n);
		slabs = realloc(m->slabs, sizeof(*slabs) * (m->nr_slabs + 1));
		if (slabs)
			m->slabs = slabs;
		if (!slab || !slabs) {
			free(slab);
			return NULL;
		}
		m->slabs[m->nr_slabs++] = slab;
		for (i = n - 1; i >= 0; i--) {
			e = (struct cp_elem *)(slab + (size_t)i * m->elem_size);
			e->older = m->free_elems;
			m->free_elems = e;
		}
	}
	e = m->free_elems;
	m->free_elems = e->older;
	return e;
}

static void elem_free(struct cp_map *m, struct cp_elem *e)
{
	e->older = m->free_elems;
	m->free_elems = e;
}

static void lru_touch(struct cp_map *m, struct cp_elem *e)
{
	if (m->type == CP_MAP_LRU_HASH && m->newest != e) {
		CP_AGE_UNLINK(m, e);
		CP_AGE_PUSH(m, e);
	}
}

static struct cp_slot *find_slot(struct cp_map *m, const void *key, __u64 h)
{
	__u64 i = h & m->mask;

	/*
	 * 8-byte keys (folio ids, page keys) hash through cp_hash64, which is
	 * a bijection on 64-bit values: equal hashes mean equal keys, and the
	 * element need not be touched (one cache miss fewer per lookup).
	 */
	if (m->key_size == 8) {
		for (;;) {
			struct cp_slot *s = &m->slots[i];

			if (!s->elem || s->hash == h)
				return s;
			i = (i + 1) & m->mask;
		}
	}
	for (;;) {
		struct cp_slot *s = &m->slots[i];

		if (!s->elem)
			return s;
		if (s->hash == h && !memcmp(ELEM_KEY(s->elem), key, m->key_size))
			return s;
		i = (i + 1) & m->mask;
	}
}

static int grow(struct cp_map *m)
{
	__u64 old_n = m->mask + 1, i;
	struct cp_slot *old = m->slots;
	struct cp_slot *slots = calloc(old_n * 2, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	m->slots = slots;
	m->mask = old_n * 2 - 1;
	for (i = 0; i < old_n; i++) {
		__u64 j;

		if (!old[i].elem)
			continue;
		j = old[i].hash & m->mask;
		while (slots[j].elem)
			j = (j + 1) & m->mask;
		slots[j] = old[i];
	}
	free(old);
	return 0;
}

void *cp_map_lookup(struct cp_map *m, const void *key)
{
	struct cp_slot *s;

	if (!m || !key)
		return NULL;
	if (m->type == CP_MAP_ARRAY) {
		__u32 idx;

		memcpy(&idx, key, sizeof(idx));
		if (idx >= m->max_entries)
			return NULL;
		return m->array + (size_t)idx * m->value_size;
	}
	if (m->type == CP_MAP_PAGE) {
		long slot = page_slot(m, key);

		if (slot < 0 || (__u64)slot >= m->nslots || !m->present[slot])
			return NULL;
		return m->values + (size_t)slot * m->value_size;
	}
	s = find_slot(m, key, key_hash(key, m->key_size));
	if (!s->elem)
		return NULL;
	lru_touch(m, s->elem);
	return ELEM_KEY(s->elem) + m->key_size;
}

long cp_map_update(struct cp_map *m, const void *key, const void *value,
		   __u64 flags)
{
	struct cp_slot *s;
	__u64 h;

	if (!m || !key || !value || flags > BPF_EXIST)
		return -EINVAL;
	if (m->type == CP_MAP_ARRAY) {
		__u32 idx;

		memcpy(&idx, key, sizeof(idx));
		if (idx >= m->max_entries)
			return -E2BIG;
		if (flags == BPF_NOEXIST)
			return -EEXIST;
		memmove(m->array + (size_t)idx * m->value_size, value,
			m->value_size);
		return 0;
	}
	if (m->type == CP_MAP_PAGE) {
		long slot = page_slot(m, key);

		if (slot < 0 || (__u64)slot >= m->nslots)
			return -EINVAL;
		if (m->present[slot]) {
			if (flags == BPF_NOEXIST)
				return -EEXIST;
		} else {
			if (flags == BPF_EXIST)
				return -ENOENT;
			if (m->count >= m->max_entries)
				return -E2BIG;
			m->present[slot] = 1;
			m->count++;
		}
		memmove(m->values + (size_t)slot * m->value_size, value,
			m->value_size);
		return 0;
	}
	h = key_hash(key, m->key_size);
	s = find_slot(m, key, h);
	if (s->elem) {
		if (flags == BPF_NOEXIST)
			return -EEXIST;
		memmove(ELEM_KEY(s->elem) + m->key_size, value, m->value_size);
		lru_touch(m, s->elem);
		return 0;
	}
	if (flags == BPF_EXIST)
		return -ENOENT;
	if (m->count >= m->max_entries) {
		if (m->type != CP_MAP_LRU_HASH || !m->oldest)
			return -E2BIG;
		while (m->count >= m->max_entries && m->oldest)
			lru_drop_oldest(m);
		if (m->count >= m->max_entries)
			return -E2BIG;
		s = find_slot(m, key, h);
	}
	if ((m->count + 1) * 2 > m->mask + 1) {
		if (grow(m))
			return -ENOMEM;
		s = find_slot(m, key, h);
	}
	s->elem = elem_alloc(m);
	if (!s->elem)
		return -ENOMEM;
	s->hash = h;
	memcpy(ELEM_KEY(s->elem), key, m->key_size);
	memcpy(ELEM_KEY(s->elem) + m->key_size, value, m->value_size);
	if (m->type == CP_MAP_LRU_HASH)
		CP_AGE_PUSH(m, s->elem);
	m->count++;
	return 0;
}

long cp_map_delete(struct cp_map *m, const void *key)
{
	struct cp_slot *s;
	__u64 i, j;

	if (!m || !key)
		return -EINVAL;
	if (m->type == CP_MAP_ARRAY)
		return -EINVAL;
	if (m->type == CP_MAP_PAGE) {
		long slot = page_slot(m, key);

		if (slot < 0 || (__u64)slot >= m->nslots || !m->present[slot])
			return -ENOENT;
		m->present[slot] = 0;
		m->count--;
		return 0;
	}
	s = find_slot(m, key, key_hash(key, m->key_size));
	if (!s->elem)
		return -ENOENT;
	if (m->type == CP_MAP_LRU_HASH)
		CP_AGE_UNLINK(m, s->elem);
	elem_free(m, s->elem);
	m->count--;
	/* backward-shift deletion keeps probe chains intact without tombstones */
	i = s - m->slots;
	j = i;
	for (;;) {
		__u64 home;

		j = (j + 1) & m->mask;
		if (!m->slots[j].elem)
			break;
		home = m->slots[j].hash & m->mask;
		/* move j into the hole at i unless its home lies in (i, j] */
		if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	m->slots[i].elem = NULL;
	return 0;
}

static void lru_drop_oldest(struct cp_map *m)
{
	cp_map_delete(m, ELEM_KEY(m->oldest));
}
