"""The points of ``bench capacity``'s search (:mod:`bench.load.capacity`): one measured point (:class:`Point`),
the saturation judgement (:func:`saturated`, :func:`resaturate`), a point's entry in capacity.json
(:func:`point_entry`; docs/results.md, "capacity.json"), a point's load settings (:func:`point_settings`) and the
default time budget of a rate search (:func:`default_time_budget`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Point", "saturated", "resaturate", "point_entry", "FLAT_SHARE", "confidence", "point_settings",
           "REFINE_WARMUP_SHARE", "REFINE_COOLDOWN_S", "default_time_budget", "RATE_TIME_BUDGET_S",
           "BURSTY_BUDGET_CAP"]

REFINE_WARMUP_SHARE = 0.25
REFINE_COOLDOWN_S = 0.0  # a refine point's window runs to its schedule's end (the drain finishes its requests)
RATE_TIME_BUDGET_S = 170.0  # --by rate, Poisson or smoother arrivals (docs/load.md, "Capacity")
BURSTY_BUDGET_CAP = 4.0  # burstier gamma arrivals: at most this many times RATE_TIME_BUDGET_S


def default_time_budget(by: str, arrival: str, burstiness: float) -> float | None:
    """``--time-budget`` when none is given: none for ``--by concurrency``; for ``--by rate``, ``RATE_TIME_BUDGET_S``
    divided by the square of the gamma burstiness when that is under 1 (at most ``BURSTY_BUDGET_CAP`` times it). A
    point's count of arrivals varies about ``1 / burstiness`` times as much as under Poisson arrivals, and the share
    over the limit rises more slowly with the load (on the sim, B-ttft: 3.5 in probit per log rate at burstiness
    0.5, 5-10 under Poisson arrivals): at 2 x 170 s B-ttft-gamma0.5's interval was 10.5 % wide, at 4 x 170 s 7.4 %
    (benchmarks/results/capacity_coverage-2026-12-06b-vm.md)."""
    if by != "rate":
        return None
    if arrival == "gamma" and 0 < burstiness < 1:
        return RATE_TIME_BUDGET_S * min(1.0 / burstiness ** 2, BURSTY_BUDGET_CAP)
    return RATE_TIME_BUDGET_S


@dataclass(slots=True)
class Point:
    """One measured point of the search (its summary is the cell dict of :mod:`bench.load.point`)."""

    load: float
    trial: int
    summary: dict[str, Any]
    phase: str = "point"

    @property
    def slo_met(self) -> bool:
        return bool(self.summary.get("slo_met"))

    @property
    def completed_rps(self) -> float:
        """Throughput over the window: requests that ended in it per s (the window's requests per s when the
        summary has no ``finished_in_window_rps``)."""
        t = self.summary["throughput"]
        v = t.get("finished_in_window_rps")
        return float((v if v is not None else t["completed_rps"]) or 0.0)

    @property
    def steady(self) -> bool:
        return bool(self.summary.get("steady", True))

    @property
    def rate(self) -> float:
        """The realized arrival rate of the point's window (the load asked when the summary has none)."""
        return float((self.summary.get("window") or {}).get("rate") or self.load)


def resaturate(points: list[Point], by: str) -> float | None:
    """The saturation flags again (:func:`saturated`), once every point ran (during the search only the points
    before it were known).
    Returns the lowest saturated load."""
    for p in points:
        p.summary["saturated"] = saturated(p, points, by)
    return min((p.load for p in points if p.summary["saturated"]), default=None)


FLAT_SHARE = 0.25  # --by concurrency: at most this share of the added streams turned into throughput


def _e2e_median(p: Point) -> float | None:
    v = ((p.summary.get("latency") or {}).get("e2e_ms") or {}).get("from_send") or {}
    return v.get("median")


