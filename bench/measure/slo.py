"""Service-level objectives, per-request attainment and goodput (pure; docs/load.md defines each figure).

An SLO string is a list of objectives joined by ``,`` or ``and``:

* percentile form ``ttft_p90=2s``, ``tpot_p90=60ms``, ``e2e_p99=30s``, ``itl_max=200ms``: metric ``ttft``, ``tpot``,
  ``itl`` or ``e2e``; statistic ``p50``..``p99`` (any whole percentile 1-99, also ``p99.9``) or ``max``; value with
  unit ``ms`` or ``s``;
* per-request form ``ttft_ms <= 2000``, ``tpot_ms <= 60``, ``e2e_s <= 30`` (or ``ttft <= 2s``): the bound every
  request must meet; it is the objective ``<metric>_max``.

Per request, an objective's threshold is met when the request succeeded and its value is <= the threshold (ttft,
tpot, e2e: the request's own value; itl: the request's own percentile of its gaps, its largest gap for ``max``).
A request "meets the SLO" when it meets every objective's threshold. Per point (and per concurrency cell, whose
window is its measured waves: :func:`waves_wall_s`):

* ``goodput``: ``{"rps", "tok_s", "met_fraction"}``: requests/s and output tokens/s of the requests that met the SLO,
  over the point's window, and their share of all the window's requests (failed and cut ones count, as misses):
  DistServe's goodput (Zhong et al., "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large
  Language Model Serving", OSDI 2024: the rate of requests that meet their TTFT and TPOT SLOs);
* ``slo``: per objective ``{"value", "held"}``: the statistic over the window's requests (failed or cut requests
  count as infinitely late, so they can break a percentile; value null with no request, or when a failed request is
  the statistic) and whether it is <= its threshold (``limit_ms`` beside).

Latencies: in open-loop modes ``ttft`` and ``e2e`` count from the request's *scheduled* time (the wait the user had:
coordinated-omission aware); ``tpot`` and ``itl`` do not depend on the start. In concurrency mode (no
``scheduled_ns``) they count from the send.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.config.slo import METRICS, SLO, Objective, parse_slo
from bench.measure.metrics import RequestMetrics, request_metrics
from bench.records import RequestRecord

__all__ = ["Objective", "SLO", "parse_slo", "request_values", "meets", "point_slo", "waves_wall_s", "METRICS"]

def _lag_ms(rec: RequestRecord) -> float:
    sched = getattr(rec, "scheduled_ns", None)
    if sched is None or not rec.sent_ns:
        return 0.0
    return float(rec.sent_ns - sched) / 1e6


def request_values(rec: RequestRecord, m: RequestMetrics, obj: Objective) -> float | None:
    """The request's own value for ``obj`` (ms); None when not defined (tpot/itl of a one-token answer)."""
    if obj.metric == "ttft":
        return None if m.ttft_ms is None else m.ttft_ms + _lag_ms(rec)
    if obj.metric == "e2e":
        return None if m.e2e_ms is None else m.e2e_ms + _lag_ms(rec)
    if obj.metric == "tpot":
        return m.tpot_ms
    if not m.itl_ms:
        return None
    return float(np.percentile(np.asarray(m.itl_ms), obj.q)) if obj.stat != "max" else max(m.itl_ms)


def meets(rec: RequestRecord, m: RequestMetrics, slo: SLO) -> bool:
    """The request succeeded and met every objective's threshold (an undefined tpot/itl is no miss)."""
    if not m.ok:
        return False
    for o in slo.objectives:
        v = request_values(rec, m, o)
        if o.metric in ("ttft", "e2e") and v is None:
            return False
        if v is not None and v > o.limit_ms:
            return False
    return True


def _stat(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = np.asarray(values, dtype=float)
    if q >= 100:
        return float(xs.max())
    if np.isinf(xs).any():  # linear interpolation is undefined next to inf: nearest rank above
        xs.sort()
        return float(xs[min(len(xs) - 1, max(0, math.ceil(q / 100.0 * len(xs)) - 1))])
    return float(np.percentile(xs, q))


def _objective_value(o: Objective, recs: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> float | None:
    vals: list[float] = []
    for r, m in zip(recs, ms):
        if not m.ok:
            vals.append(math.inf)
        elif o.metric == "itl":
            vals.extend(m.itl_ms)
        else:
            v = request_values(r, m, o)
            if v is not None:
                vals.append(v)
            elif o.metric in ("ttft", "e2e"):
                vals.append(math.inf)
    return _stat(vals, o.q)


def point_slo(records: Sequence[RequestRecord], slo: SLO, window_s: float,
              metrics: Sequence[RequestMetrics] | None = None) -> dict[str, Any]:
    """``{"goodput": {"rps", "tok_s", "met_fraction"}, "slo": {key: {"value", "held"}}}`` of a point's window.

    ``records``: the requests of the window (every one: finished, failed, cut). ``window_s``: its length.
    ``metrics``: their ``request_metrics``, in order, when the caller has them (computed here otherwise)."""
    ms = list(metrics) if metrics is not None else [request_metrics(r) for r in records]
    met = [meets(r, m, slo) for r, m in zip(records, ms)]
    n_met = sum(met)
    toks = sum(m.output_tokens for m, ok in zip(ms, met) if ok)
    good = {
        "rps": round(n_met / window_s, 4) if window_s > 0 else None,
        "tok_s": round(toks / window_s, 3) if window_s > 0 else None,
        "met_fraction": round(n_met / len(records), 6) if records else None,
    }
    per: dict[str, Any] = {}
    for o in slo.objectives:
        v = _objective_value(o, records, ms)
        per[o.key] = {"value": None if v is None or math.isinf(v) else round(v, 3),
                      "limit_ms": o.limit_ms, "held": v is not None and v <= o.limit_ms}
    return {"goodput": good, "slo": per}


def waves_wall_s(records: Sequence[RequestRecord], waves: Sequence[Sequence[str]]) -> float:
    """The wall time of a concurrency cell's measured waves, in s: per wave, from its first send to the end of its
    last response (``sent_ns + end_ns``, failed requests included, on one clock), summed over the waves. The time
    between waves (building the next wave's prompts, the collector) is no part of it. ``waves``: request ids per
    wave; ids without a record, and records never sent, are skipped."""
    by_id = {r.request_id: r for r in records}
    total_ns = 0
    for ids in waves:
        sent = [by_id[i] for i in ids if i in by_id and by_id[i].sent_ns]
        if sent:
            total_ns += max(r.sent_ns + (r.end_ns or 0) for r in sent) - min(r.sent_ns for r in sent)
    return total_ns / 1e9
