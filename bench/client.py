"""The streaming client: one request to an OpenAI-compatible endpoint -> one :class:`RequestRecord`.

Timing rule: each network read is stamped with ``time.perf_counter_ns()`` the moment it arrives, before SSE
decoding or JSON parsing; every event gets the stamp of the read that completed it. Streams are read by
:mod:`bench.fastio` (``ClientSettings.fast_io``, the default), which stamps in ``asyncio.Protocol.data_received``,
so a burst of reads on many streams is stamped before any of them is parsed; with ``fast_io=False`` (``--io
httpx``) they go through httpx and are stamped when httpx returns the read. JSON is parsed after the
stream ends, so parsing never delays the reads of other streams on the same event loop. The send time is taken
just before the request goes out, after any client-side queueing (recorded separately as ``queued_ns``).

Failures are data: HTTP errors, error objects inside a 200 stream, ``event: error``, streams cut without a
``finish_reason`` or ``[DONE]``, and streams with no generated token end as records with ``error`` set; nothing
is raised except ``asyncio.CancelledError`` (after recording the request as cancelled).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import ConfigError, EndpointUnreachable, ServerError
from .fastio import FastConnectError, FastIOError, FastPool, FastTimeout, stamp_tracker
from .records import Event, RequestRecord
from .sse import SSEDecoder

__all__ = [
    "StreamTap",
    "ClientSettings",
    "RequestSpec",
    "make_http_client",
    "normalize_url",
    "root_url",
    "discover_model",
    "stream_request",
    "redact",
]

_loads: Callable[[str], Any] = json.loads
try:  # the ``fast`` extra: orjson parses events ~3x faster; json is the reference (same results, both tested)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    pass

_ERR_BODY_LIMIT = 64 * 1024
log = logging.getLogger("bench")


def normalize_url(url: str) -> str:
    """OpenAI-style base URL, as the openai client takes it: ``http://host:port/v1`` (no trailing slash).

    ``host:port`` gets ``http://``; a URL with no path gets ``/v1``; a path is kept as given (``/v1``,
    ``/openai/v1``...). Raises :class:`ConfigError` for a URL that is not http(s).
    """
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"URL {url!r} is not an http(s) URL like http://host:port/v1")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def root_url(base: str) -> str:
    """The server root for non-OpenAI routes (``/tokenize``, ``/health``, ``/metrics``): the base minus a final
    ``/v1``."""
    return base[: -len("/v1")] if base.endswith("/v1") else base


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***`` (no-op for an empty secret)."""
    if secret and len(secret) >= 4:
        return text.replace(secret, "***")
    return text


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How bench talks to the endpoint.

    Attributes:
        api_key_env: name of the environment variable holding the API key (default ``OPENAI_API_KEY``).
        connect_timeout_s: TCP/TLS connect timeout in seconds (short: an unreachable URL fails fast).
        read_timeout_s: longest silence between two reads in seconds; ``None`` (default) = no limit, because a
            long prefill (a 1M-token prompt) can send no byte for many minutes.
        extra_headers: sent with every request.
        fast_io: stream responses (``http://`` and ``https://``) through :mod:`bench.fastio`, which stamps each
            read the moment it arrives (in ``asyncio.Protocol.data_received``) instead of after httpx's stack
            processed it; every non-streaming call (``/models``, ``/tokenize``) stays on httpx.
        stamps: fastio's stamp source: ``"auto"`` (kernel receive stamps where the OS gives them, bench.kstamp),
            ``"kernel"`` (the same) or ``"user"`` (user-space stamps); each record says which it got.
    """

    api_key_env: str = "OPENAI_API_KEY"
    connect_timeout_s: float = 10.0
    read_timeout_s: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    fast_io: bool = True
    stamps: str = "auto"

    @property
    def api_key(self) -> str | None:
        """The key from the environment, or None. Never printed or stored."""
        return os.environ.get(self.api_key_env) or None

    def headers(self) -> dict[str, str]:
        """Request headers, with ``Authorization`` when a key is set."""
        h = {"Accept": "text/event-stream", "Accept-Encoding": "identity", **self.extra_headers}
        key = self.api_key
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h


def make_http_client(settings: ClientSettings, concurrency: int = 1) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose pool never caps concurrency below ``concurrency`` streams.

    httpx's default pool allows 100 connections and silently queues the rest; bench sets no connection limit and
    keeps ``concurrency`` connections alive between waves.
    """
    # keepalive_expiry well under common server idle timeouts (cpp-httplib/llama.cpp: 5 s; uvicorn: 5 s), so a
    # pooled connection is never reused just as the server closes it
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(concurrency, 1) + 4,
                          keepalive_expiry=2.0)
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s, read=settings.read_timeout_s, write=60.0, pool=None
    )
    transport = _StaleRetryTransport(httpx.AsyncHTTPTransport(limits=limits, http2=False))
    client = _BenchClient(timeout=timeout, headers=settings.headers(), transport=transport)
    if settings.fast_io:
        client.bench_fast_pool = FastPool(stamps=settings.stamps)
    return client


