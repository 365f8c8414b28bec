/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A HyperLogLog register update on top of cp_hash64: how many distinct
 * keys a stream holds, counted over *every* reference, next to the SHARDS
 * sample that keeps only a few of them.
 *
 * Shared by the BPF sampler and the native MRC core, like the hash itself,
 * so the kernel's sketch and one built in user space from the same keys
 * are the same registers.  The estimate is computed in user space
 * (models/hll.py).
 *
 * The sample takes a key when its hash is small, so any bit of that hash
 * is correlated with being sampled.  The sketch therefore reads a remixed
 * value (one more xor-shift-multiply round): its register index and rank
 * are independent of the sampling test, and the key count the sketch
 * gives is independent of how many keys the sample happened to draw.
 *
 * Registers are bytes.  With `bits` index bits the rank is 1 + the number
 * of leading zeros of the other 64 - bits bits, at most 65 - bits.
 */
#ifndef CACHEPILOT_HLL_H
#define CACHEPILOT_HLL_H

#include "cachepilot_hash.h"

/* Index bits of the sketches cachepilot keeps (4096 one-byte registers,
 * standard error 1.04 / 64 = 1.6 %). */
#define CP_HLL_BITS 12
#define CP_HLL_REGS (1U << CP_HLL_BITS)

static inline cp_u64 cp_hll_mix(cp_u64 h)
{
	h = (h ^ (h >> 32)) * 0xd6e8feb86659fd93ULL;
	return h ^ (h >> 29);
}

/* Leading zeros of a non-zero value.  BPF has no such instruction, so the
 * BPF build takes six compare-and-shift steps; a host compiler has one. */
static inline unsigned int cp_clz64(cp_u64 x)
{
#ifdef __BPF__
	unsigned int n = 0;

	if (!(x >> 32)) { n += 32; x <<= 32; }
	if (!(x >> 48)) { n += 16; x <<= 16; }
	if (!(x >> 56)) { n += 8;  x <<= 8; }
	if (!(x >> 60)) { n += 4;  x <<= 4; }
	if (!(x >> 62)) { n += 2;  x <<= 2; }
	if (!(x >> 63)) { n += 1; }
	return n;
#else
	return (unsigned int)__builtin_clzll(x);
#endif
}

/* Register index of a key hash, with `bits` index bits. */
static inline unsigned int cp_hll_index(cp_u64 hash, unsigned int bits)
{
	return (unsigned int)(cp_hll_mix(hash) >> (64 - bits));
}

/* Rank of a key hash: 1 + leading zeros of the bits below the index (a
 * stop bit just under them caps it at 65 - bits). */
static inline unsigned char cp_hll_rank(cp_u64 hash, unsigned int bits)
{
	cp_u64 rest = (cp_hll_mix(hash) << bits) | (1ULL << (bits - 1));

	return (unsigned char)(cp_clz64(rest) + 1);
}

/* Count one reference (its key's hash) into a sketch of 1 << bits registers. */
static inline void cp_hll_add(unsigned char *regs, cp_u64 hash, unsigned int bits)
{
	cp_u64 m = cp_hll_mix(hash);
	unsigned int i = (unsigned int)(m >> (64 - bits));
	unsigned char r = (unsigned char)(cp_clz64((m << bits) | (1ULL << (bits - 1))) + 1);

	if (regs[i] < r)
		regs[i] = r;
}

#endif /* CACHEPILOT_HLL_H */
