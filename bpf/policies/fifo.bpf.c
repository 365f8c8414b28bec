// SPDX-License-Identifier: GPL-2.0
/*
 * FIFO: evict pages in the order they entered the cache; accesses change
 * nothing.
 */
#include "cache_ext_policy.h"

CP_ONE_LIST(fifo);
CP_TAKE_HEAD(fifo);

CP_POLICY(fifo,
	  .init = (void *)fifo_init,
	  .evict_folios = (void *)fifo_evict_folios,
	  .folio_added = (void *)fifo_folio_added);
