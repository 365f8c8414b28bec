/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Distinct counts of runs of consecutive time slices, from one HyperLogLog
 * sketch per slice (cachepilot_hll.h registers).
 *
 * The "stack" SHARDS estimator (models/stack.py) needs, for every pair of
 * slices i <= j, how many distinct keys slices i..j hold together.  The
 * union of slices i..j is the register-wise maximum of their sketches, so
 * one column j costs one pass back over the older slices: each step raises
 * a few registers, and the estimate follows those raises without
 * re-reading the rest.  The estimate is Ertl's improved one, as in
 * models/hll.py, on exact fixed-point sums.
 */
#ifndef CP_HLLSTACK_H
#define CP_HLLSTACK_H

#include <stddef.h>

/* Distinct keys counted into one sketch of 1 << bits registers. */
double cp_hll_estimate(const unsigned char *regs, unsigned int bits);

/*
 * sketches: `slices` sketches of 1 << bits registers, oldest first.
 * out[i * slices + j] = distinct keys of slices i..j for i <= j; entries
 * with i > j are set to 0.  At most 2^16 slices.  Returns 0, or -1 when
 * out of memory or given more slices.
 */
int cp_hll_union_matrix(const unsigned char *sketches, size_t slices,
			unsigned int bits, double *out);

#endif /* CP_HLLSTACK_H */
