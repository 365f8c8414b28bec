// SPDX-License-Identifier: GPL-2.0
/* Test policy (misbehaving): init fails. */
#include "cache_ext_policy.h"

struct badinit_state {
	__u64 unused;
};
CP_STATE_DECL(struct badinit_state);

s32 BPF_STRUCT_OPS_SLEEPABLE(badinit_init, struct mem_cgroup *memcg)
{
	return -1;
}

CP_POLICY(bad_init, .init = (void *)badinit_init);
