"""The ``sessions`` mode: multi-turn conversations, the workload where prefix caching matters (docs/load.md).

``users`` conversations start ``stagger_s`` apart; each has ``turns`` turns. Each turn is sent as a real chat
``messages`` list, as a chat client sends it: a system message (the conversation's unique prefix), then every earlier
user message and the assistant's answer to it (the content the server streamed back, and its tool calls, each
followed by a ``tool`` message with a fixed result, as an agent sends them), then the new user message of
``user_tokens`` tokens; the next turn is due ``think_s`` after the answer ended. So a server with a prefix cache can
reuse everything before the new message, through its own chat template. User messages are built before the run
starts; each turn's scheduled time is kept in its record (``scheduled_ns``: when the turn was due). On the
completions endpoint (no messages) the history is one prompt text, as before.

Per turn index the point reports requests, median prompt, cached and new (uncached) tokens, the cached share, the
median TTFT and the prefill rate of the new tokens only, ``(prompt - cached) / TTFT`` (:func:`turn_summary`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.config.tools import assistant_turn
from bench.measure.metrics import request_metrics
from bench.prompts import unique_prefix
from bench.records import RequestRecord

if TYPE_CHECKING:
    from bench.session.endpoint import Session

__all__ = ["run_sessions", "turn_summary"]


async def run_sessions(session: Session, messages: Sequence[Sequence[str]], *, max_tokens: int, think_s: float,
                       stagger_s: float, tag: str, first_index: int = 0) -> list[RequestRecord]:
    """Run the conversations (``messages[u][t]``: user u's message of turn t); returns every turn's record."""
    out: list[RequestRecord] = []
    t0 = time.perf_counter_ns() + 200_000_000

    async def user(u: int) -> None:
        prefix = unique_prefix(session.run_id, first_index + u)
        history: list[dict[str, Any]] = [{"role": "system", "content": prefix}]
        flat = prefix
        chat = session.profile.endpoint == "chat"
        due = t0 + round(u * stagger_s * 1e9)
        for t, msg in enumerate(messages[u]):
            wait = (due - time.perf_counter_ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            meta = {"phase": tag, "user": u, "turn": t}
            if chat:
                rec = await session.send(msg, max_tokens, tag, meta, history=history)
            else:
                rec = await session.send(f"{flat}\n\nUser: {msg}", max_tokens, tag, meta)
            rec.scheduled_ns = due
            session.write(rec)
            out.append(rec)
            answer = "".join(e.content for e in rec.events)
            history = [*history, {"role": "user", "content": msg}, *assistant_turn(answer, rec.tool_calls)]
            flat = f"{flat}\n\nUser: {msg}\n\nAssistant:{answer}"
            due = rec.sent_ns + (rec.end_ns or 0) + round(think_s * 1e9)

    await asyncio.gather(*(user(u) for u in range(len(messages))))
    return out


def turn_summary(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Per turn index: ``turn``, ``requests``, ``failed``, ``prompt_tokens_p50``, ``cached_tokens_p50``,
    ``new_tokens_p50`` (prompt - cached), ``cached_share`` (cached / prompt tokens, summed), ``ttft_ms_p50`` and
    ``prefill_new_tok_s_p50`` (per request (prompt - cached) / TTFT: the prefill of the new tokens only)."""
    by: dict[int, list[RequestRecord]] = {}
    for r in records:
        by.setdefault(int(r.meta.get("turn", 0)), []).append(r)
    rows = []
    for t in sorted(by):
        ms = [request_metrics(r) for r in by[t]]
        ok = [m for m in ms if m.ok]
        prompt = [m.prompt_tokens or 0 for m in ok]
        cached = [m.cached_tokens for m in ok]
        ttft = [m.ttft_ms for m in ok if m.ttft_ms is not None]
        new = [p - c for p, c in zip(prompt, cached)]
        rates = [((m.prompt_tokens or 0) - m.cached_tokens) / (m.ttft_ms / 1000) for m in ok
                 if m.ttft_ms and m.prompt_tokens]
        rows.append({"turn": t, "requests": len(ms), "failed": len(ms) - len(ok),
                     "prompt_tokens_p50": _p50(prompt), "cached_tokens_p50": _p50(cached),
                     "new_tokens_p50": _p50(new),
                     "cached_share": round(sum(cached) / sum(prompt), 4) if sum(prompt) else None,
                     "ttft_ms_p50": round(float(np.median(ttft)), 3) if ttft else None,
                     "prefill_new_tok_s_p50": round(float(np.median(rates)), 1) if rates else None})
    return rows


def _p50(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None
