"""The open-loop executor: send a planned schedule through a :class:`bench.session.endpoint.Session` and measure both the
server and bench's own schedule keeping (docs/load.md).

Each planned request has an offset ``at_s``; the run starts at ``t0`` (``perf_counter_ns``, a short delay after
the prompts are built, so building never overlaps timing) and request k is due at ``scheduled_ns = t0 + at_s``,
kept in its record (same clock as ``queued_ns``/``sent_ns``). The dispatcher sleeps on a timer until 0.1 ms before a
due time (:func:`bench.session.alarm.sleep_until`: the loop reads meanwhile, no core is kept busy), then yields to
the event loop until it passes, so reads keep flowing while it waits; a request whose time has
passed goes at once (never skipped, never bunched up to "catch up" on purpose). ``max_concurrency`` caps requests
in flight: a capped request waits for a slot, and that wait counts in its latency from the schedule.

Every planned request is counted: finished (ok), failed (a record with ``ok=False``), or cut: still in flight
``drain_s`` after the last send, cancelled and recorded with ``error_kind="cancelled"``.

Figures per point (:func:`point_summary`): planned vs achieved send rate, dispatch lag (bench's lateness) and send
lag (``sent_ns - scheduled_ns``, cap waits included) p50/p99/max, latencies from the send and from the schedule
(coordinated omission: a delayed send still made the user wait), the steady-state window (requests scheduled in
``[warmup_s, span - cooldown_s]``: the engine starts empty and drains at the end, so both ends are dropped), and
the trend test for saturation (:func:`trend`).
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.client import RequestSpec, image_rejection
from bench.client.turns import scheduled_task
from bench.errors import ServerError
from bench.measure.metrics import RequestMetrics, request_metrics
from bench.records import CUT_INTERRUPTED, RequestRecord, cut_record
from bench.session.alarm import sleep_until
from bench.session.loop_lag import LagMonitor, workers_lag
from bench.stats import summarize

if TYPE_CHECKING:
    from bench.session.endpoint import Session

__all__ = ["Planned", "PointRun", "run_plan", "run_plan_pool", "point_window", "trend", "lag_summary", "BEHIND_P99_MS",
           "START_DELAY_S"]

START_DELAY_S = 0.2
BEHIND_P99_MS = 10.0
TREND_SIGMAS = 3.0
TREND_MIN_SHARE = 0.10
TREND_MIN_MS = 2.0


@dataclass(slots=True)
class Planned:
    """One request of a schedule: due ``at_s`` after the start; sizes in tokens; ``blocks``: shared prompt blocks
    (trace hash ids); ``text``: a dataset prompt; ``meta``: copied into the record."""

    at_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()
    text: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class PointRun:
    """What one open-loop point produced: every record (plan order), the start, the in-flight samples."""

    records: list[RequestRecord]
    t0_ns: int
    span_s: float
    dispatch_lag_ns: list[int]
    inflight: list[tuple[int, int]]  # (ns, requests in flight) sampled at each dispatch
    cut: int = 0
    lag: dict[str, Any] | None = None  # event-loop lag of the loop(s) that stamped (bench.session.loop_lag; the worst worker's)
    workers: int = 1  # processes or Ray actors that sent the schedule
    lost: int = 0  # of ``cut``: requests cut because their Ray node was lost (in flight or not yet sent)
    metrics: dict[int, RequestMetrics] = field(default_factory=dict, repr=False, compare=False)  # id(record) ->

    def metrics_of(self, recs: Sequence[RequestRecord]) -> list[RequestMetrics]:
        """:func:`bench.measure.metrics.request_metrics` of ``recs`` (records of this run), each worked out once
        per run (a point's summary and its server cross-check both need them)."""
        memo, out = self.metrics, []
        for r in recs:
            m = memo.get(id(r))
            if m is None:
                m = memo[id(r)] = request_metrics(r)
            out.append(m)
        return out


class _Counters:
    __slots__ = ("sent", "done", "ok", "met")

    def __init__(self) -> None:
        self.sent = self.done = self.ok = self.met = 0


async def _dispatch(plan: Sequence[Planned], t0: int, start: Callable[[int, int], None]) -> list[int]:
    """Call ``start(k, scheduled_ns)`` for each request at its due time; returns each one's dispatch lag (ns)."""
    lags = []
    for k, p in enumerate(plan):
        sched = t0 + round(p.at_s * 1e9)
        lags.append(await sleep_until(sched))
        start(k, sched)
    return lags


async def _drain(tasks: list[asyncio.Task[None]], drain_s: float) -> None:
    """Wait up to ``drain_s`` for the requests still in flight, then cancel the rest (they record themselves as
    cut) and wait for them to finish doing so."""
    pending = [t for t in tasks if not t.done()]
    if pending:
        _, still = await asyncio.wait(pending, timeout=drain_s)
        for t in still:
            t.cancel()
        if still:
            await asyncio.wait(still)


async def _cut_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every request still in flight and wait until each has recorded itself as cut."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)


async def _send_all(plan: Sequence[Planned], t0: int, start: Callable[[int, int], None],
                    tasks: dict[int, asyncio.Task[None]], drain_s: float, why: list[str]) -> list[int]:
    """Dispatch the plan and drain it; on an interrupt nothing more is sent and what is in flight is cut (``why``
    says so in each cut record)."""
    try:
        lags = await _dispatch(plan, t0, start)
        await _drain(list(tasks.values()), drain_s)
        return lags
    except asyncio.CancelledError:
        why[0] = CUT_INTERRUPTED
        await _cut_all(list(tasks.values()))
        raise


async def run_plan(session: Session, plan: Sequence[Planned], texts: Sequence[str], *, tag: str,
                   max_concurrency: int | None = None, drain_s: float = 60.0,
                   on_done: Callable[[RequestRecord], None] | None = None,
                   counters: Any = None, closed: bool = False) -> PointRun:
    """Send ``plan`` (prompt ``texts[k]`` for request k) open loop; write each record as it finishes.

    ``counters`` (optional) gets ``sent``/``done``/``ok`` updated live, for a progress display. ``closed``: a
    concurrency point (every request due at once, ``max_concurrency`` in flight): records keep
    ``scheduled_ns = None``, as in concurrency mode."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    records: list[RequestRecord | None] = [None] * len(plan)
    c = counters if counters is not None else _Counters()
    tasks: dict[int, asyncio.Task[None]] = {}
    inflight: list[tuple[int, int]] = []
    cut = [0]
    why = [f"still in flight {drain_s:g} s after the last send (raise --drain to wait longer)"]

    async def one(k: int, sched: int) -> None:
        p = plan[k]
        meta = {**p.meta, "phase": tag, "k": k, "target_tokens": p.input_tokens, "max_tokens": p.output_tokens}
        try:
            if sem is not None:
                async with sem:
                    rec = await _send_one(session, texts[k], p.output_tokens, tag, meta, k)
            else:
                rec = await _send_one(session, texts[k], p.output_tokens, tag, meta, k)
        except asyncio.CancelledError:
            rec = cut_record(f"{session.run_id}-cut-{k:06d}", session.profile.endpoint, session.model, sched,
                             meta, why[0])
            cut[0] += 1
        rec.scheduled_ns = None if closed else sched
        records[k] = rec
        session.write(rec)
        c.done += 1
        c.ok += rec.ok
        if on_done is not None:
            on_done(rec)

    def start(k: int, sched: int) -> None:
        c.sent += 1
        inflight.append((sched, c.sent - c.done))
        tasks[k] = scheduled_task(one(k, sched)) if not closed else asyncio.create_task(one(k, sched))

    t0 = time.perf_counter_ns() + round(START_DELAY_S * 1e9)
    gc_was_on = gc.isenabled()
    gc.disable()  # no collector pause while streams are read (see runner._wave)
    mon = LagMonitor()
    mon.start()
    try:
        lags = await _send_all(plan, t0, start, tasks, drain_s, why)
    finally:
        lag = mon.stop()
        if gc_was_on:
            gc.enable()
            gc.collect()
    done = [r for r in records if r is not None]
    _refuse_rejected_images(done)
    span = max((p.at_s for p in plan), default=0.0)
    return PointRun(done, t0, span, lags, inflight, cut[0], lag)


async def _send_one(session: Session, text: str, output_tokens: int, tag: str, meta: dict[str, Any],
                    k: int) -> RequestRecord:
    """Request ``k`` of a plan at its due time. Its images are built first (a send lag, not part of TTFT), in a
    thread, off the loop that stamps the other streams' reads; a refusal of them is checked after the point."""
    images = await asyncio.to_thread(session.image_urls, f"{tag}-{k}") if session.profile.images else []
    return await session.send(text, output_tokens, tag, meta, images=images, refuse_images=False)


def _refuse_rejected_images(records: Sequence[RequestRecord]) -> None:
    """Stop after a point whose requests' images the server refused (one line naming ``--images``)."""
    line = next((x for x in map(image_rejection, records) if x is not None), None)
    if line is not None:
        raise ServerError(line)


def _inflight(records: Sequence[RequestRecord]) -> list[tuple[int, int]]:
    """Requests in flight at each request's scheduled time, from the records (sent, not yet ended)."""
    starts = sorted(r.sent_ns for r in records if r.sent_ns)
    ends = sorted(r.sent_ns + (r.end_ns or 0) for r in records if r.sent_ns)
    out = []
    for r in sorted(records, key=lambda r: r.scheduled_ns or 0):
        t = r.scheduled_ns or r.sent_ns
        out.append((t, bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t)))
    return out


