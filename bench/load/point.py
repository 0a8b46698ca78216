"""One open-loop point, end to end: settings -> plan -> prompts -> :func:`~bench.load.openloop.run_plan` ->
the point's summary (a results cell); :func:`measure_load` is the point of ``bench run --rate/--trace/--sessions``
(driven by :func:`bench.driver.run_load`).

The summary of a point is the cell dict of :func:`bench.measure.summary.summarize_cell` over the steady-state window's
requests, plus the open-loop keys documented in docs/load.md: ``load``, ``schedule`` (planned vs achieved,
dispatch and send lag), ``counts`` (finished / failed / cut), ``window``, ``throughput``, ``latency`` (from send
and from schedule), ``trend`` / ``steady``, and with an SLO ``goodput``, ``slo`` and ``slo_met``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.config.load import MODES, LoadSettings
from bench.config.profile import Cell
from bench.config.sizes import dataset_order, load_dataset
from bench.errors import ConfigError, ServerError
from bench.load.arrivals import arrival_times, rng_for
from bench.load.control import PointRequests, Process
from bench.load.estimate import rise_test, slo_model
from bench.load.openloop import (
    BEHIND_P99_MS,
    TREND_MIN_MS,
    Planned,
    PointRun,
    lag_summary,
    latency_summaries,
    point_window,
    run_plan,
    run_plan_pool,
)
from bench.load.traces import load_trace
from bench.measure.metrics import request_metrics
from bench.measure.slo import SLO, point_slo, request_values
from bench.measure.summary import summarize_cell
from bench.prompts import build_prompt, unique_prefix
from bench.prompts.build import PREFIX_SHARED_TOKENS_MAX
from bench.report.tables import num
from bench.results import cell_from_dict
from bench.server.metrics import counters_beside
from bench.server.tokenizer import TokenizerError
from bench.session.loop_lag import LagMonitor, lag_warning, stamp_context
from bench.stats import summarize
from bench.warns import in_cell, warning

if TYPE_CHECKING:
    from bench.session.endpoint import Session

__all__ = ["LoadSettings", "make_plan", "build_texts", "point_summary", "run_point", "measure_load",
           "interrupted_point", "plan_depth", "MODES"]

def make_plan(ls: LoadSettings, default_max_tokens: int) -> list[Planned]:
    """The schedule with sizes (pure; seeded by ``ls.seed``)."""
    ls.check()
    if ls.mode == "trace":
        assert ls.trace is not None
        plan = load_trace(ls.trace, block_tokens=ls.block_tokens, speed=ls.speed)
        for p in plan:
            p.meta["block_tokens"] = ls.block_tokens
        return plan
    if ls.rate is None:
        raise ConfigError("--rate R is needed in rate mode (requests/s)")
    times = arrival_times(ls.arrival, ls.rate, duration_s=ls.duration_s, requests=ls.requests,
                          burstiness=ls.burstiness, ramp_s=ls.ramp_s, seed=ls.seed, exact_count=ls.exact_count)
    n = len(times)
    assert ls.input_sizes is not None  # parsed when the settings were made
    ins = ls.input_sizes.draw(rng_for(ls.seed, "input"), n)
    outs = (ls.output_sizes.draw(rng_for(ls.seed, "output"), n)
            if ls.output_sizes is not None else np.full(n, default_max_tokens))
    plan = [Planned(float(t), int(i), int(o)) for t, i, o in zip(times, ins, outs)]
    if ls.dataset:
        data = load_dataset(ls.dataset)
        for p, j in zip(plan, dataset_order(len(data), n, rng_for(ls.seed, "dataset"))):
            p.text = data[j].text
            p.output_tokens = data[j].output_tokens or p.output_tokens
            p.meta["dataset_line"] = j + 1
    return plan


FILLER = " the"
EXACT_TRIES = 4


async def _sized(session: Session, kind: str, n: int, seed: int, prefix: str, instruction: bool,
                 overhead: int | None = None) -> str:
    """A prompt of ``n`` tokens (``overhead``: template tokens to leave out, default the session's). The builder
    lands within its tolerance; with an exact tokenizer, words are then added or dropped at the end until the
    count is exact (a few counts, once per distinct size or block), so shared blocks align token for token."""
    ov = session.template_overhead_tokens if overhead is None else overhead
    tok = session.tokenizer
    try:
        pr = await build_prompt(kind, n, seed=seed, prefix=prefix, instruction=instruction, tokenizer=tok,
                                overhead_tokens=ov)
        text, want = pr.text, n - ov
        if tok is None or not getattr(tok, "exact", True) or pr.counted_tokens is None:
            return text
        have = pr.counted_tokens
        for _ in range(EXACT_TRIES):
            if have == want:
                break
            if have < want:
                text += FILLER * (want - have)
            else:
                text = text.rsplit(None, have - want)[0] if text.split() else text
            have = await tok.count(text)
        return text
    except TokenizerError as e:
        raise ServerError(f"building a {n}-token prompt: {e}") from None


async def build_texts(session: Session, plan: list[Planned], kind: str, first_index: int) -> list[str]:
    """Prompt text of each planned request, built before the point starts.

    Plain requests: one exact-length prompt per distinct size, each request with its own unique prefix swapped in
    (``unique_prefix(run_id, first_index + k)``: equal length in characters, and in tokens on word tokenizers).
    Blocks (traces): block ``h`` of n tokens is the prose stream seeded ``h`` behind a run-wide tag, the same text
    in every request that has it; the request's tail past its blocks is unique. Dataset prompts: prefix + text."""
    sized: dict[int, tuple[str, str]] = {}
    blocks: dict[tuple[int, int], str] = {}
    out = []
    for k, p in enumerate(plan):
        prefix = unique_prefix(session.run_id, first_index + k)
        if p.text is not None:
            out.append(prefix + p.text)
        elif p.blocks:
            out.append(await _block_text(session, p, prefix, blocks, kind))
        else:
            if p.input_tokens not in sized:
                text = await _sized(session, kind, p.input_tokens, first_index + k, prefix, True)
                sized[p.input_tokens] = (prefix, text[len(prefix):])
            out.append(prefix + sized[p.input_tokens][1])
    return out


async def _block_text(session: Session, p: Planned, prefix: str, cache: dict[tuple[int, int], str], kind: str) -> str:
    bt = p.meta.get("block_tokens") or 512
    parts, left = [], p.input_tokens
    for h in p.blocks:
        n = min(bt, left)
        if n <= 0:
            break
        if (h, n) not in cache:  # template tokens come off the request's own tail, not off a shared block
            cache[(h, n)] = await _sized(session, kind, n, h, f"[blk {session.run_id}-{h}] ", False, overhead=0)
        parts.append(cache[(h, n)])
        left -= n
    if left > 0:
        parts.append(await _sized(session, kind, left, p.input_tokens, prefix, True))
    return " ".join(parts)


def _window_records(run: PointRun, lo: float, hi: float) -> list[Any]:
    return [r for r in run.records if r.scheduled_ns is not None and lo <= (r.scheduled_ns - run.t0_ns) / 1e9 <= hi]


def _closed_window(run: PointRun, cap: int) -> tuple[list[Any], float, float]:
    """Concurrency point: drop the first and last ``cap`` requests by send time (the ramp up and the drain);
    the window runs from the first kept send to the last kept end, in s from the start."""
    recs = sorted((r for r in run.records if r.sent_ns), key=lambda r: r.sent_ns)
    keep = recs[cap:-cap] if len(recs) > 4 * cap else recs
    if not keep:
        return [], 0.0, 0.0
    lo = (keep[0].sent_ns - run.t0_ns) / 1e9
    hi = max((r.sent_ns + (r.end_ns or 0) - run.t0_ns) / 1e9 for r in keep)
    return keep, lo, hi


def late_ms(planned_rps: float | None) -> float:
    """How late a request must start to count as late: ``BEHIND_P99_MS``, or a tenth of the mean planned gap when
    that is longer (at 1 req/s a 50-ms lag changes nothing)."""
    return max(BEHIND_P99_MS, 100.0 / planned_rps) if planned_rps else BEHIND_P99_MS


def _schedule_figures(run: PointRun, plan: list[Planned]) -> dict[str, Any]:
    sent = sorted(r.sent_ns for r in run.records if r.sent_ns)
    planned_rate = (len(plan) - 1) / run.span_s if run.span_s > 0 else None
    achieved = (len(sent) - 1) / ((sent[-1] - sent[0]) / 1e9) if len(sent) > 1 and sent[-1] > sent[0] else None
    send_lag = [r.sent_ns - r.scheduled_ns for r in run.records if r.sent_ns and r.scheduled_ns is not None]
    over = late_ms(planned_rate)
    return {"planned_requests": len(plan), "planned_rps": None if planned_rate is None else round(planned_rate, 4),
            "achieved_rps": None if achieved is None else round(achieved, 4), "span_s": round(run.span_s, 3),
            "dispatch_lag_ms": lag_summary(run.dispatch_lag_ns), "send_lag_ms": lag_summary(send_lag),
            "late": {"over_ms": round(over, 1), "dispatches": len(run.dispatch_lag_ns), "sends": len(send_lag),
                     "late_dispatches": sum(1 for x in run.dispatch_lag_ns if x > over * 1e6),
                     "late_sends": sum(1 for x in send_lag if x > over * 1e6)}}


SLO_RISE_SHARE = 0.05


def _trend_figures(run: PointRun, recs: list[Any], ms: list[Any], lo: float, hi: float,
                   slo: SLO | None) -> dict[str, Any]:
    """TTFT-from-schedule and in-flight trends over the window (:func:`bench.load.estimate.rise_test`; the
    saturation signal of docs/load.md). With a TTFT objective, a TTFT rise under ``SLO_RISE_SHARE`` of its limit
    does not count (a queue settling near full load rises that much and stops)."""
    xs, ys = [], []
    for r, m in zip(recs, ms):
        if m.ok and m.ttft_ms is not None:
            start = r.scheduled_ns if r.scheduled_ns is not None else r.sent_ns
            xs.append((start - run.t0_ns) / 1e9)
            ys.append(m.ttft_ms + (r.sent_ns - start) / 1e6)
    inf_x = [(t - run.t0_ns) / 1e9 for t, _ in run.inflight]
    sel = [i for i, x in enumerate(inf_x) if lo <= x <= hi]
    limits = [o.limit_ms for o in (slo.objectives if slo else ()) if o.metric == "ttft"]
    tt = rise_test(xs, ys)
    tt["rising"] = tt["rising"] and (tt["rise"] or 0) > max(TREND_MIN_MS, SLO_RISE_SHARE * min(limits, default=0))
    it = rise_test([inf_x[i] for i in sel], [float(run.inflight[i][1]) for i in sel])
    it["rising"] = it["rising"] and (it["rise"] or 0) >= 2  # two more requests in flight at least
    return {"ttft_from_schedule_ms": tt, "in_flight": it}


def objective_values(o: Any, recs: list[Any], ms: list[Any]) -> list[float]:
    """Per request of ``recs`` (in their order) its value for objective ``o`` in ms: inf when it failed (or has
    no TTFT/E2E), nan when undefined (a one-token answer's TPOT); ITL objectives give every gap of each request."""
    out: list[float] = []
    for r, m in zip(recs, ms):
        if not m.ok:
            out.append(math.inf)
        elif o.metric == "itl":
            out.extend(m.itl_ms or [math.nan])
        else:
            v = request_values(r, m, o)
            out.append(v if v is not None else (math.inf if o.metric in ("ttft", "e2e") else math.nan))
    return out


def point_requests(run: PointRun, plan: list[Planned], ls: LoadSettings, slo: SLO) -> PointRequests | None:
    """What the control variate of ``bench capacity`` needs of an open-loop point (:mod:`bench.load.control`):
    the planned send offsets, the window, the window's requests' offsets and values per TTFT, TPOT or E2E
    objective (ITL objectives have several values per request: left out), their median E2E from the schedule,
    the arrival process and the seed. None for a closed-loop point or a trace."""
    if ls.mode != "rate" or ls.rate is None or not plan:
        return None
    lo, hi = default_window(run, ls)
    recs = sorted(_window_records(run, lo, hi), key=lambda r: r.scheduled_ns)
    ms = [request_metrics(r) for r in recs]
    objs = [o for o in slo.objectives if o.metric in ("ttft", "tpot", "e2e")]
    e2e = [m.e2e_ms + (r.sent_ns - r.scheduled_ns) / 1e6 for r, m in zip(recs, ms) if m.ok and m.e2e_ms is not None]
    proc = Process(ls.arrival, float(ls.rate), ls.duration_s, ls.requests, ls.burstiness, ls.ramp_s)
    return PointRequests(np.array([p.at_s for p in plan]), lo, hi,
                         np.array([(r.scheduled_ns - run.t0_ns) / 1e9 for r in recs]),
                         {o.key: np.asarray(objective_values(o, recs, ms), dtype=float) for o in objs},
                         {o.key: o.limit_ms for o in objs}, float(np.median(e2e)) / 1e3 if e2e else 0.0, proc,
                         ls.seed)


def _finished_in_window(run: PointRun, lo: float, hi: float) -> float | None:
    """Requests/s that ended successfully inside the window's span (on the schedule's clock): the server's
    throughput over the window, which stops growing at saturation (``completed_rps`` counts the window's
    requests however late they end)."""
    if hi <= lo:
        return None
    lo_ns, hi_ns = run.t0_ns + lo * 1e9, run.t0_ns + hi * 1e9
    n = sum(1 for r in run.records if r.ok and r.sent_ns and lo_ns <= r.sent_ns + (r.end_ns or 0) <= hi_ns)
    return round(n / (hi - lo), 4)


def default_window(run: Any, ls: LoadSettings) -> tuple[float, float]:
    """The steady-state window of an open-loop point (``run``: anything with ``span_s``): ``--warmup`` (default 20 %
    of the span, at most 30 s) and ``--cooldown`` (10 %, at most 10 s) left out, or the middle half of a span too
    short for both. A trace replays every request into the statistics (warm-up and cool-down 0 unless given):
    its start and end are part of the workload it records, not a ramp of bench's. A capacity probe
    (``exact_count``) keeps what follows ``--warmup`` up to its planned duration, not to its last arrival (under
    bursty arrivals that can come early, and the window shrank to nothing)."""
    if ls.exact_count and ls.duration_s:
        return float(ls.warmup_s or 0.0), float(ls.duration_s)
    trace = ls.mode == "trace"
    w0 = ls.warmup_s if ls.warmup_s is not None else 0.0 if trace else min(30.0, 0.2 * run.span_s)
    w1 = ls.cooldown_s if ls.cooldown_s is not None else 0.0 if trace else min(10.0, 0.1 * run.span_s)
    return point_window(run, w0, w1)


def point_summary(run: PointRun, plan: list[Planned], ls: LoadSettings, slo: SLO | None, *, cell: Cell,
                  load: dict[str, Any]) -> dict[str, Any]:
    """The point's cell dict (module docstring). Pure given the run."""
    if run.span_s == 0 and ls.max_concurrency:
        recs, lo, hi = _closed_window(run, ls.max_concurrency)
    else:
        lo, hi = default_window(run, ls)
        recs = sorted(_window_records(run, lo, hi), key=lambda r: r.scheduled_ns)
    ms = run.metrics_of(recs)
    # the run's fixed overhead is in results["run"]; a point's TTFT holds queueing, so no overhead-share flag here
    s = summarize_cell(cell, recs, [[r.request_id for r in recs]], None, depth_target_tokens=None,
                       expected_cached_tokens=None, metrics=ms).to_dict()
    span = hi - lo
    ok = [m for m in ms if m.ok]
    _window_aggregate(s, ok, span)
    s.update({
        "id": load["id"], "mode": ls.mode, "load": load, "schedule": _schedule_figures(run, plan),
        "counts": {"planned": len(plan), "finished": sum(1 for r in run.records if r.ok),
                   "failed": sum(1 for r in run.records if not r.ok) - run.cut, "cut": run.cut},
        "window": {"from_s": round(lo, 3), "to_s": round(hi, 3), "requests": len(recs),
                   "rate": round(len(recs) / span, 4) if span > 0 else None},
        "throughput": {"completed_rps": round(len(ok) / span, 4) if span > 0 else None,
                       "finished_in_window_rps": _finished_in_window(run, lo, hi),
                       "output_tok_s": round(sum(m.output_tokens for m in ok) / span, 3) if span > 0 else None},
        "latency": latency_summaries(recs, ms),
        "trend": _trend_figures(run, recs, ms, lo, hi, slo),
        "client_lag": run.lag,
    })
    if run.span_s == 0 and ls.max_concurrency:
        _closed_rates(s, recs, ms, run.records)
    s["steady"] = not (s["trend"]["ttft_from_schedule_ms"]["rising"] and s["trend"]["in_flight"]["rising"])
    if slo is not None:
        s.update(point_slo(recs, slo, span, ms))
        s["slo_model"] = slo_model({o.key: (objective_values(o, recs, ms), o.limit_ms, o.q) for o in slo.objectives})
        s["slo_met"] = bool(recs) and all(v["held"] for v in s["slo"].values()) and s["steady"]
    _point_warnings(s, ls, run, stamp_context(recs, s.get("itl_ms")))
    return s


def _closed_rates(s: dict[str, Any], keep: list[Any], ms: list[Any], every: list[Any]) -> None:
    """A concurrency point's request rate by Little's law: the mean number in flight (``every`` request counted)
    between its first and last kept send over the kept requests' mean end-to-end time. Counts over the span read 6-9 % high: the streams
    start together and end in step with the engine's decode steps, so sends and ends come in bursts, and a span
    from the first to the last of them holds one burst more than its length (a sim serving at most 9.43 req/s
    read 10.12 sent and 10.25 done; this gives 9.29). The send rate of a closed loop is its completion rate."""
    t1, t2 = (keep[0].sent_ns, keep[-1].sent_ns) if len(keep) > 1 else (0, 0)
    e2e = [m.e2e_ms for m in ms if m.ok and m.e2e_ms]
    if t2 <= t1 or not e2e:
        return
    busy = sum(max(0, min(r.sent_ns + (r.end_ns or 0), t2) - max(r.sent_ns, t1)) for r in every if r.sent_ns)
    rate = round(busy / (t2 - t1) / (sum(e2e) / len(e2e) / 1e3), 4)
    s["schedule"]["achieved_rps"] = rate
    s["throughput"]["finished_in_window_rps"] = rate


def _window_aggregate(s: dict[str, Any], ok: list[Any], span: float) -> None:
    """An open-loop point's aggregate decode rate: the decode tokens (``output_tokens - first_event_tokens``) of
    the successful requests sent in its window over the window's length (docs/metrics.md). The per-wave
    definition (first first token to last last token) would add one end-to-end time to the span, and an open
    loop has no waves."""
    if span <= 0:
        return
    rate = sum(max(0, m.output_tokens - m.first_event_tokens) for m in ok) / span
    s["aggregate_decode_tok_s"] = summarize([rate]).to_dict()
    s.setdefault("samples", {})["aggregate_decode_tok_s"] = [rate]


def more_workers(sched: dict[str, Any], workers: int) -> int:
    """The sending processes to suggest when ``workers`` fell behind: scaled by planned / achieved rate, at least
    one more (and at least 2)."""
    planned, achieved = sched["planned_rps"], sched["achieved_rps"]
    ratio = planned / achieved if planned and achieved else 2.0
    return max(2, workers + 1, math.ceil(workers * ratio))


BEHIND_MIN_LATE = 3  # late starts a warning needs at least: one outlier (a p99 of 43 samples is their max) is not it
BEHIND_LATE_SHARE = 0.01  # ... and over this share of the point's starts (the p99 over the threshold)


def _many(late: int, n: int) -> bool:
    return late >= BEHIND_MIN_LATE and late > BEHIND_LATE_SHARE * n


def behind(sched: dict[str, Any]) -> bool:
    """bench fell behind its schedule: over 1 % of the requests, and at least ``BEHIND_MIN_LATE``, started over
    :func:`late_ms` after their scheduled time (dispatch lag: bench's own lateness, before any concurrency cap)."""
    late = sched.get("late") or {}
    return _many(late.get("late_dispatches", 0), late.get("dispatches", 0))


def capped(sched: dict[str, Any], max_concurrency: int | None) -> bool:
    """A ``--max-concurrency`` cap held the requests back: the sends went out below 98 % of the planned rate and
    enough of them waited over :func:`late_ms` for a slot (send lag), while bench itself was on time."""
    late = sched.get("late") or {}
    planned, achieved = sched["planned_rps"], sched["achieved_rps"]
    slow = bool(planned and achieved and achieved < 0.98 * planned)
    return bool(max_concurrency) and slow and _many(late.get("late_sends", 0), late.get("sends", 0))


def _point_warnings(s: dict[str, Any], ls: LoadSettings, run: PointRun, stamps: dict[str, Any] | None = None) -> None:
    sc = s["schedule"]
    workers = run.workers or 1
    peak = max((n for _, n in run.inflight), default=1)
    lag_note = lag_warning(run.lag, workers=run.workers, streams=peak, **(stamps or {})) if run.lag else None
    if lag_note:
        s["warnings"].append(in_cell(s["id"], lag_note))
    late = sc.get("late") or {}
    if behind(sc):
        who = "this process" if workers <= 1 else f"the {workers} sending processes"
        s["warnings"].append(warning("behind-schedule", s["id"], late=late["late_dispatches"],
                                     total=late["dispatches"], over=late["over_ms"], lag=sc["dispatch_lag_ms"]["p99"],
                                     achieved=sc["achieved_rps"], planned=sc["planned_rps"], who=who,
                                     n=more_workers(sc, workers)))
    cap = not behind(sc) and capped(sc, ls.max_concurrency)
    if cap:
        s["warnings"].append(warning("concurrency-capped", s["id"], cap=ls.max_concurrency,
                                     late=late["late_sends"], total=late["sends"], over=late["over_ms"],
                                     lag=sc["send_lag_ms"]["p99"], achieved=sc["achieved_rps"],
                                     planned=sc["planned_rps"]))
    drained = s["counts"]["cut"] - run.lost  # a lost node's cut requests: its own warning (run warnings)
    if drained:
        s["warnings"].append(warning("cut-in-flight", s["id"], n=drained, drain=ls.drain_s))
    if not s["steady"] and ls.mode == "rate" and not cap:  # a binding cap: its queue, not the server's, grew
        s["warnings"].append(warning("not-steady", s["id"]))


async def run_point(session: Session, ls: LoadSettings, plan: list[Planned], *, slo: SLO | None, tag: str,
                    first_index: int, load: dict[str, Any], counters: Any = None,
                    on_done: Any = None) -> tuple[PointRun, dict[str, Any]]:
    """Build the prompts, run the plan open loop, summarize. Records go to the session's records.jsonl."""
    out = int(np.median([p.output_tokens for p in plan])) if plan else 0
    cell = Cell(ls.mode, plan_depth(plan), ls.max_concurrency or 0, ls.prompt, out, len(plan), label=load["id"])
    observer = getattr(session, "observer", None)
    texts = await build_texts(session, plan, ls.prompt, first_index)
    for p in plan:
        p.meta.setdefault("point", load["id"])
    closed = bool(plan) and ls.max_concurrency is not None and all(p.at_s == 0 for p in plan)
    if observer is not None:
        observer.cell_started(cell, len(plan))
    if getattr(session, "pool", None) is not None and not closed and ls.max_concurrency:
        raise ConfigError("--max-concurrency is not available with --workers > 1 or --ray in open-loop runs")
    scraper = getattr(session, "scraper", None)  # the server's /metrics around the whole point
    if scraper is not None:
        await scraper.begin()
    try:
        if getattr(session, "pool", None) is not None and not closed:
            if (counted_later := getattr(observer, "counts_at_end", None)) is not None:
                counted_later(cell)  # the workers' records come back when the point ends
            run = await run_plan_pool(session, plan, texts, tag=tag)
        else:
            run = await run_plan(session, plan, texts, tag=tag, max_concurrency=ls.max_concurrency,
                                 drain_s=ls.drain_s, counters=counters, on_done=_observed(on_done, observer, cell),
                                 closed=closed)
    except BaseException:
        if scraper is not None:
            await scraper.stop()
        raise
    sm = await scraper.end() if scraper is not None else None
    summary = point_summary(run, plan, ls, slo, cell=cell, load=load)
    if sm is not None:
        header = getattr(session, "shared_prefix_tokens", PREFIX_SHARED_TOKENS_MAX)  # a stand-in session: no probes
        point_server_metrics(sm, run, summary, header_tokens=header, prefix_cache_expected=ls.mode == "trace")
    if observer is not None:
        observer.cell_done(cell, cell_from_dict(summary, f"point {load['id']}"))
    return run, summary


def point_server_metrics(sm: dict[str, Any], run: PointRun, s: dict[str, Any], header_tokens: int = 0,
                         prefix_cache_expected: bool = False) -> None:
    """The server's own counters over a whole point (every request it sent, the warm-up and cool-down too, not
    the window only): stored as ``s["server_metrics"]``, its tokens cross-checked against the point's successful
    records (a warning past :data:`bench.server.metrics.TOKEN_MISMATCH_WARN_PCT`), its TTFT beside the window's
    (a note); its prefix-cache hits beyond ``header_tokens`` (the chat template's shared header) per request
    warn, unless ``prefix_cache_expected`` (a trace replay: its prompts share the trace's prefixes on purpose)."""
    ok = [m for m in run.metrics_of(run.records) if m.ok]
    view = {**s, "output_tokens_total": sum(m.output_tokens for m in ok),
            "requests_failed": len(run.records) - len(ok)}
    s["server_metrics"], warns = counters_beside(sm, view, prefix_cache_expected=prefix_cache_expected,
                                                 expected_hits=header_tokens * len(run.records))
    s["warnings"] += warns


def _observed(on_done: Any, observer: Any, cell: Cell) -> Any:
    """``on_done`` for each finished record, then the observer's count (the progress of bench.report.progress)."""
    if observer is None:
        return on_done

    def done(rec: Any) -> None:
        if on_done is not None:
            on_done(rec)
        observer.request_done(cell, rec.ok)

    return done


async def sessions_point(session: Session, ls: LoadSettings, slo: SLO | None, max_tokens: int) -> dict[str, Any]:
    """The ``sessions`` mode as one cell: user messages built first, then the conversations
    (:mod:`bench.load.sessions`); the summary over every turn plus ``turns`` (per turn index) and the SLO keys."""
    from bench.load.sessions import run_sessions, turn_summary

    assert ls.input_sizes is not None  # parsed when the settings were made
    sizes = ls.input_sizes.draw(rng_for(ls.seed, "sessions"), ls.users * ls.turns)
    msgs = [[await _sized(session, ls.prompt, int(sizes[u * ls.turns + t]), 7919 * u + t, "", True, overhead=0)
             for t in range(ls.turns)] for u in range(ls.users)]
    cell = Cell("sessions", int(np.median(sizes)), ls.users, ls.prompt, max_tokens, ls.users * ls.turns,
                label=load_id(ls))
    observer = getattr(session, "observer", None)
    if observer is not None:
        observer.cell_started(cell, ls.users * ls.turns)
    mon = LagMonitor()
    mon.start()
    try:
        recs = await run_sessions(session, msgs, max_tokens=max_tokens, think_s=ls.think_s, stagger_s=ls.stagger_s,
                                  tag="measure")
    finally:
        lag = mon.stop()
    ms = [request_metrics(r) for r in recs]
    s = summarize_cell(cell, recs, [[r.request_id for r in recs]], None, expected_cached_tokens=None,
                       metrics=ms).to_dict()
    sent = [r.sent_ns for r in recs if r.sent_ns]
    ends = [r.sent_ns + (r.end_ns or 0) for r in recs if r.sent_ns]
    span = (max(ends) - min(sent)) / 1e9 if sent else 0.0
    s.update({"id": load_id(ls), "mode": "sessions", "load": load_dict(ls), "turns": turn_summary(recs),
              "counts": {"planned": ls.users * ls.turns, "finished": sum(r.ok for r in recs),
                         "failed": sum(not r.ok for r in recs), "cut": 0},
              "latency": latency_summaries(recs, ms), "client_lag": lag})
    lag_note = lag_warning(lag, workers=1, streams=ls.users, **stamp_context(recs, s.get("itl_ms")))
    if lag_note:
        s["warnings"].append(in_cell(s["id"], lag_note))
    if slo is not None and span > 0:
        s.update(point_slo(recs, slo, span, ms))
        s["slo_met"] = all(v["held"] for v in s["slo"].values())
    if observer is not None:
        observer.cell_done(cell, cell_from_dict(s, f"point {s['id']}"))
    return s


def load_id(ls: LoadSettings) -> str:
    """A point's id: ``rate-10``, ``rate-10-c8``, ``trace-NAME-x2``, ``sessions-4x3``."""
    if ls.mode == "sessions":
        return f"sessions-{ls.users}x{ls.turns}"
    if ls.mode == "trace":
        return f"trace-{Path(ls.trace or '').stem}" + (f"-x{ls.speed:g}" if ls.speed != 1 else "")
    base = f"rate-{ls.rate:g}" if ls.rate is not None else "concurrency"
    return base + (f"-c{ls.max_concurrency}" if ls.max_concurrency else "")


def load_dict(ls: LoadSettings) -> dict[str, Any]:
    """The ``load`` key of a point: what was asked."""
    d: dict[str, Any] = {"id": load_id(ls), "mode": ls.mode, "max_concurrency": ls.max_concurrency,
                         "seed": ls.seed}
    if ls.mode == "sessions":
        d.update({"users": ls.users, "turns": ls.turns, "think_s": ls.think_s, "stagger_s": ls.stagger_s,
                  "input_tokens": ls.input_tokens})
    elif ls.mode == "rate":
        d.update({"rate": ls.rate, "arrival": ls.arrival, "burstiness": ls.burstiness, "ramp_s": ls.ramp_s,
                  "duration_s": ls.duration_s, "requests": ls.requests, "input_tokens": ls.input_tokens,
                  "output_tokens": ls.output_tokens, "dataset": ls.dataset})
        if ls.exact_count:  # a capacity probe: exactly rate x duration arrivals (docs/load.md)
            d["exact_count"] = True
    else:
        d.update({"trace": ls.trace, "speed": ls.speed, "block_tokens": ls.block_tokens})
    return d


def plan_depth(plan: list[Planned]) -> int:
    """A point's depth: the median planned prompt (tokens)."""
    return int(np.median([p.input_tokens for p in plan])) if plan else 0


def interrupted_point(ls: LoadSettings, planned: int, recs: list[Any], slo: SLO | None,
                      depth: int = 0) -> dict[str, Any]:
    """The summary of a point stopped before its schedule ended: the requests that finished (and those cut in
    flight, as failures), no steady-state window and no schedule figures; a warning says what is missing.
    ``depth``: the one a finished point reports (:func:`plan_depth` of its plan)."""
    cell = Cell(ls.mode, depth, ls.max_concurrency or 0, ls.prompt, 0, planned, label=load_id(ls))
    ms = [request_metrics(r) for r in recs]
    s = summarize_cell(cell, recs, [[r.request_id for r in recs]], None, expected_cached_tokens=None,
                       metrics=ms).to_dict()
    cut = sum(1 for r in recs if (r.error or "").startswith("cut:"))
    s.update({"id": load_id(ls), "mode": ls.mode, "load": load_dict(ls),
              "counts": {"planned": planned, "finished": sum(r.ok for r in recs),
                         "failed": sum(not r.ok for r in recs) - cut, "cut": cut},
              "latency": latency_summaries(recs, ms)})
    s["warnings"].append(warning("interrupted-point", s["id"], ended=len(recs), planned=planned, cut=cut))
    if slo is not None and recs:
        sent = [r.sent_ns for r in recs if r.sent_ns]
        ends = [r.sent_ns + (r.end_ns or 0) for r in recs if r.sent_ns]
        span = (max(ends) - min(sent)) / 1e9 if sent else 0.0
        if span > 0:
            s.update(point_slo(recs, slo, span, ms))
            s["slo_met"] = all(v["held"] for v in s["slo"].values())
    return s


async def measure_load(session: Session, ls: LoadSettings, plan: list[Planned] | None = None) -> dict[str, Any]:
    """One open-loop point over a prepared session (``rate``, ``trace`` or ``sessions``): its summary. ``plan``:
    the schedule already made from ``ls`` (:func:`make_plan`; made here when None; unused in sessions mode)."""
    slo = ls.slo_spec
    if ls.mode == "sessions":
        return await sessions_point(session, ls, slo, session.profile.max_tokens)
    plan = make_plan(ls, session.profile.max_tokens) if plan is None else plan
    _, summary = await run_point(session, ls, plan, slo=slo, tag="measure", first_index=0, load=load_dict(ls))
    return summary


def latency_lines(lat: dict[str, Any]) -> list[str]:
    """TTFT and E2E p50 / p90 / p99 of a point's window, from the send and from the schedule (the send lag
    added: what a user who arrived on schedule waited, corrected for coordinated omission), labelled."""
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f}"

    out = []
    for key, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
        d = lat.get(key) or {}
        if not d:
            continue
        for label, v in (("from send:    ", d.get("from_send") or {}), ("from schedule:", d.get("from_schedule") or {})):
            out.append(f"  {name:4} ms p50 / p90 / p99, {label} "
                       + " / ".join(f(v.get(q)) for q in ("median", "p90", "p99")))
    if out:
        out.append("  (from schedule: send lag included, corrected for coordinated omission)")
    return out


