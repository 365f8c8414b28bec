/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Force-included into every BPF object built here (-include).
 *
 * clang emits a struct that an object only reaches through pointers as a
 * BTF forward declaration, and libbpf then finds a kfunc's prototype
 * (e.g. cache_ext_list_add(u64, struct folio *)) incompatible with the
 * kernel's, where the struct is complete.  One unused global that holds
 * the structs by value makes clang emit them in full.  libbpf ignores the
 * section.  See kernel/NOTES-for-header.md.
 */
#ifndef CACHEPILOT_BTF_ANCHOR_H
#define CACHEPILOT_BTF_ANCHOR_H
#include "vmlinux.h"

struct cp_btf_anchor {
	struct folio folio;
	struct cache_ext_list_node node;
	struct mem_cgroup memcg;
	struct cache_ext_eviction_ctx ectx;
	struct cache_ext_admit_ctx actx;
} cp_btf_anchor __attribute__((unused, section(".cp_btf_anchor")));
#endif
