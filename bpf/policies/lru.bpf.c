// SPDX-License-Identifier: GPL-2.0
/*
 * LRU: evict the least recently accessed page.  The list runs from least
 * (head) to most (tail) recently used.
 */
#include "cache_ext_policy.h"

CP_ONE_LIST(lru);
CP_TAKE_HEAD(lru);
CP_TAIL_ON_ACCESS(lru);

CP_POLICY(lru,
	  .init = (void *)lru_init,
	  .evict_folios = (void *)lru_evict_folios,
	  .folio_added = (void *)lru_folio_added,
	  .folio_accessed = (void *)lru_folio_accessed);
