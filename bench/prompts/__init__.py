"""Prompt content and exact-length prompt building for bench.

bench measures prefill throughput and decode speed at given context depths, so it needs prompts
of an exact token count whose first tokens differ per request (no server prefix-cache reuse).

* :func:`text_stream` / :class:`TextStream` - unbounded deterministic text per ``(kind, seed)``
  for the kinds in :data:`KINDS`: ``prose``, ``code``, ``structured``, ``json``.
* :data:`INSTRUCTIONS` / :func:`instruction_for` - a decode task instruction per kind.
* :func:`unique_prefix` - per-request prefix, different from the first character on.
* :func:`build_prompt` -> :class:`Prompt` - prefix + body + instruction sized to a token target.
* Token counters: :class:`HttpTokenizer` (server ``/tokenize``), :class:`CalibratedTokenizer`
  (chars-per-token estimator), :class:`RegexTokenizer` (offline approximation).

See ``docs/prompts.md``.
"""

from .build import DEFAULT_CHARS_PER_TOKEN, Prompt, build_prompt, tolerance, unique_prefix
from .content import (
    CODE_MODULES,
    INSTRUCTIONS,
    KINDS,
    TextStream,
    instruction_for,
    stream_text,
    text_stream,
)
from .tokenizer import (
    CalibratedTokenizer,
    HttpTokenizer,
    RegexTokenizer,
    Tokenizer,
    TokenizerError,
    TokenizerUnavailable,
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
    "Tokenizer",
    "TokenizerError",
    "TokenizerUnavailable",
    "HttpTokenizer",
    "CalibratedTokenizer",
    "RegexTokenizer",
]
