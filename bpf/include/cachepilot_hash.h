/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one hash of cachepilot (DESIGN.md, "Page key and hash").
 *
 * Shared verbatim by the BPF sampler (clang -target bpf) and the native MRC
 * core (host cc), so a page the kernel samples is the page user space would
 * have sampled.  Test vectors in tests/test_hash.py pin both builds.
 *
 * The mixer is the 64-bit finaliser known as splitmix64 / "Mix13": two
 * xor-shift-multiply rounds with full avalanche, cheap enough for the
 * tracepoint hot path (no loops, no tables, verifier friendly).
 */
#ifndef CACHEPILOT_HASH_H
#define CACHEPILOT_HASH_H

#ifdef __BPF__
typedef __u64 cp_u64;
#else
#include <stdint.h>
typedef uint64_t cp_u64;
#endif

#define CP_HASH_SEED 0x9e3779b97f4a7c15ULL

static inline cp_u64 cp_hash64(cp_u64 x)
{
	x += CP_HASH_SEED;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/*
 * Page key of a live page: a per-file identity mixed from (device, inode),
 * XOR the page index, so the pages of one file get distinct keys and
 * different files collide only with probability ~2^-64 per pair.
 * Trace keys are block numbers and skip this step.
 */
static inline cp_u64 cp_page_key(cp_u64 dev, cp_u64 ino, cp_u64 index)
{
	return cp_hash64(cp_hash64(dev) ^ ino) ^ index;
}

/* SHARDS: a key is sampled when its hash falls below the threshold. */
static inline int cp_sampled(cp_u64 key, cp_u64 threshold)
{
	return cp_hash64(key) < threshold;
}

/* Threshold for rate R in (0, 1]; R = 1 samples every key. */
#define CP_THRESHOLD_ALL 0xffffffffffffffffULL

#endif /* CACHEPILOT_HASH_H */
