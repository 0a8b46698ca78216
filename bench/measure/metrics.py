"""Per-request metrics: pure functions from a :class:`RequestRecord` to numbers.

Every metric has one definition, written in ``docs/metrics.md``; the short form is beside each field of
:class:`RequestMetrics`. All times are from the moment the request was sent (``sent_ns``) to the arrival of the
read that completed an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.measure.phases import phase_rates
from bench.measure.tokens import estimate_tokens, event_token_counts
from bench.records import Event, RequestRecord
from bench.stats import percentile

__all__ = ["RequestMetrics", "request_metrics", "ok_metrics_by_wave"]


@dataclass(slots=True)
class RequestMetrics:
    """Metrics of one request. Units in the names; None = not defined for this request.

    Attributes:
        ok: the request succeeded (failed requests are kept out of latency statistics).
        error: the recorded error, or None.
        ttft_ms: send -> first event carrying generated text of any kind (content, reasoning, tool arguments).
        ttfc_ms: send -> first event carrying answer content (not reasoning); None if none came.
        output_tokens: generated tokens, reasoning included (usage, else llama.cpp timings, else estimate).
        output_tokens_estimated: True when no server count arrived.
        reasoning_tokens: from usage.completion_tokens_details.reasoning_tokens, else estimated from reasoning
            text (then ``reasoning_tokens_estimated``); 0 when there was no reasoning.
        prompt_tokens: usage.prompt_tokens (else llama.cpp timings prompt_n + cache_n), or None.
        cached_tokens: usage.prompt_tokens_details.cached_tokens, else timings.cache_n, else 0.
        chunks: events that carried generated text.
        tokens_per_event: output_tokens / chunks.
        decode_tok_s: (output_tokens - first_event_tokens) / (last token time - first token time) in tok/s; needs
            2+ events. With one token per event this is (output_tokens - 1) / (last - first).
        first_event_tokens: tokens the first token-bearing event carried (1 unless the server packs several).
        itl_ms: per-token inter-token latencies: each gap between consecutive token-bearing events, divided by
            the tokens the later event carried, once per token. The TTFT is not one of them.
        itl_ms_p50, itl_ms_p99, itl_ms_max, itl_count: summary of ``itl_ms``.
        tpot_ms: (e2e_ms - ttft_ms) / (output_tokens - 1), vLLM's definition (benchmark_serving.py).
        e2e_ms: send -> end of the response.
        prefill_tok_s: llama.cpp timings.prompt_n / prompt_ms when reported (``prefill_source="server"``), else
            (prompt_tokens - cached_tokens) / TTFT (``"ttft"``; includes network and queueing: an estimate).
        queue_ms: client-side queueing before send.
        upload_ms: send -> the server had the body read, parsed and tokenized, where the server reports it (bench
            sim); None elsewhere.
        ttft_reasoning_ms / ttft_content_ms / ttft_tool_ms: send -> the first event carrying reasoning / answer
            content / a tool-call fragment; None if none came.
        reasoning_tok_s / content_tok_s / tool_tok_s: decode over that phase's own events (bench.measure.phases).
        tool_call: a tool-call fragment came. tool_call_missing: the request forced a call (``tool_choice``
            ``required`` or a function) and none came.
        images / image_bytes: what the request carried.
    """

    request_id: str
    ok: bool
    error: str | None
    error_kind: str | None
    ttft_ms: float | None
    ttfc_ms: float | None
    output_tokens: int
    output_tokens_estimated: bool
    reasoning_tokens: int
    reasoning_tokens_estimated: bool
    prompt_tokens: int | None
    cached_tokens: int
    chunks: int
    tokens_per_event: float | None
    first_event_tokens: float
    decode_tok_s: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    itl_ms_max: float | None
    itl_count: int
    tpot_ms: float | None
    e2e_ms: float | None
    prefill_tok_s: float | None
    prefill_source: str | None
    queue_ms: float
    finish_reason: str | None
    status: int | None
    upload_ms: float | None = None
    ttft_reasoning_ms: float | None = None
    ttft_content_ms: float | None = None
    ttft_tool_ms: float | None = None
    reasoning_tok_s: float | None = None
    content_tok_s: float | None = None
    tool_tok_s: float | None = None
    tool_call: bool = False
    tool_call_missing: bool = False
    images: int = 0
    image_bytes: int = 0
    itl_ms: list[float] = field(default_factory=list, repr=False)

    def to_dict(self, with_itl: bool = False) -> dict[str, Any]:
        """JSON-safe dict (floats rounded to 3 decimals); the ITL list only when ``with_itl``."""
        d = asdict(self)
        if not with_itl:
            d.pop("itl_ms")
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 3)
        return d


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _reasoning(usage: dict[str, Any], text_events: list[Event], per_event: list[float]) -> tuple[int, bool]:
    """Reasoning tokens: the server's count, else the reasoning share of each event's tokens (estimated)."""
    details = usage.get("completion_tokens_details") or {}
    reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    if reasoning is not None:
        return reasoning, False
    if not any(e.reasoning for e in text_events):
        return 0, False
    est = sum(n * (estimate_tokens(e.reasoning) / max(1, estimate_tokens(e.content + e.reasoning + e.tool)))
              for e, n in zip(text_events, per_event) if e.reasoning)
    return int(round(est)), True


def _prompt_counts(usage: dict[str, Any], timings: dict[str, Any]) -> tuple[int | None, int]:
    """Prompt tokens and cached prompt tokens (usage, else llama.cpp's timings)."""
    prompt_tokens = _int(usage.get("prompt_tokens"))
    pdetails = usage.get("prompt_tokens_details") or {}
    cached = _int(pdetails.get("cached_tokens")) if isinstance(pdetails, dict) else None
    if cached is None:
        cached = _int(timings.get("cache_n"))
    if prompt_tokens is None and timings.get("prompt_n") is not None:
        prompt_tokens = (_int(timings.get("prompt_n")) or 0) + (cached or 0)
    return prompt_tokens, cached or 0


def _itl(text_events: list[Event], per_event: list[float]) -> list[float]:
    """Inter-token latencies: each gap split evenly over the tokens its event carried."""
    itl: list[float] = []
    for prev, cur, n in zip(text_events, text_events[1:], per_event[1:]):
        k = max(1, int(round(n)))
        gap_ms = (cur.t_ns - prev.t_ns) / 1e6
        itl.extend([gap_ms / k] * k)
    return itl


def _prefill(timings: dict[str, Any], prompt_tokens: int | None, cached: int,
             ttft_ms: float | None) -> tuple[float | None, str | None]:
    """Prefill tok/s: the server's own prompt timing, else uncached prompt tokens over TTFT."""
    p_n, p_ms = timings.get("prompt_n"), timings.get("prompt_ms")
    try:
        if p_n is not None and p_ms and float(p_ms) > 0 and float(p_n) > 0:
            return float(p_n) / float(p_ms) * 1000.0, "server"
    except (TypeError, ValueError):
        pass
    if prompt_tokens is not None and ttft_ms and ttft_ms > 0 and prompt_tokens - cached > 0:
        return (prompt_tokens - cached) / (ttft_ms / 1000.0), "ttft"
    return None, None


def _decode_rate(text_events: list[Event], output_tokens: int, first_tokens: float) -> float | None:
    """Tokens decoded inside the first -> last window over its length: all but those the first event carried (1
    without speculative decoding, where this is (output_tokens - 1); k when the first event carries k tokens)."""
    if len(text_events) < 2 or output_tokens <= first_tokens:
        return None
    span = (text_events[-1].t_ns - text_events[0].t_ns) / 1e9
    return (output_tokens - first_tokens) / span if span > 0 else None


def _upload_ms(rec: RequestRecord) -> float | None:
    """Sent -> the server had the body read, parsed and tokenized, where the server says when (``bench sim``'s
    role chunk carries it as ``sched_ns``); the part of TTFT spent before the engine saw the request."""
    first = rec.events[0] if rec.events else None
    if first is None or first.has_text or first.sched_ns is None or not rec.sent_ns:
        return None
    return (first.sched_ns - rec.sent_ns) / 1e6


def request_metrics(rec: RequestRecord) -> RequestMetrics:
    """Compute :class:`RequestMetrics` from a record. Pure; never raises on odd server data."""
    usage = rec.usage or {}
    timings = rec.timings or {}
    text_events = [e for e in rec.events if e.has_text]
    chunks = len(text_events)
    server_out = _int(usage.get("completion_tokens"))
    if server_out is None:
        server_out = _int(timings.get("predicted_n"))
    per_event = event_token_counts(text_events, server_out)
    output_tokens = server_out if server_out is not None else int(round(sum(per_event)))
    out_est = server_out is None
    reasoning, reasoning_est = _reasoning(usage, text_events, per_event)
    prompt_tokens, cached = _prompt_counts(usage, timings)
    ttft_ms = text_events[0].t_ns / 1e6 if text_events else None
    ttfc_ms = next((e.t_ns / 1e6 for e in text_events if e.content), None)
    e2e_ms = rec.end_ns / 1e6 if rec.end_ns is not None else None
    first_tokens = max(1.0, per_event[0]) if per_event else 1.0
    decode = _decode_rate(text_events, output_tokens, first_tokens)
    itl = _itl(text_events, per_event)
    tpot = None
    if ttft_ms is not None and e2e_ms is not None and output_tokens >= 2:
        tpot = (e2e_ms - ttft_ms) / (output_tokens - 1)
    prefill, source = _prefill(timings, prompt_tokens, cached, ttft_ms)
    return RequestMetrics(
        request_id=rec.request_id,
        ok=rec.ok,
        error=rec.error,
        error_kind=rec.error_kind,
        ttft_ms=ttft_ms,
        ttfc_ms=ttfc_ms,
        output_tokens=output_tokens,
        output_tokens_estimated=out_est,
        reasoning_tokens=reasoning,
        reasoning_tokens_estimated=reasoning_est,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        chunks=chunks,
        tokens_per_event=(output_tokens / chunks) if chunks else None,
        first_event_tokens=first_tokens,
        decode_tok_s=decode,
        itl_ms_p50=percentile(itl, 50),
        itl_ms_p99=percentile(itl, 99),
        itl_ms_max=max(itl) if itl else None,
        itl_count=len(itl),
        tpot_ms=tpot,
        e2e_ms=e2e_ms,
        prefill_tok_s=prefill,
        prefill_source=source,
        queue_ms=rec.queue_ms,
        upload_ms=_upload_ms(rec),
        finish_reason=rec.finish_reason,
        status=rec.status,
        itl_ms=itl,
        **_workload_fields(rec, text_events, per_event),
    )


def _workload_fields(rec: RequestRecord, text_events: list[Event], per_event: list[float]) -> dict[str, Any]:
    """The phases' starts and rates (bench.measure.phases), the tool call and the images of one request."""
    phases = phase_rates(text_events, per_event)
    tool_call = any(e.tool for e in text_events)
    return {"ttft_reasoning_ms": rec.ttft_reasoning_ms, "ttft_content_ms": rec.ttft_content_ms,
            "ttft_tool_ms": rec.ttft_tool_ms, "reasoning_tok_s": phases.reasoning_tok_s,
            "content_tok_s": phases.content_tok_s, "tool_tok_s": phases.tool_tok_s, "tool_call": tool_call,
            "tool_call_missing": rec.ok and rec.tool_forced and not tool_call, "images": rec.images,
            "image_bytes": rec.image_bytes}


def ok_metrics_by_wave(metrics: Sequence[RequestMetrics],
                       waves: Sequence[Sequence[str]]) -> list[list[RequestMetrics]]:
    """The metrics of each wave's successful requests (``metrics``: the cell's, computed once; ``waves``: request
    ids per wave, in order); ids without metrics are skipped."""
    by_id = {m.request_id: m for m in metrics}
    out = []
    for ids in waves:
        out.append([by_id[i] for i in ids if i in by_id and by_id[i].ok])
    return out
