"""The capacity search: the highest load (rate, or concurrency) at which the SLOs hold, with an interval.

Method (docs/load.md, "Capacity"):

1. Escalate: run a point at ``start``, then ``factor`` times higher, until a point misses the SLO or is saturated
   (its TTFT or requests in flight kept rising over its window while its completed throughput did not grow past
   the best of the lower loads, +2 %): then escalation stops.
2. Bisect (geometric mid-points; whole numbers for concurrency) between the highest passing and the lowest
   failing load until ``hi / lo <= 1 + resolution``.
3. Confirm: the bracket is ``lo`` = the highest tested load at and below which every trial met the SLO and
   ``hi`` = the lowest tested load at and above which every trial missed it; more trials (other seeds) run at
   each end until both have ``trials``; a trial that disagrees makes that end mixed, and the bracket moves to the
   next tested load outside it (which is then confirmed in turn).

A point "meets the SLO" when every objective held in its steady-state window and the window was steady (a load
whose queue grows cannot meet any latency objective for long, however short the point). The result is the
bracket ``interval = [lo, hi]``: every trial at ``lo`` met the SLO and every trial at ``hi`` missed it (loads
with mixed results lie inside). ``boundary`` (``--by rate``; ``lo`` for concurrency) is the load inside the
bracket where the pass fraction crosses 1/2 (:func:`crossing`: isotonic fractions, interpolated in log load; the
bracket's geometric middle when nothing lies between), and ``safe = lo`` the highest load shown to hold in every
trial.

Confidence (binomial): if the chance to pass at ``lo`` were <= 1/2, ``k`` passes in ``k`` independent trials would
have probability <= 2^-k, likewise for failures at ``hi``; so the bracket holds the load where the pass chance
crosses 1/2 with probability >= 1 - 2 * 2^-k (75 % for k = 3, 94 % for k = 5).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.errors import ConfigError, PointBudgetSpent

__all__ = ["SearchSettings", "Point", "search", "confidence", "crossing", "curve_rows", "point_entry"]


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


@dataclass(slots=True)
class Point:
    """One measured point of the search (its summary is the cell dict of :mod:`bench.load.point`)."""

    load: float
    trial: int
    summary: dict[str, Any]

    @property
    def slo_met(self) -> bool:
        return bool(self.summary.get("slo_met"))

    @property
    def completed_rps(self) -> float:
        return float(self.summary["throughput"]["completed_rps"] or 0.0)

    @property
    def steady(self) -> bool:
        return bool(self.summary.get("steady", True))


RunPoint = Callable[[float, int], Awaitable[dict[str, Any]]]


def confidence(trials: int) -> float:
    """Probability that the bracket holds the 50 % pass load (module docstring): 1 - 2 * 2**-trials, >= 0."""
    return max(0.0, 1.0 - 2.0 * 2.0 ** -trials)


class _Search:
    def __init__(self, ss: SearchSettings, run_point: RunPoint) -> None:
        self.ss, self.run_point = ss, run_point
        self.points: list[Point] = []
        self.saturated_at: float | None = None

    def _norm(self, load: float) -> float:
        return float(max(1, round(load))) if self.ss.by == "concurrency" else float(load)

    async def trial(self, load: float, trial: int = 0) -> Point:
        if len(self.points) >= self.ss.max_points:
            raise PointBudgetSpent()
        s = await self.run_point(load, trial)
        p = Point(load, trial, s)
        best_below = max((q.completed_rps for q in self.points if q.load < load), default=0.0)
        sat = not p.steady and p.completed_rps <= 1.02 * best_below
        s["saturated"] = sat
        if sat and (self.saturated_at is None or load < self.saturated_at):
            self.saturated_at = load
        self.points.append(p)
        return p

    async def escalate(self) -> tuple[float | None, float | None]:
        load = self._norm(self.ss.start)
        lo: float | None = None
        while load <= self.ss.max_load:
            p = await self.trial(load)
            if not p.slo_met:
                return lo, load
            lo = load
            nxt = self._norm(load * self.ss.factor)
            load = nxt if nxt > load else load + 1
        return lo, None

    async def bisect(self, lo: float, hi: float) -> tuple[float, float]:
        while hi / lo > 1 + self.ss.resolution:
            mid = self._norm(math.sqrt(lo * hi))
            if mid <= lo or mid >= hi:
                break
            if (await self.trial(mid)).slo_met:
                lo = mid
            else:
                hi = mid
        return lo, hi

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

    async def confirm(self) -> tuple[float | None, float | None]:
        """Bring both ends of the bracket to ``trials`` trials each; an end that turns mixed moves outwards."""
        for _ in range(2 * (self.ss.trials + self.ss.max_moves)):
            lo, hi = self.bracket()
            if lo is None or hi is None:
                return lo, hi
            short = [x for x in (lo, hi) if sum(1 for p in self.points if p.load == x) < self.ss.trials]
            if not short:
                return lo, hi
            x = short[0]
            await self.trial(x, sum(1 for p in self.points if p.load == x))
        return self.bracket()


def crossing(points: list[Point], lo: float, hi: float) -> float:
    """The load where the pass fraction crosses 1/2: pass fractions per tested load in ``[lo, hi]`` made
    non-increasing (pool-adjacent-violators, weighted by trials), then interpolated linearly in log load; the
    geometric middle of ``[lo, hi]`` when no tested load lies between with a fraction of 1/2 or a crossing."""
    loads = sorted({p.load for p in points if lo <= p.load <= hi})
    blocks: list[list[float]] = []  # [passes, trials, first load index, last load index]
    for i, x in enumerate(loads):
        res = [p.slo_met for p in points if p.load == x]
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


async def search(ss: SearchSettings, run_point: RunPoint) -> dict[str, Any]:
    """Run the search; ``run_point(load, trial)`` measures one point and returns its summary. Returns the
    capacity document (``by``, ``boundary``, ``interval``, ``saturated_at``, ``points``, ``method``...)."""
    ss.check()
    s = _Search(ss, run_point)
    lo: float | None = None
    hi: float | None = None
    note = ""
    try:
        lo, hi = await s.escalate()
        if lo is not None and hi is not None:
            await s.bisect(lo, hi)
            lo, hi = await s.confirm()
    except PointBudgetSpent:
        note = f"stopped after --max-points {ss.max_points} points; the interval is what was bracketed by then"
    if lo is None:
        note = note or f"the SLO was missed at the first load ({ss.start:g}); lower --start"
    elif hi is None:
        note = note or f"the SLO held up to --max-load {ss.max_load:g}; raise it"
    boundary = lo
    if lo is not None and hi is not None and ss.by == "rate":
        boundary = round(crossing(s.points, lo, hi), 6)
    return {
        "by": ss.by,
        "boundary": boundary,
        "interval": [lo, hi],
        "safe": lo,
        "saturated_at": s.saturated_at,
        "method": {"name": "escalate x factor, bisect to resolution, confirm both ends with repeated trials",
                   "factor": ss.factor, "resolution": ss.resolution, "trials": ss.trials,
                   "confidence": round(confidence(ss.trials), 4)},
        "note": note or None,
        "points": [point_entry(p) for p in s.points],
    }


def point_entry(p: Point) -> dict[str, Any]:
    s = p.summary
    lat = s.get("latency", {})
    ttft = lat.get("ttft_ms", {}).get("from_schedule", {})
    return {
        "load": p.load, "trial": p.trial, "id": s.get("id"), "slo_met": p.slo_met, "steady": p.steady,
        "saturated": bool(s.get("saturated")), "goodput": s.get("goodput"), "slo": s.get("slo"),
        "achieved_rps": s.get("schedule", {}).get("achieved_rps"), "completed_rps": p.completed_rps,
        "ttft_p90_ms": ttft.get("p90"), "tpot_p50_ms": (s.get("tpot_ms") or {}).get("median"),
        "per_user_tok_s": (s.get("decode_tok_s") or {}).get("median"),
        "aggregate_tok_s": s.get("throughput", {}).get("output_tok_s"),
        "send_lag_p99_ms": s.get("schedule", {}).get("send_lag_ms", {}).get("p99"),
        "dir": s.get("dir"),
    }


def curve_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The curve as a table (sorted by load): throughput vs latency, per-user vs aggregate tok/s."""
    head = ["load", "trial", "achieved/s", "done/s", "TTFT p90 ms", "TPOT p50 ms", "user tok/s", "total tok/s",
            "goodput/s", "SLO", "steady"]

    def f(v: Any, d: int = 1) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    rows = []
    for p in sorted(doc["points"], key=lambda x: (x["load"], x["trial"])):
        g = p.get("goodput") or {}
        rows.append([f"{p['load']:g}", str(p["trial"]), f(p["achieved_rps"], 2), f(p["completed_rps"], 2),
                     f(p["ttft_p90_ms"]), f(p["tpot_p50_ms"], 2), f(p["per_user_tok_s"]), f(p["aggregate_tok_s"]),
                     f(g.get("rps"), 2), "met" if p["slo_met"] else "missed", "yes" if p["steady"] else "no"])
    return head, rows