class _BenchClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` carrying bench's :class:`~bench.fastio.FastPool` (``bench_fast_pool``, used by
    :func:`stream_request` for ``http://`` streams); closing the client closes the pool too."""

    bench_fast_pool: FastPool | None = None

    async def aclose(self) -> None:
        try:
            await _close_fast_pool(self)
        finally:
            await super().aclose()

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await _close_fast_pool(self)
        finally:
            await super().__aexit__(*exc)


async def _close_fast_pool(client: Any) -> None:
    pool, client.bench_fast_pool = client.bench_fast_pool, None
    if pool is not None:
        await pool.aclose()


class _StaleRetryTransport(httpx.AsyncBaseTransport):
    """Retries a request once when the server closed a pooled keep-alive connection before any response.

    Servers such as llama.cpp close a connection right after a streamed response; the close can arrive just after
    httpx put the connection back in its pool, and the next request on it fails at once with no response. Nothing
    reached the server's handler, so sending again on a fresh connection is safe; the failed attempt costs well
    under a millisecond.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.RemoteProtocolError as e:
            if "without sending a response" not in str(e):
                raise
        except (httpx.ReadError, httpx.WriteError):
            pass
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class StreamTap:
    """Live counters of one in-flight request, read by progress displays (cheap to update in the read loop).

    Attributes:
        events: SSE events decoded so far (about one token each; for live display only, never for results).
        started: the request was sent.
        finished: the request ended.
    """

    __slots__ = ("events", "started", "finished")

    def __init__(self) -> None:
        self.events = 0
        self.started = False
        self.finished = False


@dataclass(slots=True)
class RequestSpec:
    """One planned request: where it goes and the exact JSON body.

    Attributes:
        request_id: unique within a run.
        endpoint: ``"chat"`` (``/chat/completions``) or ``"completions"`` (``/completions``).
        body: the JSON body; bench adds ``stream: true`` and ``stream_options.include_usage`` if missing.
        meta: copied into the record (cell, stream index, targets).
    """

    request_id: str
    endpoint: str
    body: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


async def discover_model(client: httpx.AsyncClient, base: str, secret: str | None = None) -> str:
    """The first model id of ``GET {base}/models``.

    Raises:
        EndpointUnreachable: connection refused / DNS / connect timeout.
        ServerError: an HTTP error or a body with no model.
    """
    try:
        r = await client.get(f"{base}/models", headers={"Accept": "application/json"})
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise EndpointUnreachable(redact(f"cannot reach {base}: {_exc_text(e)}", secret)) from None
    except httpx.HTTPError as e:
        raise ServerError(redact(f"GET {base}/models failed: {_exc_text(e)}", secret)) from None
    if r.status_code >= 400:
        msg = _error_from_body(r.status_code, r.headers.get("content-type", ""), r.content)
        raise ServerError(redact(f"GET {base}/models: {msg}; pass --model", secret))
    try:
        data = r.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerError(f"GET {base}/models returned no model list; pass --model") from None


def _exc_text(e: BaseException) -> str:
    s = str(e).strip() or type(e).__name__
    return s.splitlines()[0][:300]


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def _error_from_body(status: int, ctype: str, body: bytes) -> str:
    """One line: ``HTTP <status>: <message>`` from a JSON, HTML or text error body."""
    text = body[:_ERR_BODY_LIMIT].decode("utf-8", "replace")
    msg = ""
    if "json" in ctype or text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
            err = obj.get("error", obj) if isinstance(obj, dict) else obj
            if isinstance(err, dict):
                msg = str(err.get("message") or err.get("detail") or err)
            else:
                msg = str(err)
        except ValueError:
            msg = text
    elif "html" in ctype or text.lstrip().lower().startswith(("<!doctype", "<html")):
        m = _TITLE.search(text)
        msg = m.group(1) if m else _TAG.sub(" ", text)
    else:
        msg = text
    msg = " ".join(msg.split())[:200]
    if 300 <= status < 400 and not msg:
        msg = "redirect; give the final URL"
    return f"HTTP {status}: {msg}" if msg else f"HTTP {status}"


def _http_kind(status: int) -> str:
    if status < 400:
        return "http_redirect"  # httpx follows no redirect: the URL to give is the final one
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


async def stream_request(
    client: httpx.AsyncClient,
    base: str,
    spec: RequestSpec,
    *,
    model: str,
    secret: str | None = None,
    queued_ns: int | None = None,
    tap: StreamTap | None = None,
) -> RequestRecord:
    """Send one streaming request and record it.

    Args:
        client: from :func:`make_http_client`.
        base: normalized base URL (``http://host:port/v1``).
        spec: the request; ``spec.body`` is sent with ``model``, ``stream: true`` and
            ``stream_options: {include_usage: true}`` filled in where absent.
        model: model name.
        secret: the API key, only to scrub it from error text.
        queued_ns: when the caller queued the request (defaults to now).
        tap: optional live counters for a progress display.

    Returns:
        The :class:`RequestRecord`; ``record.error`` is set for every failure. Never raises for server or network
        faults; re-raises ``asyncio.CancelledError`` (the record is then discarded by the caller).
    """
    now = time.perf_counter_ns()
    rec = RequestRecord(spec.request_id, spec.endpoint, model, queued_ns=queued_ns or now, meta=dict(spec.meta))
    body = dict(spec.body)
    body.setdefault("model", model)
    body.setdefault("stream", True)
    if body.get("stream"):
        body.setdefault("stream_options", {"include_usage": True})
    path = "/chat/completions" if spec.endpoint == "chat" else "/completions"
    payload = json.dumps(body).encode()
    request = client.build_request(
        "POST", base + path, content=payload, headers={"Content-Type": "application/json"}
    )
    raw: list[Any] = []  # SSEEvent
    perf = time.perf_counter_ns
    response: Any = None  # httpx.Response or fastio.FastResponse
    fast: FastPool | None = getattr(client, "bench_fast_pool", None)
    src: Any = None  # where the reads' stamps come from (bench.fastio.stamp_tracker)
    try:
        if tap is not None:
            tap.started = True
        if fast is not None:
            rec.stamp_source = fast.stamp_source
        rec.sent_ns = perf()
        if fast is not None:
            response = await fast.stream("POST", str(request.url), request.headers.multi_items(), payload,
                                         connect_timeout=client.timeout.connect, read_timeout=client.timeout.read)
            src = stamp_tracker(response)  # read again after the body: a read without a kernel stamp shows
            rec.stamp_source = src.stamp_source
        else:
            response = await client.send(request, stream=True)
        rec.status = response.status_code
        if log.isEnabledFor(logging.DEBUG):
            hdrs = {k: ("Bearer ***" if k.lower() == "authorization" else v) for k, v in request.headers.items()}
            log.debug("%s POST %s (%d bytes, headers %s) -> HTTP %d %s", spec.request_id, request.url,
                      len(payload), hdrs, response.status_code, response.headers.get("content-type", ""))
        ctype = response.headers.get("content-type", "")
        if response.status_code >= 300:
            err_body = await _read_limited(response)
            rec.end_ns = perf() - rec.sent_ns
            rec.error = redact(_error_from_body(response.status_code, ctype, err_body), secret)
            rec.error_kind = _http_kind(response.status_code)
            return rec
        if "text/event-stream" not in ctype and "json" in ctype:
            whole = await response.aread()
            t = perf()
            rec.end_ns = t - rec.sent_ns
            _parse_whole(rec, whole, t)
            _finish(rec)
            return rec
        dec = SSEDecoder()
        try:
            # fastio stamps in data_received (when the bytes arrived); httpx reads are stamped as they come out
            stamped = response.aiter_stamped() if fast is not None else _stamp_reads(response)
            async for t, chunk in stamped:
                evs = dec.feed(chunk, t)
                if evs:
                    raw.extend(evs)
                    if tap is not None:
                        tap.events += len(evs)
        finally:
            t_end = perf()
            raw.extend(dec.close(t_end))
            rec.end_ns = t_end - rec.sent_ns
    except asyncio.CancelledError:
        rec.error, rec.error_kind = "cancelled", "cancelled"
        raise
    except (httpx.ConnectError, httpx.ConnectTimeout, FastConnectError) as e:
        rec.error = redact(f"cannot connect to {base}: {_exc_text(e)}", secret)
        rec.error_kind = "connect"
    except FastTimeout as e:
        rec.error = redact(f"timed out waiting for the server ({_exc_text(e)})", secret)
        rec.error_kind = "timeout"
    except FastIOError as e:
        rec.error = redact(f"stream broken: {_exc_text(e)}", secret)
        rec.error_kind = "incomplete"
    except httpx.TimeoutException as e:
        rec.error = redact(f"timed out waiting for the server ({type(e).__name__})", secret)
        rec.error_kind = "timeout"
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        rec.error = redact(f"stream broken: {_exc_text(e)}", secret)
        rec.error_kind = "incomplete"
    except httpx.HTTPError as e:
        rec.error = redact(f"{type(e).__name__}: {_exc_text(e)}", secret)
        rec.error_kind = "protocol"
    finally:
        if tap is not None:
            tap.finished = True
        if response is not None:
            await response.aclose()
        if src is not None:
            rec.stamp_source = src.stamp_source
        if rec.end_ns is None and rec.sent_ns:
            rec.end_ns = perf() - rec.sent_ns
    _parse_events(rec, raw, secret)
    _finish(rec)
    if rec.error is not None:
        log.debug("%s failed: %s", spec.request_id, rec.error)  # already redacted
    return rec


async def _stamp_reads(response: httpx.Response) -> Any:
    """``(perf_counter_ns, bytes)`` for each read of an httpx streaming response, stamped as it is returned."""
    perf = time.perf_counter_ns
    async for chunk in response.aiter_raw():
        yield perf(), chunk


async def _read_limited(response: Any) -> bytes:
    buf = bytearray()
    async for chunk in response.aiter_raw():
        buf += chunk
        if len(buf) >= _ERR_BODY_LIMIT:
            break
    return bytes(buf)


def _set_error(rec: RequestRecord, msg: str, kind: str, secret: str | None = None) -> None:
    if rec.error is None:  # the first failure is the cause; later ones are consequences
        rec.error = redact(msg, secret)
        rec.error_kind = kind


def _parse_events(rec: RequestRecord, raw: list[Any], secret: str | None) -> None:
    """Turn decoded SSE events into :class:`Event` objects and fill usage/finish/error fields."""
    sent = rec.sent_ns
    for sse in raw:
        data = sse.data
        if not data.strip():
            continue  # an empty data field is a keep-alive, not an event
        if data.strip() == "[DONE]":
            rec.done = True
            continue
        if sse.event == "error":
            _set_error(rec, f"error event: {_one_line(data)}", "stream_error", secret)
            continue
        try:
            obj = _loads(data)
        except ValueError:
            _set_error(rec, f"event is not JSON: {_one_line(data)[:120]}", "bad_json", secret)
            continue
        if not isinstance(obj, dict):
            _set_error(rec, f"event is not a JSON object: {_one_line(data)[:120]}", "bad_json", secret)
            continue
        _absorb(rec, obj, sse.t_ns - sent, secret)


def _one_line(s: str) -> str:
    return " ".join(s.split())[:300]


def _absorb(rec: RequestRecord, obj: dict[str, Any], t_rel: int, secret: str | None) -> None:
    """Fold one parsed chunk (streaming or whole) into the record."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            code = err.get("code") or err.get("type") or ""
            msg = err.get("message") or ""
            text = f"error in stream: {code} {msg}".strip()
        else:
            text = f"error in stream: {err}"
        _set_error(rec, _one_line(text), "stream_error", secret)
        return
    ev = Event(t_rel)
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict) or ch.get("index", 0) != 0:
            continue
        delta = ch.get("delta") or ch.get("message")
        if isinstance(delta, dict):
            ev.content += delta.get("content") or ""
            ev.reasoning += (delta.get("reasoning_content") or "") + (delta.get("reasoning") or "")
            for tc in delta.get("tool_calls") or ():
                fn = (tc or {}).get("function") or {}
                ev.tool += (fn.get("name") or "") + (fn.get("arguments") or "")
        text = ch.get("text")
        if isinstance(text, str):
            ev.content += text
        if ch.get("finish_reason"):
            rec.finish_reason = ch["finish_reason"]
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage:
        rec.usage = usage
    timings = obj.get("timings")
    if isinstance(timings, dict) and timings:
        rec.timings = timings
    sim = obj.get("sim")
    if isinstance(sim, dict):
        ev.sched_ns = sim.get("sched_ns")
        ev.write_ns = sim.get("write_ns")
        ev.tokens = sim.get("tokens")
    rec.events.append(ev)


def _parse_whole(rec: RequestRecord, body: bytes, t_abs: int) -> None:
    """A non-streaming JSON answer (server ignored ``stream``): one event at the time the body completed."""
    try:
        obj = json.loads(body)
    except ValueError:
        _set_error(rec, "response is not JSON", "bad_json")
        return
    if not isinstance(obj, dict):
        _set_error(rec, "response is not a JSON object", "bad_json")
        return
    _absorb(rec, obj, t_abs - rec.sent_ns, None)
    rec.done = True


def _finish(rec: RequestRecord) -> None:
    """Apply the success rules once everything is parsed."""
    if rec.error is not None:
        return
    if not rec.done and rec.finish_reason is None:
        _set_error(rec, "stream ended without finish_reason or [DONE]", "incomplete")
        return
    if not any(e.has_text for e in rec.events):
        _set_error(rec, "no tokens generated", "no_tokens")


def require_ok(rec: RequestRecord) -> None:
    """Raise the error matching a failed record (used by ``bench probe``).

    Raises:
        EndpointUnreachable: connection failure.
        ServerError: any other failure.
    """
    if rec.ok:
        return
    if rec.error_kind == "connect":
        raise EndpointUnreachable(rec.error or "cannot connect")
    raise ServerError(f"request failed: {rec.error}")