def saturated(p: Point, points: list[Point], by: str) -> bool:
    """``--by rate``: not steady, and completed no more than 2 % above the best completed throughput of any lower
    load, each counted at most at its own load (a 4-s probe at 8 req/s finished 9.6 req/s in its 1.5-s window
    and, so counted, made the probe at 16 "saturated": the search stayed under 16 with a boundary of 22).
    ``--by concurrency`` (the closed loop caps what is in flight, so the steadiness test cannot fire): against
    the lower load ``q`` of the best completed throughput, ``N / N_q - 1 = g`` more streams gave at most
    ``FLAT_SHARE * g`` more throughput (it flattened) and each stream's median E2E grew by at least ``g / 2`` (the
    added streams queue: Little's law; skipped where the summaries carry no latency)."""
    below = [q for q in points if q.load < p.load]
    if not below:
        return False
    if by == "rate":  # a lower load's throughput counts no higher than its own load (a probe's short window can)
        best = max(min(x.completed_rps, x.load) for x in below)
        return not p.steady and p.completed_rps <= 1.02 * best
    q = max(below, key=lambda x: x.completed_rps)
    g = p.load / q.load - 1
    flat = p.completed_rps <= q.completed_rps * (1 + FLAT_SHARE * g)
    rp, rq = _e2e_median(p), _e2e_median(q)
    return flat and (rp is None or rq is None or rp >= rq * (1 + g / 2))


def point_entry(p: Point) -> dict[str, Any]:
    s = p.summary
    lat = s.get("latency", {})
    ttft = lat.get("ttft_ms", {}).get("from_schedule", {})
    return {
        "load": p.load, "trial": p.trial, "phase": p.phase, "id": s.get("id"), "slo_met": p.slo_met,
        "steady": p.steady, "rate": (s.get("window") or {}).get("rate"), "slo_model": s.get("slo_model"),
        "saturated": bool(s.get("saturated")), "goodput": s.get("goodput"), "slo": s.get("slo"),
        "achieved_rps": s.get("schedule", {}).get("achieved_rps"), "completed_rps": p.completed_rps,
        "ttft_p90_ms": ttft.get("p90"), "tpot_p50_ms": (s.get("tpot_ms") or {}).get("median"),
        "per_user_tok_s": (s.get("decode_tok_s") or {}).get("median"),
        "aggregate_tok_s": s.get("throughput", {}).get("output_tok_s"),
        "send_lag_p99_ms": s.get("schedule", {}).get("send_lag_ms", {}).get("p99"),
        "dir": s.get("dir"),
    }


def confidence(trials: int, trials_hi: int | None = None) -> float:
    """Sign-test level of a bracket with ``trials`` agreeing trials at its low end and ``trials_hi`` (default the
    same) at its high end: 1 - 2^-k_lo - 2^-k_hi, >= 0."""
    k_hi = trials if trials_hi is None else trials_hi
    return max(0.0, 1.0 - 2.0 ** -trials - 2.0 ** -k_hi)


def point_settings(ls: Any, load: float, by: str, seed: int, duration_s: float | None,
                   refine_s: float | None = None) -> Any:
    """The :class:`bench.load.point.LoadSettings` of one search point: a probe (``duration_s`` given) offers
    exactly its load (``exact_count``: as many arrivals as load x duration, half of them in its second half) and
    is judged on the second half of its planned duration; a refine point keeps ``--warmup`` or leaves out its first
    ``REFINE_WARMUP_SHARE``, and keeps ``--cooldown`` or leaves out its last ``REFINE_COOLDOWN_S``."""
    from dataclasses import replace

    pls = ls.at(load, by=by, seed=seed)
    if duration_s is not None:
        return replace(pls, duration_s=duration_s, requests=None, warmup_s=duration_s / 2, cooldown_s=0.0,
                       exact_count=True)
    if pls.warmup_s is None and pls.duration_s is not None and by == "rate":
        pls = replace(pls, warmup_s=REFINE_WARMUP_SHARE * pls.duration_s)
    if pls.cooldown_s is None and by == "rate":
        pls = replace(pls, cooldown_s=REFINE_COOLDOWN_S)
    if refine_s is not None and pls.duration_s is not None:
        if refine_s < pls.duration_s and pls.warmup_s is not None:  # a shortened point keeps its window's share
            pls = replace(pls, warmup_s=min(pls.warmup_s, REFINE_WARMUP_SHARE * refine_s))
        pls = replace(pls, duration_s=refine_s)
    return pls
