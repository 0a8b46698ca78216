"""Small, pure statistics: percentiles with their sample counts, and bootstrap confidence intervals.

Percentiles use linear interpolation between order statistics (numpy's default, "type 7" of Hyndman & Fan 1996).
A percentile q is reported as reliable only when the sample has at least ``ceil(1 / (1 - q/100))`` values
(p90 needs 10, p99 needs 100); below that :func:`summarize` still gives the value but flags it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Summary", "summarize", "percentile", "min_samples", "bootstrap_ci"]


def min_samples(q: float) -> int:
    """Fewest samples for percentile ``q`` (0-100) to rest on at least one observation beyond it."""
    if q <= 50:
        return 1
    return math.ceil(1.0 / (1.0 - q / 100.0) - 1e-9)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Percentile ``q`` (0-100) of ``values``; None for an empty sample."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution summary of one metric.

    Attributes:
        n: sample count.
        mean, median, p10, p90, p99, min, max: in the metric's unit; None when ``n == 0``.
        thin: names of percentiles that had fewer samples than :func:`min_samples` asks (e.g. ``["p99"]``).
    """

    n: int
    mean: float | None
    median: float | None
    p10: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None
    thin: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-safe dict with values rounded to 4 significant decimals."""
        out: dict[str, object] = {"n": self.n}
        for k in ("mean", "median", "p10", "p90", "p99", "min", "max"):
            v = getattr(self, k)
            out[k] = None if v is None else round(v, 4)
        out["thin"] = list(self.thin)
        return out


def summarize(values: Sequence[float | None]) -> Summary:
    """Summary of the non-None values."""
    xs = np.asarray([v for v in values if v is not None], dtype=float)
    n = int(xs.size)
    if n == 0:
        return Summary(0, None, None, None, None, None, None, None, ())
    p10, p50, p90, p99 = (float(v) for v in np.percentile(xs, [10, 50, 90, 99]))
    thin = tuple(f"p{q}" for q in (10, 90, 99) if n < min_samples(q if q > 50 else 100 - q))
    return Summary(n, float(xs.mean()), p50, p10, p90, p99, float(xs.min()), float(xs.max()), thin)


def bootstrap_ci(
    samples: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.median,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of ``stat`` over ``samples`` (Efron & Tibshirani 1993, ch. 13).

    Returns ``(lo, hi)``; for fewer than 2 samples both ends equal the statistic. Deterministic for a seed.
    """
    xs = np.asarray(samples, dtype=float)
    if xs.size < 2:
        v = float(stat(xs)) if xs.size else float("nan")
        return v, v
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, xs.size, size=(resamples, xs.size))
    boots = np.apply_along_axis(stat, 1, xs[idx])
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(boots, [a, 1.0 - a])
    return float(lo), float(hi)


# --- Additions for the CI gate (bench.gate): smooth quantiles and a calibrated two-sample ratio bootstrap -------

__all__ += [
    "betainc_reg",
    "student_t_ppf",
    "hd_weights",
    "hd_quantile",
    "thd_weights",
    "thd_quantile",
    "make_estimator",
    "expanded_tail",
    "bootstrap_ratio_ci",
]


