"""Prompt content and exact-length prompt building for bench.

bench measures prefill throughput and decode speed at given context depths, so it needs prompts
of an exact token count whose first tokens differ per request (no server prefix-cache reuse).

* :func:`text_stream` / :class:`TextStream` - unbounded deterministic text per ``(kind, seed)``
  for the kinds in :data:`KINDS`: ``prose``, ``code``, ``structured``, ``json``.
* :data:`INSTRUCTIONS` / :func:`instruction_for` - a decode task instruction per kind.
* :func:`unique_prefix` - per-request prefix, different from the first character on.
* :func:`build_prompt` -> :class:`Prompt` - prefix + body + instruction sized to a token target.
* Token counters live in :mod:`bench.server.tokenizer` (the server's ``/tokenize``, a calibrated estimator, an
  offline approximation): prompts know no HTTP.

See ``docs/prompts.md``.
"""

from bench.prompts.build import DEFAULT_CHARS_PER_TOKEN, Prompt, build_prompt, tolerance, unique_prefix
from bench.prompts.content import (
    CODE_MODULES,
    INSTRUCTIONS,
    KINDS,
    TextStream,
    instruction_for,
    stream_text,
    text_stream,
)

__all__ = [
    "KINDS",
    "INSTRUCTIONS",
    "CODE_MODULES",
    "DEFAULT_CHARS_PER_TOKEN",
    "instruction_for",
    "text_stream",
    "stream_text",
    "TextStream",
    "unique_prefix",
    "Prompt",
    "build_prompt",
    "tolerance",
]
