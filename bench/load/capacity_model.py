"""``bench capacity``'s search against the sim's engine model in virtual time: no HTTP, no sleeping.

:class:`ModelPoints` is a ``run_point`` for :func:`bench.load.capacity.search`: each point's schedule is the one
bench would send (:func:`bench.load.point.make_plan`: the same arrival process, seed and sizes), its timing is the
sim's scheduler replayed exactly (:func:`bench.sim.truth.simulate_load`: FIFO admission, prefill, batch steps of
t(b)), and its summary comes from the same functions as a live point's (window, exceedance shares, steadiness
test). What it leaves out: HTTP and client overhead (``client_ms`` adds a constant to TTFT and E2E)
and bench's own send lag. ``clock`` is the virtual time the points would have taken (their spans, the drain of
the last requests and ``overhead_s`` per point). Used by the tests and by benchmarks/capacity_coverage.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.config.load import LoadSettings
from bench.load.capacity_points import point_settings
from bench.load.control import PointRequests, Process
from bench.load.estimate import rise_test, slo_model
from bench.load.openloop import TREND_MIN_MS
from bench.load.point import SLO_RISE_SHARE, default_window, make_plan
from bench.measure.slo import SLO
from bench.sim.config import SimConfig
from bench.sim.truth import simulate_load

__all__ = ["ModelPoints"]



@dataclass(slots=True)
class _Span:
    span_s: float


class ModelPoints:
    """``await points(load, trial, duration_s=None)`` -> a point summary (the keys the search reads)."""

    def __init__(self, cfg: SimConfig, ls: LoadSettings, slo: SLO, *, max_tokens: int = 16,
                 overhead_s: float = 0.5, client_ms: float = 0.0) -> None:
        self.cfg, self.ls, self.slo, self.max_tokens = cfg, ls, slo, max_tokens
        self.overhead_s, self.client_ms = overhead_s, client_ms
        self.now_s = 0.0
        self.count = 0

    def clock(self) -> float:
        return self.now_s

    async def __call__(self, load: float, trial: int, duration_s: float | None = None,
                       refine_s: float | None = None) -> dict[str, Any]:
        self.count += 1
        pls = point_settings(self.ls, load, "rate", self.ls.seed + 1000 * trial + self.count, duration_s, refine_s)
        return self.point(pls)

    def point(self, pls: LoadSettings) -> dict[str, Any]:
        plan = make_plan(pls, self.max_tokens)
        at = np.array([p.at_s for p in plan])
        prompt, out = plan[0].input_tokens, plan[0].output_tokens
        if any(p.input_tokens != prompt or p.output_tokens != out for p in plan):
            raise ValueError("the engine model needs fixed --input-tokens and output tokens")
        arr = [round(x * 1e9) for x in at]
        sim = simulate_load(self.cfg, arr, prompt, out)
        first = np.array(sim["first_ns"], dtype=float)
        last = np.array(sim["last_ns"], dtype=float)
        a = np.array(arr, dtype=float)
        values = {"ttft": (first - a) / 1e6 + self.client_ms, "e2e": (last - a) / 1e6 + self.client_ms,
                  "tpot": (last - first) / 1e6 / (out - 1) if out > 1 else np.full(a.size, np.nan)}
        span = float(at[-1]) if at.size else 0.0
        self.now_s += span + max(0.0, (float(last.max()) - float(a[-1])) / 1e9) + self.overhead_s
        lo, hi = default_window(_Span(span), pls)
        obj = [o for o in self.slo.objectives if o.metric in values]
        if len(obj) != len(self.slo.objectives):
            raise ValueError("the engine model scores ttft, tpot and e2e objectives only")
        sel = (at >= lo) & (at <= hi)
        s = self._summary(pls, at, sel, values, last, lo, hi, span)
        proc = Process(pls.arrival, pls.rate or 0.0, pls.duration_s, pls.requests, pls.burstiness, pls.ramp_s)
        e2e = values["e2e"][sel]
        s["requests"] = PointRequests(at, lo, hi, at[sel], {o.key: values[o.metric][sel] for o in obj},
                                      {o.key: o.limit_ms for o in obj}, float(np.median(e2e)) / 1e3 if e2e.size
                                      else 0.0, proc, pls.seed)
        return s

    def _summary(self, pls: LoadSettings, at: np.ndarray, sel: np.ndarray, values: dict[str, np.ndarray],
                 last: np.ndarray, lo: float, hi: float, span: float) -> dict[str, Any]:
        width = hi - lo
        n = int(sel.sum())
        per, model_in = {}, {}
        for o in self.slo.objectives:
            v = values[o.metric][sel]
            v = v[~np.isnan(v)]
            stat = float(np.max(v)) if o.q >= 100 else float(np.percentile(v, o.q)) if v.size else None
            per[o.key] = {"value": None if stat is None else round(stat, 3), "limit_ms": o.limit_ms,
                          "held": stat is not None and stat <= o.limit_ms}
            model_in[o.key] = (values[o.metric][sel], o.limit_ms, o.q)
        # in flight at each arrival: arrived so far minus finished by then
        ends = np.sort(last)
        inflight = np.arange(1, at.size + 1) - np.searchsorted(ends, at * 1e9, side="right")
        tt = rise_test(at[sel], values["ttft"][sel])
        limits = [o.limit_ms for o in self.slo.objectives if o.metric == "ttft"]
        tt["rising"] = tt["rising"] and (tt["rise"] or 0) > max(TREND_MIN_MS, SLO_RISE_SHARE * min(limits, default=0))
        it = rise_test(at[sel], inflight[sel].astype(float))
        it["rising"] = it["rising"] and (it["rise"] or 0) >= 2
        steady = not (tt["rising"] and it["rising"])
        met = all(v["held"] for v in per.values()) and steady and n > 0
        return {"id": f"rate-{pls.rate:g}", "slo_met": met, "steady": steady,
                "throughput": {"completed_rps": round(n / width, 4) if width > 0 else None,
                               "finished_in_window_rps": round(float(((last >= lo * 1e9) & (last <= hi * 1e9)).sum())
                                                               / width, 4) if width > 0 else None},
                "window": {"from_s": round(lo, 3), "to_s": round(hi, 3), "requests": n,
                           "rate": round(n / width, 4) if width > 0 else None},
                "schedule": {"span_s": round(span, 3), "planned_requests": int(at.size),
                             "achieved_rps": round((at.size - 1) / span, 4) if span > 0 else None},
                "slo": per, "slo_model": slo_model(model_in), "trend": {"ttft_from_schedule_ms": tt, "in_flight": it},
                "goodput": None}
