"""Arrival schedules: when each request of an open-loop run is sent (pure, seeded, reproducible).

Kinds (``kind``), all with mean rate ``rate`` requests/s:

* ``poisson``: exponential gaps (a Poisson process);
* ``gamma``: gamma gaps of shape ``burstiness`` (scale ``1 / (burstiness * rate)``), so the mean gap is
  ``1 / rate`` and the coefficient of variation ``1 / sqrt(burstiness)``: ``burstiness < 1`` is burstier than
  Poisson, ``1`` is Poisson, ``> 1`` smoother (vLLM's ``--burstiness``);
* ``constant``: gaps of exactly ``1 / rate``.

The first request is at t = 0; times are offsets in seconds. An optional linear ramp-up of ``ramp_s`` seconds
raises the rate from 0 to ``rate``: the unit-rate process is generated first and mapped through the inverse of
the cumulative intensity ``L(t) = rate * t**2 / (2 * ramp_s)`` (t < ramp_s), ``rate * (t - ramp_s / 2)`` after.

Seeds: every random draw comes from a ``numpy.random.Generator`` made from ``SeedSequence(seed)`` spawned per
purpose (:func:`rng_for`), so the schedule, the input sizes and the output sizes are independent streams. The
schedule is generated once, in the parent, and dealt out to worker processes (:func:`split_round_robin`): workers
never replay one seeded stream (the trains of equal gaps a shared seed makes).

:func:`ks_statistic` / :func:`ks_pvalue` (one-sample Kolmogorov-Smirnov) and :func:`gamma_cdf` check a schedule
against its distribution (tests/load/test_load.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from bench.errors import ConfigError

__all__ = ["ARRIVAL_KINDS", "PURPOSES", "arrival_times", "rng_for", "split_round_robin",
           "ks_statistic", "ks_pvalue", "gamma_cdf", "exp_cdf"]

ARRIVAL_KINDS = ("poisson", "gamma", "constant")
PURPOSES = ("arrivals", "input", "output", "dataset", "sessions")
MAX_REQUESTS = 10_000_000


def rng_for(seed: int, purpose: str) -> np.random.Generator:
    """The generator of one purpose (``PURPOSES``) of a run seeded ``seed``: ``SeedSequence(seed).spawn``."""
    children = np.random.SeedSequence(seed).spawn(len(PURPOSES))
    return np.random.default_rng(children[PURPOSES.index(purpose)])


def split_round_robin(n: int, workers: int) -> list[list[int]]:
    """Indexes 0..n-1 dealt to ``workers`` in turn (request i goes to worker i % workers)."""
    return [list(range(w, n, workers)) for w in range(workers)]


def _check(kind: str, rate: float, duration_s: float | None, requests: int | None, burstiness: float,
           ramp_s: float) -> None:
    if kind not in ARRIVAL_KINDS:
        raise ConfigError(f"--arrival: {kind!r} is not one of {', '.join(ARRIVAL_KINDS)}")
    if not (isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"--rate must be a finite number > 0 (requests/s), got {rate!r}")
    if (duration_s is None) == (requests is None):
        raise ConfigError("give exactly one of --duration and --requests")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise ConfigError(f"--duration must be a finite number > 0 (s), got {duration_s!r}")
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        raise ConfigError(f"--requests must be in 1..{MAX_REQUESTS}, got {requests!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ConfigError(f"--burstiness must be a finite number > 0 (1 = Poisson), got {burstiness!r}")
    if not ramp_s >= 0:
        raise ConfigError(f"ramp_s must be >= 0 s, got {ramp_s!r}")


def _unit_gaps(kind: str, n: int, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` gaps of a unit-rate process of ``kind``."""
    if kind == "constant":
        return np.ones(n)
    if kind == "poisson":
        return rng.exponential(1.0, n)
    return rng.gamma(burstiness, 1.0 / burstiness, n)


def _from_operational(u: np.ndarray, rate: float, ramp_s: float) -> np.ndarray:
    """Map unit-rate times ``u`` to real time under the (ramped) intensity."""
    if ramp_s <= 0:
        return u / rate
    u_ramp = rate * ramp_s / 2.0
    return np.where(u < u_ramp, np.sqrt(2.0 * ramp_s * u / rate), u / rate + ramp_s / 2.0)


