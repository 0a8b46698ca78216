"""``bench record``: one live response's raw bytes and their arrival times -> a stream case (docs/cases.md).

The request goes through bench's normal client (:func:`bench.client.stream_request`) on its httpx read path; an
httpx response hook tees every read the client makes into a list, stamped on arrival with
``time.perf_counter_ns()``. The case's writes are those reads at their times after the request was sent, so
``bench replay`` serves the same bytes with the same gaps. The ``expect`` block is what bench measured live:
counts exactly, times as ranges wide enough for the replay's loopback and timer jitter. The request is stored
beside the response with the API key redacted (``Authorization: Bearer ***``; the key's text is scrubbed from
the whole case as well).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.client import ClientSettings, RequestSpec, discover_model, make_http_client, stream_request
from bench.errors import ConfigError
from bench.records import RequestRecord
from bench.redaction import redact

__all__ = ["Capture", "capture", "case_from_capture", "record_case", "write_case", "RECORD_PROMPT"]

RECORD_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
_KEPT_HEADERS = ("content-type",)


@dataclass(slots=True)
class Capture:
    """One captured exchange: the record bench measured, the raw reads ``(perf_counter_ns, bytes)`` and the
    response head."""

    record: RequestRecord
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    url: str = ""


class _TeeStream(httpx.AsyncByteStream):
    """Passes an httpx response stream through, stamping and keeping a copy of each read."""

    def __init__(self, inner: Any, sink: list[tuple[int, bytes]]) -> None:
        self.inner = inner
        self.sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.sink.append((time.perf_counter_ns(), bytes(chunk)))
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def tee_client(settings: ClientSettings, cap: Capture) -> httpx.AsyncClient:
    """bench's client on its httpx read path, with a response hook that tees every response into ``cap``."""
    from dataclasses import replace

    client = make_http_client(replace(settings, fast_io=False))

    async def hook(response: httpx.Response) -> None:
        if response.request.method == "POST":
            cap.status = response.status_code
            cap.headers = {k: v for k, v in response.headers.items() if k.lower() in _KEPT_HEADERS}
            response.stream = _TeeStream(response.stream, cap.reads)

    client.event_hooks["response"] = [hook]
    return client


def _body(endpoint: str, max_tokens: int, prompt: str | None, model: str) -> dict[str, Any]:
    if endpoint == "chat":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt or RECORD_PROMPT}]}
    else:
        body = {"prompt": prompt or RECORD_PROMPT}
    body.update({"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}})
    return body


async def capture(client: httpx.AsyncClient, cap: Capture, base: str, spec: RequestSpec, model: str,
                  secret: str | None) -> Capture:
    """Send ``spec`` through ``client`` (from :func:`tee_client` with ``cap``) and fill ``cap``."""
    cap.reads.clear()
    cap.body = dict(spec.body)
    cap.url = base + ("/chat/completions" if spec.endpoint == "chat" else "/completions")
    cap.record = await stream_request(client, base, spec, model=model, secret=secret)
    return cap


def _range(v: float | None, rel: float, abs_: float) -> list[float] | None:
    if v is None:
        return None
    return [round(max(0.0, v * (1 - rel) - abs_), 3), round(v * (1 + rel) + abs_, 3)]


def _expect(m: dict[str, Any]) -> dict[str, Any]:
    exp: dict[str, Any] = {"ok": m["ok"]}
    if not m["ok"]:
        if m.get("error"):
            exp["error"] = str(m["error"]).split(":")[0]
        return exp
    for k in ("output_tokens", "output_tokens_estimated", "chunks", "prompt_tokens", "cached_tokens",
              "reasoning_tokens", "itl_count"):
        exp[k] = m.get(k)
    exp["ttft_ms"] = _range(m.get("ttft_ms"), 0.25, 15.0)
    if m.get("decode_tok_s"):
        d = float(m["decode_tok_s"])
        exp["decode_tok_s"] = [round(d / 1.5, 3), round(d * 1.5, 3)]
    return {k: v for k, v in exp.items() if v is not None or k in ("ttft_ms",)}


def case_from_capture(cap: Capture, case_id: str, secret: str | None) -> dict[str, Any]:
    """The case dict (docs/cases.md) of a capture, with its ``request`` and the live ``expect``."""
    from bench.measure.metrics import request_metrics

    rec = cap.record
    sent = rec.sent_ns
    events: list[dict[str, Any]] = [
        {"at_ms": round(max(0, t - sent) / 1e6, 3), "data": b.decode("utf-8", "replace")} for t, b in cap.reads
    ]
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = "Bearer ***"
    m = request_metrics(rec).to_dict()
    case = {
        "id": case_id,
        "about": f"recorded by bench record from {cap.url} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "endpoint": rec.endpoint,
        "status": cap.status or 0,
        "headers": cap.headers or {"content-type": "text/event-stream"},
        "request": {"method": "POST", "url": cap.url, "headers": headers, "body": cap.body},
        "events": events,
        "expect": _expect(m),
    }
    text = redact(json.dumps(case, ensure_ascii=False), secret)
    out: dict[str, Any] = json.loads(text)
    return out


async def record_case(base: str, settings: ClientSettings, *, case_id: str, model: str | None = None,
                      endpoint: str = "chat", max_tokens: int = 64, prompt: str | None = None) -> dict[str, Any]:
    """Record one streaming request to ``base`` as a case dict. Never raises for a failed request (the case then
    holds the failure); raises EndpointUnreachable / ServerError when the model cannot be discovered."""
    secret = settings.api_key
    cap = Capture(RequestRecord("record-0", endpoint, model or ""))
    async with tee_client(settings, cap) as client:
        name = model or await discover_model(client, base, secret)
        spec = RequestSpec("record-0", endpoint, _body(endpoint, max_tokens, prompt, name))
        await capture(client, cap, base, spec, name, secret)
    return case_from_capture(cap, case_id, secret)


def write_case(case: dict[str, Any], path: str | Path) -> Path:
    """Write a case file (indented JSON). Raises ConfigError when the file cannot be written."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(case, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot write {p}: {e.strerror or e}") from None
    return p
