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