def arrival_times(kind: str, rate: float, *, duration_s: float | None = None, requests: int | None = None,
                  burstiness: float = 1.0, ramp_s: float = 0.0, seed: int = 0,
                  exact_count: bool = False) -> np.ndarray:
    """Send offsets in seconds (sorted, first 0.0) for ``requests`` arrivals or every arrival before
    ``duration_s``. Same arguments -> the same schedule. Raises ConfigError naming the flag on a bad value.

    ``exact_count`` (with ``duration_s``): exactly ``round(rate x duration)`` arrivals (at least 1), half of them
    (rounded down) in each half of the duration (the first half holds the rest), the process's gaps scaled to
    fill each half: for Poisson arrivals each half is a Poisson process conditioned on its count, so a short
    point offers its nominal rate in each half and only the burstiness within them is random (a capacity probe,
    judged on its second half: a 6-s Poisson probe at 4 req/s drew 36 arrivals, 6.1 req/s, and missed the SLO at
    a load it never offered; a 10-s gamma probe with burstiness 0.5 at 1 req/s drew its 10 arrivals all in its
    first half, and its judged half was empty)."""
    _check(kind, rate, duration_s, requests, burstiness, ramp_s)
    rng = rng_for(seed, "arrivals")
    if exact_count and duration_s is not None:
        u_end = rate * (duration_s - ramp_s / 2.0) if duration_s >= ramp_s else rate * duration_s ** 2 / (2 * ramp_s)
        return _from_operational(_exact_halves(kind, max(1, round(u_end)), u_end, burstiness, rng), rate, ramp_s)
    if requests is not None:
        gaps = _unit_gaps(kind, requests, burstiness, rng)
        u = np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        return _from_operational(u, rate, ramp_s)
    assert duration_s is not None
    u_end = rate * (duration_s - ramp_s / 2.0) if duration_s >= ramp_s else rate * duration_s ** 2 / (2 * ramp_s)
    chunks: list[np.ndarray] = []
    total, used = 0, 0.0
    while used < u_end:  # gaps drawn in chunks: the same stream however it is chunked
        n = max(16, int(u_end - used) + 16)
        if total + n > MAX_REQUESTS:
            raise ConfigError(f"--rate x --duration asks for more than {MAX_REQUESTS} requests")
        chunks.append(_unit_gaps(kind, n, burstiness, rng))
        total += n
        used += float(chunks[-1].sum())
    u = np.concatenate(([0.0], np.cumsum(np.concatenate(chunks))))
    u = u[u < u_end]
    return _from_operational(u, rate, ramp_s)


def _exact_halves(kind: str, n: int, u_end: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` unit-rate times in ``[0, u_end)``, the first at 0: ``n // 2`` in the second half (after a gap of the
    process from its start) and the rest in the first, each half's gaps scaled to fill it. Constant arrivals:
    evenly spaced over ``[0, u_end)`` (which puts ``n // 2`` in the second half too)."""
    if kind == "constant":
        return np.arange(n) * (u_end / n)
    n2 = n // 2
    half = u_end / 2.0
    g1 = _unit_gaps(kind, n - n2, burstiness, rng)
    u1 = np.concatenate(([0.0], np.cumsum(g1[:-1] * (half / float(g1.sum())))))
    if n2 == 0:
        return u1
    g2 = _unit_gaps(kind, n2 + 1, burstiness, rng)
    return np.concatenate((u1, half + np.cumsum(g2[:-1] * (half / float(g2.sum())))))


def exp_cdf(rate: float) -> Callable[[float], float]:
    """CDF of exponential gaps at ``rate``."""
    return lambda x: 1.0 - math.exp(-rate * x) if x > 0 else 0.0


def gamma_cdf(shape: float, scale: float) -> Callable[[float], float]:
    """CDF of the gamma distribution: the regularized lower incomplete gamma P(shape, x / scale)."""
    lg = math.lgamma(shape)

    def cdf(x: float) -> float:
        if x <= 0:
            return 0.0
        z = x / scale
        if z < shape + 1.0:  # series
            term = total = 1.0 / shape
            a = shape
            for _ in range(1000):
                a += 1.0
                term *= z / a
                total += term
                if abs(term) < abs(total) * 1e-15:
                    break
            return min(1.0, total * math.exp(-z + shape * math.log(z) - lg))
        # continued fraction (modified Lentz) for the upper tail Q
        b = z + 1.0 - shape
        c, d = 1.0 / 1e-300, 1.0 / b
        h = d
        for i in range(1, 1000):
            an = -i * (i - shape)
            b += 2.0
            d = an * d + b
            d = 1e-300 if abs(d) < 1e-300 else d
            c = b + an / c
            c = 1e-300 if abs(c) < 1e-300 else c
            d = 1.0 / d
            delta = d * c
            h *= delta
            if abs(delta - 1.0) < 1e-15:
                break
        return max(0.0, 1.0 - math.exp(-z + shape * math.log(z) - lg) * h)

    return cdf


def ks_statistic(samples: Sequence[float] | np.ndarray, cdf: Callable[[float], float]) -> float:
    """One-sample Kolmogorov-Smirnov statistic D = sup |F_n(x) - F(x)|."""
    xs = np.sort(np.asarray(samples, dtype=float))
    n = xs.size
    if n == 0:
        raise ValueError("no samples")
    f = np.array([cdf(float(x)) for x in xs])
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))


def ks_pvalue(d: float, n: int) -> float:
    """Asymptotic p-value of D for n samples (Kolmogorov's series with Stephens' small-n correction)."""
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if lam < 0.2:
        return 1.0
    s = sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return float(max(0.0, min(1.0, 2.0 * s)))
