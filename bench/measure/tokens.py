"""Token accounting: output-token counts and how many tokens each event carried.

Counts come from the server whenever it gives them (``usage.completion_tokens``, else llama.cpp's
``timings.predicted_n``). Without either, bench estimates (and says so with ``output_tokens_estimated``): each
token-bearing event counts as the larger of 1 and the number of word/punctuation pieces in its text, a
GPT-2-style pre-tokenization that is close to the token count of English text and code, and exact for servers that
send one token per event (the common case without speculative decoding).

Tokens per event (needed to turn a gap between events into a per-token ITL) are: the server's own figure when it
reports one (``bench sim``); otherwise the per-event estimates, scaled so they sum to the server's total. This is
an estimate whenever a server packs several tokens per event; with one token per event it is exact.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bench.records import Event

__all__ = ["estimate_tokens", "event_token_counts"]

_PIECE = re.compile(r"\s?[A-Za-z]+|\s?\d{1,3}|\s?[^\sA-Za-z\d]+|\s+(?!\S)|\s+")


def estimate_tokens(text: str) -> int:
    """Estimated token count of ``text`` (pre-tokenization pieces; >= 1 for non-empty text, 0 for "")."""
    if not text:
        return 0
    return max(1, len(_PIECE.findall(text)))


def _event_text(e: Event) -> str:
    return e.content + e.reasoning + e.tool


def event_token_counts(events: Sequence[Event], total: int | None) -> list[float]:
    """Tokens carried by each token-bearing event.

    Args:
        events: token-bearing events only, in arrival order.
        total: the server's output-token count, or None.

    Returns:
        One float per event (>= 0). Sums to ``total`` when it is given and the server did not report per-event
        counts; otherwise to the estimated total.
    """
    if not events:
        return []
    if all(e.tokens is not None for e in events):
        return [float(e.tokens or 0) for e in events]
    est = [float(max(1, estimate_tokens(_event_text(e)))) for e in events]
    s = sum(est)
    if total is not None and total > 0 and s > 0 and abs(s - total) > 1e-9:
        f = total / s
        est = [x * f for x in est]
    return est
