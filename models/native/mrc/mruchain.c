/* See mruchain.h. */
#include <stdlib.h>

#include "mruchain.h"

int cp_mru_bins(const double *w, const uint8_t *known, const uint8_t *freec,
		const int64_t *target, const int64_t *bounds, int64_t nbins,
		int64_t base, int64_t k, double *hit)
{
	double *num = malloc(2 * (size_t)(k ? k : 1) * sizeof(*num));
	double *den = num + k;
	double *prior;

	if (!num)
		return -1;
	for (int64_t b = 0; b < nbins; b++) {
		int64_t here = base + b;
		int64_t lo = bounds[b], hi = bounds[b + 1];
		double *row = hit + here * k;

		/* the row before: history's last, or this stratum's bin before */
		prior = here ? hit + (here - 1) * k : NULL;
		if (hi <= lo) {
			for (int64_t j = 0; j < k; j++)
				row[j] = prior ? prior[j] : 1.0;
			continue;
		}
		double total = 0.0;

		for (int64_t i = lo; i < hi; i++)
			total += w[i];
		for (int64_t j = 0; j < k; j++) {
			num[j] = 0.0;
			den[j] = total;
		}
		for (int64_t i = lo; i < hi; i++) {
			const uint8_t *kn = known + i * k, *fr = freec + i * k;
			int64_t tg = target[i];
			/* a link into the bin itself leaves its denominator */
			const double *src = tg == here ? NULL :
				hit + (tg < here ? tg : here ? here - 1 : 0) * k;

			for (int64_t j = 0; j < k; j++) {
				if (kn[j])
					num[j] += w[i];
				if (!fr[j])
					continue;
				if (src)
					num[j] += w[i] * src[j];
				else
					den[j] -= w[i];
			}
		}
		for (int64_t j = 0; j < k; j++) {
			double h = den[j] > 1e-12 ? num[j] / den[j] : (prior ? prior[j] : 1.0);

			row[j] = h < 0.0 ? 0.0 : h > 1.0 ? 1.0 : h;
		}
	}
	free(num);
	return 0;
}
