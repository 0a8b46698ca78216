"""Cell summaries: the records of one cell -> the numbers of that cell (pure; docs/metrics.md defines each).

A cell is waves of N concurrent streams at one depth and prompt type. Per-stream figures summarize per-request
metrics over the cell's successful requests; the aggregate decode rate is per wave:

    aggregate_decode_tok_s = sum over the wave's streams of (output_tokens - first_event_tokens)
                             / (latest last-token time - earliest first-token time)

on one clock (sparkDash's aggregate: all streams' decode tokens over the wave's decode window). Prompt throughput
is ``uncached prompt tokens / TTFT`` per request; the overhead-corrected value divides by ``TTFT - overhead`` where
``overhead`` is the median TTFT of tiny prompts measured at the start of the run (network, HTTP, scheduling and
one decode step); a cell whose overhead is over 30 % of its median TTFT is flagged.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.config.profile import Cell
from bench.errors import ErrorKind
from bench.measure.metrics import RequestMetrics, request_metrics
from bench.measure.noise import cell_noise, noise_warnings, wave_medians
from bench.records import RequestRecord
from bench.results import CellResult
from bench.stats import summarize
from bench.warns import counts, warning

__all__ = ["summarize_cell", "wave_aggregate_decode", "OVERHEAD_FLAG_SHARE", "CLIENT_CPU_WARN_PCT"]

OVERHEAD_FLAG_SHARE = 0.30
PROMPT_MISS_WARN_PCT = 2.0
CLIENT_CPU_WARN_PCT = 70.0
SERVER_GAP_WARN_SHARE = 0.20
OPEN_LOOP_MODES = ("rate", "trace", "sessions")  # an open-loop point's Cell.sweep (bench.config.load.MODES)
LOST = ErrorKind.WORKER_LOST.value  # a request of a Ray node lost mid-run: cut, not failed
PHASE_KEYS = ("ttft_reasoning_ms", "ttft_content_ms", "reasoning_tok_s", "content_tok_s", "ttft_tool_ms",
              "tool_tok_s", "upload_ms")


def _workload(res: CellResult, cell: Cell, records: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> None:
    """The cell's tool-call counts and image figures (docs/metrics.md, "Workloads")."""
    ok = [(r, m) for r, m in zip(records, ms) if m.ok]
    res.tool_calls = sum(1 for _, m in ok if m.tool_call)
    res.tool_calls_forced = sum(1 for r, _ in ok if r.tool_forced)
    res.tool_calls_missing = sum(1 for _, m in ok if m.tool_call_missing)
    if res.tool_calls_missing:
        res.warnings.append(warning("tool-calls-missing", cell.id, missing=res.tool_calls_missing,
                                    forced=res.tool_calls_forced))
    res.images, res.image_size = cell.images, cell.image_size
    if not cell.images:
        return
    res.image_bytes = summarize([float(m.image_bytes) for _, m in ok]).to_dict()
    per_image = [(m.prompt_tokens - int(r.meta["counted_tokens"])) / m.images for r, m in ok
                 if m.images and m.prompt_tokens is not None and isinstance(r.meta.get("counted_tokens"), int)]
    if per_image:
        res.image_prompt_tokens = round(sorted(per_image)[len(per_image) // 2], 1)


def wave_aggregate_decode(recs: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> float | None:
    """Aggregate decode tok/s of one wave (definition above); None when the window is empty.

    Only successful requests count; times are absolute ``sent_ns + event t_ns`` on one clock.
    """
    firsts: list[int] = []
    lasts: list[int] = []
    toks: float = 0
    for r, m in zip(recs, ms):
        if not m.ok:
            continue
        tev = [e for e in r.events if e.has_text]
        if len(tev) < 2 or m.output_tokens <= m.first_event_tokens:
            continue
        firsts.append(r.sent_ns + tev[0].t_ns)
        lasts.append(r.sent_ns + tev[-1].t_ns)
        toks += m.output_tokens - m.first_event_tokens
    if not firsts:
        return None
    span = (max(lasts) - min(firsts)) / 1e9
    return toks / span if span > 0 else None


def summarize_cell(
    cell: Cell,
    records: Sequence[RequestRecord],
    waves: Sequence[Sequence[str]],
    overhead_ms: float | None,
    *,
    depth_target_tokens: int | None = None,
    expected_cached_tokens: int | None = 0,
    client_cpu_pct: float | None = None,
    target_ci: float = 0.0,
    max_waves: int | None = None,
    metrics: Sequence[RequestMetrics] | None = None,
) -> CellResult:
    """The summary of one cell (a ``cells[]`` entry of results.json; fields in :class:`bench.results.CellResult`).

    Args:
        cell: the cell.
        records: its measured records (warm-ups excluded), failures included.
        waves: request ids of each measured wave, in order.
        overhead_ms: the run's fixed per-request overhead (median TTFT of tiny prompts) or None.
        depth_target_tokens: the prompt tokens asked for (None for depth 0, the shortest prompt).
        expected_cached_tokens: cached tokens per request that are no surprise (the chat template's fixed header,
            which every chat request shares); more than this is warned about. None: no warning (prefix-cache runs).
        client_cpu_pct: bench's own CPU use while measuring (% of one core), warned about past 70 %.
        target_ci: the profile's ``target_ci`` (0: none); the cell's noise is compared with it (:mod:`bench.measure.noise`).
        max_waves: the profile's ``max_waves`` (named in the noise warning when more would be needed).
        metrics: ``request_metrics`` of each record, in order, when the caller has them already (computed here
            otherwise).
    """
    ms = _metrics_of(records, metrics)
    ok = [m for m in ms if m.ok]
    cut, errors = _failures(ms)
    agg = _aggregates(records, ms, waves)
    rates = _prompt_rates(records, ms, overhead_ms)
    warnings = (_warnings(cell, ok, ms, errors, rates, overhead_ms, depth_target_tokens, expected_cached_tokens)
                + _short_warning(cell, records, ms) + _client_warnings(cell, ms, client_cpu_pct))
    samples = _samples(ok, rates, agg)
    res = CellResult(
        id=cell.id, sweep=cell.sweep, depth=cell.depth, streams=cell.streams, prompt=cell.prompt,
        max_tokens=cell.max_tokens, requests_ok=len(ok), requests_failed=len(ms) - len(ok) - cut, errors=dict(errors),
        waves=len(waves), overhead_ms=overhead_ms, overhead_share=rates["share"], overhead_flag=rates["flag"],
        prompt_target=depth_target_tokens, prompt_miss_pct=_prompt_miss(ok, depth_target_tokens),
        output_tokens_estimated=sum(1 for m in ok if m.output_tokens_estimated),
        cached_tokens=sum(m.cached_tokens for m in ok), reasoning_tokens=sum(m.reasoning_tokens for m in ok),
        client_cpu_pct=None if client_cpu_pct is None else round(client_cpu_pct, 1),
        samples=samples, warnings=warnings, requests_cut=cut,
    )
    for key in ("decode_tok_s", "ttft_ms", "ttfc_ms", "tpot_ms", "e2e_ms", "prompt_tok_s", "prompt_tok_s_corrected",
                "server_prefill_tok_s", "server_decode_tok_s", "ttft_minus_server_prompt_ms",
                "aggregate_decode_tok_s", *PHASE_KEYS):
        setattr(res, key, summarize(samples[key]).to_dict())
    _workload(res, cell, records, ms)
    res.itl_ms = summarize([x for m in ok for x in m.itl_ms]).to_dict()
    res.prompt_tokens = summarize([m.prompt_tokens for m in ok]).to_dict()
    res.output_tokens = summarize([m.output_tokens for m in ok]).to_dict()
    res.tokens_per_event = summarize([m.tokens_per_event for m in ok]).to_dict()
    res.queue_ms = summarize([m.queue_ms for m in ms]).to_dict()
    res.noise = cell_noise(wave_medians(ms, waves), samples["decode_tok_s"], target_ci)
    res.warnings += noise_warnings(cell.id, res.noise, max_waves)
    return res


def _failures(ms: Sequence[RequestMetrics]) -> tuple[int, Counter[str]]:
    """``(cut, errors by kind)``: a lost Ray node's requests are cut (the server did not fail them), the other
    failures counted by kind."""
    cut = sum(1 for m in ms if m.error_kind == LOST)
    return cut, Counter(m.error_kind or "unknown" for m in ms if not m.ok and m.error_kind != LOST)


def _metrics_of(records: Sequence[RequestRecord], metrics: Sequence[RequestMetrics] | None) -> list[RequestMetrics]:
    """The records' metrics: those given (one per record, in order), else computed now."""
    if metrics is None:
        return [request_metrics(r) for r in records]
    if len(metrics) != len(records):
        raise ValueError(f"summarize_cell: {len(metrics)} metrics for {len(records)} records")
    return list(metrics)


def _aggregates(records: Sequence[RequestRecord], ms: Sequence[RequestMetrics],
                waves: Sequence[Sequence[str]]) -> list[float]:
    by_id = {r.request_id: (r, m) for r, m in zip(records, ms)}
    agg = []
    for ids in waves:
        pairs = [by_id[i] for i in ids if i in by_id]
        a = wave_aggregate_decode([p[0] for p in pairs], [p[1] for p in pairs])
        if a is not None:
            agg.append(a)
    return agg


def _server_timings(records: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> tuple[list[float], list[float]]:
    """llama.cpp's own decode rates, and TTFT minus its own prompt time, per successful request."""
    server_dec, gap = [], []
    for r, m in zip(records, ms):
        if not m.ok:
            continue
        t = r.timings or {}
        try:
            if t.get("predicted_per_second"):
                server_dec.append(float(t["predicted_per_second"]))
            if t.get("prompt_ms") is not None and m.ttft_ms is not None:
                gap.append(m.ttft_ms - float(t["prompt_ms"]))
        except (TypeError, ValueError):
            pass
    return server_dec, gap


def _prompt_rates(records: Sequence[RequestRecord], ms: Sequence[RequestMetrics],
                  overhead_ms: float | None) -> dict[str, Any]:
    """Prompt tok/s (plain and overhead-corrected), the server's prefill rates, and the overhead's share of TTFT."""
    prompt_tok_s, corrected, server_pf, shares = [], [], [], []
    for m in (m for m in ms if m.ok):
        if m.prompt_tokens is not None and m.ttft_ms:
            unc = m.prompt_tokens - m.cached_tokens
            if unc > 0:
                prompt_tok_s.append(unc / (m.ttft_ms / 1000))
                if overhead_ms is not None:
                    shares.append(overhead_ms / m.ttft_ms)
                    if m.ttft_ms > overhead_ms:
                        corrected.append(unc / ((m.ttft_ms - overhead_ms) / 1000))
        if m.prefill_source == "server" and m.prefill_tok_s:
            server_pf.append(m.prefill_tok_s)
    server_dec, gap = _server_timings(records, ms)
    share = sorted(shares)[len(shares) // 2] if shares else None
    return {"prompt_tok_s": prompt_tok_s, "prompt_tok_s_corrected": corrected, "server_prefill_tok_s": server_pf,
            "server_decode_tok_s": server_dec, "ttft_minus_server_prompt_ms": gap, "share": share,
            "flag": share is not None and share > OVERHEAD_FLAG_SHARE}


def _samples(ok: Sequence[RequestMetrics], rates: dict[str, Any], agg: list[float]) -> dict[str, list[float]]:
    samples: dict[str, list[float | None]] = {
        "decode_tok_s": [m.decode_tok_s for m in ok],
        "ttft_ms": [m.ttft_ms for m in ok],
        "ttfc_ms": [m.ttfc_ms for m in ok],
        "tpot_ms": [m.tpot_ms for m in ok],
        "e2e_ms": [m.e2e_ms for m in ok],
        "itl_ms_p50": [m.itl_ms_p50 for m in ok],
        **{k: list(rates[k]) for k in ("prompt_tok_s", "prompt_tok_s_corrected", "server_prefill_tok_s",
                                       "server_decode_tok_s", "ttft_minus_server_prompt_ms")},
        "aggregate_decode_tok_s": list(agg),
        **{k: [getattr(m, k) for m in ok] for k in PHASE_KEYS},
    }
    return {k: [round(v, 4) for v in vs if v is not None] for k, vs in samples.items()}


def _prompt_miss(ok: Sequence[RequestMetrics], target: int | None) -> float | None:
    pts = [m.prompt_tokens for m in ok if m.prompt_tokens and not m.images] if target else []
    return max(abs(p - target) / target * 100 for p in pts) if pts and target else None


def _warnings(cell: Cell, ok: Sequence[RequestMetrics], ms: Sequence[RequestMetrics], errors: Counter[str],
              rates: dict[str, Any], overhead_ms: float | None, target: int | None,
              expected_cached: int | None) -> list[str]:
    """The cell's warnings about its numbers; each names what it means."""
    out: list[str] = []
    if rates["flag"] and cell.depth > 0:
        out.append(warning("overhead-dominates", cell.id, share=rates["share"]))
    out += _server_gap_warning(cell, ok, rates["ttft_minus_server_prompt_ms"], overhead_ms)
    miss = _prompt_miss(ok, target)
    if miss is not None and miss > PROMPT_MISS_WARN_PCT:
        out.append(warning("prompt-size-miss", cell.id, miss=miss, target=target))
    if expected_cached is not None:
        extra = [m.cached_tokens for m in ok if m.cached_tokens > expected_cached]
        if extra:
            out.append(warning("prefix-cached", cell.id, header=expected_cached, n=len(extra), most=max(extra)))
    if any(m.output_tokens_estimated for m in ok):
        out.append(warning("no-usage", cell.id))
    failed = sum(errors.values())
    if failed:
        out.append(warning("requests-failed", cell.id, failed=failed, total=len(ms), errors=counts(errors)))
    return out


def _short_warning(cell: Cell, records: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> list[str]:
    """Requests that ended before the output each one asked for (its own ``max_tokens`` in the record's meta: a
    trace's ``output_length``, a dataset's size; else the cell's)."""
    asked = [int(r.meta.get("max_tokens") or cell.max_tokens) for r, m in zip(records, ms) if m.ok]
    short = [a for m, a in zip((m for m in ms if m.ok), asked) if m.output_tokens < a]
    if not short:
        return []
    limit = f"max_tokens={asked[0]}" if len(set(asked)) == 1 else "the max_tokens each asked for"
    return [warning("stopped-early", cell.id, n=len(short), limit=limit)]


def _server_gap_warning(cell: Cell, ok: Sequence[RequestMetrics], gap: list[float],
                        overhead_ms: float | None) -> list[str]:
    """TTFT well beyond the server's own prompt time in a closed-loop cell. Not for an open-loop point (its sweep is
    its mode): arrivals at random times wait for the step in progress and for the requests ahead of them, so a gap
    is the queueing the point measures, and --cache-ram 0 (the fix the warning names) would not remove it."""
    if not gap or cell.depth <= 0 or cell.sweep in OPEN_LOOP_MODES:
        return []
    g = sorted(gap)[len(gap) // 2]
    tt = sorted(m.ttft_ms for m in ok if m.ttft_ms)
    t_med = tt[len(tt) // 2] if tt else None
    if t_med and g > SERVER_GAP_WARN_SHARE * t_med and g > 2 * (overhead_ms or 0):
        return [warning("outside-server-timing", cell.id, gap=g, ttft=t_med)]
    return []


def _client_warnings(cell: Cell, ms: Sequence[RequestMetrics], cpu_pct: float | None) -> list[str]:
    """The client's CPU (not when every request failed: no figure to distrust, and a loop of fast failures keeps
    any client busy) and a cell where every request failed."""
    out = []
    if cpu_pct is not None and cpu_pct > CLIENT_CPU_WARN_PCT and any(m.ok for m in ms):
        n = max(2, math.ceil(cpu_pct / (CLIENT_CPU_WARN_PCT / 2)))
        out.append(warning("client-cpu", cell.id, cpu=cpu_pct, n=n))
    if ms and all(not m.ok for m in ms):
        kinds = sorted({m.error_kind or "?" for m in ms})
        out.append(warning("all-failed", cell.id, kinds=", ".join(kinds)))
    return out
