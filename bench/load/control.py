"""Control variates from the schedule (``bench capacity --by rate``; docs/load.md, "Capacity").

Near the boundary almost all of a point's noise comes from its arrivals: a burst of sends fills the engine and
many requests go over the limit together. bench draws the arrivals itself, so it knows their distribution
exactly, and a function of them whose expectation is computed by drawing more schedules of the same process
(no server needed) is a control variate: subtracting its deviation from that expectation removes the part of
the point's share that the realized arrivals explain, and keeps the estimator unbiased whatever the function.

* :func:`features`: per request, functions of the schedule alone: the arrival rate in bins before and after
  its send (widths in units of the requests' median end-to-end time ``u``) and the workload of a virtual queue
  (the Lindley recursion) served at a few multiples of the reference rate.
* :func:`fit_proxy`: a logistic regression of "over the limit" on those features, pooled over the points;
  :func:`adjusted_shares` fits one per block of each point's window (``FOLDS`` blocks) on every request but that
  block's (the other points' windows and the point's own other blocks): :class:`Folded`.
* :func:`adjusted_share`: a point's share minus (the mean fitted probability of its requests - its expectation
  over ``draws`` schedules of the same process), and the variance of that estimate (batch means of the
  residuals plus the expectation's Monte Carlo variance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.load.arrivals import arrival_times

__all__ = ["Process", "PointRequests", "features", "fit_proxy", "Folded", "adjusted_share", "Adjusted",
           "BIN_EDGES_U", "QUEUE_SPEEDS", "DRAWS", "BATCHES", "FOLDS"]

BIN_EDGES_U = (-16.0, -8.0, -4.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
QUEUE_SPEEDS = (1.1, 1.2, 1.4, 2.0)
DRAWS = 300
BATCHES = 10
RIDGE = 1.0


@dataclass(frozen=True, slots=True)
class Process:
    """The arrival process of a point: what :func:`bench.load.arrivals.arrival_times` draws from."""

    kind: str
    rate: float
    duration_s: float | None
    requests: int | None = None
    burstiness: float = 1.0
    ramp_s: float = 0.0

    def draw(self, seed: int) -> np.ndarray:
        return arrival_times(self.kind, self.rate, duration_s=self.duration_s, requests=self.requests,
                             burstiness=self.burstiness, ramp_s=self.ramp_s, seed=seed)


@dataclass(frozen=True, slots=True)
class PointRequests:
    """What a point's requests give the control variate: every planned send offset (s, sorted), the window
    ``[lo, hi]`` (schedule s), the window's requests' send offsets, per objective each one's value in ms (inf:
    failed, nan: undefined) and its limit, the median end-to-end time of the window's requests (s), the process
    and the seed its expectation's draws start from."""

    at_s: np.ndarray
    lo: float
    hi: float
    sent_s: np.ndarray
    values: dict[str, np.ndarray]
    limits: dict[str, float]
    e2e_s: float
    process: Process
    seed: int


def features(at_s: np.ndarray, t: np.ndarray, u: float, ref_rate: float) -> np.ndarray:
    """Rows per time in ``t`` (each a send in ``at_s``): the arrival rate in each bin of ``BIN_EDGES_U * u``
    around it over ``ref_rate``, then the Lindley workload (in mean gaps) of a queue served at ``QUEUE_SPEEDS``
    times ``ref_rate`` as of that send."""
    cols = []
    for a, b in zip(BIN_EDGES_U, BIN_EDGES_U[1:]):
        n = np.searchsorted(at_s, t + b * u, side="right") - np.searchsorted(at_s, t + a * u, side="right")
        cols.append(n / ((b - a) * u * ref_rate))
    idx = np.clip(np.searchsorted(at_s, t, side="right") - 1, 0, max(0, at_s.size - 1))
    gaps = np.diff(at_s, prepend=at_s[:1]) if at_s.size else at_s
    for c in QUEUE_SPEEDS:
        s = np.cumsum(1.0 / (c * ref_rate) - gaps)
        s -= s[0] if s.size else 0.0
        work = s - np.minimum.accumulate(np.minimum(s, 0.0))
        cols.append(work[idx] * ref_rate if s.size else np.zeros(t.size))
    return np.column_stack(cols) if cols else np.zeros((t.size, 0))


