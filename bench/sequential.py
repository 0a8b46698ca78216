"""Group-sequential boundaries for the gate (pure math: information fractions in, critical values out).

The gate looks at its data after each round of waves and stops as soon as a rule is decided. Looking repeatedly at
a fixed-sample 95 % interval would raise the chance of a false regression with every look; instead each look
spends part of the one-sided error ``alpha`` by the Lan-DeMets O'Brien-Fleming-type spending function
(K. K. G. Lan, D. L. DeMets, *Discrete sequential boundaries for clinical trials*, Biometrika 70(3), 1983,
659-663)::

    alpha(t) = 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t)))        t = I_k / I_max, the information fraction

and the critical value ``c_k`` of look ``k`` is the one at which the probability, under a true ratio exactly at the
limit, of first crossing at look ``k`` is ``alpha(t_k) - alpha(t_{k-1})``. That probability is computed by the
recursive numerical integration of Armitage, McPherson and Rowe (1969; C. Jennison, B. W. Turnbull, *Group
Sequential Methods with Applications to Clinical Trials*, Chapman & Hall 2000, ch. 19) for the canonical joint
distribution of the look statistics ``Z_k`` (``Cov(Z_j, Z_k) = sqrt(I_j / I_k)``, j <= k). The canonical form holds
for the gate's log-ratio even when only the candidate grows and the baseline is a fixed stored sample: then
``Var(theta_k) = s_b^2/m + s_c^2/n_k`` and ``Cov(theta_j, theta_k) = Var(theta_k)`` for ``n_j <= n_k``.

The boundaries are *non-binding*: each side (regression, pass) is computed as if the other did not exist, so
stopping at the other one only lowers the error of this one. Early looks need very strong evidence (``c_1`` of 3-4
at a small fraction) and the last one about as much as a fixed-sample test (``c_K`` 2.0-2.1 for ``alpha`` 2.5 %
against 1.96), which is why O'Brien-Fleming-type spending costs little resolution at the end.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

__all__ = ["obf_spent", "boundaries", "fractions", "look_schedule", "expand_z", "se_df"]

_ND = NormalDist()
_SPAN = 9.0  # the grid reaches this many standard deviations (of the whole information) below the boundary


def obf_spent(t: float, alpha: float) -> float:
    """One-sided error spent by information fraction ``t``: ``2 (1 - Phi(z_{1-alpha/2} / sqrt t))``, 0 at
    ``t <= 0``, ``alpha`` at ``t >= 1``."""
    if t <= 0:
        return 0.0
    if t >= 1:
        return alpha
    return 2.0 * (1.0 - _ND.cdf(_ND.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t)))


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _phi_sf(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.asarray(_ERFC(x / math.sqrt(2.0)), dtype=float)


def _cross_mass(grid: np.ndarray, dens: np.ndarray, h: float, b: float, sd: float) -> float:
    """Probability of going from the continuation density ``dens`` (on ``grid``) above ``b`` in one increment."""
    return float(np.sum(dens * _phi_sf((b - grid) / sd)) * h)


def _solve_b(grid: np.ndarray, dens: np.ndarray, h: float, sd: float, target: float) -> float:
    lo, hi = float(grid[-1]) - 1.0, float(grid[-1]) + 12.0 * sd + 12.0
    for _ in range(80):  # bisection: the crossing mass falls as the boundary rises
        mid = 0.5 * (lo + hi)
        if _cross_mass(grid, dens, h, mid, sd) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=512)
def _boundaries(ts: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    out: list[float] = []
    spent_before, t_prev = 0.0, 0.0
    grid = dens = np.zeros(0)
    h = 0.0
    for t in ts:
        want = obf_spent(t, alpha) - spent_before
        if t <= t_prev or want <= 1e-15:
            out.append(math.inf)  # no new information or nothing left to spend: this look cannot decide
            continue
        if not out or grid.size == 0:  # the first look: S_1 ~ N(0, t)
            b = math.sqrt(t) * _ND.inv_cdf(1.0 - want)
            h = min(0.01, math.sqrt(t) / 40.0)
            grid = np.arange(b - _SPAN, b, h) + h / 2.0
            dens = np.exp(-grid ** 2 / (2.0 * t)) / math.sqrt(2.0 * math.pi * t)
        else:
            sd = math.sqrt(t - t_prev)
            b = _solve_b(grid, dens, h, sd, want)
            h_new = min(0.01, sd / 10.0)
            new = np.arange(b - _SPAN, b, h_new) + h_new / 2.0
            kern = np.exp(-((new[:, None] - grid[None, :]) ** 2) / (2.0 * sd * sd)) / (sd * math.sqrt(2.0 * math.pi))
            dens, grid, h = kern @ dens * h, new, h_new
        out.append(b / math.sqrt(t))
        spent_before, t_prev = obf_spent(t, alpha), t
    return tuple(out)


def boundaries(ts: Sequence[float], alpha: float) -> tuple[float, ...]:
    """One-sided critical values ``c_k`` (standard normal scale) for looks at information fractions ``ts``
    (increasing; values above 1 count as 1): a look statistic beyond ``c_k`` decides. ``inf`` for a look that
    adds no information or has nothing left to spend."""
    clipped = tuple(round(min(max(t, 0.0), 1.0), 9) for t in ts)
    return _boundaries(clipped, alpha)


def fractions(waves: Sequence[int], waves_max: int, baseline_waves: int | None) -> list[float]:
    """Information fractions of looks after ``waves`` candidate waves (increasing), out of ``waves_max``.

    With a fixed ``baseline_waves`` (a stored baseline) the information of a look with ``n`` candidate waves is
    ``1 / (1/m + 1/n)`` (equal per-wave variance on both sides); with ``baseline_waves`` None both sides grow
    together (a matched A/B) and the information is proportional to ``n``."""
    if baseline_waves is None:
        return [n / waves_max for n in waves]
    m = baseline_waves

    def info(n: int) -> float:
        return 1.0 / (1.0 / m + 1.0 / n)

    return [info(n) / info(waves_max) for n in waves]


def look_schedule(first: int, waves_max: int, growth: float = 1.5) -> list[int]:
    """Candidate waves at each look: ``first``, then ``ceil(growth * previous)`` (at least one more), up to
    ``waves_max`` (the last look; a look that would leave less than a quarter of its waves for the last one is
    moved to ``waves_max``). Fixed before measuring, so the looks do not depend on the data."""
    first = max(1, min(first, waves_max))
    out = [first]
    while out[-1] < waves_max:
        nxt = min(waves_max, max(out[-1] + 1, math.ceil(growth * out[-1])))
        if waves_max - nxt < 0.25 * nxt:
            nxt = waves_max
        out.append(nxt)
    return out


def se_df(stat: str, n: int, n_other: int) -> float:
    """Effective degrees of freedom of a bootstrap standard error of ``stat`` with these sample counts.

    For the mean it is the pooled ``n + n_other - 2``. The bootstrap variance of a quantile is much noisier: its
    relative error falls only like ``n^(-1/4)`` (P. Hall, M. A. Martin, *Exact convergence rate of bootstrap
    quantile variance estimator*, Probability Theory and Related Fields 80, 1988, 261-268). bench's simulation
    of the trimmed Harrell-Davis median (lognormal samples, 8-200 a side) measured the spread of that SE as a
    chi-square with about ``2 sqrt(m)`` degrees of freedom, ``m = min(n, n_other)``; for a quantile ``q`` only the
    samples near its tail count, so ``df = 2 sqrt(2 m min(q, 1-q))`` (p90 of 8-16 samples: 2.5-3.6, as
    measured), at least 2 and at most the pooled df."""
    pooled = float(n + n_other - 2)
    if stat == "mean":
        return pooled
    q = 0.5 if stat == "median" else int(stat[1:]) / 100.0
    m = min(n, n_other)
    return max(2.0, min(pooled, 2.0 * math.sqrt(2.0 * m * min(q, 1.0 - q))))


def expand_z(c: float, n: int, n_other: int, df: float | None = None) -> float:
    """The critical value ``c`` widened for small samples as :func:`bench.stats.expanded_tail` widens the fixed
    interval (Hesterberg 2015): ``sqrt(m/(m-1)) * t_{df}^{-1}(Phi(c))`` with ``m = min(n, n_other)`` and ``df``
    (default the pooled ``n + n_other - 2``; :func:`se_df` for a bootstrap SE); ``c`` itself when a side has fewer
    than 2 samples or ``c`` is infinite."""
    from bench.stats import student_t_ppf

    m = min(n, n_other)
    if m < 2 or not math.isfinite(c):
        return c
    p = _ND.cdf(c)
    if p >= 1.0 - 1e-12:
        return math.inf  # beyond 7 standard errors: no finite sample decides such a look
    return math.sqrt(m / (m - 1.0)) * student_t_ppf(p, df if df is not None else n + n_other - 2)
