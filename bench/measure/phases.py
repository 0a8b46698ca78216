"""The phases of one answer: reasoning, content and tool-call arguments, each with its own start and decode rate.

A thinking model streams reasoning first and the answer after it; a tool-calling one streams the call's arguments
instead of (or after) content. Each phase is measured apart (docs/metrics.md, "Phases"):

* each token-bearing event's tokens (:func:`bench.measure.tokens.event_token_counts`) are split between the phases
  whose text it carries, in proportion to each phase's estimated tokens in it (all of them to the one phase an
  event carries alone, the usual case);
* ``{phase}_tok_s = (tokens of the phase - those of its first event) / (its last event's time - its first's)``:
  the same rule as ``decode_tok_s``, over the phase's own events only; None with fewer than 2 of them;
* its start is the record's ``ttft_reasoning_ms`` / ``ttft_content_ms`` / ``ttft_tool_ms``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.measure.tokens import estimate_tokens
from bench.records import Event

__all__ = ["PHASES", "PhaseRates", "phase_rates", "phase_tokens"]

PHASES = ("reasoning", "content", "tool")


@dataclass(frozen=True, slots=True)
class PhaseRates:
    """Decode tok/s of each phase (None when it had fewer than 2 events) and its tokens."""

    reasoning_tok_s: float | None
    content_tok_s: float | None
    tool_tok_s: float | None
    tool_tokens: float


def phase_tokens(events: Sequence[Event], per_event: Sequence[float]) -> dict[str, list[float]]:
    """Per phase, the tokens each of ``events`` (token-bearing, in order) carried of it."""
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    for e, n in zip(events, per_event):
        texts = {p: getattr(e, p) for p in PHASES}
        present = [p for p in PHASES if texts[p]]
        if len(present) == 1:
            shares = {present[0]: 1.0}
        else:
            est = {p: float(estimate_tokens(texts[p])) for p in present}
            total = sum(est.values()) or 1.0
            shares = {p: est[p] / total for p in present}
        for p in PHASES:
            out[p].append(n * shares.get(p, 0.0))
    return out


def _rate(events: Sequence[Event], tokens: Sequence[float]) -> float | None:
    idx = [i for i, n in enumerate(tokens) if n > 0]
    if len(idx) < 2:
        return None
    span = (events[idx[-1]].t_ns - events[idx[0]].t_ns) / 1e9
    decoded = sum(tokens[i] for i in idx) - tokens[idx[0]]
    return decoded / span if span > 0 and decoded > 0 else None


def phase_rates(events: Sequence[Event], per_event: Sequence[float]) -> PhaseRates:
    """Each phase's decode rate over its own events (module docstring)."""
    toks = phase_tokens(events, per_event)
    return PhaseRates(_rate(events, toks["reasoning"]), _rate(events, toks["content"]), _rate(events, toks["tool"]),
                      sum(toks["tool"]))