def _logistic(z: np.ndarray, y: np.ndarray, pen: np.ndarray) -> np.ndarray:
    """Penalized logistic regression of 0/1 ``y`` on the design ``z`` (first column the intercept)."""
    p0 = min(max(float(y.mean()), 1e-3), 1 - 1e-3)
    beta = np.zeros(z.shape[1])
    beta[0] = math.log(p0 / (1 - p0))
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -30, 30)))
        w = p * (1 - p) + 1e-9
        step = np.linalg.solve((z * w[:, None]).T @ z + np.diag(pen), z.T @ (y - p) - pen * beta)
        beta = beta + step
        if float(np.max(np.abs(step))) < 1e-8:
            break
    return beta


@dataclass(frozen=True, slots=True)
class Proxy:
    """The fitted probability of "over the limit" given the schedule: ``index`` = a ridge regression of the log
    value on the standardized features and log(rate), then a logistic regression of over-the-limit on it."""

    w: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    link: np.ndarray

    def predict(self, x: np.ndarray, log_rate: float, t: np.ndarray | None = None) -> np.ndarray:
        """The fitted probability of each row of ``x`` (``t``, the rows' send times, is not used)."""
        z = (np.column_stack([x, np.full(x.shape[0], log_rate)]) - self.mean) / self.sd
        eta = self.link[0] + self.link[1] * (self.w[0] + z @ self.w[1:])
        out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(eta, -30, 30)))
        return out


@dataclass(frozen=True, slots=True)
class Folded:
    """One proxy per block of a point's window (``edges``: the blocks' bounds, s): a row sent in block ``f`` is
    predicted by ``proxies[f]``, which was fitted without that block's requests."""

    proxies: tuple[Proxy, ...]
    edges: np.ndarray

    def predict(self, x: np.ndarray, log_rate: float, t: np.ndarray | None = None) -> np.ndarray:
        """The fitted probability of each row of ``x`` by the proxy of the block of its send time in ``t``."""
        assert t is not None
        block = np.searchsorted(self.edges[1:-1], t, side="right")
        out = np.empty(t.size)
        for f, proxy in enumerate(self.proxies):
            sel = block == f
            if sel.any():
                out[sel] = proxy.predict(x[sel], log_rate)
        return out


def fit_proxy(xs: Sequence[np.ndarray], log_rates: Sequence[float], values: Sequence[np.ndarray],
              limit: float) -> Proxy:
    """:class:`Proxy` fitted on the feature rows ``xs``, each point's log rate and the requests' ``values`` (ms,
    inf for a failed request) pooled over points: the log value (at most ``log(1000 limit)``) by ridge regression
    (penalty ``RIDGE`` on standardized coefficients), over-the-limit by a logistic regression on that index."""
    x = np.vstack([np.column_stack([a, np.full(a.shape[0], r)]) for a, r in zip(xs, log_rates)])
    v = np.concatenate(list(values))
    y = (v > limit).astype(float)
    lv = np.log(np.clip(v, 1e-3 * limit, 1e3 * limit))
    mean, sd = x.mean(axis=0), x.std(axis=0)
    sd = np.where(sd > 1e-12, sd, 1.0)
    z = np.column_stack([np.ones(y.size), (x - mean) / sd])
    pen = np.full(z.shape[1], RIDGE)
    pen[0] = 0.0
    w = np.linalg.solve(z.T @ z + np.diag(pen), z.T @ lv)
    idx = z @ w
    link = _logistic(np.column_stack([np.ones(y.size), idx]), y, np.zeros(2))
    return Proxy(w, mean, sd, link)


@dataclass(frozen=True, slots=True)
class Adjusted:
    """A point's adjusted share over the limit and its variance (``raw``: the plain share; ``n``: requests)."""

    share: float
    var: float
    raw: float
    n: int