async def run_plan_pool(session: Session, plan: Sequence[Planned], texts: Sequence[str], *, tag: str) -> PointRun:
    """:func:`run_plan` through the session's pool: worker processes (``--workers N``) or Ray actors (``--ray``).
    The plan is dealt round-robin; each worker keeps its share's schedule (on the shared clock; a Ray actor on its
    host's clock, converted both ways by :mod:`bench.session.ray_actors`). No concurrency cap, no live counters; the
    workers wait for every request, so the only cut requests are those of a lost Ray node (in flight or not yet
    sent: ``worker_lost`` records with their due times, counted in ``cut`` and ``lost``); dispatch lags come back
    in each record's meta, each worker's loop lag with the records (the point's lag: the worst)."""
    specs = []
    for k, (p, text) in enumerate(zip(plan, texts)):
        meta = {**p.meta, "phase": tag, "k": k, "target_tokens": p.input_tokens, "max_tokens": p.output_tokens}
        specs.append(RequestSpec(f"{session.run_id}-{tag}-w{k:06d}", session.profile.endpoint,
                                 session.body(text, p.output_tokens, session.image_urls(f"{tag}-{k}")), meta))
    offsets = [round(p.at_s * 1e9) for p in plan]
    assert session.pool is not None, "run_plan_pool needs the session's pool"
    recs = await session.pool.arun(specs, start_delay_s=START_DELAY_S, offsets=offsets, on_record=session.write)
    _refuse_rejected_images(recs)
    t0 = min((r.scheduled_ns for r in recs if r.scheduled_ns is not None), default=0)
    lags = [int(r.meta.pop("dispatch_lag_ns")) for r in recs if "dispatch_lag_ns" in r.meta]  # lost: never sent
    span = max((p.at_s for p in plan), default=0.0)
    lag = workers_lag(getattr(session.pool, "last_lag_ns", None) or [])
    lost = sum(1 for r in recs if r.error_kind == "worker_lost")
    return PointRun(list(recs), t0, span, lags, _inflight(recs), lost, lag, session.workers, lost)


