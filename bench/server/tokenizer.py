"""Token counters used to size prompts.

A tokenizer here is any object with ``async def count(text: str) -> int`` (the number of tokens
in ``text`` alone: no chat template, no special tokens added by the request path) and an optional
boolean attribute ``exact`` (default ``True``). ``exact = False`` marks an estimator:
:func:`bench.prompts.build_prompt` then sizes a prompt from one ratio computation instead of
searching.

Implementations:

* :class:`HttpTokenizer` - the server's own ``/tokenize`` endpoint (llama.cpp or vLLM/SGLang form).
* :class:`CalibratedTokenizer` - ``len(text) / chars_per_token``, the ratio learned from probe
  requests' ``usage.prompt_tokens``.
* :class:`RegexTokenizer` - a local approximation (one token per word or punctuation mark), for
  offline use and tests.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import httpx

from bench.errors import TokenizerError, TokenizerUnavailable

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "TokenizerUnavailable",
    "HttpTokenizer",
    "CalibratedTokenizer",
    "RegexTokenizer",
]


@runtime_checkable
class Tokenizer(Protocol):
    """Protocol: ``await count(text)`` returns the token count (``int`` >= 0) of ``text``."""

    async def count(self, text: str) -> int:  # pragma: no cover - protocol
        ...


def _server_root(url: str) -> str:
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root


class HttpTokenizer:
    """Count tokens with the server's ``POST {root}/tokenize`` endpoint.

    Two request forms are tried, in order, and the first that works is remembered:

    * llama.cpp: ``{"content": text}`` -> ``{"tokens": [int, ...]}``
    * vLLM / SGLang: ``{"prompt": text, "model": model}`` -> ``{"tokens": [...], "count": n}``

    ``root_url`` is the server root; a trailing ``/v1`` (an OpenAI base URL) is stripped. Counts
    are whatever the server reports for the bare text: llama.cpp adds no BOS by default while
    vLLM does, a constant difference that the caller's ``overhead_tokens`` absorbs.

    Failures after the first success raise :class:`~bench.errors.TokenizerError` with one redacted line (status
    and the server's message, or the network error), never an httpx exception; :meth:`fallback` then gives an
    estimator calibrated on the counts that succeeded, so the caller can go on.

    Args:
        client: an open ``httpx.AsyncClient`` (its timeouts and headers apply: with
            :func:`bench.client.make_http_client`, the bounded ``setup_timeout_s``).
        root_url: server root such as ``"http://127.0.0.1:8080"``.
        model: model name for the vLLM form; omitted from the body when ``None``.
    """

    exact = True

    def __init__(self, client: httpx.AsyncClient, root_url: str, model: str | None = None) -> None:
        self.client = client
        self.root_url = _server_root(root_url)
        self.model = model
        self.form: str | None = None  # "llama" | "vllm" once detected
        self.calls = 0  # number of HTTP requests made (for diagnostics)
        self.samples: list[tuple[int, int]] = []  # (characters, tokens) of the longest successful counts
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        """The ``/tokenize`` URL used (``str``)."""
        return f"{self.root_url}/tokenize"

    def _body(self, form: str, text: str) -> dict[str, Any]:
        if form == "llama":
            return {"content": text}
        body: dict[str, Any] = {"prompt": text}
        if self.model is not None:
            body["model"] = self.model
        return body

    @staticmethod
    def _parse(data: Any) -> int | None:
        if not isinstance(data, dict):
            return None
        count = data.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        tokens = data.get("tokens")
        if isinstance(tokens, list):
            return len(tokens)
        return None

    async def _try(self, form: str, text: str) -> int | None:
        try:
            return await self._post(form, text)
        except TokenizerError:
            return None

    async def _post(self, form: str, text: str) -> int:
        """One ``POST /tokenize``; raises :class:`TokenizerError` (one redacted line) for any failure."""
        from bench.client import error_from_body, exc_line

        self.calls += 1
        try:
            resp = await self.client.post(self.url, json=self._body(form, text))
        except httpx.HTTPError as exc:
            raise TokenizerError(f"POST {self.url} failed: {exc_line(exc)}") from None
        if resp.status_code != 200:
            msg = error_from_body(resp.status_code, resp.headers.get("content-type", ""), resp.content)
            raise TokenizerError(f"POST {self.url}: {msg}")
        try:
            n = self._parse(resp.json())
        except (ValueError, RecursionError):
            n = None
        if n is None:
            raise TokenizerError(f"POST {self.url}: reply has no 'tokens' list or 'count'")
        self._remember(len(text), n)
        return n

    def _remember(self, chars: int, tokens: int) -> None:
        if chars > 0 and tokens > 0:
            self.samples.append((chars, tokens))
            if len(self.samples) > 64:
                self.samples.sort(reverse=True)
                del self.samples[32:]  # keep the longest: they calibrate best

    def fallback(self) -> CalibratedTokenizer | None:
        """An estimator calibrated on the counts this tokenizer got right (``sum chars / sum tokens``), for a
        caller whose ``/tokenize`` failed mid-run; None before any success."""
        chars = sum(c for c, _ in self.samples)
        tokens = sum(t for _, t in self.samples)
        if chars <= 0 or tokens <= 0:
            return None
        return CalibratedTokenizer(chars / tokens)

    async def _detect(self, text: str) -> int:
        async with self._lock:
            if self.form is not None:
                return await self._count_known(text)
            for form in ("llama", "vllm"):
                n = await self._try(form, text)
                if n is not None:
                    self.form = form
                    return n
        raise TokenizerUnavailable(f"no usable tokenize endpoint at {self.url}")

    async def _count_known(self, text: str) -> int:
        assert self.form is not None
        return await self._post(self.form, text)

    async def count(self, text: str) -> int:
        """Return the server's token count (``int``) for ``text``.

        The first call detects the request form. Raises :class:`TokenizerUnavailable` if neither
        form works, :class:`TokenizerError` on a later failure.
        """
        if self.form is None:
            return await self._detect(text)
        return await self._count_known(text)

    async def available(self) -> bool:
        """Probe the endpoint with a short text; ``True`` if a form works (it is remembered)."""
        if self.form is not None:
            return True
        try:
            await self._detect("Hello, world.")
        except TokenizerError:
            return False
        return True


class CalibratedTokenizer:
    """Estimate token counts as ``round(len(text) / chars_per_token)``.

    For servers without ``/tokenize``: the ratio comes from probe requests whose
    ``usage.prompt_tokens`` is known (see :meth:`calibrate`). ``exact`` is ``False``, so prompt
    building uses the ratio once instead of searching.

    Args:
        chars_per_token: characters per token (``float`` > 0), e.g. ``4.0`` for English prose.
    """

    exact = False

    def __init__(self, chars_per_token: float) -> None:
        cpt = float(chars_per_token)
        if not math.isfinite(cpt) or cpt <= 0:
            raise ValueError(f"chars_per_token must be a positive finite number, got {chars_per_token!r}")
        self.chars_per_token = cpt

    def __repr__(self) -> str:
        return f"CalibratedTokenizer(chars_per_token={self.chars_per_token:.4f})"

    def count_sync(self, text: str) -> int:
        """Synchronous :meth:`count`."""
        if not text:
            return 0
        return max(1, round(len(text) / self.chars_per_token))

    async def count(self, text: str) -> int:
        """Return the estimated token count (``int``; 0 for empty text, else at least 1)."""
        return self.count_sync(text)

    @classmethod
    def calibrate(
        cls, samples: Iterable[tuple[str, int]], *, overhead_tokens: int = 0
    ) -> CalibratedTokenizer:
        """Learn the ratio from ``(text, prompt_tokens)`` pairs.

        ``prompt_tokens`` is the server's ``usage.prompt_tokens`` for a request whose prompt text
        was ``text``; ``overhead_tokens`` (chat template, BOS) is subtracted from each sample.
        The ratio is ``sum(len(text)) / sum(prompt_tokens - overhead_tokens)`` (longer probes
        weigh more). Raises ``ValueError`` if there are no samples or no tokens left.
        """
        chars = 0
        tokens = 0
        n = 0
        for text, prompt_tokens in samples:
            chars += len(text)
            tokens += int(prompt_tokens) - int(overhead_tokens)
            n += 1
        if n == 0:
            raise ValueError("calibrate() needs at least one (text, prompt_tokens) sample")
        if tokens <= 0 or chars <= 0:
            raise ValueError(f"cannot calibrate from {chars} chars and {tokens} tokens")
        return cls(chars / tokens)

    @classmethod
    def from_probe(cls, text: str, prompt_tokens: int, *, overhead_tokens: int = 0) -> CalibratedTokenizer:
        """Calibrate from one probe: ``len(text) / (prompt_tokens - overhead_tokens)``."""
        return cls.calibrate([(text, prompt_tokens)], overhead_tokens=overhead_tokens)


class RegexTokenizer:
    """Local approximation: one token per ``\\w+`` run or per non-space punctuation character.

    Deterministic and fast; no model needed. ``exact`` is ``True`` in the sense that its own
    counts are the ground truth for itself, so prompt building searches against it (tests use
    it to check the length search). Real BPE counts differ.
    """

    exact = True
    PATTERN = re.compile(r"\w+|[^\w\s]")

    def count_sync(self, text: str) -> int:
        """Synchronous :meth:`count`."""
        return len(self.PATTERN.findall(text))

    async def count(self, text: str) -> int:
        """Return the number of word runs plus punctuation characters in ``text`` (``int``)."""
        return self.count_sync(text)