def _batch_var(r: np.ndarray) -> float:
    """Variance of the mean of the series ``r`` by batch means (``BATCHES`` consecutive batches)."""
    k = min(BATCHES, r.size // 4)
    if k < 2:
        return float(r.var()) / max(1, r.size)
    means = np.array([b.mean() for b in np.array_split(r, k)])
    return float(means.var(ddof=1)) / k


def expected_proxy(proxy: Proxy | Folded, pr: PointRequests, u: float, ref_rate: float,
                   draws: int = DRAWS) -> tuple[float, float]:
    """The mean fitted probability of the window's requests, expected over ``draws`` schedules of the point's
    process (seeds ``pr.seed + 1 ..``), and that mean's Monte Carlo variance."""
    log_rate = math.log(pr.process.rate)
    means = []
    for i in range(draws):
        at = pr.process.draw(pr.seed + 1 + i)
        t = at[(at >= pr.lo) & (at <= pr.hi)]
        if t.size:
            means.append(float(proxy.predict(features(at, t, u, ref_rate), log_rate, t).mean()))
    m = np.asarray(means)
    return float(m.mean()), float(m.var(ddof=1)) / m.size if m.size > 1 else 0.0


def adjusted_share(proxy: Proxy | Folded, pr: PointRequests, key: str, u: float, ref_rate: float,
                   draws: int = DRAWS) -> Adjusted:
    """``share - (mean fitted probability - its expectation)`` over the window's requests with a defined value,
    with its variance: the residuals' batch-means variance plus the expectation's Monte Carlo variance."""
    v = pr.values[key]
    ok = ~np.isnan(v)
    y, t = (v[ok] > pr.limits[key]).astype(float), pr.sent_s[ok]
    if y.size == 0:
        return Adjusted(math.nan, math.inf, math.nan, 0)
    g = proxy.predict(features(pr.at_s, t, u, ref_rate), math.log(pr.process.rate), t)
    e, v_mc = expected_proxy(proxy, pr, u, ref_rate, draws)
    floor = float(y.mean() * (1 - y.mean())) / y.size  # no less than independent requests would give
    return Adjusted(float(y.mean() - g.mean() + e), max(floor, VAR_INFLATE * _batch_var(y - g)) + v_mc,
                    float(y.mean()), int(y.size))


VAR_INFLATE = 3.0  # docs/load.md: 5 before the fit floored a point's variance at its fitted share (coverage at 170 s)
FOLDS = 4  # blocks of a point's window, each with its own cross-fitted proxy


def adjusted_shares(prs: Sequence[PointRequests], key: str) -> list[Adjusted]:
    """Each point's :class:`Adjusted` share for objective ``key`` (cross-fitting: a proxy fitted on a point's own
    requests follows their noise and hides part of it): its window split into ``FOLDS`` blocks in schedule
    order, each block's requests predicted by a proxy fitted on the *other* points' windows and the point's own
    other blocks. The time unit ``u`` is the points' median end-to-end time, the reference rate their median
    rate."""
    u = max(1e-3, float(np.median([p.e2e_s for p in prs])))
    ref = float(np.median([p.process.rate for p in prs]))
    rows = []
    for p in prs:
        v = p.values[key]
        ok = ~np.isnan(v)
        rows.append((features(p.at_s, p.sent_s[ok], u, ref), math.log(p.process.rate), v[ok]))
    out = []
    for j, p in enumerate(prs):
        others = [r for i, r in enumerate(rows) if i != j]
        edges = np.linspace(p.lo, p.hi, FOLDS + 1)
        block = np.searchsorted(edges[1:-1], p.sent_s[~np.isnan(p.values[key])], side="right")
        x, log_rate, v = rows[j]
        proxies = []
        for f in range(FOLDS):
            own = block != f  # the point's requests outside block f (none when FOLDS is 1)
            train = others + [(x[own], log_rate, v[own])] if own.any() else others or [rows[j]]
            proxies.append(fit_proxy([r[0] for r in train], [r[1] for r in train], [r[2] for r in train],
                                     p.limits[key]))
        out.append(adjusted_share(Folded(tuple(proxies), edges), p, key, u, ref))
    return out
