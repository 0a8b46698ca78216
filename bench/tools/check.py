"""``bench check URL``: what an endpoint actually does with the streaming behaviours that break benchmark numbers.

A handful of short requests (a few seconds in all), each read through bench's normal client with its raw bytes
teed (:mod:`bench.tools.record`), answer: where usage comes (``include_usage``: at the end, on every chunk, never),
whether ``min_tokens``/``ignore_eos`` are honoured, tokens per event (speculative decoding packs several), a
role-only first chunk, reasoning fields and their names, tool-call streaming, ``/tokenize``, ``/metrics`` (which
of bench's quantities), the context size, prefix caching (the same prompt twice -> cached tokens), whether the
response stays open after ``[DONE]``, SSE keep-alive comments, and the chat template's prompt overhead. Each
finding comes with what bench does about it (docs/check.md). :func:`check_endpoint` returns the JSON report;
:func:`report_rows` the table rows.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from dataclasses import replace
from typing import Any

import httpx

from bench.client import KEY_REFUSED, ClientSettings, ImageSet, RequestSpec, discover_model
from bench.client.border import admit
from bench.errors import TokenizerError
from bench.measure.metrics import request_metrics
from bench.records import RequestRecord
from bench.server.info import discover_server
from bench.server.metrics import available_keys, detect_metrics, parse_page
from bench.server.tokenizer import HttpTokenizer
from bench.tools.record import Capture, capture, tee_client
from bench.transport.sse import SSEDecoder

__all__ = ["check_endpoint", "report_rows", "analyze_stream", "failure_line", "OPEN_AFTER_DONE_MS"]

CHECK_READ_TIMEOUT_S = 15.0
OPEN_AFTER_DONE_MS = 250.0  # a response still open this long after [DONE] "keeps open"
LINGER_PROBE_S = 1.0  # how long the linger probe waits for the body to end after [DONE]


async def _drain(it: Any, into: bytearray) -> None:
    async for chunk in it:
        into += chunk
MIN_TOKENS_ASKED = 48
_COMMENT = re.compile(rb"(?:^|\n):")
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _json_events(reads: list[tuple[int, bytes]]) -> list[tuple[int, Any]]:
    """``(arrival ns, parsed JSON or the string "[DONE]")`` of each data event in teed reads."""
    dec = SSEDecoder()
    out: list[tuple[int, Any]] = []
    for t, b in reads:
        for ev in dec.feed(b, t):
            data = ev.data.strip()
            if not data:
                continue
            if data == "[DONE]":
                out.append((ev.t_ns, "[DONE]"))
                continue
            try:
                out.append((ev.t_ns, json.loads(data)))
            except ValueError:
                continue
    return out


def _delta(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {}
    for ch in obj.get("choices") or ():
        if isinstance(ch, dict):
            d = ch.get("delta") or {}
            return d if isinstance(d, dict) else {}
    return {}


def _has_text(obj: Any) -> bool:
    d = _delta(obj)
    if any(d.get(k) for k in ("content", *_REASONING_KEYS)) or d.get("tool_calls"):
        return True
    chs = obj.get("choices") if isinstance(obj, dict) else None
    return bool(chs and isinstance(chs[0], dict) and chs[0].get("text"))


def _usage_mode(objs: list[Any]) -> str:
    """``every_chunk`` when most token chunks carry usage, ``final`` when only chunks after them do, else
    ``never``."""
    text = [o for o in objs if _has_text(o)]
    with_usage = [o for o in text if isinstance(o.get("usage"), dict) and o["usage"]]
    if text and len(with_usage) * 2 > len(text):
        return "every_chunk"
    if any(isinstance(o, dict) and isinstance(o.get("usage"), dict) and o["usage"] for o in objs):
        return "final"
    return "never"


def analyze_stream(reads: list[tuple[int, bytes]], rec: RequestRecord) -> dict[str, Any]:
    """What one teed chat stream shows: usage placement, role-only first chunk, reasoning field names, SSE
    comments, and the time from ``[DONE]`` to the end of the response. Pure."""
    evs = _json_events(reads)
    objs = [o for _, o in evs if o != "[DONE]"]
    first = objs[0] if objs else None
    d0 = _delta(first)
    role_first = bool(first is not None and d0.get("role") and not _has_text(first))
    names = sorted({k for o in objs for k in _REASONING_KEYS if _delta(o).get(k)})
    done_t = next((t for t, o in evs if o == "[DONE]"), None)
    end_abs = rec.sent_ns + rec.end_ns if rec.end_ns is not None else None
    done_to_end = (end_abs - done_t) / 1e6 if done_t is not None and end_abs is not None else None
    return {
        "usage": _usage_mode(objs),
        "role_first_chunk": role_first,
        "reasoning_fields": names,
        "keepalive_comments": any(_COMMENT.search(b) for _, b in reads),
        "done": done_t is not None,
        "done_to_end_ms": round(done_to_end, 3) if done_to_end is not None else None,
        "keeps_open_after_done": bool(done_to_end is not None and done_to_end > OPEN_AFTER_DONE_MS
                                      or rec.error_kind == "timeout" and rec.done),
    }


class _Checker:
    """Holds the client and capture of one check run."""

    def __init__(self, client: httpx.AsyncClient, cap: Capture, base: str, model: str, secret: str | None) -> None:
        self.client, self.cap, self.base, self.model, self.secret = client, cap, base, model, secret
        self.n = 0
        self.ok = 0  # generation requests that succeeded: none means every finding is an artefact of the failure

    async def send(self, endpoint: str, body: dict[str, Any]) -> Capture:
        self.n += 1
        body = {"model": self.model, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **body}
        spec = RequestSpec(f"check-{self.n}", endpoint, body)
        got = await capture(self.client, self.cap, self.base, spec, self.model, self.secret)
        self.ok += got.record.ok
        return got

    async def main_stream(self) -> dict[str, Any]:
        cap = await self.send("chat", {"messages": [{"role": "user", "content": "Tell me about lighthouses."}],
                                       "max_tokens": 32})
        rec = cap.record
        out = analyze_stream(list(cap.reads), rec)
        m = request_metrics(rec)
        out.update({"ok": rec.ok, "error": rec.error, "status": rec.status, "tokens_per_event": m.tokens_per_event,
                    "output_tokens": m.output_tokens, "chat_prompt_tokens": m.prompt_tokens})
        return out

    async def linger(self) -> dict[str, Any]:
        """Time from ``[DONE]`` to the end of the body, read raw for up to 1 s: bench's client stops at ``[DONE]``
        (and closes a connection kept open), so this is measured on its own stream."""
        body = {"model": self.model, "temperature": 0, "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say OK."}]}
        t_done: int | None = None
        after = bytearray()
        try:
            async with self.client.stream("POST", f"{self.base}/chat/completions", json=body) as r:
                it = r.aiter_raw()
                tail = b""
                async for chunk in it:
                    tail = (tail + chunk)[-64:]
                    if b"[DONE]" in tail:
                        t_done = time.perf_counter_ns()
                        break
                if t_done is None:
                    return {}
                try:
                    await asyncio.wait_for(_drain(it, after), LINGER_PROBE_S)
                except TimeoutError:
                    pass
        except httpx.HTTPError:
            if t_done is None:
                return {}
        ms = (time.perf_counter_ns() - t_done) / 1e6
        return {"done_to_end_ms": round(ms, 3), "keeps_open_after_done": ms > OPEN_AFTER_DONE_MS,
                "comments_after_done": bool(_COMMENT.search(bytes(after)))}

    async def min_tokens(self) -> dict[str, Any]:
        msg = [{"role": "user", "content": "Reply with one word: yes."}]
        plain = (await self.send("chat", {"messages": msg, "max_tokens": MIN_TOKENS_ASKED})).record
        forced = (await self.send("chat", {"messages": msg, "max_tokens": MIN_TOKENS_ASKED,
                                           "min_tokens": MIN_TOKENS_ASKED, "ignore_eos": True})).record
        mp, mf = request_metrics(plain), request_metrics(forced)
        return {"min_tokens_honoured": bool(forced.ok and mf.output_tokens >= MIN_TOKENS_ASKED),
                "min_tokens_rejected": forced.status is not None and 400 <= forced.status < 500,
                "stops_early_without_min_tokens": bool(plain.ok and mp.output_tokens < MIN_TOKENS_ASKED)}

    async def tool_calls(self) -> str:
        cap = await self.send("chat", {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                                       "tools": _TOOLS, "tool_choice": "auto", "max_tokens": 64})
        rec = cap.record
        if rec.status is not None and rec.status >= 400:
            return "rejected"
        n = sum(1 for _, o in _json_events(list(cap.reads)) if isinstance(o, dict) and _delta(o).get("tool_calls"))
        return "none" if n == 0 else "one_chunk" if n == 1 else "streamed"

    async def images(self, text_prompt_tokens: int | None) -> dict[str, Any]:
        """One chat request with one small noise image: accepted or not, and the prompt tokens it added."""
        url = ImageSet(1, 64, 64, "jpeg").urls(uuid.uuid4().hex)[0]
        parts = [{"type": "text", "text": "Tell me about lighthouses."}, {"type": "image_url", "image_url": {"url": url}}]
        rec = (await self.send("chat", {"messages": [{"role": "user", "content": parts}], "max_tokens": 4})).record
        if not rec.ok:
            return {"images": "rejected", "images_error": (rec.error or "")[:200], "image_tokens": None}
        pt = request_metrics(rec).prompt_tokens
        added = pt - text_prompt_tokens if pt is not None and text_prompt_tokens is not None else None
        return {"images": "accepted", "images_error": None, "image_tokens": added}

    async def prefix_cache(self) -> dict[str, Any]:
        """The same prompt twice: cached tokens in the second's usage, else (a server that does not report them,
        such as vLLM without ``--enable-prompt-tokens-details``) prefix-cache hits on its ``/metrics`` page."""
        nonce = uuid.uuid4().hex
        words = " ".join(f"{nonce[i % 32]}{i}" for i in range(200))
        body = {"messages": [{"role": "user", "content": f"{nonce} {words}"}], "max_tokens": 4}
        scraper = await detect_metrics(self.client, self.base)
        scraper = scraper if scraper is not None and scraper.source == "metrics" else None
        if scraper is not None:
            await scraper.begin()
        try:
            first = request_metrics((await self.send("chat", body)).record)
            second = request_metrics((await self.send("chat", body)).record)
        except BaseException:
            if scraper is not None:
                await scraper.stop()
            raise
        sm = await scraper.end() if scraper is not None else {}
        c1, c2, pt = first.cached_tokens, second.cached_tokens, second.prompt_tokens or 0
        hit = pt > 0 and c2 >= c1 + max(16, (pt - c1) // 4)
        hits = sm.get("prefix_cache_hits")
        seen = pt > 0 and not hit and c1 == c2 == 0 and hits is not None and hits >= max(16, pt // 4)
        return {"prefix_cache": bool(hit or seen), "cached_tokens_second": c2, "cached_tokens_first": c1,
                "prefix_cache_hits_metrics": hits, "prefix_cache_seen_in": "usage" if hit else
                "metrics" if seen else None}

    async def tokenize(self, text: str) -> int | None:
        """Tokens of ``text`` by the server's ``/tokenize`` in either form bench sizes prompts with (llama.cpp's
        ``content``, vLLM's and SGLang's ``prompt`` + ``model``), or None."""
        try:
            return await HttpTokenizer(self.client, self.base, self.model).count(text)
        except TokenizerError:
            return None

    async def metrics(self) -> dict[str, Any]:
        scraper = await detect_metrics(self.client, self.base)
        if scraper is None or scraper.source != "metrics":
            return {"metrics": False, "metrics_backend": None, "metrics_keys": []}
        r = await self.client.get(scraper.url, timeout=10.0)
        try:
            keys = available_keys(parse_page(r.text), scraper.backend)
        except ValueError:
            keys = []
        return {"metrics": True, "metrics_backend": scraper.backend, "metrics_keys": keys}


async def check_endpoint(base: str, settings: ClientSettings, model: str | None = None) -> dict[str, Any]:
    """Run every check against ``base`` (``http://host:port/v1``) and return the report (keys in docs/check.md).

    Raises EndpointUnreachable / ServerError only when the model list cannot be read (nothing else can run).
    """
    if settings.read_timeout_s is None:  # a server that never ends a response must not hang the check
        settings = replace(settings, read_timeout_s=CHECK_READ_TIMEOUT_S)
    secret = settings.api_key
    cap = Capture(RequestRecord("check-0", "chat", model or ""))
    async with tee_client(settings, cap) as client:
        name = model or await discover_model(client, base, secret)
        info = await discover_server(client, base)
        ck = _Checker(client, cap, base, name, secret)
        rep: dict[str, Any] = {"url": base, "model": name, "backend": info.get("backend"),
                               "context_tokens": info.get("context_size")}
        rep.update(await ck.main_stream())
        lg = await ck.linger()
        rep["keepalive_comments"] = bool(rep.get("keepalive_comments") or lg.pop("comments_after_done", False))
        rep.update(lg)
        rep.update(await ck.min_tokens())
        rep["tool_calls"] = await ck.tool_calls()
        rep.update(await ck.images(rep.get("chat_prompt_tokens")))
        rep.update(await ck.prefix_cache())
        content_tokens = await ck.tokenize("Tell me about lighthouses.")
        rep["tokenize"] = content_tokens is not None
        cpt = rep.get("chat_prompt_tokens")
        rep["chat_template_tokens"] = cpt - content_tokens if cpt is not None and content_tokens is not None else None
        rep.update(await ck.metrics())
        rep["requests_ok"] = ck.ok
    return dict(admit(rep))  # what the server's raw reads said, and --model, as they leave the check


def failure_line(rep: dict[str, Any]) -> str | None:
    """The one line for a check in which no generation request succeeded (``requests_ok`` 0: every finding
    would be an artefact of the failure), naming the first error and its cure; None when one succeeded."""
    if rep.get("requests_ok"):
        return None
    line = f"every request of the check failed ({rep.get('error') or 'no response'}), so nothing was checked"
    if rep.get("status") in (401, 403):
        return f"{line}; {KEY_REFUSED}"
    return f"{line}; `bench probe {rep.get('url')}` shows one request in full"


def _yes(v: Any) -> str:
    return "yes" if v is True else "no" if v is False else "?" if v is None else str(v)


def _does(rep: dict[str, Any]) -> dict[str, str]:
    u = rep.get("usage")
    tpe = rep.get("tokens_per_event") or 1.0
    return {
        "usage": {"final": "token counts from the server's usage", "every_chunk": "last usage wins (the total)",
                  "never": "estimates output tokens (flagged)"}.get(str(u), ""),
        "tokens_per_event": "ITL per token: gap / tokens in the event" if tpe > 1.05 else "one token per event",
        "min_tokens_honoured": "outputs reach max_tokens" if rep.get("min_tokens_honoured")
        else "short outputs are warned about per cell",
        "role_first_chunk": "not a token: TTFT waits for text",
        "reasoning_fields": "reasoning counts as output (TTFT), TTFC is content",
        "tool_calls": {"none": "tools accepted, none called (--tool-choice required forces one)",
                       "rejected": "the server refused a request with tools"}.get(
            str(rep.get("tool_calls")), "tool-call arguments count as output"),
        "images": "--images sends image_url parts" if rep.get("images") == "accepted"
        else "--images stops with one line naming it",
        "tokenize": "prompts sized by the server's tokenizer" if rep.get("tokenize")
        else "prompts sized by estimate, checked by usage",
        "metrics": "server_metrics per cell" if rep.get("metrics") else "no server view per cell",
        "context_tokens": "depth + max_tokens must fit in it" if rep.get("context_tokens") else "unknown: mind depths",
        "prefix_cache": "unique prefix per request; hits warned" if rep.get("prefix_cache")
        else "nothing to defeat",
        "keeps_open_after_done": "E2E includes the wait: the response end" if rep.get("keeps_open_after_done")
        else "E2E = end of response",
        "keepalive_comments": "comments skipped, never tokens",
        "chat_template_tokens": _template_does(rep.get("chat_template_tokens")),
    }


def _template_does(n: Any) -> str:
    if n is None:
        return "unknown: no /tokenize to compare with"
    return "the shared header is expected as cached" if n > 0 else "no template tokens around the prompt"


def report_rows(rep: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(behaviour, found, what bench does)`` rows of a report, short enough for an 80-column table."""
    does = _does(rep)
    tpe = rep.get("tokens_per_event")
    found = {
        "usage": str(rep.get("usage")),
        "tokens_per_event": f"{tpe:.2f}" if isinstance(tpe, (int, float)) else "?",
        "min_tokens_honoured": _yes(rep.get("min_tokens_honoured")),
        "role_first_chunk": _yes(rep.get("role_first_chunk")),
        "reasoning_fields": ", ".join(rep.get("reasoning_fields") or []) or "none",
        "tool_calls": {"none": "not called"}.get(str(rep.get("tool_calls")), str(rep.get("tool_calls"))),
        "images": str(rep.get("images")) + (f" ({rep['image_tokens']} tok)" if rep.get("image_tokens") else ""),
        "tokenize": _yes(rep.get("tokenize")),
        "metrics": (rep.get("metrics_backend") or "yes") if rep.get("metrics") else "no",
        "context_tokens": str(rep.get("context_tokens") or "?"),
        "prefix_cache": _yes(rep.get("prefix_cache")),
        "keeps_open_after_done": _yes(rep.get("keeps_open_after_done")),
        "keepalive_comments": _yes(rep.get("keepalive_comments")),
        "chat_template_tokens": _yes(rep.get("chat_template_tokens")),
    }
    return [(k, v, does[k]) for k, v in found.items()]
