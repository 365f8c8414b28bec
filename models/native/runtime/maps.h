/* SPDX-License-Identifier: Apache-2.0 */
#ifndef CP_MAPS_H
#define CP_MAPS_H

#define CP_RUNTIME_INTERNAL
#include "cache_ext_policy.h"

struct cp_instance;

/* capacity: the cache's pages, for maps declared per page of it */
struct cp_map *cp_map_new(const struct cp_map_def *def,
			  struct cp_instance *inst, __u64 capacity);
/* Page maps: room for values of nslots pool slots (call between
 * callbacks: the values may move). */
int cp_map_pool_resize(struct cp_map *m, __u64 nslots);
/* Maps per page of capacity follow a new capacity. */
int cp_map_set_capacity(struct cp_map *m, __u64 capacity);
void cp_map_free(struct cp_map *m);
void *cp_map_lookup(struct cp_map *m, const void *key);
long cp_map_update(struct cp_map *m, const void *key, const void *value,
		   __u64 flags);
long cp_map_delete(struct cp_map *m, const void *key);

#endif /* CP_MAPS_H */
