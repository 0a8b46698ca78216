"""bench/load/control.py and estimate.fit_shares: the control-variate shares of ``bench capacity --by rate``."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from bench.load import estimate as E
from bench.load.control import BIN_EDGES_U, QUEUE_SPEEDS, Process, features
from bench.load.estimate import SHIFT_LOG_SD, VAR_FLOOR, fit_shares


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


def _probit_shares(rates: list[float], slope: float = 11.0, at: float = 10.0) -> list[float]:
    """The shares of probit(share) = probit(0.1) + slope log(rate / at): 0.1 at ``at`` req/s."""
    z0 = NormalDist().inv_cdf(0.1)
    return [NormalDist().cdf(z0 + slope * math.log(r / at)) for r in rates]


def test_fit_shares_recovers_a_known_crossing() -> None:
    rates = [9.0, 9.6, 10.4, 11.0]
    fit = fit_shares(rates, _probit_shares(rates), [1e-4] * 4, [500] * 4, 0.1, 0.95)
    assert fit is not None and fit.boundary is not None and fit.lo is not None and fit.hi is not None
    assert abs(fit.boundary / 10.0 - 1) < 1e-3 and fit.lo < 10.0 < fit.hi and fit.adjusted
    assert fit.link == "probit" and fit.to_dict()["link"] == "probit"


def test_fit_shares_interval_allows_a_shift_common_to_all_points() -> None:
    # exact shares with tiny variances: the points' scatter says nothing, yet every point may share a bias (start-up
    # transient, curvature across the loads tried); the interval keeps +-z SHIFT_LOG_SD in log rate, whatever the
    # slope (a shift of the load, not of the probit: a shallow share curve is not given a wider allowance)
    rates = [9.0, 9.3, 10.7, 11.0]
    half = 1.959964 * SHIFT_LOG_SD
    for slope in (20.0, 4.0):
        fit = fit_shares(rates, _probit_shares(rates, slope), [1e-8] * 4, [10**6] * 4, 0.1, 0.95)
        assert fit is not None and fit.lo is not None and fit.hi is not None
        assert fit.b == pytest.approx(slope, rel=1e-3)
        assert math.log(10.0 / fit.lo) > 0.95 * half and math.log(fit.hi / 10.0) > 0.95 * half
        assert math.log(fit.hi / fit.lo) < 2.2 * half


def test_two_points_lean_on_the_slope_prior_not_on_a_low_points_noise() -> None:
    # two points bracketing the truth (10 req/s, slope 11): the upper one right, the lower one read 0.002 with a
    # tiny variance of its own, where the long-run share is 0.03 (a window without a queue episode). Through the
    # two points alone the line would cross 0.1 at 10.2 req/s (2.2 % high); the variance floor at the fitted share
    # and the slope's prior keep the answer near the upper point's own crossing
    rates = [9.2, 10.8]
    up = _probit_shares([10.8])[0]
    fit = fit_shares(rates, [0.002, up], [1e-6, up * (1 - up) * 5 / 800], [600, 800], 0.1, 0.95)
    assert fit is not None and fit.boundary is not None and fit.lo is not None and fit.hi is not None
    assert abs(fit.boundary / 10.0 - 1) < 0.02 and fit.lo < 10.0 < fit.hi
    z = [NormalDist().inv_cdf(0.002), NormalDist().inv_cdf(up)]
    through = math.exp(math.log(9.2) + (NormalDist().inv_cdf(0.1) - z[0]) / (z[1] - z[0]) * math.log(10.8 / 9.2))
    assert through > 10.2  # what the two points alone would say
    assert abs(fit.boundary / 10.0 - 1) < 0.7 * (through / 10.0 - 1)


def test_the_variance_floor_follows_the_fitted_share() -> None:
    # the same four exact points: a floor at the fitted share widens the interval when each point claims less
    # variance than VAR_FLOOR binomial (the floor), and leaves it when the points' own variances are larger
    rates = [9.0, 9.6, 10.4, 11.0]
    true = _probit_shares(rates)
    tight = fit_shares(rates, true, [1e-9] * 4, [500] * 4, 0.1, 0.95)
    floor = [VAR_FLOOR * p * (1 - p) / 500 for p in true]
    at_floor = fit_shares(rates, true, floor, [500] * 4, 0.1, 0.95)
    assert tight is not None and at_floor is not None and tight.lo and tight.hi and at_floor.lo and at_floor.hi
    assert tight.lo == pytest.approx(at_floor.lo, rel=1e-6) and tight.hi == pytest.approx(at_floor.hi, rel=1e-6)
    wide = fit_shares(rates, true, [4 * f for f in floor], [500] * 4, 0.1, 0.95)
    assert wide is not None and wide.lo and wide.hi and wide.hi / wide.lo > at_floor.hi / at_floor.lo


def test_a_share_that_hardly_moves_drops_the_slope_prior() -> None:
    # B-tpot on the sim: the long-run share is 9.5, 10.1 and 10.7 % at -2 %, 0 and +2 % of the boundary (a probit
    # slope near 2). Points that say so clearly are fitted without the prior (which would put the slope near 11
    # and state an interval far too narrow); points that agree with it keep it
    rates = [9.5, 9.8, 10.2, 10.5]
    flat = _probit_shares(rates, slope=2.0)
    fit = fit_shares(rates, flat, [1e-6] * 4, [800] * 4, 0.1, 0.95)
    assert fit is not None and fit.b == pytest.approx(2.0, rel=0.01)
    x, s, v, n = np.log(np.array(rates)), np.array(flat), np.array([1e-6] * 4), np.array([800.0] * 4)
    assert E._probit_fit(x, s, v, n, prior=True)[0][1] > 3.5  # what the prior would have made of it
    steep = _probit_shares(rates, slope=12.0)
    kept = fit_shares(rates[1:3], steep[1:3], [0.02 ** 2] * 2, [800] * 2, 0.1, 0.95)
    alone = E._probit_fit(np.log(np.array(rates[1:3])), np.array(steep[1:3]), np.array([0.02 ** 2] * 2),
                          np.array([800.0] * 2), prior=False)
    assert kept is not None and not E._prior_conflict(*alone)
    assert abs(kept.b - E.SLOPE_PRIOR) < abs(float(alone[0][1]) - E.SLOPE_PRIOR)  # pulled towards the prior
