// SPDX-License-Identifier: GPL-2.0
/*
 * Test policy: LRU that does not cache pages read by thread 7 (admission
 * through bpf_get_current_pid_tgid), and counts admissions per thread in
 * an array map.
 */
#include "cache_ext_policy.h"

CP_ONE_LIST(atid);
CP_TAKE_HEAD(atid);
CP_TAIL_ON_ACCESS(atid);
CP_ARRAY_MAP(atid_seen, __u32, __u64, 16);

bool BPF_STRUCT_OPS(atid_admit_folio, struct cache_ext_admit_ctx *actx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 slot = tid & 15;
	__u64 *seen = bpf_map_lookup_elem(&atid_seen, &slot);

	if (tid == 7)
		return false;
	if (seen)
		(*seen)++;
	return true;
}

CP_POLICY(admit_tid,
	  .init = (void *)atid_init,
	  .evict_folios = (void *)atid_evict_folios,
	  .folio_added = (void *)atid_folio_added,
	  .folio_accessed = (void *)atid_folio_accessed,
	  .admit_folio = (void *)atid_admit_folio);