def betainc_reg(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``.

    Continued fraction of DLMF 8.17.22 (used where it converges fast, ``x < (a + 1) / (a + b + 2)``, and through
    the symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)`` elsewhere), evaluated with the modified Lentz method
    (Thompson & Barnett 1986, J. Comput. Phys. 64:490). Absolute error below 1e-13 for the arguments bench uses.
    """
    if a <= 0 or b <= 0:
        raise ValueError(f"betainc_reg needs a, b > 0 (got a={a}, b={b})")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - betainc_reg(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    front = math.exp(log_front) / a
    tiny = 1e-300
    # Lentz on 1 + d1/(1 + d2/(1 + ...)); the fraction wanted is 1/(1 + d1/(1 + ...)) = 1/value.
    value, c, d = 1.0, 1.0, 0.0
    for i in range(1, 1000):
        m = i // 2
        if i % 2:
            coef = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            coef = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + coef * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + coef / c
        c = c if abs(c) > tiny else tiny
        step = c * d
        value *= step
        if abs(step - 1.0) < 1e-15:
            break
    return front / value


def _student_t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc_reg(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


_T_PPF_CACHE: dict[tuple[float, float], float] = {}


def student_t_ppf(p: float, df: float) -> float:
    """Quantile ``p`` (0 < p < 1) of Student's t with ``df > 0`` degrees of freedom.

    The CDF is ``1 - I_{df/(df+t^2)}(df/2, 1/2) / 2`` for ``t > 0`` (Abramowitz & Stegun 26.7.1 via 26.5.27),
    inverted by bisection to 1e-10. Cached.
    """
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"student_t_ppf needs 0 < p < 1 and df > 0 (got p={p}, df={df})")
    key = (p, df)
    if key not in _T_PPF_CACHE:
        lo, hi = -1e6, 1e6
        for _ in range(300):
            mid = 0.5 * (lo + hi)
            if _student_t_cdf(mid, df) < p:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-10:
                break
        _T_PPF_CACHE[key] = 0.5 * (lo + hi)
    return _T_PPF_CACHE[key]


_HD_CACHE: dict[tuple[int, float], np.ndarray] = {}


def hd_weights(n: int, q: float) -> np.ndarray:
    """Harrell-Davis weights of the ``n`` order statistics for quantile ``q`` (0 < q < 1).

    ``w_i = I_{i/n}(a, b) - I_{(i-1)/n}(a, b)`` with ``a = (n + 1) q``, ``b = (n + 1)(1 - q)``
    (Harrell & Davis 1982, Biometrika 69(3):635-640). Shape ``(n,)``, sums to 1. Cached per ``(n, q)``.
    """
    if n < 1:
        raise ValueError("hd_weights needs n >= 1")
    if not 0.0 < q < 1.0:
        raise ValueError(f"hd_weights needs 0 < q < 1 (got {q})")
    key = (n, q)
    w = _HD_CACHE.get(key)
    if w is None:
        a, b = (n + 1) * q, (n + 1) * (1.0 - q)
        cdf = np.array([betainc_reg(a, b, i / n) for i in range(n + 1)])
        w = np.diff(cdf)
        w.setflags(write=False)
        _HD_CACHE[key] = w
    return w


def hd_quantile(values: Sequence[float] | np.ndarray, q: float) -> float | np.ndarray:
    """Harrell-Davis estimate of quantile ``q`` (0-1): a weighted mean of all order statistics (weights from
    :func:`hd_weights`). Smooth in the data, unlike the sample quantile, which jumps between order statistics.

    ``values`` of shape ``(n,)`` gives a float; shape ``(rows, n)`` gives one estimate per row. Raises
    ValueError on an empty sample.
    """
    return _weighted_quantile(values, q, hd_weights, "hd_quantile")


def _weighted_quantile(values: Sequence[float] | np.ndarray, q: float, weights: Callable[[int, float], np.ndarray],
                       name: str) -> float | np.ndarray:
    """Sort along the last axis and take the weighted sum of order statistics given by ``weights(n, q)``."""
    xs = np.sort(np.asarray(values, dtype=float), axis=-1)
    n = xs.shape[-1]
    if n == 0:
        raise ValueError(f"{name} of an empty sample")
    out = xs @ weights(n, q)
    return float(out) if xs.ndim == 1 else out


_THD_CACHE: dict[tuple[int, float], np.ndarray] = {}


def _beta_hdi(a: float, b: float, width: float) -> tuple[float, float]:
    """The interval ``[L, L + width]`` of highest Beta(a, b) density (a + b >= 2), by bisection on
    ``log f(L + width) - log f(L)``, which falls with ``L`` because the density is log-concave there."""
    if a <= 1.0 and b <= 1.0:
        return 0.5 - width / 2, 0.5 + width / 2
    if a <= 1.0:
        return 0.0, width
    if b <= 1.0:
        return 1.0 - width, 1.0

    def logf(x: float) -> float:
        x = min(max(x, 1e-300), 1.0 - 1e-16)
        return (a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x)

    mode = (a - 1.0) / (a + b - 2.0)
    lo, hi = max(0.0, mode - width), min(mode, 1.0 - width)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if logf(mid + width) > logf(mid):
            lo = mid
        else:
            hi = mid
    return lo, lo + width


def thd_weights(n: int, q: float) -> np.ndarray:
    """Trimmed Harrell-Davis weights of the ``n`` order statistics for quantile ``q`` (0 < q < 1).

    As :func:`hd_weights`, but the Beta((n+1)q, (n+1)(1-q)) distribution is restricted to its highest-density
    interval ``[L, R]`` of width ``1/sqrt(n)`` and renormalized: ``w_i = F*(i/n) - F*((i-1)/n)`` with
    ``F*(x) = (F(clip(x, L, R)) - F(L)) / (F(R) - F(L))`` (A. Akinshin, "Trimmed Harrell-Davis quantile estimator
    based on the highest density interval of the given width", Communications in Statistics - Simulation and
    Computation, 2023; arXiv:2111.11776). Order statistics far from the quantile get weight 0, so one outlier
    cannot pull the estimate. Shape ``(n,)``, sums to 1. Cached per ``(n, q)``.
    """
    if n < 1:
        raise ValueError("thd_weights needs n >= 1")
    if not 0.0 < q < 1.0:
        raise ValueError(f"thd_weights needs 0 < q < 1 (got {q})")
    key = (n, q)
    w = _THD_CACHE.get(key)
    if w is None:
        if n == 1:
            w = np.ones(1)
        else:
            a, b = (n + 1) * q, (n + 1) * (1.0 - q)
            lo, hi = _beta_hdi(a, b, 1.0 / math.sqrt(n))
            f_lo, f_hi = betainc_reg(a, b, lo), betainc_reg(a, b, hi)
            cdf = np.array([(betainc_reg(a, b, min(max(i / n, lo), hi)) - f_lo) / (f_hi - f_lo)
                            for i in range(n + 1)])
            w = np.diff(cdf)
        w.setflags(write=False)
        _THD_CACHE[key] = w
    return w


def thd_quantile(values: Sequence[float] | np.ndarray, q: float) -> float | np.ndarray:
    """Trimmed Harrell-Davis estimate of quantile ``q`` (0-1) (weights :func:`thd_weights`): smooth in the data
    like :func:`hd_quantile`, and robust to a stray value like the sample quantile.

    ``values`` of shape ``(n,)`` gives a float; shape ``(rows, n)`` gives one estimate per row. Raises
    ValueError on an empty sample.
    """
    return _weighted_quantile(values, q, thd_weights, "thd_quantile")


def make_estimator(stat: str) -> Callable[[np.ndarray], np.ndarray]:
    """The row-wise estimator behind a gate statistic name.

    ``"mean"`` -> arithmetic mean; ``"median"`` -> trimmed Harrell-Davis median (:func:`thd_quantile`);
    ``"pNN"`` (1 <= NN <= 99, e.g. ``"p90"``) -> trimmed Harrell-Davis quantile NN/100. The returned function maps
    an array of shape ``(rows, n)`` to ``(rows,)``. Raises ValueError on another name.
    """
    if stat == "mean":
        return lambda rows: np.asarray(rows, dtype=float).mean(axis=-1)
    if stat == "median":
        q = 0.5
    elif len(stat) >= 2 and stat[0] == "p" and stat[1:].isdigit() and 1 <= int(stat[1:]) <= 99:
        q = int(stat[1:]) / 100.0
    else:
        raise ValueError(f"unknown statistic {stat!r} (use mean, median or p1..p99)")
    return lambda rows: np.atleast_1d(thd_quantile(rows, q))


def expanded_tail(level: float, n: int, n_other: int | None = None) -> float:
    """Tail probability to read off a bootstrap distribution for an *expanded* percentile interval.

    The plain percentile interval is too narrow for small samples: its spread is the plug-in one, short by
    ``(n-1)/n`` in variance, and its tails are normal rather than Student. Hesterberg (2015, "What teachers should
    know about the bootstrap", The American Statistician 69(4):371-386, section 5) widens it by reading the
    bootstrap distribution at ``alpha'/2 = Phi(-sqrt(n/(n-1)) * t_{alpha/2, df})`` instead of ``alpha/2``, with
    ``df = n - 1`` for one sample. For two samples (``n_other`` given) bench uses ``n = min(n, n_other)`` in the
    variance factor and the pooled two-sample ``df = n + n_other - 2``. Returns ``alpha'/2`` (one tail); 0 (the
    whole bootstrap range) when a sample has fewer than 2 values.
    """
    alpha = 1.0 - level
    if n_other is None:
        m, df = n, n - 1
    else:
        m, df = min(n, n_other), n + n_other - 2
    if m < 2:
        return 0.0
    z = math.sqrt(m / (m - 1.0)) * student_t_ppf(1.0 - alpha / 2.0, df)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def bootstrap_ratio_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    stat: str = "median",
    *,
    level: float = 0.95,
    resamples: int = 4000,
    seed: int | Sequence[int] = 0,
    expand: bool = True,
) -> tuple[float, float, float, float, float]:
    """Ratio ``stat(candidate) / stat(baseline)`` with a two-sample percentile-bootstrap confidence interval.

    Each side is resampled independently with replacement (Efron & Tibshirani 1993, ch. 8.3 two-sample bootstrap;
    ch. 13 percentile interval); the interval is read at the tails of the ``resamples`` bootstrap ratios.
    With ``expand`` the tails are those of :func:`expanded_tail` for the two sample sizes.
    ``stat`` is a :func:`make_estimator` name. Deterministic for a seed.

    Returns ``(base_estimate, cand_estimate, ratio, lo, hi)``. Raises ValueError when a side has fewer than
    2 values or the baseline estimate is not positive.
    """
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"need at least 2 samples per side (baseline {a.size}, candidate {b.size})")
    est = make_estimator(stat)
    base_v = float(est(a[None, :])[0])
    cand_v = float(est(b[None, :])[0])
    if not base_v > 0:
        raise ValueError(f"baseline {stat} is {base_v}; a ratio needs a positive baseline")
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, a.size, size=(resamples, a.size))]
    rb = b[rng.integers(0, b.size, size=(resamples, b.size))]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = est(rb) / est(ra)
    ratios = ratios[np.isfinite(ratios)]
    tail = expanded_tail(level, a.size, b.size) if expand else (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return base_v, cand_v, cand_v / base_v, float(lo), float(hi)
