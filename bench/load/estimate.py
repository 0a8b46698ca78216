"""The statistics of ``bench capacity --by rate`` (docs/load.md, "Capacity"): pure functions on arrays.

* :func:`exceedance`: per SLO objective, the share of a window's requests over the limit, with its variance
  from the series' integrated autocorrelation time (Sokal's automatic window), not from a binomial count.
* :func:`rise_test`: the steadiness test: a rise of the second half of the window over the first, in units of
  its autocorrelation-aware standard error, and large against the level (docs/load.md, "Saturation rule").
* :func:`fit_boundary`: the model across points: logit(share over the limit) linear in log(realized rate),
  binomial weights (requests), dispersion from the points' scatter, and the load where the fitted share
  crosses ``alpha = 1 - q / 100``, with a Fieller interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["tau_int", "exceedance", "rise_test", "Fit", "fit_boundary", "fit_shares", "t_quantile", "crossing",
           "round6", "RISE_SIGMAS", "RISE_MIN_SHARE", "RISE_PARTS"]

RISE_SIGMAS = 4.0
RISE_MIN_SHARE = 0.25
RISE_PARTS = 5  # a rising series also rises from each of these equal parts of its window to the next
SOKAL_C = 5.0


def tau_int(x: Sequence[float] | np.ndarray) -> float:
    """Integrated autocorrelation time of a series (in samples, >= 1): 1 + 2 sum of its autocorrelations up to
    Sokal's automatic window (the first M with M >= SOKAL_C * tau(M)). 1 for a constant or short series."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n < 8:
        return 1.0
    a = a - a.mean()
    var = float(np.dot(a, a)) / n
    if var <= 0:
        return 1.0
    f = np.fft.rfft(a, n=2 * n)
    acf = np.fft.irfft(f * np.conjugate(f))[:n] / (n * var)
    tau = 1.0
    for m in range(1, n // 2):
        tau += 2.0 * float(acf[m])
        if m >= SOKAL_C * tau:
            break
    return max(1.0, tau)


def exceedance(values: Sequence[float], limit: float) -> dict[str, Any]:
    """``{"n", "over", "share", "tau"}``: how many of ``values`` (in arrival order; inf = failed) exceed
    ``limit``, their share, and the integrated autocorrelation time of the exceedance series (the variance of
    ``share`` is ``share (1 - share) tau / n``)."""
    v = np.asarray(values, dtype=float)
    ind = (v > limit).astype(float)
    n = int(ind.size)
    over = int(ind.sum())
    return {"n": n, "over": over, "share": round(over / n, 6) if n else None,
            "tau": round(tau_int(ind), 3) if 0 < over < n else 1.0}


def rise_test(xs_s: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Steadiness of a series over its window: ``rise`` = mean of the second half minus mean of the first half
    (by sample time), ``se`` its standard error from each half's residuals around its own straight line, their
    variance inflated by their integrated autocorrelation time; ``rising`` when the rise exceeds ``RISE_SIGMAS``
    standard errors and ``RISE_MIN_SHARE`` of the first half's mean (a queue that grows without bound doubles
    its wait; noise in a stable queue does not reach a quarter of the level in both tests at once), and the mean
    of each of ``RISE_PARTS`` equal spans of the window exceeds the one before (a queue that grows without
    bound grows all the time; a stable one that wandered up for half a window seldom did in every part:
    benchmarks/results/steadiness_alarms-2026-12-05-vm.md)."""
    t, y = np.asarray(xs_s, dtype=float), np.asarray(ys, dtype=float)
    keep = np.isfinite(y)
    t, y = t[keep], y[keep]
    if y.size < 16:
        return {"rise": None, "se": None, "rising": False}
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    mid = 0.5 * (t[0] + t[-1])
    a, b = y[t < mid], y[t >= mid]
    if a.size < 8 or b.size < 8:
        return {"rise": None, "se": None, "rising": False}
    var = sum(_detrended_var(t[sel], p) for sel, p in ((t < mid, a), (t >= mid, b)))
    rise, se = float(b.mean() - a.mean()), math.sqrt(var)
    rising = rise > RISE_SIGMAS * se and rise > RISE_MIN_SHARE * abs(float(a.mean())) and _every_part_up(t, y)
    return {"rise": round(rise, 3), "se": round(se, 3), "rising": bool(rising)}


def _every_part_up(t: np.ndarray, y: np.ndarray) -> bool:
    """The mean of ``y`` over each of ``RISE_PARTS`` equal time spans (``t`` sorted) exceeds the one before."""
    edges = np.linspace(t[0], t[-1], RISE_PARTS + 1)
    part = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, RISE_PARTS - 1)
    count = np.bincount(part, minlength=RISE_PARTS)
    if count.min() == 0:
        return False
    means = np.bincount(part, weights=y, minlength=RISE_PARTS) / count
    return bool(np.all(np.diff(means) > 0))


def _detrended_var(t: np.ndarray, y: np.ndarray) -> float:
    """Variance of the mean of ``y`` (sampled at ``t``), from its residuals around a straight line (a trend is
    what the test looks for, not noise) times their integrated autocorrelation time."""
    r = y - np.polyval(np.polyfit(t, y, 1), t) if np.ptp(t) > 0 else y - y.mean()
    return float(r.var()) * tau_int(r) / y.size


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: exact (bisection on the closed-form distribution function of Abramowitz & Stegun
    26.7.3-4) for a whole ``df`` up to 30, the Cornish-Fisher expansion in 1/df around the normal quantile
    (within 0.1 % there) above; the normal one for df <= 0 or infinite."""
    z = NormalDist().inv_cdf(p)
    if df <= 0 or math.isinf(df):
        return z
    nu = round(df)
    if abs(df - nu) < 1e-9 and nu <= 30:
        target, lo, hi = abs(2 * p - 1), 0.0, 1e6
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _t_central(mid, nu) < target else (lo, mid)
        return math.copysign(0.5 * (lo + hi), p - 0.5)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def _t_central(t: float, nu: int) -> float:
    """P(|T| <= t) for Student's t with ``nu`` (whole) degrees of freedom."""
    th = math.atan(t / math.sqrt(nu))
    c2, s = math.cos(th) ** 2, math.sin(th)
    if nu % 2 == 0:
        term, acc = 1.0, 1.0
        for j in range(2, nu, 2):
            term *= c2 * (j - 1) / j
            acc += term
        return s * acc
    if nu == 1:
        return 2 * th / math.pi
    term, acc = math.cos(th), math.cos(th)
    for j in range(3, nu - 1, 2):
        term *= c2 * (j - 1) / j
        acc += term
    return 2 / math.pi * (th + s * acc)


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted crossing of one objective: ``boundary`` (req/s) and its interval ``lo``/``hi`` (None when the
    data do not bound it on that side), the model ``a + b log(rate)`` and what it was fitted on."""

    boundary: float | None
    lo: float | None
    hi: float | None
    a: float
    b: float
    points: int
    phi: float
    df: float
    scatter: float | None = None  # the points' Pearson chi-square / (points - 2): their variance over binomial
    adjusted: bool = False  # fitted to control-variate shares with their own variances (fit_shares)
    link: str = "logit"  # the model: link(share) = a + b log(rate), logit (fit_boundary) or probit (fit_shares)
    prior: bool = False  # the slope's prior was used (fit_shares, unless the points alone contradict it)

    def to_dict(self) -> dict[str, Any]:
        return {"boundary": round6(self.boundary), "interval": [round6(self.lo), round6(self.hi)],
                "intercept": round(self.a, 4), "slope": round(self.b, 4), "points": self.points, "overdispersion": round(self.phi, 3),
                "scatter": None if self.scatter is None else round(self.scatter, 3),
                "df": round(self.df, 1) if math.isfinite(self.df) else None, "adjusted": self.adjusted,
                "link": self.link, "slope_prior": self.prior}


def round6(v: float | None) -> float | None:
    """``v`` to 6 decimals (the loads and intervals of capacity.json), None kept."""
    return None if v is None else round(v, 6)


def _irls(x: np.ndarray, k: np.ndarray, n: np.ndarray, w_eff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Binomial logistic regression of k/n on [1, x], each point weighted by ``w_eff`` (1 / its dispersion);
    returns the coefficients and (X'WX)^-1 (unscaled)."""
    X = np.column_stack([np.ones_like(x), x])
    p0 = np.clip((k + 0.5) / (n + 1.0), 1e-4, 1 - 1e-4)
    z0 = np.log(p0 / (1 - p0))
    W0 = w_eff * n * p0 * (1 - p0)
    beta = np.linalg.lstsq(X * np.sqrt(W0)[:, None], z0 * np.sqrt(W0), rcond=None)[0]
    for _ in range(50):
        eta = X @ beta
        p = np.clip(1.0 / (1.0 + np.exp(-np.clip(eta, -50, 50))), 1e-9, 1 - 1e-9)
        W = w_eff * n * p * (1 - p)
        z = eta + (k / n - p) / (p * (1 - p))
        new = np.linalg.lstsq(X * np.sqrt(W)[:, None], z * np.sqrt(W), rcond=None)[0]
        if np.max(np.abs(new - beta)) < 1e-9:
            beta = new
            break
        beta = new
    eta = X @ beta
    p = np.clip(1.0 / (1.0 + np.exp(-np.clip(eta, -50, 50))), 1e-9, 1 - 1e-9)
    W = w_eff * n * p * (1 - p)
    cov = np.linalg.pinv((X * W[:, None]).T @ X)
    return beta, cov


def fit_boundary(rates: Sequence[float], stats: Sequence[dict[str, Any]], alpha: float, level: float) -> Fit | None:
    """The crossing of ``share = alpha`` by the model logit(share) = a + b log(rate) fitted to the points
    (``rates``: each point's realized arrival rate in its window; ``stats``: its :func:`exceedance` dict).

    Each point weighs by its ``n`` requests alone. The dispersion (variance over binomial) is the points'
    Pearson chi-square around the model / (points - 2), at least the pooled integrated autocorrelation time
    (``n``-weighted mean of the points' ``tau``: within one window it comes out 1.6-3.6 times too small on the sim,
    so it is only a floor); the interval is Fieller's for ``(logit(alpha) - a) / b`` at ``level`` with
    Student-t quantiles of points - 2 degrees of freedom (two points: the floor alone, with ``n / (SOKAL_C
    tau)`` degrees of freedom; :mod:`bench.load.capacity` states no level then); an end is None when the data
    do not bound it. None with fewer than two distinct rates or no request.
    """
    x = np.log(np.asarray(rates, dtype=float))
    n = np.asarray([s["n"] for s in stats], dtype=float)
    k = np.asarray([s["over"] for s in stats], dtype=float)
    tau = np.asarray([max(1.0, float(s.get("tau") or 1.0)) for s in stats])
    ok = n > 0
    x, n, k, tau = x[ok], n[ok], k[ok], tau[ok]
    if x.size < 2 or np.ptp(x) <= 0:
        return None
    # every point weighs by its requests alone: a point's own autocorrelation time grows with its share (a queue
    # episode makes both), so weighing by n / tau would pull the fit towards the points that came out low
    informative = (k > 0) & (k < n)
    pooled = float(np.sum(tau[informative] * n[informative]) / np.sum(n[informative])) if informative.any() else 1.0
    beta, cov = _irls(x, k, n, np.ones_like(n))
    a, b = float(beta[0]), float(beta[1])
    p = 1.0 / (1.0 + np.exp(-np.clip(a + b * x, -50, 50)))
    p = np.clip(p, 1e-9, 1 - 1e-9)
    # dispersion: the points' own scatter around the model (Pearson chi-square / (points - 2)); the pooled
    # within-point autocorrelation time is only a floor (measured on the sim it is 1.6-3.6 times too small: a
    # 30-s window holds too few queue episodes to see their correlation)
    df_pts = x.size - 2
    pearson = float(np.sum((k - n * p) ** 2 / (n * p * (1 - p))))
    phi = max(pooled, pearson / df_pts) if df_pts > 0 else pooled
    cov = cov * phi
    df = float(df_pts) if df_pts > 0 else float(np.sum(n / (SOKAL_C * pooled)))
    L = math.log(alpha / (1 - alpha))
    tq = t_quantile(0.5 + level / 2, df)
    lo, hi = _fieller(L - a, b, cov[0, 0], cov[1, 1], cov[0, 1], tq)
    theta = (L - a) / b if b > 0 else None
    est = math.exp(theta) if theta is not None and abs(theta) < 50 else None
    return Fit(est, lo, hi, a, b, int(x.size), phi, df, pearson / df_pts if df_pts > 0 else None)


def _fieller(num: float, b: float, vaa: float, vbb: float, vab: float, tq: float) -> tuple[float | None, float | None]:
    """Fieller interval for theta = num / b with num = L - a: the thetas where (num - b theta)^2 <= tq^2
    Var(a + b theta). Returned as rates (exp theta); (None, None) when unbounded on both sides."""
    t2 = tq * tq
    qa = b * b - t2 * vbb
    qb = -2.0 * num * b - 2.0 * t2 * vab  # Var(a + b th) = vaa + 2 th vab + th^2 vbb
    qc = num * num - t2 * vaa
    if qa <= 0:
        return None, None
    disc = qb * qb - 4 * qa * qc
    if disc < 0:
        return None, None
    r = math.sqrt(disc)
    t1, t2r = (-qb - r) / (2 * qa), (-qb + r) / (2 * qa)
    lo_th, hi_th = min(t1, t2r), max(t1, t2r)
    return (math.exp(lo_th) if lo_th > -50 else None, math.exp(hi_th) if hi_th < 50 else None)


def slo_model(values: dict[str, tuple[Sequence[float], float, float]]) -> dict[str, Any]:
    """Per objective key ``(values in schedule order, limit_ms, q)``: its :func:`exceedance` dict plus
    ``alpha = 1 - q / 100`` (``max`` objectives, q = 100, count as q = 99.9: a long-run maximum under random
    arrivals grows without bound). Undefined values (nan) are left out."""
    out = {}
    for key, (vals, limit, q) in values.items():
        v = np.asarray(vals, dtype=float)
        e = exceedance(v[~np.isnan(v)], limit)
        e["alpha"] = round(1.0 - min(q, 99.9) / 100.0, 6)
        out[key] = e
    return out


def fit_shares(rates: Sequence[float], shares: Sequence[float], variances: Sequence[float], ns: Sequence[int],
               alpha: float, level: float) -> Fit | None:
    """The crossing of ``share = alpha`` by the model probit(share) = a + b log(rate) fitted to estimated shares
    with known variances (the control-variate shares of :mod:`bench.load.control`; docs/load.md, "Fit").

    Quasi-likelihood by iteratively reweighted least squares: each point weighs by the inverse of its variance,
    at least ``VAR_FLOOR`` times the binomial variance at the *fitted* share (a window that held no queue episode
    reads near 0 with a tiny variance of its own, while the long-run share there is several percent); the slope
    has the prior ``SLOPE_PRIOR`` +- ``SLOPE_PRIOR_SD`` (two points alone fix a line through their noise). The
    dispersion is the points' Pearson chi-square over points - 2 when that exceeds 1 (Student-t with points - 2
    degrees of freedom then, the normal quantile otherwise); Fieller's interval as in :func:`fit_boundary`, the
    intercept's variance plus ``(b SHIFT_LOG_SD) ** 2`` (a bias common to all points, which their scatter cannot
    show, of ``SHIFT_LOG_SD`` in log rate)."""
    x = np.log(np.asarray(rates, dtype=float))
    n = np.asarray(ns, dtype=float)
    s = np.clip(np.asarray(shares, dtype=float), 0.0, 1.0)
    v = np.asarray(variances, dtype=float)
    ok = (n > 0) & np.isfinite(s) & np.isfinite(v) & (v > 0)
    x, n, s, v = x[ok], n[ok], s[ok], v[ok]
    if x.size < 2 or np.ptp(x) <= 0:
        return None
    alone = _probit_fit(x, s, v, n, prior=False)
    prior = not _prior_conflict(*alone)
    beta, info, var = _probit_fit(x, s, v, n, prior=True) if prior else alone
    a, b = float(beta[0]), float(beta[1])
    mu = _phi_cdf(a + b * x)
    df_pts = x.size - 2
    scatter = float(np.sum((s - mu) ** 2 / var)) / df_pts if df_pts > 0 else None
    phi = max(1.0, scatter) if scatter is not None else 1.0
    df = float(df_pts) if phi > 1.0 else math.inf
    tq = t_quantile(0.5 + level / 2, df)
    cov = np.linalg.inv(info) * phi
    cov[0, 0] += (b * SHIFT_LOG_SD) ** 2  # a shift of the load common to every point: no scatter shows it
    L = NormalDist().inv_cdf(alpha)
    lo, hi = _fieller(L - a, b, cov[0, 0], cov[1, 1], cov[0, 1], tq)
    theta = (L - a) / b if b > 0 else None
    est = math.exp(theta) if theta is not None and abs(theta) < 50 else None
    return Fit(est, lo, hi, a, b, int(x.size), phi, df, scatter, True, "probit", prior)


def _phi_cdf(z: np.ndarray) -> np.ndarray:
    return np.asarray([0.5 * math.erfc(-float(t) / math.sqrt(2.0)) for t in np.atleast_1d(z)])


def _phi_pdf(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.exp(-0.5 * np.asarray(z, dtype=float) ** 2) / math.sqrt(2.0 * math.pi)
    return out


def _prior_conflict(beta: np.ndarray, info: np.ndarray, var: np.ndarray) -> bool:
    """The points alone (their fit without the prior: :func:`_probit_fit`'s result) put the slope more than
    ``PRIOR_CONFLICT`` standard deviations (the prior's and their own estimate's together) from ``SLOPE_PRIOR``: a
    share that hardly moves with the load (B-tpot on the sim: 9.5, 10.1, 10.7 % at -2 %, 0 and +2 % of the
    boundary, a probit slope near 2), where the prior would state a level the data do not support (its intervals
    covered the truth in 85 % of searches at 95 %)."""
    try:
        se = math.sqrt(max(float(np.linalg.inv(info)[1, 1]), 0.0))
    except (np.linalg.LinAlgError, ValueError):
        return False
    return abs(float(beta[1]) - SLOPE_PRIOR) > PRIOR_CONFLICT * math.hypot(SLOPE_PRIOR_SD, se)


def _probit_fit(x: np.ndarray, s: np.ndarray, v: np.ndarray, n: np.ndarray, *, prior: bool) -> tuple[
        np.ndarray, np.ndarray, np.ndarray]:
    """IRLS for probit(s) = a + b x with each point's variance ``max(v, VAR_FLOOR mu (1 - mu) / n)`` at the
    current fit ``mu`` and (``prior``) the slope's normal prior: (coefficients, the information matrix X'WX plus
    the prior's, the variances used)."""
    X = np.column_stack([np.ones_like(x), x])
    pen = np.diag([0.0, 1.0 / SLOPE_PRIOR_SD ** 2 if prior else 0.0])
    nd = NormalDist()
    z0 = np.array([nd.inv_cdf(float(q)) for q in np.clip(s, 0.5 / n, 1 - 0.5 / n)])  # start: least squares
    beta = np.linalg.lstsq(X.T @ X + pen, X.T @ z0 + pen @ np.array([0.0, SLOPE_PRIOR]), rcond=None)[0]
    var, info = v, pen
    for i in range(100):
        eta = X @ beta
        mu = np.clip(_phi_cdf(eta), 1e-9, 1 - 1e-9)
        d = np.maximum(_phi_pdf(eta), 1e-12)
        var = np.maximum(v, VAR_FLOOR * mu * (1 - mu) / n)
        w = d * d / var
        z = eta + (s - mu) / d
        info = (X * w[:, None]).T @ X + pen
        new = np.linalg.lstsq(info, (X * w[:, None]).T @ z + pen @ np.array([0.0, SLOPE_PRIOR]), rcond=None)[0]
        done = float(np.max(np.abs(new - beta))) < 1e-9
        beta = 0.5 * (beta + new) if not done and i > 20 else new  # damped if it oscillates
        if done:
            break
    return beta, info, var


# The sd, in log rate, of a bias shared by every refine point, which :func:`fit_shares` adds to the intercept's
# variance as ``(b SHIFT_LOG_SD) ** 2``: each point starts from an empty engine (its window's share sits a little
# under the long-run share, as if the load were a little lower), and probit(share) bends across the loads tried (the
# fitted line is a chord). Measured on the sim's engine model as a boundary error: +0.65 % on A-ttft-poisson at
# 600 s (benchmarks/results/capacity_coverage-2026-12-04c-vm.md), +0.4 % on B-ttft-gamma0.5 at 340 s
# (capacity_coverage-2026-12-06-vm.md). In log rate, not in probit: the same shift of the load moves a steep share
# curve's probit more than a shallow one's (before, 0.07 in probit: 0.6 % of load at slope 11, 2 % at slope 3.5).
SHIFT_LOG_SD = 0.01
# The slope's prior, probit(share) per log(rate) near the boundary: on the sim 10-12 (A-ttft-poisson), 12-14
# (A-tpot-poisson), 5-10 (B-ttft-poisson) (benchmarks/capacity_share_curve.py; docs/load.md, "How", step 4).
SLOPE_PRIOR = 11.0
SLOPE_PRIOR_SD = 3.5
PRIOR_CONFLICT = 2.0  # the points alone this many sds from the prior: fit without it (:func:`_prior_conflict`)
# A point's variance is at least this many times the binomial variance at the fitted share (its requests come in
# queue episodes: a 37-s window near the boundary varies 23-65 times more than independent requests would).
VAR_FLOOR = 5.0


def crossing(results: Sequence[tuple[float, bool]], lo: float, hi: float) -> float:
    """The load where the pass fraction crosses 1/2: pass fractions per tested load in ``[lo, hi]`` made
    non-increasing (pool-adjacent-violators, weighted by trials), then interpolated linearly in log load; the
    geometric middle of ``[lo, hi]`` when no tested load lies between with a fraction of 1/2 or a crossing.
    ``results``: ``(load, met the SLO)`` of every trial (bench.load.capacity's bracketing)."""
    loads = sorted({x for x, _ in results if lo <= x <= hi})
    blocks: list[list[float]] = []  # [passes, trials, first load index, last load index]
    for i, x in enumerate(loads):
        res = [met for y, met in results if y == x]
        blocks.append([float(sum(res)), float(len(res)), i, i])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            b = blocks.pop()
            blocks[-1] = [blocks[-1][0] + b[0], blocks[-1][1] + b[1], blocks[-1][2], b[3]]
    frac = [0.0] * len(loads)
    for b in blocks:
        for i in range(int(b[2]), int(b[3]) + 1):
            frac[i] = b[0] / b[1]
    for i in range(1, len(loads)):
        if frac[i - 1] >= 0.5 > frac[i]:
            t = (frac[i - 1] - 0.5) / (frac[i - 1] - frac[i])
            return math.exp(math.log(loads[i - 1]) + t * (math.log(loads[i]) - math.log(loads[i - 1])))
    return math.sqrt(lo * hi)
