"""Keeping the API key out of everything bench prints, logs, raises or writes.

One registry of secrets for the process: :class:`bench.client.ClientSettings` registers the API key the moment it
is read from the environment (:func:`add_secret`). What a server sends is redacted where it enters bench, before
anything parses or transforms it (:mod:`bench.client.border`: every response read whole, response headers; the
streamed text as its record). Every path out applies the registry as well, not chosen call sites:

* :class:`bench.errors.BenchError` redacts its message when it is made (every user-facing error);
* :class:`bench.records.RequestRecord` redacts its text when the client finishes it and again when it is
  serialised (``to_dict``: records.jsonl, worker transfers), the answer text included, across event boundaries;
* the terminal consoles of :mod:`bench.report.console` write through :class:`RedactingStream`;
* the ``bench`` logger (and ``-v``'s handler) carry :data:`LOG_FILTER`;
* the results exporters (:mod:`bench.report.export`) redact the text they write;
* an uncaught exception's traceback is printed redacted (:func:`install_excepthook`, from ``bench.cli.app.main``).

A key is found verbatim or in any letter case (a server that lower-cases an ``owned_by``), with any character
written as a JSON escape (``\\u0073``, ``\\/``) or a URL's ``%73``, split by whitespace (a wrapped line, a newline
inside a JSON string, written raw or as a ``\\n`` escape), and cut off at the end of a text (a body truncated in the middle of the key, 8 characters or
more). Replacement: ``***`` in free text; in a record's events, each character of the key becomes ``*`` so the
events keep their lengths (token estimates do not change).
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any

__all__ = ["add_secret", "secrets", "redact", "redact_obj", "find_spans", "mask_spans", "RedactingStream",
           "LOG_FILTER", "MASK", "install_excepthook"]

MASK = "***"
_MIN_LEN = 4  # shorter values are not treated as secrets (they would match ordinary text)
_MIN_TAIL = 8  # a text ending in this many leading characters of a key (or more) is a cut-off key
_GAP = r"(?:\s|\\+[nrt])*"  # what may split a key: whitespace, or a JSON escape of it (escaped again: JSON in JSON)

_patterns: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {}  # secret -> (plain, escaped): see find_spans


def add_secret(secret: str | None) -> None:
    """Register ``secret`` (the API key) for redaction everywhere in this process; no-op for ``None``/short."""
    if not secret or len(secret) < _MIN_LEN or secret in _patterns:
        return
    plain = re.compile(r"\s*".join(re.escape(c) for c in secret.lower()))
    escaped = re.compile(_GAP.join(_char(c) for c in secret), re.IGNORECASE)
    _patterns[secret] = (plain, escaped)


def _char(c: str) -> str:
    """One character of a key as a server may write it: itself (any letter case: a lower-cased ``owned_by``),
    a JSON ``\\uXXXX`` or backslash escape (escaped again when that JSON sits in a JSON string), or a URL's
    ``%XX``."""
    forms = [re.escape(c), r"\\+" + re.escape(c)]
    for x in sorted({c, c.lower(), c.upper()}):  # an escape of the character in the case it was changed to
        forms.append(rf"\\+u{ord(x):04x}")
        if ord(x) < 0x80:
            forms.append(f"%{ord(x):02x}")
    return "(?:" + "|".join(forms) + ")"


def secrets() -> list[str]:
    """The registered secrets (for tests and diagnostics; never print them)."""
    return list(_patterns)


def _register(extra: str | None) -> None:
    if extra:
        add_secret(extra)


def find_spans(text: str, extra: str | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of every occurrence of a registered secret in ``text`` (split or cut off), sorted."""
    _register(extra)
    if not _patterns or not text:
        return []
    low = text.lower()
    # the common case (no backslash, no %, lower() keeps every position): the lower-cased key, whitespace between
    # its characters, in the lower-cased text; else the full pattern (escapes, any case), a few times slower
    simple = len(low) == len(text) and "\\" not in text and "%" not in text
    spans: list[tuple[int, int]] = []
    for secret, (plain, escaped) in _patterns.items():
        spans += [m.span() for m in (plain.finditer(low) if simple else escaped.finditer(text))]
        tail = _tail_prefix(text, secret)
        if tail:
            spans.append((len(text) - tail, len(text)))
    spans.sort()
    return spans


def _tail_prefix(text: str, secret: str) -> int:
    """Length of the longest proper prefix of ``secret`` (>= 8 chars) that ``text`` ends with, else 0."""
    for k in range(len(secret) - 1, _MIN_TAIL - 1, -1):
        if text[-k:].lower() == secret[:k].lower():
            return k
    return 0


def redact(text: str, extra: str | None = None) -> str:
    """``text`` with every registered secret (and ``extra``, registered too) replaced by ``***``."""
    if not isinstance(text, str):
        return text
    spans = find_spans(text, extra)
    if not spans:
        return text
    out, pos = [], 0
    for a, b in spans:
        if b <= pos:
            continue
        out.append(text[pos:max(a, pos)])
        out.append(MASK)
        pos = b
    out.append(text[pos:])
    return "".join(out)


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, strings) with :func:`redact` applied to every string,
    keys included; other values are returned as they are. Returns ``obj`` itself when nothing needed a change."""
    if not _patterns:
        return obj
    return _walk(obj)


def _walk(obj: Any) -> Any:
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {_walk(k): _walk(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(v) for v in obj)
    return obj


def mask_spans(pieces: list[str]) -> list[str] | None:
    """``pieces`` (consecutive texts, e.g. the content of each event) with every secret found in their
    concatenation masked character by character (``*``), so a key spread over several pieces is caught and each
    piece keeps its length. None when nothing was found (the common case: no copy is made)."""
    if not _patterns:
        return None
    joined = "".join(pieces)
    spans = find_spans(joined)
    if not spans:
        return None
    chars = list(joined)
    for a, b in spans:
        for i in range(a, b):
            chars[i] = "*"
    out, pos = [], 0
    for p in pieces:
        out.append("".join(chars[pos:pos + len(p)]))
        pos += len(p)
    return out


class RedactingStream:
    """A text stream that redacts what is written, then writes it to ``target()`` (resolved on every write, so
    a replaced ``sys.stdout``/``sys.stderr`` is followed). Every other attribute is the target's."""

    def __init__(self, target: Callable[[], IO[str]]) -> None:
        self._target = target

    def write(self, s: str) -> int:
        self._target().write(redact(s))
        return len(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)

    @classmethod
    def stdout(cls) -> RedactingStream:
        """Redacting ``sys.stdout``."""
        return cls(lambda: sys.stdout)

    @classmethod
    def stderr(cls) -> RedactingStream:
        """Redacting ``sys.stderr``."""
        return cls(lambda: sys.stderr)


class _RedactFilter(logging.Filter):
    """Formats a log record's message and redacts it (arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _patterns:
            record.msg = redact(record.getMessage())
            record.args = ()
            if record.exc_info and not record.exc_text:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


LOG_FILTER = _RedactFilter()


def install_excepthook() -> None:
    """Make ``sys.excepthook`` print an uncaught exception's traceback redacted (idempotent)."""
    if getattr(sys.excepthook, "bench_redacting", False):
        return

    def hook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(redact("".join(traceback.format_exception(tp, value, tb))))

    hook.bench_redacting = True  # type: ignore[attr-defined]
    sys.excepthook = hook
