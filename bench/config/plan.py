"""The plan of requests: profile -> cells -> waves -> planned requests, and each request's JSON body (pure, no I/O).

A :class:`PlannedRequest` says everything about a request except its prompt's exact text, which needs the
server's tokenizer (:func:`bench.prompts.build_prompt`): the cell, the phase, its id, the prompt kind, target
length, seed and unique prefix, ``max_tokens``, and (open-loop modes) when it is scheduled. :func:`request_body` is
the one place a request body is made (``bench run``, ``gate``, ``ab``, ``probe``, ``replay`` and the load modes).

Rules kept here:
- every prompt starts with a unique prefix (:func:`bench.prompts.unique_prefix`) unless the profile asks for prefix
  caching on purpose, so no request shares a cached prefix with another beyond the chat template's header;
- output length is forced with ``min_tokens``/``ignore_eos`` beside ``max_tokens`` while the server accepts them;
- thinking is off for chat unless asked (``chat_template_kwargs: {enable_thinking: false}``); temperature 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.config.profile import Cell, Profile
from bench.prompts import unique_prefix

__all__ = ["BodyOptions", "PlannedRequest", "Planner", "request_body", "planned_waves", "WARMUP_MAX_TOKENS"]

WARMUP_MAX_TOKENS = 8
PHASES = ("calibration", "overhead", "warmup", "prime", "measure")


@dataclass(frozen=True)
class BodyOptions:
    """What shapes a request body besides its prompt: the endpoint and the capabilities the server accepted."""

    endpoint: str = "chat"
    temperature: float = 0.0
    thinking: bool = False
    force_length: bool = True
    template_kwargs: bool = True
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None


def user_content(text: str, image_urls: Sequence[str] = ()) -> str | list[dict[str, Any]]:
    """A user message's content: the text, or (with images) a text part followed by one ``image_url`` part each."""
    if not image_urls:
        return text
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": u}} for u in image_urls)]


def request_body(opts: BodyOptions, text: str, max_tokens: int, *, image_urls: Sequence[str] = (),
                 history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The JSON body for a prompt (endpoint, max_tokens, temperature, length forcing, thinking, tools). Chat:
    ``history`` (earlier messages: system, user and assistant turns) then the user message of ``text`` and
    ``image_urls``."""
    if opts.endpoint == "chat":
        b: dict[str, Any] = {"messages": [*history, {"role": "user", "content": user_content(text, image_urls)}]}
        if not opts.thinking and opts.template_kwargs:
            b["chat_template_kwargs"] = {"enable_thinking": False}
        if opts.tools:
            b["tools"] = list(opts.tools)
            if opts.tool_choice is not None:
                b["tool_choice"] = opts.tool_choice
    else:
        b = {"prompt": text}
    b["max_tokens"] = max_tokens
    b["temperature"] = opts.temperature
    if opts.force_length:
        b["min_tokens"] = max_tokens
        b["ignore_eos"] = True
    return b


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the plan.

    Attributes:
        request_id: unique in the run: ``<run id>-<phase>-<n>``.
        phase: calibration, overhead, warmup, prime or measure.
        kind: prompt type (prose, code, structured, json).
        target_tokens: prompt length asked for (0: the shortest prompt).
        seed: content seed (different requests read different text).
        prefix: the unique prefix the prompt starts with ('' for prefix-cache runs: their requests, and the
            priming one, share one prompt: seed 0).
        max_tokens: output tokens asked for.
        meta: what the record carries: cell, stream, phase, wave, target_tokens.
        scheduled_ns: open-loop modes: when it is due (absolute ``perf_counter_ns``); None for waves.
        images: images the request carries (chat), each ``image_wh`` pixels.
        thinking: the cell's thinking switch (None: the profile's).
    """

    request_id: str
    phase: str
    kind: str
    target_tokens: int
    seed: int
    prefix: str
    max_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)
    scheduled_ns: int | None = None
    images: int = 0
    image_wh: tuple[int, int] = (0, 0)
    thinking: bool | None = None


def planned_waves(profile: Profile, cell: Cell) -> int:
    """Waves a cell runs at least: enough for ``requests`` and ``min_waves``."""
    return max(profile.min_waves, math.ceil(cell.requests / cell.streams))


class Planner:
    """Makes the run's planned requests with ids unique in the run (the only state: a counter)."""

    def __init__(self, run_id: str, profile: Profile) -> None:
        self.run_id = run_id
        self.profile = profile
        self._counter: Iterator[int] = itertools.count()

    def next_id(self, phase: str) -> tuple[str, int]:
        """A new request id for ``phase`` and its run-wide index."""
        i = next(self._counter)
        return f"{self.run_id}-{phase}-{i:05d}", i

    def probe(self, phase: str, n: int, text_seed: int) -> tuple[str, str]:
        """Id and unique prefix of a set-up probe (overhead, calibration): seeds far from the cells' seeds."""
        rid, _ = self.next_id(phase)
        return rid, unique_prefix(self.run_id, text_seed + n)

    def wave(self, cell: Cell, phase: str, wave_no: int, *, depth: int | None = None, n: int | None = None,
             max_tokens: int | None = None) -> list[PlannedRequest]:
        """One wave of ``cell``: ``n`` (default ``cell.streams``) requests at ``depth`` (default the cell's)."""
        depth = cell.depth if depth is None else depth
        out = []
        for k in range(cell.streams if n is None else n):
            rid, idx = self.next_id(phase)
            # prefix_cache: one prompt for every request of the cell, the one the priming request warms (seed 0 at
            # every stream; a seed per stream gave streams 1.. prompts of their own, measured cold)
            shared = self.profile.prefix_cache
            prefix, seed = ("", 0) if shared else (unique_prefix(self.run_id, idx), idx)
            meta = {"cell": cell.id, "stream": k, "phase": phase, "target_tokens": depth, "wave": wave_no}
            out.append(PlannedRequest(rid, phase, cell.prompt, depth, seed, prefix,
                                      cell.max_tokens if max_tokens is None else max_tokens, meta,
                                      images=cell.images, image_wh=cell.image_wh, thinking=cell.thinking))
        return out
