// SPDX-License-Identifier: Apache-2.0
/* Distinct counts of unions of slice sketches; see hllstack.h. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hllstack.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/*
 * A sketch summarised for the estimate: registers at 0, registers at the
 * largest rank q + 1, and sum of 2^(q - r) over the registers r in 1..q.
 * With m = 2^bits registers and q = 64 - bits the sum stays below 2^63,
 * so it is kept exactly in an integer however many raises it absorbs.
 */
struct summary {
	uint64_t sum;
	int64_t zeros;
	int64_t maxed;
};

struct params {
	unsigned int bits;
	unsigned int q;		/* largest rank below the top one */
	double m;
	double unit;		/* 2^-q: the sum's unit */
	uint64_t share[256];	/* 2^(q - r) for ranks 1..q, else 0 */
};

static void params_init(struct params *p, unsigned int bits)
{
	p->bits = bits;
	p->q = 64 - bits;
	p->m = (double)((size_t)1 << bits);
	p->unit = ldexp(1.0, -(int)p->q);
	for (unsigned int r = 0; r < 256; r++)
		p->share[r] = (r == 0 || r > p->q) ? 0 : (uint64_t)1 << (p->q - r);
}

/* x + sum_k x^(2^k) 2^(k-1), x the share of empty registers */
static double sigma(double x)
{
	double y = 1.0, z = x;

	if (x >= 1.0)
		return INFINITY;
	for (;;) {
		double next;

		x *= x;
		next = z + x * y;
		y += y;
		if (next == z)
			return z;
		z = next;
	}
}

/* (1 - x - sum_k (1 - x^(2^-k))^2 2^-k) / 3, x the share below the top rank */
static double tau(double x)
{
	double y = 1.0, z = 1.0 - x;

	if (x <= 0.0 || x >= 1.0)
		return 0.0;
	for (;;) {
		double next;

		x = sqrt(x);
		y *= 0.5;
		next = z - (1.0 - x) * (1.0 - x) * y;
		if (next == z)
			return z / 3.0;
		z = next;
	}
}

/* Ertl's improved estimate, as models/hll.py computes it. */
static double estimate(const struct summary *s, const struct params *p)
{
	double z;

	if ((double)s->zeros == p->m)
		return 0.0;
	z = (p->m * tau(1.0 - (double)s->maxed / p->m) + (double)s->sum) * p->unit;
	z += p->m * sigma((double)s->zeros / p->m);
	return p->m * p->m / (2.0 * M_LN2 * z);
}

static void summarise(const unsigned char *regs, const struct params *p,
		      struct summary *s)
{
	size_t m = (size_t)1 << p->bits, count[256] = { 0 };

	for (size_t r = 0; r < m; r++)
		count[regs[r]]++;
	s->zeros = (int64_t)count[0];
	s->maxed = 0;
	s->sum = 0;
	for (unsigned int r = 1; r < 256; r++) {
		s->sum += count[r] * p->share[r];
		if (r > p->q)
			s->maxed += (int64_t)count[r];
	}
}

double cp_hll_estimate(const unsigned char *regs, unsigned int bits)
{
	struct params p;
	struct summary s;

	params_init(&p, bits);
	summarise(regs, &p, &s);
	return estimate(&s, &p);
}

/*
 * For one register, the slices whose value exceeds that of every later
 * slice: their values fall from the oldest to the newest, so each value
 * appears at most once and the stack is a set of values (bit v of `ranks`)
 * with the slice of each.  The union of slices i..j holds, in this
 * register, the smallest value whose slice is at or after i, or 0 when
 * every entry is older than i.  Ranks are at most 65 - bits < 64.
 */
struct reg_stack {
	uint64_t ranks;
	uint16_t slice[64];	/* the union matrix takes at most 2^16 slices */
};

/* How each union i..j (j the newest slice) changes, by start slice i:
 * difference arrays over i, prefix-summed once the column is done. */
struct column_delta {
	int64_t *sum;
	int64_t *zeros;
	int64_t *maxed;
};

/*
 * Slice j has value v > 0 in this register: every union i..j with i < j
 * whose value here is below v rises to v.  Entries are visited newest
 * (smallest value) first; each bounds the range of starts that held the
 * value before it.  Only starts below j are read for column j, so the
 * first range, which ends at j, needs no closing entry; and only it can
 * have held 0.
 */
