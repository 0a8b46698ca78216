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

from collections import Counter
from collections.abc import Sequence
from typing import Any

from .metrics import RequestMetrics, request_metrics
from .profile import Cell
from .records import RequestRecord
from .stats import summarize

__all__ = ["summarize_cell", "wave_aggregate_decode", "SAMPLE_KEYS", "OVERHEAD_FLAG_SHARE"]

OVERHEAD_FLAG_SHARE = 0.30
PROMPT_MISS_WARN_PCT = 2.0
SAMPLE_KEYS = ("decode_tok_s", "ttft_ms", "ttfc_ms", "tpot_ms", "e2e_ms", "itl_ms_p50", "prompt_tok_s",
               "prompt_tok_s_corrected", "server_prefill_tok_s", "server_decode_tok_s", "ttft_minus_server_prompt_ms")
SERVER_GAP_WARN_SHARE = 0.20


def wave_aggregate_decode(recs: Sequence[RequestRecord], ms: Sequence[RequestMetrics]) -> float | None:
    """Aggregate decode tok/s of one wave (definition above); None when the window is empty.

    Only successful requests count; times are absolute ``sent_ns + event t_ns`` on one clock.
    """
    firsts, lasts, toks = [], [], 0
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
) -> dict[str, Any]:
    """Summary dict of one cell (the ``cells[]`` entries of results.json; schema in docs/results.md).

    Args:
        cell: the cell.
        records: its measured records (warm-ups excluded), failures included.
        waves: request ids of each measured wave, in order.
        overhead_ms: the run's fixed per-request overhead (median TTFT of tiny prompts) or None.
        depth_target_tokens: the prompt tokens asked for (None for depth 0, the shortest prompt).
        expected_cached_tokens: cached tokens per request that are no surprise (the chat template's fixed header,
            which every chat request shares); more than this is warned about. None: no warning (prefix-cache runs).
    """
    ms = [request_metrics(r) for r in records]
    by_id = {r.request_id: (r, m) for r, m in zip(records, ms)}
    ok = [m for m in ms if m.ok]
    errors = Counter(m.error_kind or "unknown" for m in ms if not m.ok)
    warnings: list[str] = []

    agg = []
    for ids in waves:
        pairs = [by_id[i] for i in ids if i in by_id]
        a = wave_aggregate_decode([p[0] for p in pairs], [p[1] for p in pairs])
        if a is not None:
            agg.append(a)

    prompt_tok_s, corrected, server_pf, shares = [], [], [], []
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
    for m in ok:
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
    share = sorted(shares)[len(shares) // 2] if shares else None
    flag = share is not None and share > OVERHEAD_FLAG_SHARE
    if flag and cell.depth > 0:
        warnings.append(
            f"{cell.id}: fixed overhead is {share:.0%} of TTFT; prompt tok/s here mostly measures overhead"
        )

    if gap and cell.depth > 0:
        g = sorted(gap)[len(gap) // 2]
        tt = sorted(m.ttft_ms for m in ok if m.ttft_ms)
        t_med = tt[len(tt) // 2] if tt else None
        if t_med and g > SERVER_GAP_WARN_SHARE * t_med and g > 2 * (overhead_ms or 0):
            warnings.append(
                f"{cell.id}: {g:.0f} ms of the {t_med:.0f} ms TTFT is outside the server's own prompt timing "
                "(tokenizing, queueing, or a prompt-cache copy: llama.cpp's --cache-ram)"
            )

    miss = None
    if depth_target_tokens:
        pts = [m.prompt_tokens for m in ok if m.prompt_tokens]
        if pts:
            miss = max(abs(p - depth_target_tokens) / depth_target_tokens * 100 for p in pts)
            if miss > PROMPT_MISS_WARN_PCT:
                warnings.append(
                    f"{cell.id}: server counted prompts up to {miss:.1f} % away from {depth_target_tokens} tokens"
                )
    cached = sum(m.cached_tokens for m in ok)
    if expected_cached_tokens is not None:
        extra = [m.cached_tokens for m in ok if m.cached_tokens > expected_cached_tokens]
        if extra:
            warnings.append(
                f"{cell.id}: the server reports cached prompt tokens beyond the template header "
                f"({expected_cached_tokens}) in {len(extra)} request(s), up to {max(extra)}"
            )
    if any(m.output_tokens_estimated for m in ok):
        warnings.append(f"{cell.id}: the server sent no usage; output tokens are estimated")
    short = [m for m in ok if m.output_tokens < cell.max_tokens]
    if short:
        warnings.append(f"{cell.id}: {len(short)} request(s) stopped before max_tokens={cell.max_tokens}")
    if len(ok) < len(ms):
        warnings.append(f"{cell.id}: {len(ms) - len(ok)} of {len(ms)} requests failed ({dict(errors)})")

    itl_all = [x for m in ok for x in m.itl_ms]
    samples = {
        "decode_tok_s": [m.decode_tok_s for m in ok],
        "ttft_ms": [m.ttft_ms for m in ok],
        "ttfc_ms": [m.ttfc_ms for m in ok],
        "tpot_ms": [m.tpot_ms for m in ok],
        "e2e_ms": [m.e2e_ms for m in ok],
        "itl_ms_p50": [m.itl_ms_p50 for m in ok],
        "prompt_tok_s": prompt_tok_s,
        "prompt_tok_s_corrected": corrected,
        "server_prefill_tok_s": server_pf,
        "server_decode_tok_s": server_dec,
        "ttft_minus_server_prompt_ms": gap,
        "aggregate_decode_tok_s": agg,
    }
    samples = {k: [round(v, 4) for v in vs if v is not None] for k, vs in samples.items()}
    return {
        "id": cell.id,
        "sweep": cell.sweep,
        "depth": cell.depth,
        "streams": cell.streams,
        "prompt": cell.prompt,
        "max_tokens": cell.max_tokens,
        "requests_ok": len(ok),
        "requests_failed": len(ms) - len(ok),
        "errors": dict(errors),
        "waves": len(waves),
        "decode_tok_s": summarize(samples["decode_tok_s"]).to_dict(),
        "aggregate_decode_tok_s": summarize(agg).to_dict(),
        "ttft_ms": summarize(samples["ttft_ms"]).to_dict(),
        "ttfc_ms": summarize(samples["ttfc_ms"]).to_dict(),
        "itl_ms": summarize(itl_all).to_dict(),
        "tpot_ms": summarize(samples["tpot_ms"]).to_dict(),
        "e2e_ms": summarize(samples["e2e_ms"]).to_dict(),
        "prompt_tok_s": summarize(prompt_tok_s).to_dict(),
        "prompt_tok_s_corrected": summarize(corrected).to_dict(),
        "server_prefill_tok_s": summarize(server_pf).to_dict(),
        "server_decode_tok_s": summarize(server_dec).to_dict(),
        "ttft_minus_server_prompt_ms": summarize(gap).to_dict(),
        "overhead_ms": overhead_ms,
        "overhead_share": share,
        "overhead_flag": flag,
        "prompt_tokens": summarize([m.prompt_tokens for m in ok]).to_dict(),
        "prompt_target": depth_target_tokens,
        "prompt_miss_pct": miss,
        "output_tokens": summarize([m.output_tokens for m in ok]).to_dict(),
        "output_tokens_estimated": sum(1 for m in ok if m.output_tokens_estimated),
        "tokens_per_event": summarize([m.tokens_per_event for m in ok]).to_dict(),
        "cached_tokens": cached,
        "reasoning_tokens": sum(m.reasoning_tokens for m in ok),
        "queue_ms": summarize([m.queue_ms for m in ms]).to_dict(),
        "samples": samples,
        "warnings": warnings,
    }
