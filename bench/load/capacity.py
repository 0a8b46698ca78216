"""The capacity search: the highest load (rate, or concurrency) at which the SLOs hold, with an interval.

``--by rate`` (docs/load.md, "Capacity"): the answer is the *steady-state boundary*: the highest offered rate of
the given arrival process and request sizes at which every objective ``METRIC_pQ <= LIMIT`` holds in the long
run, i.e. the long-run share of requests over ``LIMIT`` is at most ``alpha = 1 - Q / 100``.

1. Probe: short points (``probe_s`` at most, about ``probe_requests`` requests) from ``start`` up by ``factor``
   until one misses the SLO or saturates, then geometric bisection while ``hi / lo > 1 + probe_resolution``.
   Probes only bracket; they start from an empty engine and are too short to enter the estimate.
2. Refine (docs/load.md, "How", step 2): points of the full duration, each measured after its start-up
   transient (``--warmup``, default ``REFINE_WARMUP_SHARE`` of it): the first at the highest probe that held;
   while no fit bounds the boundary, the middle of the refine points' bracket (an open side steps out:
   :meth:`_RateSearch._open_step`); then the fitted boundary times ``1 -+ spread`` in turn. Refine loads stay
   below ``(1 + spread)^2`` times the lowest probe that missed (:meth:`_RateSearch._cap`). Constant arrivals:
   shorter refine points (``CONSTANT_REFINE_SHARE`` of the first) bisect the refine bracket, whose interpolated
   crossing is the answer.
3. Fit, per objective over every refine point not saturated (docs/load.md, "How", steps 3-4): each point's share
   over the limit corrected by a control variate from its schedule (:mod:`bench.load.control`), then
   probit(share) linear in log(rate) (:func:`bench.load.estimate.fit_shares`: each point's own variance, floored
   at the fitted share; a prior on the slope); constant arrivals bisect instead, and ITL objectives keep
   :func:`bench.load.estimate.fit_boundary`. The boundary is where the fitted share is ``alpha``; ``interval`` is
   its Fieller interval at ``confidence`` (Bonferroni over objectives; the lowest objective's boundary).
   Refining stops at ``target_width`` after ``min_refine`` refine points, or when the point or time budget runs
   out (the interval earned so far, marked in ``note``; :meth:`_RateSearch._no_level` says when no level is
   stated). A first probe longer than the budget is refused up front (:meth:`SearchSettings.check`).

``--by concurrency``: escalate, bisect and confirm both ends of the bracket with ``trials`` trials (the closed
loop has no schedule: the statistic is per point, pass or fail); ``interval = [lo, hi]`` with ``lo`` the
highest tested load at and below which every trial met the SLO and ``hi`` the lowest at and above which every
trial missed, always computed from the points that ran; ``confidence = 1 - 2^-k_lo - 2^-k_hi`` with ``k`` the
trials run at each end (a sign test that the pass chance crosses 1/2 inside, ignoring that the ends were
chosen by the search: an upper bound on what it claims, stated as such). A time budget cuts a concurrency point
where it ends (its length is not known before it runs).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.errors import ConfigError, PointBudgetSpent, TimeBudgetSpent
from bench.load.capacity_points import FLAT_SHARE, Point, confidence, point_entry, resaturate, saturated
from bench.load.control import PointRequests, adjusted_shares
from bench.load.estimate import SLOPE_PRIOR, SLOPE_PRIOR_SD, Fit, crossing, fit_boundary, fit_shares, round6
from bench.report.tables import curve_rows  # the curve as a table (the terminal and the HTML report)

__all__ = ["SearchSettings", "Point", "search", "confidence", "crossing", "curve_rows", "point_entry", "DEFINITIONS",
           "saturated", "FLAT_SHARE", "probe_length"]

DEFINITIONS = {
    "rate": "steady-state boundary: the highest offered rate (req/s) of the arrival process and sizes asked at "
            "which, for every objective METRIC_pQ <= LIMIT, the long-run share of requests over LIMIT is at most "
            "1 - Q/100",
    "concurrency": "the highest number of requests in flight at which every trial's point statistics met the SLO",
}


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How the search moves (flags of ``bench capacity``)."""

    by: str = "rate"
    start: float = 1.0
    factor: float = 2.0
    max_load: float = 10_000.0
    resolution: float = 0.02
    trials: int = 3
    max_points: int = 40
    max_moves: int = 3
    confidence: float = 0.95
    target_width: float = 0.05
    time_budget_s: float | None = None
    probe_s: float = 4.0
    probe_resolution: float = 0.5
    min_refine: int = 4
    spread: float = 0.06
    refine_s: float | None = None  # a refine point's schedule (--duration): the budget plans the first one with it

    def check(self) -> None:
        """Raise ConfigError naming the flag of the first bad value."""
        if self.by not in ("rate", "concurrency"):
            raise ConfigError(f"--by: {self.by!r} is not rate or concurrency")
        if not self.start > 0 or (self.by == "concurrency" and self.start < 1):
            raise ConfigError(f"--start must be > 0 (>= 1 for concurrency), got {self.start}")
        if not self.factor > 1:
            raise ConfigError(f"--factor must be > 1, got {self.factor}")
        if not 0 < self.resolution < 1:
            raise ConfigError(f"--resolution must be in (0, 1), got {self.resolution}")
        if self.trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {self.trials}")
        if not self.max_load >= self.start:
            raise ConfigError(f"--max-load must be >= --start, got {self.max_load}")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        if not self.target_width > 0:
            raise ConfigError(f"--target-width must be > 0, got {self.target_width}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError(f"--time-budget must be > 0 s, got {self.time_budget_s}")
        self._check_first_probe()

    def _check_first_probe(self) -> None:
        """``--by rate``: the first probe (:func:`probe_length` at ``--start``) must fit ``--time-budget``: it cannot
        be shortened (its judged half needs ``PROBE_REQUESTS`` requests), so a search that could not finish it is
        refused before it starts (``--start 0.01`` planned a 1,000-s probe under ``--time-budget 30``)."""
        budget = self.time_budget_s
        first = probe_length(self, self.start)
        if self.by != "rate" or budget is None or first <= budget:
            return
        if self.probe_s > budget:
            raise ConfigError(f"--time-budget {budget:g} is shorter than the first probe ({first:.0f} s at --start "
                              f"{self.start:g}; a probe lasts at least {self.probe_s:g} s): raise --time-budget to at "
                              f"least {math.ceil(first):d}")
        low = math.ceil(2 * PROBE_REQUESTS / budget * 1000) / 1000
        raise ConfigError(f"--start {self.start:g} needs a first probe of {first:,.0f} s ({PROBE_REQUESTS} requests "
                          f"in its judged second half), more than --time-budget {budget:g}: raise --start to at "
                          f"least {low:g} or --time-budget to at least {math.ceil(first):d}")


def probe_length(ss: SearchSettings, load: float) -> float:
    """A probe's schedule at ``load``: ``probe_s``, or long enough for ``PROBE_REQUESTS`` requests in the second
    half of it (the half that is judged)."""
    return max(ss.probe_s, 2 * PROBE_REQUESTS / load)


RunPoint = Callable[..., Awaitable[dict[str, Any]]]  # run_point(load, trial, duration_s=None) -> summary

PRIOR_SLOPE = 25.0  # logit(share) per log(load), for the next refine load while every refine point is on one side
PROBE_REQUESTS = 5
BUDGET_SLACK_S = 1.0  # a stretched refine point leaves this much of the budget: the clock moves before the check
DRAIN_MARGIN = 1.5  # the budget plans a point's drain as this times the longest seen (a later one can be longer)
REFINE_MIN_S = 15.0  # the shortest refine point a time budget shortens one to (less: the search stops there)
MIN_ADJUSTED = 2  # refine points before a control-variate fit states its level (each point's variance is its own)
MIN_CALIBRATED = 4  # steady refine points before the interval's level is stated (the points' own spread checks it)
CONSTANT_REFINE_SHARE = 0.4  # constant arrivals: refine points after the first last this share of it (bisection)
CONSTANT_REFINE_MIN_S = 20.0  # ... but no less than this (a queue growing slowly above capacity must show)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


class _Search:
    def __init__(self, ss: SearchSettings, run_point: RunPoint, clock: Callable[[], float]) -> None:
        self.ss, self.run_point, self.clock = ss, run_point, clock
        self.points: list[Point] = []
        self.t0 = clock()
        self.overhead_s = 0.0  # DRAIN_MARGIN x the most a point took beyond its schedule (drain, prompts)
        self.cut: tuple[float, int] | None = None  # (load, trial) of a point the time budget cut (concurrency)

    def _norm(self, load: float) -> float:
        return float(max(1, round(load))) if self.ss.by == "concurrency" else float(load)

    def _check_budget(self, duration_s: float | None, load: float) -> None:
        if len(self.points) >= self.ss.max_points:
            raise PointBudgetSpent()
        if self.ss.time_budget_s is None or not self.points:
            return
        span = duration_s if duration_s is not None else self._typical_span()
        if self.clock() - self.t0 + span * (1.0 + self._backlog(load)) + self.overhead_s > self.ss.time_budget_s:
            raise TimeBudgetSpent()

    def _backlog(self, load: float) -> float:
        """Seconds of drain per second of schedule at ``load``: ``load / c - 1`` over the saturated points' highest
        throughput ``c`` (0 without one, or below it); a queue that grows through a point drains after it (H100
        llama-server: a 50-s point at 5.66 req/s, where a probe had finished 4-5, ran the search 10 s over)."""
        sat = [p.completed_rps for p in self.points if p.summary.get("saturated") and p.completed_rps > 0]
        return max(0.0, load / max(sat) - 1.0) if sat and self.ss.by == "rate" else 0.0

    def _typical_span(self) -> float:
        """The refine points' own length (a later one may be stretched); before the first, ``refine_s``."""
        spans = [float((p.summary.get("schedule") or {}).get("span_s") or 0.0) for p in self.points
                 if p.phase != "probe"]
        return min(spans, default=self.ss.refine_s or 0.0)

    async def trial(self, load: float, trial: int = 0, *, duration_s: float | None = None,
                    phase: str = "point", refine_s: float | None = None) -> Point:
        self._check_budget(duration_s if duration_s is not None else refine_s, load)
        began = self.clock()
        kw = {"duration_s": duration_s} if duration_s is not None else {"refine_s": refine_s} if refine_s else {}
        s = await self._measure(load, trial, kw)
        span = float((s.get("schedule") or {}).get("span_s") or 0.0)
        self.overhead_s = max(self.overhead_s, DRAIN_MARGIN * (self.clock() - began - span))
        p = Point(load, trial, s, phase)
        s["saturated"] = saturated(p, self.points, self.ss.by)
        self.points.append(p)
        return p

    async def _measure(self, load: float, trial: int, kw: dict[str, Any]) -> dict[str, Any]:
        """``run_point``; ``--by concurrency`` with a time budget: cut where the budget ends (a closed-loop point's
        length is not known before it runs; cut, it has no statistics): :class:`TimeBudgetSpent`, ``self.cut`` set."""
        if self.ss.by != "concurrency" or self.ss.time_budget_s is None:
            return await self.run_point(load, trial, **kw)
        left = self.ss.time_budget_s - (self.clock() - self.t0)
        try:
            return await asyncio.wait_for(self.run_point(load, trial, **kw), max(left, 0.0))
        except TimeoutError:
            self.cut = (load, trial)
            raise TimeBudgetSpent() from None

    def _stop_note(self, e: Exception) -> str:
        if isinstance(e, TimeBudgetSpent) and self.cut is not None:
            return (f"--time-budget {self.ss.time_budget_s:g} s ran out during the point at {self.cut[0]:g} in flight, "
                    f"after {len(self.points)} finished points: it was cut there (cut_point: its records only; a "
                    "closed-loop point's length is not known before it runs)"
                    + ("; raise --time-budget" if not self.points else
                       ": the interval is what the finished points earned"))
        if isinstance(e, TimeBudgetSpent):
            return (f"stopped by --time-budget {self.ss.time_budget_s:g} s after {len(self.points)} points "
                    f"({self.clock() - self.t0:.0f} s): the interval is what those points earned")
        return f"stopped after --max-points {self.ss.max_points} points: the interval is what those points earned"


class _Bracketing(_Search):
    """Escalate, bisect, confirm (``--by concurrency``; pass or fail per point)."""

    async def escalate(self, duration: Callable[[float], float | None] = lambda x: None,
                       phase: str = "point") -> tuple[float | None, float | None]:
        load = self._norm(self.ss.start)
        lo: float | None = None
        while load <= self.ss.max_load:
            p = await self.trial(load, duration_s=duration(load), phase=phase)
            if not self.passes(p):
                return lo, load
            lo = load
            nxt = self._norm(load * self.ss.factor)
            load = nxt if nxt > load else load + 1
        return lo, None

    async def bisect(self, lo: float, hi: float, resolution: float,
                     duration: Callable[[float], float | None] = lambda x: None,
                     phase: str = "point") -> tuple[float, float]:
        while hi / lo > 1 + resolution:
            mid = self._norm(math.sqrt(lo * hi))
            if mid <= lo or mid >= hi:
                break
            p = await self.trial(mid, duration_s=duration(mid), phase=phase)
            if self.passes(p):
                lo = mid
            else:
                hi = mid
        return lo, hi

    def passes(self, p: Point) -> bool:
        """A point of the bracketing: it met the SLO (for a probe: every objective held; a probe starts from an
        empty engine and is too short for the steadiness test) and, for rates, was not saturated (a concurrency
        point that saturates but meets the SLO passes: ``saturated_at`` reports it)."""
        held = all(v["held"] for v in (p.summary.get("slo") or {}).values()) if p.phase == "probe" else p.slo_met
        return held and not (self.ss.by == "rate" and p.summary.get("saturated"))

    def bracket(self) -> tuple[float | None, float | None]:
        """``lo``: the highest tested load at and below which every trial met the SLO; ``hi``: the lowest tested
        load at and above which every trial missed it (mixed loads lie between)."""
        loads = sorted({p.load for p in self.points})
        res = {x: [p.slo_met for p in self.points if p.load == x] for x in loads}
        lo = hi = None
        for x in loads:
            if not all(res[x]):
                break
            lo = x
        for x in reversed(loads):
            if any(res[x]):
                break
            hi = x
        return lo, hi

    def count(self, x: float | None) -> int:
        return sum(1 for p in self.points if p.load == x)

    async def confirm(self) -> tuple[float | None, float | None]:
        """Bring both ends of the bracket to ``trials`` trials each; an end that turns mixed moves outwards."""
        for _ in range(2 * (self.ss.trials + self.ss.max_moves)):
            lo, hi = self.bracket()
            if lo is None or hi is None:
                return lo, hi
            short = [x for x in (lo, hi) if self.count(x) < self.ss.trials]
            if not short:
                return lo, hi
            await self.trial(short[0], self.count(short[0]))
        return self.bracket()

    async def run(self) -> dict[str, Any]:
        note = ""
        try:
            lo, hi = await self.escalate()
            if lo is not None and hi is not None:
                await self.bisect(lo, hi, self.ss.resolution)
                await self.confirm()
        except (PointBudgetSpent, TimeBudgetSpent) as e:
            note = self._stop_note(e)
        lo, hi = self.bracket()  # always from the points that ran (never the escalation's bracket)
        if lo is None:
            note = note or f"the SLO was missed at the first load ({self.ss.start:g}); lower --start"
        elif hi is None:
            top = max(p.load for p in self.points)
            note = note or f"the SLO held at every load tried (up to {top:g}); raise --max-load"
        boundary = lo
        if lo is not None and hi is not None and self.ss.by == "rate":
            boundary = round(crossing([(p.load, p.slo_met) for p in self.points], lo, hi), 6)
        conf = None if lo is None or hi is None else round(confidence(self.count(lo), self.count(hi)), 4)
        return {"boundary": boundary, "interval": [lo, hi], "safe": lo, "confidence": conf, "note": note or None,
                "method": {**self.method(), "confidence": conf}}

    def method(self, fitted: bool = True) -> dict[str, Any]:
        """capacity.json's ``method``: the name and settings of the search, the trials at the bracket's ends."""
        lo, hi = self.bracket()
        return {"name": "escalate x factor, bisect to resolution, confirm both ends with repeated trials",
                "factor": self.ss.factor, "resolution": self.ss.resolution, "trials": self.ss.trials,
                "trials_at_ends": [self.count(lo), self.count(hi)], "confidence": None}

    def interrupted(self) -> dict[str, Any]:
        """The answer of a search an interrupt stopped: no boundary, interval or level, and
        ``method.finished_bracket``: :meth:`bracket` over the finished points (an end null where they leave it open)."""
        lo, hi = self.bracket() if self.points else (None, None)
        unit = "req/s" if self.ss.by == "rate" else "in flight"
        n = len(self.points)
        if lo is not None and hi is not None:
            said = f"the finished points put the capacity between {lo:g} and {hi:g} {unit}"
        elif lo is not None:
            said = f"the SLO held at every finished point (up to {max(p.load for p in self.points):g} {unit})"
        elif hi is not None:
            said = f"the SLO was missed at every finished point (from {hi:g} {unit})"
        else:
            said = "no point finished"
        note = (f"interrupted after {n} finished point{'s' if n != 1 else ''}: no boundary and no confidence level; "
                f"{said} (method.finished_bracket; run the search again for an answer)")
        return {"method": {**self.method(fitted=False), "finished_bracket": [lo, hi]}, "confidence": None,
                "boundary": None, "interval": None, "safe": None, "note": note}


class _RateSearch(_Bracketing):
    """Probe, refine, fit (``--by rate``: module docstring)."""

    def __init__(self, ss: SearchSettings, run_point: RunPoint, clock: Callable[[], float]) -> None:
        super().__init__(ss, run_point, clock)
        self._cache: dict[tuple[str, tuple[int, ...]], Fit | None] = {}

    def probe_duration(self, load: float) -> float:
        """:func:`probe_length`."""
        return probe_length(self.ss, load)

    def fits(self) -> dict[str, Fit | str | None]:
        """Per objective: its :class:`Fit` over the steady refine points, ``"never over"`` when no request of them
        exceeded its limit, or None when they do not yet allow a fit."""
        pts = [p for p in self.points if p.phase == "refine" and p.summary.get("slo_model")
               and not p.summary.get("saturated")]
        if not pts:
            return {}
        keys = list(pts[0].summary["slo_model"])
        level = 1.0 - (1.0 - self.ss.confidence) / max(1, len(keys))
        out: dict[str, Fit | str | None] = {}
        for key in keys:
            stats = [p.summary["slo_model"][key] for p in pts]
            if sum(s["over"] for s in stats) == 0:
                out[key] = "never over"
                continue
            reqs = [p.summary.get("requests") for p in pts]
            if all(isinstance(r, PointRequests) and key in r.values and r.process.kind != "constant" for r in reqs):
                out[key] = self._adjusted_fit(pts, key, stats[0]["alpha"], level)
            else:
                out[key] = fit_boundary([p.rate for p in pts], stats, stats[0]["alpha"], level)
        return out

    def _adjusted_fit(self, pts: list[Point], key: str, alpha: float, level: float) -> Fit | None:
        """:func:`bench.load.estimate.fit_shares` over the points' control-variate shares (cached per points)."""
        tag = (key, tuple(id(p) for p in pts))
        if tag not in self._cache:
            adj = adjusted_shares([p.summary["requests"] for p in pts], key)
            for p, a in zip(pts, adj):
                p.summary["slo_model"][key]["adjusted"] = {"share": round(a.share, 6), "sd": round(math.sqrt(a.var), 6)}
            self._cache[tag] = fit_shares([p.summary["requests"].process.rate for p in pts], [a.share for a in adj],
                                          [a.var for a in adj], [a.n for a in adj], alpha, level)
        return self._cache[tag]

    def estimate(self) -> tuple[float | None, float | None, float | None]:
        """(boundary, lo, hi) of the lowest objective's fitted crossing; None where not bounded yet."""
        fits = self.fits()
        real = [f for f in fits.values() if isinstance(f, Fit)]
        if not real or any(f is None for f in fits.values()) or any(f.boundary is None for f in real):
            return None, None, None
        b = min(float(f.boundary) for f in real if f.boundary is not None)
        los = [f.lo for f in real]
        his = [f.hi if f.hi is not None else math.inf for f in real]
        lo = None if any(v is None for v in los) else min(v for v in los if v is not None)
        hi = min(his)
        return b, lo, (hi if math.isfinite(hi) else None)

    def refine_bracket(self) -> tuple[float | None, float | None]:
        """The highest refine load below the boundary (every objective's share at most its alpha, steady) that
        lies under the lowest refine load above it, and that lowest one."""
        ref = [p for p in self.points if p.phase == "refine"]
        top = min((p.load for p in ref if self._over(p)), default=None)
        low = max((p.load for p in ref if not self._over(p) and (top is None or p.load < top)), default=None)
        return low, top

    def _over(self, p: Point) -> bool:
        """The point's shares say it is above the boundary (or it was not steady): its control-variate share
        where the last fit gave one (``adjusted``), else its plain share."""
        model = p.summary.get("slo_model") or {}
        shares = [((m.get("adjusted") or {}).get("share", m["share"]), m["alpha"]) for m in model.values()]
        return not p.steady or any(s is not None and s > a for s, a in shares)

    def _next_load(self, side: int) -> float:
        """Around the fitted boundary (``side``: above or below it by ``spread``); with no bounded fit yet, the geometric
        middle of the refine bracket, an open side stepping out by :meth:`_open_step`."""
        b, ilo, ihi = self.estimate()
        step = 1.0 + self.ss.spread
        low, top = self.refine_bracket()
        if self.constant():  # a deterministic response: bisect, an open side closed by the probes' bracket
            plo, phi = self.bracket()
            if low is not None and top is not None:
                return self.interpolate(low, top, 0.2)
            if low is not None and phi is not None and phi > low:
                return math.sqrt(low * phi)
            if top is not None and plo is not None and plo < top:
                return math.sqrt(plo * top)
        if b is not None and ilo is not None and ihi is not None and (top is None or b < top * step):
            return b * step if side > 0 else b / step
        if low is None:
            return self._open_step(min(p.load for p in self.points if p.phase == "refine"), -1)
        if top is None:
            return self._open_step(low, 1)
        return math.sqrt(low * top)

    def _open_step(self, x: float, side: int) -> float:
        """From the refine load ``x`` (every refine point under the limit: ``side`` 1; over: -1) the next load
        (docs/load.md, "How", step 2): ``(1 + spread)^2`` further, or where ``x``'s share puts the crossing along
        ``PRIOR_SLOPE``, but no further than ``1 + spread`` short of the nearest probe beyond ``x`` that missed
        (held); upwards from a point with no request over any limit, that probe's load itself."""
        step = 1.0 + self.ss.spread
        nxt = x * step ** (2 * side)
        crosses = self._prior_crossings(x)
        probes = [q.load for q in self.points if q.phase == "probe" and self.passes(q) == (side < 0)
                  and (q.load - x) * side > 0]
        if not crosses or not probes:
            return nxt
        if side > 0 and self._none_over(x):  # no request over any limit: at the probe that missed (chance?)
            return max(nxt, min(probes))
        if side > 0:
            return max(nxt, min(min(crosses), min(probes) / step))
        return min(nxt, max(min(crosses), max(probes) * step))

    def _refine_at(self, x: float) -> Point:
        return next(q for q in self.points if q.phase == "refine" and q.load == x)

    def _none_over(self, x: float) -> bool:  # no request of the refine point at x went over any limit
        return all(m.get("over") == 0 for m in (self._refine_at(x).summary.get("slo_model") or {}).values())

    def _prior_crossings(self, x: float) -> list[float]:
        """Per objective, where the refine point at ``x``'s share puts alpha's crossing with ``PRIOR_SLOPE``."""
        p = self._refine_at(x)
        crosses = []
        for m in (p.summary.get("slo_model") or {}).values():
            share = (m.get("adjusted") or {}).get("share", m["share"])
            if share is not None and m.get("n"):
                s = min(max(float(share), 0.5 / m["n"]), 1 - 0.5 / m["n"])
                crosses.append(x * math.exp((_logit(m["alpha"]) - _logit(s)) / PRIOR_SLOPE))
        return crosses

    def _toward_refine(self, est: float | None, blo: float | None, bhi: float | None) -> float | None:
        """An answer from the probes' bracket kept on the side of the boundary its refine points found (within
        ``[blo, bhi]``): no higher than the lowest refine load over the limit, no lower than the highest under it."""
        low, top = self.refine_bracket()
        if est is None or blo is None or bhi is None:
            return est
        if top is not None:
            est = min(est, top)
        if low is not None:
            est = max(est, low)
        return min(max(est, blo), bhi)

    def constant(self) -> bool:
        """The points' arrivals are constant (bench's schedule is deterministic)."""
        reqs = [p.summary.get("requests") for p in self.points]
        return bool(reqs) and all(isinstance(r, PointRequests) and r.process.kind == "constant" for r in reqs)

    def interpolate(self, low: float, top: float, margin: float) -> float:
        """Where the share crosses alpha between the refine loads ``low`` (under) and ``top`` (over), linearly in
        share vs log load (a point over only by not being steady counts as its middle), kept ``margin`` of the
        way (in log load) inside the bracket."""
        ref = {p.load: p for p in self.points if p.phase == "refine"}
        t = 0.5
        shares = [(m["share"], m["alpha"]) for m in (ref[low].summary.get("slo_model") or {}).values()]
        tops = [m["share"] for m in (ref[top].summary.get("slo_model") or {}).values()]
        ts = [(a - sl) / (st - sl) for (sl, a), st in zip(shares, tops)
              if sl is not None and st is not None and st > a >= sl]
        if ts and ref[top].steady:
            t = min(ts)
        t = min(1.0 - margin, max(margin, t))
        return math.exp(math.log(low) + t * (math.log(top) - math.log(low)))

    def _refine_length(self, load: float) -> float | None:
        """The next refine point's schedule length (docs/load.md, "How", steps 2 and 5): under constant arrivals
        ``CONSTANT_REFINE_SHARE`` of the first, at least ``CONSTANT_REFINE_MIN_S``; else, with a time budget, the
        budget left less ``BUDGET_SLACK_S`` split evenly over the points of ``--duration`` that fit in it, shortened
        where the load's backlog (:meth:`_backlog`) would drain past the budget."""
        typical = self._typical_span()
        first = next((p for p in self.points if p.phase == "refine"), None)
        if self.constant():  # bisection: the first refine point runs its --duration, never stretched
            if first is None:
                return None
            span = float(first.summary["schedule"]["span_s"])
            return max(CONSTANT_REFINE_SHARE * span, min(span, CONSTANT_REFINE_MIN_S))
        if self.ss.time_budget_s is None or typical <= 0:
            return None
        left = self.ss.time_budget_s - (self.clock() - self.t0) - BUDGET_SLACK_S
        k = math.floor(left / (typical + self.overhead_s))
        most = (left - self.overhead_s) / (1.0 + self._backlog(load))  # not one whole point left: a shorter one
        length = min(max(typical, left / k - self.overhead_s), most) if k >= 1 else most
        return length if length >= REFINE_MIN_S else None

    def _done(self, n: int) -> bool:
        if not any(isinstance(f, Fit) for f in self.fits().values()) or self.bisecting():
            # no fit at all (every share 0 or 1, as under constant arrivals): the refine bracket narrowed instead
            low, top = self.refine_bracket()
            return low is not None and top is not None and top / low - 1 <= self.ss.target_width
        b, ilo, ihi = self.estimate()
        return (b is not None and ilo is not None and ihi is not None and n >= self.ss.min_refine
                and ihi / ilo - 1 <= self.ss.target_width)

    async def refine(self, lo: float, hi: float) -> None:
        # the first refine point at the highest probe that held: a probe starts from an empty engine and is short,
        # so it passes above the steady-state boundary more often than below it
        x, side, n = lo, 1, 0
        while True:
            await self.trial(x, phase="refine", refine_s=self._refine_length(x))
            n += 1
            if self._done(n):
                return
            x = min(self._cap(hi), max(self.ss.start / 4, self._next_load(side)))
            side = -side

    def _cap(self, hi: float) -> float:
        """Refine loads stay below ``(1 + spread)^2`` times the lowest probe that missed (``hi``: a far-off fit would
        otherwise send a point to a load whose drain outlasts any budget), or ``factor`` times the highest refine
        load under the limit where that is at or above ``hi`` (a longer point contradicted the probe's miss)."""
        low, _ = self.refine_bracket()
        cap = low * self.ss.factor if low is not None and low >= hi else hi * (1.0 + self.ss.spread) ** 2
        return min(self.ss.max_load, cap)

    async def run(self) -> dict[str, Any]:
        note = ""
        lo = hi = None
        try:
            lo, hi = await self.escalate(self.probe_duration, "probe")
            if lo is not None and hi is not None:
                lo, hi = await self.bisect(lo, hi, self.ss.probe_resolution, self.probe_duration, "probe")
                await self.refine(lo, hi)
        except (PointBudgetSpent, TimeBudgetSpent) as e:
            note = self._stop_note(e)
        return self.answer(lo, hi, note)

    def bisecting(self) -> bool:
        """Only constant arrivals bisect, answering their refine bracket: under random arrivals a side read from
        a noisy share can put it beside the boundary (docs/load.md: 8 of 20 B-tpot-poisson brackets missed)."""
        return self.constant()

    def outer_range(self, ilo: float | None, ihi: float | None) -> tuple[float | None, float | None]:
        """The fit's bounded ends, an open one replaced by the lowest refine load under the limit (the highest
        over it); with no such refine load, the probes' bracket end where the refine points do not contradict it
        (None where they do: every refine point under the limit, one at or above the probe that missed)."""
        ref = [p for p in self.points if p.phase == "refine"]
        plo, phi = self.bracket()
        low, top = self.refine_bracket()
        lo = ilo if ilo is not None else min((p.load for p in ref if not self._over(p)),
                                             default=plo if plo is not None and (top is None or plo < top) else None)
        hi = ihi if ihi is not None else max((p.load for p in ref if self._over(p)),
                                             default=phi if phi is not None and (low is None or phi > low) else None)
        return (min(lo, hi), max(lo, hi)) if lo is not None and hi is not None else (lo, hi)

    def method(self, fitted: bool = True) -> dict[str, Any]:
        """capacity.json's ``method``: the name and settings of the search, and (``fitted``) the fits per objective
        (None when not fitted: an interrupted search does not fit its finished points)."""
        fits = {k: (f.to_dict() if isinstance(f, Fit) else f) for k, f in self.fits().items()} if fitted else None
        return {"name": "probe (escalate x factor, bisect), refine around the estimate, fit probit(share over the "
                "limit) vs log(rate) across points", "factor": self.ss.factor,
                "probe_resolution": self.ss.probe_resolution, "target_width": self.ss.target_width,
                "spread": self.ss.spread, "refine_points": sum(1 for p in self.points if p.phase == "refine"),
                "fits": fits}

    def _no_level(self, fits: list[Fit]) -> str | None:
        """Why a bounded fit states no level (None: it states one): too few refine points, or all of them on one
        side of the limit (docs/load.md, "How": the paragraph on ``confidence``)."""
        fitted = min(f.points for f in fits)
        if fitted < (MIN_ADJUSTED if all(f.adjusted and f.prior for f in fits) else MIN_CALIBRATED):
            flat = [f for f in fits if f.adjusted and not f.prior]
            why = (f"their shares hardly move with the load (slope {flat[0].b:.1f} in probit per log rate, against "
                   f"the prior's {SLOPE_PRIOR:g} +- {SLOPE_PRIOR_SD:g})" if flat else
                   "their scatter cannot check its spread")
            return (f"the interval comes from {fitted} refine points, fewer than {MIN_CALIBRATED}: {why}, so no "
                    "level is stated (raise --time-budget)")
        low, top = self.refine_bracket()
        if fitted < MIN_CALIBRATED and (low is None or top is None):
            side = "under" if top is None else "over"
            return (f"every refine point was {side} the limit (by its control-variate share where it has one): the "
                    "boundary is extrapolated beyond them along the fitted slope, so no level is stated and the "
                    "interval reaches at least the nearest probe beyond them (raise --time-budget)")
        return None

    def _closed_by_probes(self, low: float | None, top: float | None) -> tuple[float | None, float | None]:
        """``(low, top)`` with an open side closed by the nearest probe beyond that missed (held); else left None."""
        probes = [p for p in self.points if p.phase == "probe"]
        if top is None and low is not None:
            top = min((p.load for p in probes if not self.passes(p) and p.load > low), default=None)
        elif low is None and top is not None:
            low = max((p.load for p in probes if self.passes(p) and p.load < top), default=None)
        return low, top

    def _to_probes(self, ilo: float, ihi: float) -> tuple[float, float]:
        """A no-level fit past refine points all on one side of the limit, widened to the probe beyond them."""
        low, top = self.refine_bracket()
        plo, phi = self._closed_by_probes(low, top)
        return (min(ilo, plo) if low is None and plo is not None else ilo,
                max(ihi, phi) if top is None and phi is not None else ihi)

    def _answer_bracket(self) -> tuple[float | None, float | None, str]:
        """The bracket an answer without a bounding fit states, and what it is: the refine bracket; an open side
        closed by the nearest probe beyond it that missed (held), else left open; no refine point: the probes'."""
        low, top = self.refine_bracket()
        if low is not None and top is not None:
            return low, top, "refine points (" + ("constant arrivals, bisected)" if self.constant() else "no fit)")
        if low is None and top is None:
            return (*self.bracket(), "single probe points")
        low, top = self._closed_by_probes(low, top)
        return low, top, "refine points, closed by the probe points beyond them" + (
            "" if low is not None and top is not None else " (open: no probe beyond them)")

    def answer(self, lo: float | None, hi: float | None, note: str) -> dict[str, Any]:
        b, ilo, ihi = self.estimate()
        doc: dict[str, Any] = {"method": self.method(), "confidence": self.ss.confidence}
        fits = [f for f in self.fits().values() if isinstance(f, Fit)]
        if b is not None and ilo is not None and ihi is not None and not self.bisecting():
            why = self._no_level(fits)
            if why:
                ilo, ihi = self._to_probes(ilo, ihi)
                doc["confidence"] = None
                note = (note + "; " if note else "") + why
            elif note and ihi / ilo - 1 > self.ss.target_width:  # stopped by a budget short of the target width
                note += (f" ({100 * (ihi / ilo - 1):.1f} % wide, over --target-width {self.ss.target_width:g}: a "
                         "longer --time-budget narrows it)")
            doc.update({"boundary": round(b, 6), "interval": [round(ilo, 6), round(ihi, 6)], "safe": round(ilo, 6)})
        elif fits and b is not None and not self.bisecting():
            olo, ohi = self.outer_range(ilo, ihi)
            kept = min(max(b, olo if olo is not None else b), ohi if ohi is not None else b)
            doc.update({"boundary": round(kept, 6), "interval": [round6(olo), round6(ohi)], "safe": round6(olo),
                        "confidence": None})
            note = (note + "; " if note else "") + (
                "the fit does not bound the boundary at this level: the interval is the range of the refine "
                "loads tried (lowest under the limit to highest over it), with no stated confidence" + (
                    "" if self.refine_bracket()[1] is not None else "; no refine point went over the limit: "
                    + ("open above" if ohi is None else "above, the lowest probe that missed")
                    + " (raise --time-budget)"))
        else:
            blo, bhi, kind = self._answer_bracket()
            if lo is None and blo is None:
                note = note or f"the SLO was missed at the first load ({self.ss.start:g}); lower --start"
            elif hi is None and bhi is None:
                top = max(p.load for p in self.points)
                note = note or f"the SLO held at every load tried (up to {top:g}); raise --max-load"
            else:
                note = (note + "; " if note else "") + (f"no fit bounds the boundary: the interval is the bracket "
                                                        f"of {kind}, with no stated confidence")
            mid = math.sqrt(blo * bhi) if blo is not None and bhi is not None else blo
            est = b if b is not None and blo is not None and bhi is not None and blo <= b <= bhi else mid
            est = self._toward_refine(est, blo, bhi)
            if self.constant() and kind.startswith("refine") and blo is not None and bhi is not None:
                est = self.interpolate(blo, bhi, 0.0)
            doc.update({"boundary": round6(est), "interval": [blo, bhi], "safe": blo, "confidence": None})
        doc["note"] = note or None
        return doc


async def search(ss: SearchSettings, run_point: RunPoint, clock: Callable[[], float] = time.monotonic, *,
                 on_interrupt: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
    """Run the search; ``run_point(load, trial[, duration_s=...])`` measures one point and returns its summary
    (``duration_s``: a probe's schedule length; without it the point's own). ``clock``: seconds, for
    ``time_budget_s`` (a virtual clock in simulations). Returns the capacity document (``by``, ``boundary``,
    ``interval``, ``confidence``, ``definition``, ``saturated_at``, ``points``, ``method``, ``note``...).
    Cancelled (an interrupt), it hands ``on_interrupt`` the document of the points finished so far (phases and
    saturation as in a whole search, :meth:`_Bracketing.interrupted`'s answer), then lets the cancellation go on."""
    ss.check()
    s: _Bracketing = _RateSearch(ss, run_point, clock) if ss.by == "rate" else _Bracketing(ss, run_point, clock)
    try:
        doc = await s.run()
    except asyncio.CancelledError:
        if on_interrupt is not None:
            on_interrupt(_document(s, s.interrupted()))
        raise
    return _document(s, doc)


def _document(s: _Bracketing, answer: dict[str, Any]) -> dict[str, Any]:
    """The capacity document of the search ``s`` with its ``answer`` (the saturation flags judged again over every
    point that ran)."""
    return {"by": s.ss.by, "definition": DEFINITIONS[s.ss.by], **answer,
            "saturated_at": resaturate(s.points, s.ss.by), "time_budget_s": s.ss.time_budget_s,
            "elapsed_s": round(s.clock() - s.t0, 3), "points": [point_entry(p) for p in s.points]}
