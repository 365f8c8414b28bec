// SPDX-License-Identifier: GPL-2.0
/*
 * Admission filter, application-informed (cache_ext paper, section 5.6):
 * pages that registered threads read are not admitted to the page cache;
 * they are read as if with direct I/O.  Meant for background work such as
 * an LSM store's compaction, whose large one-time reads would otherwise
 * push out the pages foreground requests need.  Everything else is plain
 * LRU.
 *
 * Registered threads: their tids are keys of the `af_tids` map, filled by
 * `cachepilot policy register-tids` (through the map pinned by the loader)
 * or by the application.  In the simulator the trace annotates a
 * registered thread's accesses by setting bit 31 of their tid
 * (CP_TID_REGISTERED; kernel tids never have it).
 *
 * A registered thread still hits on pages that are already cached (the
 * filter decides admission only), as in the paper.
 */
#include "cache_ext_policy.h"

#define AF_MAX_TIDS 4096
#define CP_TID_REGISTERED (1U << 31)

struct admit_filter_state {
	__u64 list;
	__u64 bypassed;		/* reads kept out of the cache */
};
CP_STATE_DECL(struct admit_filter_state);

/* tid of a registered thread -> 1 */
CP_HASH_MAP(af_tids, __u32, __u8, AF_MAX_TIDS);

CP_ONE_LIST_OPS(admit_filter);
CP_TAKE_HEAD(admit_filter);
CP_TAIL_ON_ACCESS(admit_filter);

bool BPF_STRUCT_OPS(admit_filter_admit_folio, struct cache_ext_admit_ctx *actx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	if ((tid & CP_TID_REGISTERED) ||
	    bpf_map_lookup_elem(&af_tids, &tid)) {
		__sync_fetch_and_add(&CP_STATE.bypassed, 1);
		return false;
	}
	return true;
}

CP_POLICY(admit_filter,
	  .init = (void *)admit_filter_init,
	  .evict_folios = (void *)admit_filter_evict_folios,
	  .folio_added = (void *)admit_filter_folio_added,
	  .folio_accessed = (void *)admit_filter_folio_accessed,
	  .admit_folio = (void *)admit_filter_admit_folio);