def point_window(run: PointRun, warmup_s: float, cooldown_s: float) -> tuple[float, float]:
    """The steady-state window ``(from_s, to_s)`` in schedule offsets: drop the first ``warmup_s`` and the last
    ``cooldown_s`` of the schedule's span; a span too short for both keeps its middle half."""
    lo, hi = warmup_s, run.span_s - cooldown_s
    if hi - lo < 0.25 * run.span_s:
        lo, hi = 0.25 * run.span_s, 0.75 * run.span_s
    return lo, hi


def lag_summary(ns: Sequence[int]) -> dict[str, float | None]:
    """``{"p50", "p99", "max"}`` of lags in ms."""
    if not ns:
        return {"p50": None, "p99": None, "max": None}
    xs = np.asarray(ns, dtype=float) / 1e6
    return {"p50": round(float(np.percentile(xs, 50)), 4), "p99": round(float(np.percentile(xs, 99)), 4),
            "max": round(float(xs.max()), 4)}


def trend(xs_s: Sequence[float], ys: Sequence[float], span_s: float, min_rise: float = 0.0) -> dict[str, Any]:
    """Rise of ``ys`` over a window of ``span_s`` seconds (``xs_s``: sample times from the window's start), robust
    to outliers: the median of the last third of the window minus the median of the first third, times 1.5 (a
    straight line rises 2/3 of its full rise between the two thirds' middles). Its standard error comes from the
    samples' MAD around their thirds' medians (normal approximation of a median's error, 1.2533 sigma / sqrt(n)).
    Returns ``{"rise", "se", "rising"}``: rising when the rise exceeds ``TREND_SIGMAS`` standard errors,
    ``TREND_MIN_SHARE`` of the median, ``TREND_MIN_MS`` and ``min_rise``."""
    t, y = np.asarray(xs_s, dtype=float), np.asarray(ys, dtype=float)
    if t.size < 9 or span_s <= 0:
        return {"rise": None, "se": None, "rising": False}
    third = np.clip((t / span_s * 3).astype(int), 0, 2)
    parts = [y[third == k] for k in range(3)]
    if any(p.size < 3 for p in parts):
        return {"rise": None, "se": None, "rising": False}
    meds = [float(np.median(p)) for p in parts]
    resid = np.concatenate([p - m for p, m in zip(parts, meds)])
    sigma = 1.4826 * float(np.median(np.abs(resid)))
    rise = 1.5 * (meds[2] - meds[0])
    se = 1.5 * 1.2533 * sigma * math.sqrt(1.0 / parts[0].size + 1.0 / parts[2].size)
    med = float(np.median(y))
    rising = (rise > TREND_SIGMAS * se and rise > TREND_MIN_SHARE * abs(med) and rise > TREND_MIN_MS
              and rise > min_rise)
    return {"rise": round(rise, 3), "se": round(se, 3), "rising": bool(rising)}


def latency_summaries(recs: Sequence[RequestRecord], ms: Sequence[Any]) -> dict[str, Any]:
    """TTFT and E2E from the send and from the schedule (ms), successful requests."""
    out: dict[str, Any] = {}
    for name in ("ttft_ms", "e2e_ms"):
        send = [getattr(m, name) for m in ms if m.ok and getattr(m, name) is not None]
        sched = [getattr(m, name) + ((r.sent_ns - r.scheduled_ns) / 1e6 if r.scheduled_ns else 0.0)
                 for r, m in zip(recs, ms) if m.ok and getattr(m, name) is not None]
        out[name] = {"from_send": summarize(send).to_dict(), "from_schedule": summarize(sched).to_dict()}
    return out