def _pct_text(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def describe_point(s: dict[str, Any]) -> list[str]:
    """Plain lines on a point: schedule keeping, counts, window, steadiness, goodput and each SLO."""
    if s.get("mode") == "sessions":
        return [f"{s['id']}: turn {t['turn']}: {t['requests']} requests; p50: prompt {num(t['prompt_tokens_p50'])}"
                f" tokens, cached {num(t['cached_tokens_p50'])}, TTFT {num(t['ttft_ms_p50'])} ms; cached share "
                f"{_pct_text(t['cached_share'])}" for t in s["turns"]]
    sc, c, w = s["schedule"], s["counts"], s["window"]
    lag = sc["send_lag_ms"]
    lines = [f"{s['id']}: planned {sc['planned_requests']} requests at {num(sc['planned_rps'])} req/s, achieved "
             f"{num(sc['achieved_rps'])} req/s",
             f"  send lag p50 / p99 / max: {num(lag['p50'])} / {num(lag['p99'])} / {num(lag['max'])} ms",
             f"  finished {c['finished']}, failed {c['failed']}, cut {c['cut']}; steady: "
             f"{'yes' if s['steady'] else 'no (saturated)'}",
             f"  window {num(w['from_s'], 1)}-{num(w['to_s'], 1)} s ({w['requests']} of {c['planned']} requests)"]
    lines += latency_lines(s.get("latency") or {})
    if "goodput" in s:
        g = s["goodput"]
        met = g["met_fraction"]
        lines.append(f"  goodput {num(g['rps'])} req/s, {num(g['tok_s'])} tok/s; SLO met by "
                     f"{'-' if met is None else f'{100 * met:.1f} %'} of requests")
        for k, v in s["slo"].items():
            lines.append(f"  {k}: {num(v['value'])} ms (limit {num(v['limit_ms'])} ms) "
                         f"{'held' if v['held'] else 'MISSED'}")
    return lines
