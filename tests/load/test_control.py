"""bench/load/control.py and estimate.fit_shares: the control-variate shares of ``bench capacity --by rate``."""

from __future__ import annotations

import math

import numpy as np

from bench.load.control import BIN_EDGES_U, QUEUE_SPEEDS, Process, features
from bench.load.estimate import SHIFT_SD, fit_shares


def test_queue_features_are_the_lindley_recursion() -> None:
    at = Process("poisson", 10.0, 30.0).draw(3)
    x = features(at, at, 0.5, 10.0)
    assert x.shape == (at.size, len(BIN_EDGES_U) - 1 + len(QUEUE_SPEEDS))
    for j, c in enumerate(QUEUE_SPEEDS):
        w, out = 0.0, []
        for i in range(at.size):
            w = max(0.0, w + 1 / (c * 10.0) - (at[i] - at[i - 1])) if i else 0.0
            out.append(w * 10.0)
        assert np.allclose(x[:, len(BIN_EDGES_U) - 1 + j], out)


def test_rate_bins_average_one_at_the_reference_rate() -> None:
    at = Process("poisson", 20.0, 400.0).draw(5)
    mid = at[(at > 100) & (at < 300)]
    x = features(at, mid, 0.5, 20.0)
    # the bin that ends at a send holds that send too (seen from an arrival, its own bin has one more)
    own = BIN_EDGES_U.index(0.0) - 1
    means = np.delete(x[:, : len(BIN_EDGES_U) - 1].mean(axis=0), own)
    assert np.all(np.abs(means - 1.0) < 0.1)


def test_fit_shares_recovers_a_known_crossing() -> None:
    rates = [9.0, 9.6, 10.4, 11.0]
    true = [1 / (1 + math.exp(-(-2.197 + 20 * math.log(r / 10.0)))) for r in rates]  # share 0.1 at 10 req/s
    fit = fit_shares(rates, true, [1e-4] * 4, [500] * 4, 0.1, 0.95)
    assert fit is not None and fit.boundary is not None and fit.lo is not None and fit.hi is not None
    assert abs(fit.boundary / 10.0 - 1) < 1e-3 and fit.lo < 10.0 < fit.hi and fit.adjusted


def test_fit_shares_interval_allows_a_shift_common_to_all_points() -> None:
    # exact shares with tiny variances: the points' scatter says nothing, yet every point may share a bias (start-up
    # transient, curvature across the loads tried); the interval keeps +-z SHIFT_SD / slope in log rate
    rates = [9.0, 9.3, 10.7, 11.0]
    true = [1 / (1 + math.exp(-(-2.197 + 20 * math.log(r / 10.0)))) for r in rates]
    fit = fit_shares(rates, true, [1e-8] * 4, [10**6] * 4, 0.1, 0.95)
    assert fit is not None and fit.lo is not None and fit.hi is not None
    half = 1.959964 * SHIFT_SD / 20
    assert math.log(10.0 / fit.lo) > 0.95 * half and math.log(fit.hi / 10.0) > 0.95 * half
    assert math.log(fit.hi / fit.lo) < 2.2 * half
