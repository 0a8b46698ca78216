"""The ``sessions`` mode: multi-turn conversations, the workload where prefix caching matters (docs/load.md).

``users`` conversations start ``stagger_s`` apart; each has ``turns`` turns. A turn's prompt is the whole history
(the conversation's unique prefix, every earlier user message and answer) followed by a new user message of
``user_tokens`` tokens, sent as one user message; the next turn is due ``think_s`` after the answer ended. So a
server with a prefix cache can reuse everything before the new message. User messages are built before the run
starts; each turn's scheduled time is kept in its record (``scheduled_ns``: when the turn was due).

Per turn index the point reports requests, median prompt and cached tokens, the cached share and the median TTFT
(:func:`turn_summary`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

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
        history = unique_prefix(session.run_id, first_index + u)
        due = t0 + round(u * stagger_s * 1e9)
        for t, msg in enumerate(messages[u]):
            wait = (due - time.perf_counter_ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            text = f"{history}\n\nUser: {msg}"
            rec = await session.send(text, max_tokens, tag, {"phase": tag, "user": u, "turn": t})
            rec.scheduled_ns = due
            session.write(rec)
            out.append(rec)
            answer = "".join(e.content for e in rec.events)
            history = f"{text}\n\nAssistant:{answer}"
            due = rec.sent_ns + (rec.end_ns or 0) + round(think_s * 1e9)

    await asyncio.gather(*(user(u) for u in range(len(messages))))
    return out


def turn_summary(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Per turn index: ``turn``, ``requests``, ``failed``, ``prompt_tokens_p50``, ``cached_tokens_p50``,
    ``cached_share`` (cached / prompt tokens, summed) and ``ttft_ms_p50``."""
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
        rows.append({"turn": t, "requests": len(ms), "failed": len(ms) - len(ok),
                     "prompt_tokens_p50": float(np.median(prompt)) if prompt else None,
                     "cached_tokens_p50": float(np.median(cached)) if cached else None,
                     "cached_share": round(sum(cached) / sum(prompt), 4) if sum(prompt) else None,
                     "ttft_ms_p50": round(float(np.median(ttft)), 3) if ttft else None})
    return rows