static void push_value(struct reg_stack *st, struct column_delta *d,
		       const struct params *p, uint32_t j, unsigned int v)
{
	uint64_t overtaken = (2ULL << v) - 1;	/* values <= v */
	uint64_t rest = st->ranks;		/* entries not passed yet */
	int top = v > p->q;			/* v is the top rank */
	uint32_t lower = rest ? (uint32_t)st->slice[__builtin_ctzll(rest)] + 1 : 0;

	d->sum[lower] += (int64_t)p->share[v];
	d->zeros[lower]--;
	if (top)
		d->maxed[lower]++;
	while (rest & overtaken) {
		unsigned int old = (unsigned int)__builtin_ctzll(rest);
		uint32_t upper = lower;
		int64_t ds = (int64_t)(p->share[v] - p->share[old]);
		int dm = top - (old > p->q);

		rest &= rest - 1;
		lower = rest ? (uint32_t)st->slice[__builtin_ctzll(rest)] + 1 : 0;
		/* an equal value adds nothing; no test, it would be a coin toss */
		d->sum[lower] += ds;
		d->sum[upper] -= ds;
		if (dm) {
			d->maxed[lower] += dm;
			d->maxed[upper] -= dm;
		}
	}
	st->ranks = rest | 1ULL << v;
	st->slice[v] = (uint16_t)j;
}

/* Bit k set: regs[k] is not 0 (k < 16). */
static inline unsigned int nonzero16(const unsigned char *regs)
{
#ifdef __SSE2__
	__m128i x = _mm_loadu_si128((const __m128i *)regs);

	return ~(unsigned int)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_setzero_si128())) & 0xffff;
#else
	unsigned int held = 0;

	for (unsigned int k = 0; k < 16; k++)
		held |= (unsigned int)(regs[k] != 0) << k;
	return held;
#endif
}

int cp_hll_union_matrix(const unsigned char *sketches, size_t slices,
			unsigned int bits, double *out)
{
	size_t m = (size_t)1 << bits;
	struct reg_stack *stacks = calloc(m, sizeof(*stacks));
	struct summary *run = calloc(slices, sizeof(*run));
	struct column_delta d = {
		calloc(slices + 1, sizeof(int64_t)),
		calloc(slices + 1, sizeof(int64_t)),
		calloc(slices + 1, sizeof(int64_t)),
	};
	struct params p;
	int rc = -1;

	if (!stacks || !run || !d.sum || !d.zeros || !d.maxed || slices > (1u << 16) ||
	    m < 16)
		goto out;
	params_init(&p, bits);
	memset(out, 0, slices * slices * sizeof(*out));
	for (size_t j = 0; j < slices; j++) {
		const unsigned char *h = sketches + j * m;
		int64_t sum = 0, zeros = 0, maxed = 0;
		struct summary alone = { 0, 0, 0 };

		for (size_t base = 0; base < m; base += 16) {
			/* the registers slice j holds: whether one is empty is a
			 * coin toss, so find them 16 at a time and visit those */
			unsigned int held = nonzero16(h + base);

			alone.zeros += 16 - (size_t)__builtin_popcount(held);
			while (held) {
				size_t r = base + (size_t)__builtin_ctz(held);
				unsigned int v = h[r];

				held &= held - 1;
				alone.sum += p.share[v];
				alone.maxed += v > p.q;
				push_value(&stacks[r], &d, &p, (uint32_t)j, v);
			}
		}
		/* Unions that start earlier: the column before, plus the raises. */
		for (size_t i = 0; i < j; i++) {
			sum += d.sum[i];
			zeros += d.zeros[i];
			maxed += d.maxed[i];
			d.sum[i] = d.zeros[i] = d.maxed[i] = 0;
			run[i].sum += (uint64_t)sum;
			run[i].zeros += zeros;
			run[i].maxed += maxed;
			out[i * slices + j] = estimate(&run[i], &p);
		}
		d.sum[j] = d.zeros[j] = d.maxed[j] = 0;
		run[j] = alone;
		out[j * slices + j] = estimate(&run[j], &p);
	}
	rc = 0;
out:
	free(stacks);
	free(run);
	free(d.sum);
	free(d.zeros);
	free(d.maxed);
	return rc;
}
