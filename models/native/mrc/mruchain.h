/* The sequential part of MRU's chain model (models/mruchain.py): the hit
 * ratio of each time bin of a stratum, in order, since a bin's sampled
 * accesses read the ratios of the bins their chains link back to. */
#ifndef CP_MRUCHAIN_H
#define CP_MRUCHAIN_H

#include <stdint.h>

/*
 * Bins base .. base+nbins-1 of `hit` (rows of k doubles, one per cache
 * size).  Bin b holds sampled accesses bounds[b] .. bounds[b+1]-1; access
 * i weighs w[i], and at size j it is a known hit (known[i*k+j]), or
 * follows its chain (freec[i*k+j]) to bin target[i], or neither.  A bin's
 * ratio is the weighted share of hits among the accesses that do not link
 * into the bin itself; a bin without any takes the ratio before it (the
 * row before base, or 1).  -1 when out of memory, else 0.
 */
int cp_mru_bins(const double *w, const uint8_t *known, const uint8_t *freec,
		const int64_t *target, const int64_t *bounds, int64_t nbins,
		int64_t base, int64_t k, double *hit);

#endif
