"""The per-tenant throughput model: time per operation = a + b * miss_ratio.

With t_hit and t_miss the service times of a hit and a miss and c
operations in flight, a = t_hit / c and b = t_miss / c, so

    throughput(m) = 1 / (a + b * m).

(a, b) is fitted from the tenant's own (observed miss ratio, observed
throughput) pairs by non-negative least squares on y = 1 / throughput.
Until there are enough pairs spanning enough miss ratio to separate a from
b, the prior (config: control.prior or the tenant's `model`) is used, scaled
so that it passes through the mean of whatever has been observed: the
prior's shape with the tenant's level.

Two non-negative unknowns make NNLS small enough to solve in closed form
for every tenant at once (one vectorised pass instead of 1,000 solver calls
per round); the test suite checks it against scipy.optimize.nnls.
"""
from __future__ import annotations

import numpy as np


def nnls2(n, sm, smm, sy, smy, syy):
    """Exact NNLS for y ~ a + b*m with a, b >= 0, for many problems at once,
    from their sufficient statistics (count, sum m, sum m^2, sum y, sum m*y,
    sum y^2).  Returns (a, b) arrays.

    For two unknowns the optimum is either the unconstrained solution (when
    it is non-negative) or lies on a face a = 0 or b = 0, each of which is a
    one-variable fit; the best feasible candidate is the NNLS solution."""
    n, sm, smm, sy, smy, syy = (np.asarray(v, dtype=np.float64)
                                for v in (n, sm, smm, sy, smy, syy))

    def sse(a, b):
        return (syy - 2 * a * sy - 2 * b * smy + a * a * n
                + 2 * a * b * sm + b * b * smm)

    det = n * smm - sm * sm
    safe = np.where(np.abs(det) > 1e-300, det, 1.0)
    a_u = (smm * sy - sm * smy) / safe
    b_u = (n * smy - sm * sy) / safe
    free_ok = (np.abs(det) > 1e-12 * np.maximum(n * smm, 1e-300)) & \
        (a_u >= 0) & (b_u >= 0)
    # faces
    a_f = np.maximum(sy / np.where(n > 0, n, 1.0), 0.0)          # b = 0
    b_f = np.maximum(smy / np.where(smm > 0, smm, 1.0), 0.0)     # a = 0
    e_a = sse(a_f, 0.0)
    e_b = np.where(smm > 0, sse(0.0, b_f), np.inf)
    use_a = e_a <= e_b
    a = np.where(free_ok, a_u, np.where(use_a, a_f, 0.0))
    b = np.where(free_ok, b_u, np.where(use_a, 0.0, b_f))
    return a, b


def fit(obs_m: np.ndarray, obs_y: np.ndarray, count: np.ndarray,
        prior_a: np.ndarray, prior_b: np.ndarray,
        min_points: int, min_spread: float):
    """Fit every tenant's model.

    obs_m, obs_y: (tenants, window) observations, padded where count is
    short (padding is ignored); count: observations per tenant.
    Returns (a, b, fitted) where fitted says the data, not the prior, set
    the slope.
    """
    w = obs_m.shape[1] if obs_m.ndim == 2 else 0
    mask = np.arange(w)[None, :] < count[:, None]
    m = np.where(mask, obs_m, 0.0)
    y = np.where(mask, obs_y, 0.0)
    n = count.astype(np.float64)
    sm, smm = m.sum(1), (m * m).sum(1)
    sy, smy, syy = y.sum(1), (m * y).sum(1), (y * y).sum(1)
    big = np.where(mask, obs_m, -np.inf).max(1, initial=-np.inf)
    small = np.where(mask, obs_m, np.inf).min(1, initial=np.inf)
    spread = np.where(count > 0, big - small, 0.0)
    enough = (count >= min_points) & (spread >= min_spread)

    a_fit, b_fit = nnls2(n, sm, smm, sy, smy, syy)
    # A per-operation time of exactly zero at m = 0 would promise infinite
    # throughput; no hit is faster than 1 % of the fastest observed time.
    fastest = np.where(mask, obs_y, np.inf).min(1, initial=np.inf)
    a_fit = np.maximum(a_fit, 0.01 * np.where(np.isfinite(fastest), fastest, 0.0))

    # Prior scaled through the observed mean (prior shape, tenant's level).
    nz = np.where(n > 0, n, 1.0)
    pred = prior_a + prior_b * (sm / nz)
    scale = np.where((count > 0) & (pred > 0), (sy / nz) / np.where(pred > 0, pred, 1.0), 1.0)
    a = np.where(enough, a_fit, prior_a * scale)
    b = np.where(enough, b_fit, prior_b * scale)
    fitted = enough & (b > 0)
    return a, b, fitted


def throughput(a, b, miss_ratio):
    """Modelled operations per second at a miss ratio."""
    t = np.asarray(a) + np.asarray(b) * np.asarray(miss_ratio)
    with np.errstate(divide="ignore"):
        return np.where(t > 0, 1.0 / np.where(t > 0, t, 1.0), np.inf)


def miss_ratio_for(a, b, min_throughput):
    """Highest miss ratio that still delivers min_throughput: > 1 means any
    cache size will do, < 0 means no cache size can."""
    a, b, s = (np.asarray(v, dtype=np.float64) for v in (a, b, min_throughput))
    with np.errstate(divide="ignore", invalid="ignore"):
        budget = np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), np.inf) - a
        return np.where(b > 0, budget / np.where(b > 0, b, 1.0),
                        np.where(budget >= 0, np.inf, -np.inf))


def relative_spread(obs_m: np.ndarray, obs_y: np.ndarray, count: np.ndarray,
                    a: np.ndarray, b: np.ndarray, min_points: int) -> np.ndarray:
    """Per tenant, the standard deviation of its observed seconds per
    operation around the fitted model (a + b m), relative to the model's
    mean: how far one interval's throughput strays from what the model
    says at the same miss ratio.  Demand that varies over time (a trace
    replay, phases) shows up here, as does plain measurement noise.  0
    for a tenant with fewer than `min_points` observations."""
    w = obs_m.shape[1] if obs_m.ndim == 2 else 0
    mask = np.arange(w)[None, :] < count[:, None]
    fit = a[:, None] + b[:, None] * obs_m
    resid = np.where(mask, obs_y - fit, 0.0)
    n = np.maximum(count, 1).astype(np.float64)
    mean_fit = np.where(mask, fit, 0.0).sum(1) / n
    sd = np.sqrt((resid * resid).sum(1) / np.maximum(n - 1, 1))
    out = np.where((count >= max(min_points, 2)) & (mean_fit > 0), sd / np.where(
        mean_fit > 0, mean_fit, 1.0), 0.0)
    return np.where(np.isfinite(out), out, 0.0)
