"""Change points in a series of runs: where a figure moved to a new level and stayed there.

The detector (``pelt``, the default) works on the logarithm of the values, so sizes are relative and a step of
x % is the same height at any level:

1. the run-to-run noise ``sigma`` is estimated robustly from the first differences (``1.4826 MAD / sqrt 2``, which
   a few steps barely move) and the series is divided by it;
2. ruptures' PELT (Killick, Fearnhead & Eckley 2012, "Optimal detection of changepoints with a linear computational
   cost", JASA 107:500; implementation: Truong, Oudre & Vayatis 2020, "Selective review of offline change point
   detection methods", Signal Processing 167) finds the segmentation minimising the squared error plus a penalty
   ``beta * log(n)`` per change (``beta`` = :data:`BETA`, a BIC-type penalty), each segment at least
   ``min_size`` runs;
3. every change found is tested: Welch's t-test between the segments on its two sides (Otava/Hunter's check of
   each e-divisive candidate is the same idea); a change with ``p >= alpha`` is dropped, its segments merged, and
   the rest tested again. The size is the ratio of the two segments' geometric means, in %, with the Welch
   ``1 - alpha`` interval.

``binseg`` (binary segmentation, the same cost and penalty) and ``threshold`` (the single comparison a per-run gate
makes: each run against the mean and spread of the ``window`` runs before it) are there to be compared with
(benchmarks/history_truth.py; results in benchmarks/results/).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.history import runs_text

__all__ = ["Change", "SeriesResult", "detect", "METHODS", "BETA", "MIN_SIZE", "ALPHA", "MAX_NOISE_PCT"]

METHODS = ("pelt", "binseg", "threshold")
BETA = 3.0  # penalty per change, in units of log(n) (benchmarks/history_truth.py measures its false alarms)
MIN_SIZE = 3  # runs on each side of a change, at least
ALPHA = 0.01  # the Welch test's level for a change to be kept; its interval is the 1 - ALPHA one
MAX_NOISE_PCT = 20.0  # run-to-run noise above which a series is called too noisy to look for changes in
_SIGMA_FLOOR = 1e-4  # 0.01 %: the noise of a series whose runs repeat exactly


@dataclass(frozen=True)
class Change:
    """A change point: ``index`` is the position of the first run after it; ``before``/``after`` are the runs of
    the segments on each side, as ``(first, end)`` positions (end exclusive)."""

    index: int
    change_pct: float
    lo_pct: float
    hi_pct: float
    p_value: float
    before: tuple[int, int]
    after: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"index": self.index, "change_pct": round(self.change_pct, 3), "ci_pct": [round(self.lo_pct, 3),
                round(self.hi_pct, 3)], "p_value": self.p_value, "before": list(self.before),
                "after": list(self.after)}


@dataclass
class SeriesResult:
    """What :func:`detect` found: ``status`` is ``ok``, ``too short``, ``too noisy`` or ``bad values`` (then no
    changes); ``need``: the runs the method needs to judge the series."""

    n: int
    status: str
    noise_pct: float | None
    changes: list[Change] = field(default_factory=list)
    note: str = ""
    need: int = 0


def noise_sigma(logx: np.ndarray) -> float:
    """Robust run-to-run noise of a log series: ``1.4826 * MAD(diff) / sqrt(2)`` (a step adds one outlier)."""
    d = np.diff(logx)
    if d.size == 0:
        return _SIGMA_FLOOR
    mad = float(np.median(np.abs(d - np.median(d))))
    return max(1.4826 * mad / math.sqrt(2.0), _SIGMA_FLOOR)


def _segment(z: np.ndarray, method: str, min_size: int, beta: float) -> list[int]:
    import ruptures as rpt

    algo: Any = rpt.Pelt if method == "pelt" else rpt.Binseg
    bkps = algo(model="l2", min_size=min_size, jump=1).fit(z.reshape(-1, 1)).predict(pen=beta * math.log(z.size))
    return [int(b) for b in bkps[:-1]]  # the last one is the series' end


def _welch(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float, float, float]:
    """``(diff, lo, hi, p)`` of mean(b) - mean(a), Welch's t (scipy.stats)."""
    from scipy import stats

    diff = float(b.mean() - a.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return diff, diff, diff, 0.0 if diff != 0.0 else 1.0
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if va > 0 and vb > 0 else \
        float(min(a.size, b.size) - 1)
    t = stats.t.ppf(1.0 - alpha / 2.0, df)
    p = float(2.0 * stats.t.sf(abs(diff) / se, df))
    return diff, diff - t * se, diff + t * se, p


def _tested(logx: np.ndarray, bkps: list[int], alpha: float) -> list[Change]:
    """Drop the least significant change until every change left has ``p < alpha`` (segments re-merged)."""
    bk = list(bkps)
    while bk:
        edges = [0, *bk, logx.size]
        tests = [_welch(logx[edges[i]:edges[i + 1]], logx[edges[i + 1]:edges[i + 2]], alpha)
                 for i in range(len(bk))]
        worst = max(range(len(bk)), key=lambda i: tests[i][3])
        if tests[worst][3] < alpha:
            return [Change(bk[i], _pct(d), _pct(lo), _pct(hi), p, (edges[i], edges[i + 1]),
                           (edges[i + 1], edges[i + 2])) for i, (d, lo, hi, p) in enumerate(tests)]
        bk.pop(worst)
    return []


def _pct(log_diff: float) -> float:
    return (math.exp(log_diff) - 1.0) * 100.0


def _threshold(logx: np.ndarray, window: int, k: float = 3.0) -> list[Change]:
    """The per-run check: run i flagged when it lies more than ``k`` sigma from the mean of the ``window`` runs
    before it (sigma their standard deviation); after a flag the window restarts at it."""
    out: list[Change] = []
    start = 0
    for i in range(window, logx.size):
        ref = logx[max(start, i - window):i]
        if ref.size < window:
            continue
        sd = max(float(ref.std(ddof=1)), _SIGMA_FLOOR)
        d = float(logx[i] - ref.mean())
        if abs(d) > k * sd:
            out.append(Change(i, _pct(d), _pct(d - k * sd), _pct(d + k * sd), float("nan"), (i - ref.size, i),
                              (i, i + 1)))
            start = i
    return out


def detect(values: Sequence[float] | np.ndarray, *, method: str = "pelt", min_size: int = MIN_SIZE, beta: float = BETA,
           alpha: float = ALPHA, max_noise_pct: float = MAX_NOISE_PCT, window: int = 10,
           judge_last: int = 1) -> SeriesResult:
    """Change points in ``values`` (positive numbers, oldest first); see the module docstring. ``judge_last``: the
    newest runs that must be judged (``threshold`` judges a run only with ``window`` runs before it, so a series of
    fewer than ``window + judge_last`` is ``too short`` for it: a step among its first runs would go unseen)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    xs = np.asarray([float(v) for v in values], dtype=float)
    n = int(xs.size)
    need = window + max(judge_last, 1) if method == "threshold" else 2 * min_size
    if n and (not np.all(np.isfinite(xs)) or np.any(xs <= 0)):
        return SeriesResult(n, "bad values", None, note="a value is zero, negative or not finite", need=need)
    if n < need:
        why = f" ({window} before each of the last {max(judge_last, 1)})" if method == "threshold" else ""
        return SeriesResult(n, "too short", None, note=f"{runs_text(n)}; at least {need} are needed{why}",
                            need=need)
    logx = np.log(xs)
    sigma = noise_sigma(logx)
    noise_pct = _pct(sigma)
    if noise_pct > max_noise_pct:
        return SeriesResult(n, "too noisy", noise_pct, note=f"run-to-run noise {noise_pct:.1f} % is above "
                            f"{max_noise_pct:g} %", need=need)
    if method == "threshold":
        return SeriesResult(n, "ok", noise_pct, _threshold(logx, window), need=need)
    bkps = _segment(logx / sigma, method, min_size, beta)
    return SeriesResult(n, "ok", noise_pct, _tested(logx, bkps, alpha), need=need)
