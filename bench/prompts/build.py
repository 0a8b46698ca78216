"""Exact-length prompt building and per-request unique prefixes."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from bench.prompts.content import INSTRUCTIONS, TextStream, _check_kind

__all__ = ["Prompt", "build_prompt", "unique_prefix", "tolerance", "DEFAULT_CHARS_PER_TOKEN"]

#: First-guess characters per token by kind (typical of BPE vocabularies around 32k-150k
#: entries). Only the starting point of the search; a tokenizer with a ``chars_per_token``
#: attribute overrides it.
DEFAULT_CHARS_PER_TOKEN: dict[str, float] = {
    "prose": 4.3,
    "code": 3.4,
    "structured": 3.0,
    "json": 2.9,
}

_SNAP_WINDOW = 48  # look back at most this many characters for a whitespace cut point
_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # 32 symbols, no 0/1/l/o look-alikes
_CODE_BITS = 25  # 5 symbols x 5 bits
PREFIX_SHARED_TOKENS_MAX = 4
"""Tokens two unique prefixes of a run can share at most (the code's first 4 symbols; the 5th always differs as a
whole code never repeats): cached tokens up to the template header plus this many are no sign of a warm cache."""
_MIX = 0x9E3779B1  # odd: index -> index * _MIX mod 2**25 is a bijection


@dataclass(frozen=True)
class Prompt:
    """A built prompt.

    Attributes:
        text: the full prompt text: ``prefix + body + "\\n\\n" + instruction`` (parts omitted
            when empty).
        kind: content kind (``"prose"``, ``"code"``, ``"structured"``, ``"json"``).
        target_tokens: the requested size in tokens, including ``overhead_tokens``.
        counted_tokens: the tokenizer's count of ``text`` alone (without the overhead), or
            ``None`` when built without a tokenizer.
        seed: the content stream seed.
        overhead_tokens: the per-request overhead (chat template, BOS) that was subtracted.
        tokenizer_calls: number of ``count`` calls spent building it.
    """

    text: str
    kind: str
    target_tokens: int
    counted_tokens: int | None
    seed: int
    overhead_tokens: int = 0
    tokenizer_calls: int = 0

    @property
    def expected_prompt_tokens(self) -> int | None:
        """``counted_tokens + overhead_tokens``: what ``usage.prompt_tokens`` should report."""
        if self.counted_tokens is None:
            return None
        return self.counted_tokens + self.overhead_tokens


def tolerance(target_tokens: int) -> int:
    """Accepted error in tokens for a target: ``max(2, ceil(0.5% of target))``."""
    return max(2, math.ceil(0.005 * max(0, int(target_tokens))))


def unique_prefix(run_id: str, index: int) -> str:
    """Return the short text that begins request ``index`` of run ``run_id``.

    Shape: ``"<code> [req <run-tag>-<index>] "``, e.g. ``"i9c3c [req 2485f2-0017] "``, about
    10-15 tokens. ``<code>`` is 5 characters from a 32-symbol alphabet encoding
    ``(index * odd_constant + hash(run_id)) mod 2**25`` low bits first, so:

    * within a run, indexes below 2**25 get pairwise different codes (a bijection), and any two
      indexes that differ by an odd number - consecutive requests in particular - differ at
      the very first character;
    * different runs get different offsets and run tags.

    No server prefix cache can therefore reuse more than a character or two between requests.
    Deterministic: same ``(run_id, index)`` -> same string. Raises ``ValueError`` for a
    negative index.
    """
    index = int(index)
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    digest = hashlib.sha256(str(run_id).encode("utf-8")).digest()
    offset = int.from_bytes(digest[:4], "big")
    x = (index * _MIX + offset) % (1 << _CODE_BITS)
    code = "".join(_ALPHABET[(x >> (5 * i)) & 31] for i in range(_CODE_BITS // 5))
    return f"{code} [req {digest[4:7].hex()}-{index:04d}] "


def _cut(stream: TextStream, n: int, snap: bool) -> tuple[int, str]:
    """First ``n`` characters of ``stream``, ending at a whitespace boundary when ``snap``.

    Returns ``(cut_position, body)``; ``body`` has trailing whitespace removed.
    """
    n = max(0, int(n))
    if n == 0:
        return 0, ""
    raw = stream.take(n + 1)
    pos = n
    if snap and not raw[n : n + 1].isspace():
        lo = max(0, n - _SNAP_WINDOW)
        for i in range(n - 1, lo - 1, -1):
            if raw[i].isspace():
                pos = i
                break
    return pos, raw[:pos].rstrip()


def _compose(prefix: str, body: str, instr: str) -> str:
    if body and instr:
        return f"{prefix}{body}\n\n{instr}"
    return f"{prefix}{body}{instr}"


async def build_prompt(
    kind: str,
    target_tokens: int,
    *,
    seed: int,
    prefix: str = "",
    instruction: bool | str = True,
    tokenizer: Any | None,
    overhead_tokens: int = 0,
    max_calls: int = 8,
) -> Prompt:
    """Build a prompt of ``target_tokens`` tokens from the ``(kind, seed)`` content stream.

    Args:
        kind: ``"prose"``, ``"code"``, ``"structured"`` or ``"json"``.
        target_tokens: wanted prompt size in tokens as the server will see it (the context depth).
        seed: content stream seed; use a different seed per request of a wave.
        prefix: text that begins the prompt, normally :func:`unique_prefix` ``(run_id, i)``.
        instruction: ``True`` appends the kind's task instruction, ``False`` nothing, a ``str`` is used as it.
        tokenizer: ``async count(text) -> int`` (:mod:`bench.server.tokenizer`); ``None`` sizes by the default
            characters-per-token ratio (``counted_tokens`` None).
        overhead_tokens: tokens the request path adds (chat template, BOS): ``usage.prompt_tokens - count(text)``.
        max_calls: cap on ``tokenizer.count`` calls (>= 2).

    Returns:
        A :class:`Prompt`. With an exact tokenizer (``tokenizer.exact`` true or absent) the counted size is within
        :func:`tolerance` ``(target_tokens - overhead_tokens)`` of the text target in all but pathological cases
        (the closest candidate within ``max_calls``; :class:`_LengthSearch` says how). With an estimator (``exact``
        false) the ratio is used once. A target not above prefix + instruction gives that shortest prompt.
    """
    _check_kind(kind)
    if isinstance(instruction, str):
        instr = instruction.strip()
    else:
        instr = INSTRUCTIONS[kind] if instruction else ""
    target = int(target_tokens) - int(overhead_tokens)
    stream = TextStream(kind, seed)
    cpt0 = float(getattr(tokenizer, "chars_per_token", 0) or DEFAULT_CHARS_PER_TOKEN[kind])

    def result(text: str, counted: int | None, calls: int) -> Prompt:
        return Prompt(text=text, kind=kind, target_tokens=int(target_tokens), counted_tokens=counted,
                      seed=int(seed), overhead_tokens=int(overhead_tokens), tokenizer_calls=calls)

    base_text = _compose(prefix, "", instr)
    if tokenizer is None:
        base = math.ceil(len(base_text) / cpt0)
        if target <= base:
            return result(base_text, None, 0)
        _, body = _cut(stream, round((target - base) * cpt0), True)
        return result(_compose(prefix, body, instr), None, 0)
    base = await tokenizer.count(base_text)
    if target <= base:
        return result(base_text, base, 1)
    if not getattr(tokenizer, "exact", True):
        _, body = _cut(stream, round((target - base) * cpt0), True)
        text = _compose(prefix, body, instr)
        return result(text, await tokenizer.count(text), 2)
    search = _LengthSearch(stream, prefix, instr, target, base, cpt0)
    text, count, calls = await search.run(tokenizer, max(2, int(max_calls)))
    return result(text, count, calls)


class _LengthSearch:
    """Find the body length whose prompt counts ``target`` tokens: secant steps inside a bracket, else bisection."""

    def __init__(self, stream: TextStream, prefix: str, instr: str, target: int, base: int, cpt0: float) -> None:
        self.stream, self.prefix, self.instr = stream, prefix, instr
        self.target, self.base, self.cpt0 = target, base, cpt0
        self.best = (target - base, _compose(prefix, "", instr), base)  # (error, text, count)
        self.lo_n, self.lo_c = 0, base  # largest cut known to be short of the target
        self.hi_n: int | None = None  # smallest cut known to overshoot
        self.hi_c = 0

    def _cut_at(self, n_guess: float) -> tuple[int, str]:
        want = int(round(n_guess))
        want = min(max(want, self.lo_n + 1), self.hi_n - 1) if self.hi_n is not None else max(want, self.lo_n + 1)
        pos, body = _cut(self.stream, want, True)
        if pos <= self.lo_n or (self.hi_n is not None and pos >= self.hi_n):
            pos, body = _cut(self.stream, want, False)  # snapping gives no progress: cut mid-word
        return pos, _compose(self.prefix, body, self.instr)

    def _next_guess(self) -> float:
        lo_n, lo_c, hi_n, hi_c, target = self.lo_n, self.lo_c, self.hi_n, self.hi_c, self.target
        if hi_n is None:  # extrapolate with the ratio measured from the base point
            ratio = lo_n / (lo_c - self.base) if lo_c > self.base else 2 * self.cpt0
            return lo_n + (target - lo_c) * ratio
        guess = lo_n + (target - lo_c) * (hi_n - lo_n) / (hi_c - lo_c) if hi_c > lo_c else (lo_n + hi_n) / 2
        return guess if lo_n < round(guess) < hi_n else (lo_n + hi_n) / 2

    async def run(self, tokenizer: Any, max_calls: int) -> tuple[str, int, int]:
        """Returns ``(text, counted tokens, tokenizer calls)`` of the closest prompt found."""
        calls, tol = 1, tolerance(self.target)
        n_guess = (self.target - self.base) * self.cpt0
        while calls < max_calls:
            pos, text = self._cut_at(n_guess)
            c = await tokenizer.count(text)
            calls += 1
            err = abs(c - self.target)
            if err < self.best[0] or (err == self.best[0] and c <= self.target < self.best[2]):
                self.best = (err, text, c)
            if err <= tol:
                break
            if c < self.target:
                if pos > self.lo_n:
                    self.lo_n, self.lo_c = pos, c
            elif self.hi_n is None or pos < self.hi_n:
                self.hi_n, self.hi_c = pos, c
            if self.hi_n is not None and self.hi_n - self.lo_n <= 1:
                break
            n_guess = self._next_guess()
        return self.best[1], self.best[2], calls
