"""The streaming client: one request to an OpenAI-compatible endpoint -> one :class:`RequestRecord`.

Timing rule: each network read is stamped with ``time.perf_counter_ns()`` the moment it arrives, before SSE
decoding or JSON parsing; every event gets the stamp of the read that completed it. Streams are read by
:mod:`bench.fastio` (``ClientSettings.fast_io``, the default), which stamps in ``asyncio.Protocol.data_received``,
so a burst of reads on many streams is stamped before any of them is parsed; with ``fast_io=False`` (``--io
httpx``) they go through httpx and are stamped when httpx returns the read. JSON is parsed after the
stream ends, by one worker task per event loop that yields to the loop after each :data:`PARSE_BUDGET_S` (1 ms)
of work, so the end-of-stream work of requests that finish together never holds up the reads (and stamps) of
the others on the same loop for longer than that. The send time is taken
just before the request goes out, after any client-side queueing (recorded separately as ``queued_ns``).

A response is complete at ``data: [DONE]``: reading stops there, ``end_ns`` is the arrival of that read, and the
connection is given back (or closed when the server keeps the body open past :data:`DONE_GRACE_S`), whether the
body is chunked, sized or close-delimited. A body the server compressed anyway (``Content-Encoding: gzip`` or
``deflate``) is decoded; any other encoding is refused with a message naming it.

Only ``message`` events carry chunks: other event types (``event: ping``) are ignored, ``event: error`` is a
failure. Failures are data: HTTP errors, error objects inside a 200 stream or a 200 JSON body, ``event: error``,
streams cut without a ``finish_reason`` or ``[DONE]``, and streams with no generated token end as records with
``error`` set; nothing is raised except ``asyncio.CancelledError`` (after recording the request as cancelled).
Every record is redacted of the API key before it is returned (:mod:`bench.redaction`).

Timeouts: the generation stream waits without limit by default (``read_timeout_s``); every other call made with
the client (``/models``, ``/tokenize``, ``/props``...) is bounded by ``setup_timeout_s`` (30 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import ssl
import time
import weakref
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import ConfigError, EndpointUnreachable, ServerError, UnreadableResponse
from .fastio import FastConnectError, FastIOError, FastPool, FastTimeout, stamp_tracker
from .records import Event, RequestRecord
from .redaction import LOG_FILTER, add_secret, redact
from .sse import SSEDecoder, SSEEvent
from .turns import take_turn

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
    "error_from_body",
    "exc_line",
    "DONE_GRACE_S",
    "PARSE_SLICE",
    "PARSE_BUDGET_S",
]

def _json_loader() -> Callable[[str], Any]:
    """orjson's parser where the ``fast`` extra is installed (~3x faster), else json's (the reference; same results,
    both tested)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - exercised where orjson is absent
        return json.loads
    return orjson.loads


_loads = _json_loader()

_ERR_BODY_LIMIT = 64 * 1024
DONE_GRACE_S = 0.02  # after [DONE]: how long the rest of the body (chunked terminator) may take to be reusable
PARSE_SLICE = 64  # events parsed at a time by the end-of-stream worker
PARSE_BUDGET_S = 0.001  # most end-of-stream work between two yields of that worker to the event loop
log = logging.getLogger("bench")
log.addFilter(LOG_FILTER)


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


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How bench talks to the endpoint.

    Attributes:
        api_key_env: name of the environment variable holding the API key (default ``OPENAI_API_KEY``).
        connect_timeout_s: TCP/TLS connect timeout in seconds (short: an unreachable URL fails fast).
        read_timeout_s: longest silence between two reads of a generation stream in seconds; ``None`` (default)
            = no limit, because a long prefill (a 1M-token prompt) can send no byte for many minutes.
        setup_timeout_s: longest wait for any other call (``/models``, ``/tokenize``, ``/props``...), per read;
            30 s by default, ``None`` = no limit.
        extra_headers: sent with every request.
        fast_io: stream responses (``http://`` and ``https://``) through :mod:`bench.fastio`, which stamps each
            read the moment it arrives (in ``asyncio.Protocol.data_received``) instead of after httpx's stack
            processed it; every non-streaming call (``/models``, ``/tokenize``) stays on httpx.
        ca_bundle: PEM file of the CA certificates to trust for ``https://`` (instead of the default store;
            ``SSL_CERT_FILE`` is the environment's way to say the same), both read paths.
        insecure: do not verify the server's TLS certificate at all (the CLI warns).
        stamps: fastio's stamp source: ``"auto"`` (kernel receive stamps where the OS gives them, bench.kstamp),
            ``"kernel"`` (the same) or ``"user"`` (user-space stamps); each record says which it got.
    """

    api_key_env: str = "OPENAI_API_KEY"
    connect_timeout_s: float = 10.0
    read_timeout_s: float | None = None
    setup_timeout_s: float | None = 30.0
    extra_headers: dict[str, str] = field(default_factory=dict)
    fast_io: bool = True
    ca_bundle: str | None = None
    insecure: bool = False
    stamps: str = "auto"

    @property
    def api_key(self) -> str | None:
        """The key from the environment, or None. Never printed or stored: reading it registers it for redaction
        everywhere (:func:`bench.redaction.add_secret`)."""
        key = os.environ.get(self.api_key_env) or None
        add_secret(key)
        return key

    def headers(self) -> dict[str, str]:
        """Request headers, with ``Authorization`` when a key is set."""
        h = {"Accept": "text/event-stream", "Accept-Encoding": "identity", **self.extra_headers}
        key = self.api_key
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``https://`` on both read paths; None = httpx's default (certifi, ``SSL_CERT_FILE``).

        Raises:
            ConfigError: ``ca_bundle`` cannot be read as PEM certificates, or both options are given.
        """
        if self.insecure and self.ca_bundle:
            raise ConfigError("give --ca-bundle FILE or --insecure, not both")
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        if self.ca_bundle:
            try:
                return ssl.create_default_context(cafile=self.ca_bundle)
            except (OSError, ssl.SSLError, ValueError) as e:
                raise ConfigError(f"--ca-bundle {self.ca_bundle}: not a readable PEM file of CA certificates "
                                  f"({exc_line(e)})") from None
        return None


def make_http_client(settings: ClientSettings, concurrency: int = 1) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose pool never caps concurrency below ``concurrency`` streams.

    httpx's default pool allows 100 connections and silently queues the rest; bench sets no connection limit and
    keeps ``concurrency`` connections alive between waves. The client's own timeout (every call but the
    generation stream) reads ``settings.setup_timeout_s``; :func:`stream_request` uses ``read_timeout_s``.
    """
    # keepalive_expiry well under common server idle timeouts (cpp-httplib/llama.cpp: 5 s; uvicorn: 5 s), so a
    # pooled connection is never reused just as the server closes it
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(concurrency, 1) + 4,
                          keepalive_expiry=2.0)
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s, read=settings.setup_timeout_s, write=60.0, pool=None
    )
    ctx = settings.ssl_context()
    inner = httpx.AsyncHTTPTransport(limits=limits, http2=False, verify=ctx if ctx is not None else True)
    client = _BenchClient(timeout=timeout, headers=settings.headers(), transport=_StaleRetryTransport(inner))
    client.bench_stream_timeout = httpx.Timeout(
        connect=settings.connect_timeout_s, read=settings.read_timeout_s, write=60.0, pool=None
    )
    if settings.fast_io:
        client.bench_fast_pool = FastPool(ssl_context=ctx, stamps=settings.stamps)
    return client


class _BenchClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` carrying bench's :class:`~bench.fastio.FastPool` (``bench_fast_pool``, used by
    :func:`stream_request` for ``http://`` streams) and the generation stream's timeout
    (``bench_stream_timeout``); closing the client closes the pool too."""

    bench_fast_pool: FastPool | None = None
    bench_stream_timeout: httpx.Timeout | None = None

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
    """The first model id of ``GET {base}/models`` (bounded by the client's setup timeout).

    Raises:
        EndpointUnreachable: connection refused / DNS / connect timeout.
        ServerError: an HTTP error, a timeout or a body with no model.
    """
    add_secret(secret)
    try:
        r = await client.get(f"{base}/models", headers={"Accept": "application/json"})
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise EndpointUnreachable(f"cannot reach {base}: {exc_line(e)}") from None
    except httpx.TimeoutException:
        raise ServerError(f"GET {base}/models: no answer within the setup timeout; pass --model, or raise "
                          "--setup-timeout") from None
    except httpx.HTTPError as e:
        raise ServerError(f"GET {base}/models failed: {exc_line(e)}") from None
    if r.status_code >= 400:
        msg = error_from_body(r.status_code, r.headers.get("content-type", ""), r.content)
        raise ServerError(f"GET {base}/models: {msg}; pass --model")
    try:
        data = r.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise ServerError(f"GET {base}/models returned no model list; pass --model") from None


def exc_line(e: BaseException) -> str:
    """An exception as one redacted line of at most 300 characters (the type name when it has no text)."""
    s = redact(str(e)).strip() or type(e).__name__
    return s.splitlines()[0][:300]


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def error_from_body(status: int, ctype: str, body: bytes) -> str:
    """One redacted line: ``HTTP <status>: <message>`` from a JSON, HTML or text error body."""
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
        except (ValueError, RecursionError):
            msg = text
    elif "html" in ctype or text.lstrip().lower().startswith(("<!doctype", "<html")):
        m = _TITLE.search(text)
        msg = m.group(1) if m else _TAG.sub(" ", text)
    else:
        msg = text
    msg = " ".join(redact(msg).split())[:200]  # redacted before the cut: no key prefix survives it
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
        secret: the API key, to scrub it from the record (registered for redaction everywhere).
        queued_ns: when the caller queued the request (defaults to now).
        tap: optional live counters for a progress display.

    Returns:
        The :class:`RequestRecord`; ``record.error`` is set for every failure. Never raises for server or network
        faults; re-raises ``asyncio.CancelledError`` (the record is then discarded by the caller).
    """
    add_secret(secret)
    now = time.perf_counter_ns()
    rec = RequestRecord(spec.request_id, spec.endpoint, model, queued_ns=queued_ns or now, meta=dict(spec.meta))
    raw: list[SSEEvent] = []
    try:
        await _exchange(client, base, spec, model, rec, raw, tap)
    except asyncio.CancelledError:
        rec.error, rec.error_kind = "cancelled", "cancelled"
        raise
    except (httpx.HTTPError, FastIOError, UnreadableResponse) as e:
        _record_failure(rec, e, base)
    finally:
        if tap is not None:
            tap.finished = True
        if rec.end_ns is None and rec.sent_ns:
            rec.end_ns = time.perf_counter_ns() - rec.sent_ns
    await _parse_sliced(rec, raw)
    if rec.error is not None:
        log.debug("%s failed: %s", spec.request_id, rec.error)
    return rec


def _payload(spec: RequestSpec, model: str) -> bytes:
    body = dict(spec.body)
    body.setdefault("model", model)
    body.setdefault("stream", True)
    if body.get("stream"):
        body.setdefault("stream_options", {"include_usage": True})
    return json.dumps(body).encode()


def _stream_timeout(client: httpx.AsyncClient) -> httpx.Timeout:
    t = getattr(client, "bench_stream_timeout", None)
    return t if isinstance(t, httpx.Timeout) else client.timeout


async def _exchange(client: httpx.AsyncClient, base: str, spec: RequestSpec, model: str, rec: RequestRecord,
                    raw: list[SSEEvent], tap: StreamTap | None) -> None:
    """Send the request and read the response into ``rec`` (status, end) and ``raw`` (SSE events). A wave of
    requests takes turns (bench.turns) to build and send theirs, sharing the loop with the streams already
    running."""
    await take_turn()
    path = "/chat/completions" if spec.endpoint == "chat" else "/completions"
    payload = _payload(spec, model)
    timeout = _stream_timeout(client)
    request = client.build_request("POST", base + path, content=payload,
                                   headers={"Content-Type": "application/json"}, timeout=timeout)
    fast: FastPool | None = getattr(client, "bench_fast_pool", None)
    response: Any = None  # httpx.Response or fastio.FastResponse
    src: Any = None  # where the reads' stamps come from (bench.fastio.stamp_tracker)
    if tap is not None:
        tap.started = True
    try:
        if fast is not None:
            rec.stamp_source = fast.stamp_source
        rec.sent_ns = time.perf_counter_ns()
        if fast is not None:
            response = await fast.stream("POST", str(request.url), request.headers.multi_items(), payload,
                                         connect_timeout=timeout.connect, read_timeout=timeout.read)
            src = stamp_tracker(response)  # read again after the body: a read without a kernel stamp shows
        else:
            response = await client.send(request, stream=True)
        rec.status = response.status_code
        _log_response(spec, request, len(payload), response)
        await _read_response(response, fast is not None, rec, raw, tap)
    finally:
        if src is not None:
            rec.stamp_source = src.stamp_source
        if response is not None:
            await response.aclose()


def _log_response(spec: RequestSpec, request: httpx.Request, size: int, response: Any) -> None:
    if log.isEnabledFor(logging.DEBUG):
        hdrs = {k: ("Bearer ***" if k.lower() == "authorization" else v) for k, v in request.headers.items()}
        log.debug("%s POST %s (%d bytes, headers %s) -> HTTP %d %s", spec.request_id, request.url, size, hdrs,
                  response.status_code, response.headers.get("content-type", ""))


async def _read_response(response: Any, fast: bool, rec: RequestRecord, raw: list[SSEEvent],
                         tap: StreamTap | None) -> None:
    ctype = response.headers.get("content-type", "")
    inflate = _content_decoder(response.headers.get("content-encoding", ""), refuse=response.status_code < 300)
    stamped = response.aiter_stamped() if fast else _stamp_reads(response)
    if response.status_code >= 300:
        err_body = await _read_body(stamped, inflate, _ERR_BODY_LIMIT)
        rec.end_ns = time.perf_counter_ns() - rec.sent_ns
        rec.error = error_from_body(response.status_code, ctype, err_body)
        rec.error_kind = _http_kind(response.status_code)
        return
    if "text/event-stream" not in ctype and "json" in ctype:
        whole = await _read_body(stamped, inflate, None)
        t = time.perf_counter_ns()
        rec.end_ns = t - rec.sent_ns
        _parse_whole(rec, whole, t)
        return
    sink = _SSESink(inflate, raw, tap)
    t_done: int | None = None
    try:
        if fast and response.can_pump:  # decoded in the read callback (kernel stamps: bench.fastio.BodyPump)
            t_done = await response.pump(sink.feed)
            if t_done is None:
                sink.flush()
        else:
            t_done = await _read_sse(stamped, sink)
    finally:
        t_end = time.perf_counter_ns()
        if t_done is None:
            raw.extend(sink.dec.close(t_end))
        rec.end_ns = (t_done if t_done is not None else t_end) - rec.sent_ns
    await _after_done(response, stamped, fast)


class _SSESink:
    """Body bytes -> SSE events in ``raw`` (decoded when compressed), counted on ``tap``; :meth:`feed` says when
    ``[DONE]`` arrived. The same code whether the reading task feeds it or the read callback does."""

    __slots__ = ("inflate", "dec", "raw", "tap")

    def __init__(self, inflate: Any, raw: list[SSEEvent], tap: StreamTap | None) -> None:
        self.inflate = inflate
        self.dec = SSEDecoder()
        self.raw = raw
        self.tap = tap

    def feed(self, t: int, chunk: bytes) -> bool:
        """One body piece stamped ``t``; True once it completed the ``[DONE]`` event."""
        if self.inflate is not None:
            chunk = _inflate(self.inflate, chunk)
        evs = self.dec.feed(chunk, t)
        if evs:
            self.raw.extend(evs)
            if self.tap is not None:
                self.tap.events += len(evs)
            for ev in evs:
                if len(ev.data) < 16 and _is_done(ev):  # a chunk's JSON is longer: one len() per event
                    return True
        return False

    def flush(self) -> None:
        """The body ended: what the compressed stream still held."""
        if self.inflate is not None:
            self.raw.extend(self.dec.feed(_inflate(self.inflate, b"", final=True), time.perf_counter_ns()))


async def _read_sse(stamped: Any, sink: _SSESink) -> int | None:
    """Feed the stamped reads to ``sink`` until the body ends (None) or ``[DONE]`` arrives (its stamp)."""
    async for t, chunk in stamped:
        if sink.feed(t, chunk):
            return t
    sink.flush()
    return None


def _is_done(ev: SSEEvent) -> bool:
    d = ev.data
    return len(d) < 16 and ev.event == "message" and d.strip() == "[DONE]"


async def _after_done(response: Any, stamped: Any, fast: bool) -> None:
    """After ``[DONE]`` (or the end of the body): let the connection go back to the pool if the rest of the body
    arrives within :data:`DONE_GRACE_S`, else close it. Never waits longer, never raises for the server's sake.
    Responses that end together take turns (bench.turns), so the other streams' reads go on meanwhile."""
    try:
        await take_turn()
        if fast:
            await response.close_after_done(DONE_GRACE_S)
        else:
            await _drain_httpx(stamped, DONE_GRACE_S)
    except (httpx.HTTPError, FastIOError, TimeoutError):
        pass
    finally:
        await stamped.aclose()


async def _drain_httpx(stamped: Any, grace: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while (left := deadline - loop.time()) > 0:
        try:
            await asyncio.wait_for(stamped.__anext__(), left)
        except StopAsyncIteration:
            return


async def _stamp_reads(response: httpx.Response) -> AsyncIterator[tuple[int, bytes]]:
    """``(perf_counter_ns, bytes)`` for each read of an httpx streaming response, stamped as it is returned."""
    perf = time.perf_counter_ns
    async for chunk in response.aiter_raw():
        yield perf(), chunk


async def _read_body(stamped: Any, inflate: Any, limit: int | None) -> bytes:
    """The body (decoded when compressed), up to ``limit`` bytes (None: all)."""
    buf = bytearray()
    async for _t, chunk in stamped:
        buf += _inflate(inflate, chunk) if inflate is not None else chunk
        if limit is not None and len(buf) >= limit:
            break
    if inflate is not None and (limit is None or len(buf) < limit):
        buf += _inflate(inflate, b"", final=True)
    await stamped.aclose()
    return bytes(buf)


class _Inflater:
    """Incremental ``deflate`` decoding: zlib-wrapped (RFC 9110) or raw (what some servers send), told apart by
    the first two bytes."""

    def __init__(self) -> None:
        self._z: Any = None
        self._head = b""

    def decompress(self, data: bytes) -> bytes:
        if self._z is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            b0, b1 = self._head[0], self._head[1]
            wrapped = (b0 & 0x0F) == 8 and (b0 << 8 | b1) % 31 == 0
            self._z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        return bytes(self._z.decompress(data))

    def flush(self) -> bytes:
        return bytes(self._z.flush()) if self._z is not None else b""


def _content_decoder(encoding: str, *, refuse: bool) -> Any:
    """A decoder for a ``Content-Encoding`` bench asked not to get (it sends ``Accept-Encoding: identity``): gzip
    and deflate are decoded; anything else raises :class:`UnreadableResponse` naming it (an error body is then read raw)."""
    enc = encoding.strip().lower()
    if not enc or enc == "identity":
        return None
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return _Inflater()
    if not refuse:
        return None
    raise UnreadableResponse(f"the server sent the stream with Content-Encoding: {encoding.strip()[:40]}, which bench does "
                   "not decode (it decodes gzip and deflate and asks for identity): turn compression off for "
                   "text/event-stream on the server or proxy")


def _inflate(z: Any, data: bytes, final: bool = False) -> bytes:
    try:
        return bytes(z.flush() if final else z.decompress(data))
    except zlib.error as e:
        raise UnreadableResponse(f"cannot decode the compressed body (Content-Encoding): {e}") from None


_TIMEOUTS = (FastTimeout, httpx.TimeoutException)
_CONNECT = (httpx.ConnectError, httpx.ConnectTimeout, FastConnectError)
_BROKEN = (FastIOError, httpx.RemoteProtocolError, httpx.ReadError)


def _record_failure(rec: RequestRecord, e: BaseException, base: str) -> None:
    """The record's error for a network or protocol failure (order matters: connect errors are timeouts too)."""
    if isinstance(e, UnreadableResponse):
        rec.error, rec.error_kind = str(e), e.kind
    elif isinstance(e, _CONNECT):
        rec.error, rec.error_kind = f"cannot connect to {base}: {exc_line(e)}", "connect"
    elif isinstance(e, FastTimeout):
        rec.error, rec.error_kind = f"timed out waiting for the server ({exc_line(e)})", "timeout"
    elif isinstance(e, httpx.TimeoutException):
        rec.error, rec.error_kind = f"timed out waiting for the server ({type(e).__name__})", "timeout"
    elif isinstance(e, _BROKEN):
        rec.error, rec.error_kind = f"stream broken: {exc_line(e)}", "incomplete"
    else:
        rec.error, rec.error_kind = f"{type(e).__name__}: {exc_line(e)}", "protocol"


def _set_error(rec: RequestRecord, msg: str, kind: str) -> None:
    if rec.error is None:  # the first failure is the cause; later ones are consequences
        rec.error = redact(msg)
        rec.error_kind = kind


class _Deferred:
    """The end-of-stream work of every finished response on one event loop, done by ONE worker task in slices of
    :data:`PARSE_SLICE` events, at most :data:`PARSE_BUDGET_S` of work between two yields to the loop.

    Why one worker: when hundreds of streams end at the same decode step, every one of their tasks is ready in the
    same loop iteration, and the loop polls sockets only between iterations; each parsing its own response there
    (even in slices) would hold every other stream's reads, and their stamps, for the sum of all the parses.
    Queued here, the parses run one slice after another with the loop polling in between, so a read that arrives
    meanwhile is stamped within about one budget (~1 ms) of its arrival. The worker ends when the queue is empty
    (no task outlives the work; the next response starts a new one).
    """

    def __init__(self) -> None:
        self.queue: deque[tuple[RequestRecord, list[SSEEvent], asyncio.Future[None]]] = deque()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        perf = time.perf_counter
        t0 = perf()
        while self.queue:
            rec, raw, fut = self.queue.popleft()
            try:
                for i in range(0, max(len(raw), 1), PARSE_SLICE):
                    if _parse_events(rec, raw[i:i + PARSE_SLICE]):
                        break
                    if perf() - t0 > PARSE_BUDGET_S:
                        await asyncio.sleep(0)
                        t0 = perf()
                _finish(rec)
            except Exception as e:  # a bug, never the server's doing: fail the request, not the worker
                _set_error(rec, f"internal error while parsing: {type(e).__name__}: {e}", "protocol")
            if not fut.done():
                fut.set_result(None)
            if perf() - t0 > PARSE_BUDGET_S:
                await asyncio.sleep(0)
                t0 = perf()


_deferred: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deferred] = weakref.WeakKeyDictionary()


async def _parse_sliced(rec: RequestRecord, raw: list[SSEEvent]) -> None:
    """Parse ``raw`` into ``rec`` and apply the success rules (:func:`_finish`), through the loop's
    :class:`_Deferred` worker: off the path that stamps reads."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    d = _deferred.get(loop)
    if d is not None and not d.task.done():
        d.queue.append((rec, raw, fut))  # the running worker takes it (it checks the queue after every item)
    else:
        d = _Deferred()
        d.queue.append((rec, raw, fut))
        _deferred[loop] = d
    await fut


def _parse_events(rec: RequestRecord, raw: list[SSEEvent]) -> bool:
    """Turn decoded SSE events into :class:`Event` objects and fill usage/finish/error fields. Only ``message``
    events carry chunks; other types are ignored except ``error``. Returns True at ``[DONE]`` (the response is
    complete there: what follows is ignored).

    The common chunk is folded in here, with no call and the fewest lookups: one choice, index 0, and either a
    non-empty ``delta`` without tool calls whose content and reasoning are strs or null, or (completions) no
    ``delta`` and a str ``text``; no ``error`` or ``timings``. Every other chunk goes to :func:`_absorb`, the
    reference, which gives the same record for the common chunk too (tests/test_client.py checks that)."""
    sent = rec.sent_ns
    loads = _loads
    append = rec.events.append
    for sse in raw:
        if rec.done:
            return True
        if sse.event != "message":
            _no_chunk(rec, sse)
            continue
        try:
            obj = loads(sse.data)
        except (ValueError, RecursionError):  # also a keep-alive or [DONE]: rare, so not checked for first
            _no_chunk(rec, sse)
            continue
        if obj.__class__ is not dict:  # the loaders give plain dicts, lists and strs: exact-type checks suffice
            _set_error(rec, f"event is not a JSON object: {_one_line(sse.data)[:120]}", "bad_json")
            continue
        choices = obj.get("choices")
        if choices.__class__ is list and len(choices) == 1 and "error" not in obj and "timings" not in obj:
            ch = choices[0]
            delta = ch.get("delta") if ch.__class__ is dict and ch.get("index", 0) == 0 else False
            if delta.__class__ is dict and delta and "text" not in ch:
                text = delta.get("content") or ""  # a falsy value adds no text, whatever its type
                if len(delta) == 1 and text:
                    r1 = r2 = ""  # content is its only key
                else:
                    r1, r2 = delta.get("reasoning_content") or "", delta.get("reasoning") or ""
                    text = None if delta.get("tool_calls") else text  # tool calls: the general path
            elif delta is None and "message" not in ch:
                text, r1, r2 = ch.get("text"), "", ""
            else:
                text, r1, r2 = None, "", ""  # not the common chunk
            if text.__class__ is str and r1.__class__ is str and r2.__class__ is str:
                fr, usage, sim = ch.get("finish_reason"), obj.get("usage"), obj.get("sim")
                if fr:
                    rec.finish_reason = str(fr)[:100]
                if usage and usage.__class__ is dict:  # some servers send usage on every chunk
                    rec.usage = usage
                if sim.__class__ is dict:
                    s, w, k = sim.get("sched_ns"), sim.get("write_ns"), sim.get("tokens")
                    append(Event(sse.t_ns - sent, text, r1 + r2, "", s if s.__class__ is int else None,
                                 w if w.__class__ is int else None, k if k.__class__ is int else None))
                else:
                    append(Event(sse.t_ns - sent, text, r1 + r2))
                continue
        _absorb(rec, obj, sse.t_ns - sent)
    return rec.done


def _no_chunk(rec: RequestRecord, sse: SSEEvent) -> None:
    """An event that carries no chunk: an ``error`` event fails the request, other non-``message`` events (ping)
    are ignored; a ``message`` whose data is not JSON is a keep-alive (empty), ``[DONE]``, or a failure."""
    if sse.event != "message":
        if sse.event == "error":
            _set_error(rec, f"error event: {_one_line(sse.data)}", "stream_error")
        return
    data = sse.data.strip()
    if data == "[DONE]":
        rec.done = True
    elif data:
        _set_error(rec, f"event is not JSON: {_one_line(sse.data)[:120]}", "bad_json")


def _one_line(s: str) -> str:
    return " ".join(redact(s).split())[:300]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _absorb(rec: RequestRecord, obj: dict[str, Any], t_rel: int) -> None:
    """Fold one parsed chunk (streaming or whole) into the record, as one :class:`Event` built once; fields of
    the wrong type are ignored, and so are choices whose ``index`` is not 0."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            code = err.get("code") or err.get("type") or ""
            text = f"error in stream: {code} {err.get('message') or ''}".strip()
        else:
            text = f"error in stream: {err}"
        _set_error(rec, _one_line(text), "stream_error")
        return
    content = reasoning = tool = ""
    choices = obj.get("choices")
    if choices.__class__ is list:
        for ch in choices:
            if ch.__class__ is dict and ch.get("index", 0) == 0:
                c, r, t = _absorb_choice(rec, ch)
                content, reasoning, tool = content + c, reasoning + r, tool + t
    usage = obj.get("usage")
    if usage and usage.__class__ is dict:
        rec.usage = usage
    timings = obj.get("timings")
    if timings and timings.__class__ is dict:
        rec.timings = timings
    sim = obj.get("sim")
    if sim.__class__ is dict:
        rec.events.append(Event(t_rel, content, reasoning, tool, _int(sim.get("sched_ns")),
                                _int(sim.get("write_ns")), _int(sim.get("tokens"))))
    else:
        rec.events.append(Event(t_rel, content, reasoning, tool))


def _int(v: Any) -> int | None:
    return v if v.__class__ is int else None  # not bool (a subclass of int), not None


def _absorb_choice(rec: RequestRecord, ch: dict[str, Any]) -> tuple[str, str, str]:
    """One choice's (content, reasoning, tool) text, noting its ``finish_reason`` on the record: exact-type checks
    (the JSON loaders give plain dicts, lists and strs)."""
    content = reasoning = tool = ""
    delta = ch.get("delta") or ch.get("message")
    if delta.__class__ is dict:
        c = delta.get("content")
        if c.__class__ is str:
            content = c
        r = delta.get("reasoning_content")
        if r.__class__ is str:
            reasoning = r
        r = delta.get("reasoning")
        if r.__class__ is str:
            reasoning += r
        calls = delta.get("tool_calls")
        if calls.__class__ is list:
            for tc in calls:
                fn = tc.get("function") if tc.__class__ is dict else None
                if fn.__class__ is dict:
                    tool += _text(fn.get("name")) + _text(fn.get("arguments"))
    c = ch.get("text")
    if c.__class__ is str:
        content += c
    fr = ch.get("finish_reason")
    if fr:
        rec.finish_reason = str(fr)[:100]
    return content, reasoning, tool


def _parse_whole(rec: RequestRecord, body: bytes, t_abs: int) -> None:
    """A non-streaming JSON answer (server ignored ``stream``): one event at the time the body completed."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        _set_error(rec, "response is not JSON", "bad_json")
        return
    if not isinstance(obj, dict):
        _set_error(rec, "response is not a JSON object", "bad_json")
        return
    _absorb(rec, obj, t_abs - rec.sent_ns)
    rec.done = True


def _finish(rec: RequestRecord) -> None:
    """Apply the success rules once everything is parsed, then redact the record."""
    if rec.error is None:
        if not rec.done and rec.finish_reason is None:
            _set_error(rec, "stream ended without finish_reason or [DONE]", "incomplete")
        elif not any(e.has_text for e in rec.events):
            _set_error(rec, "no tokens generated", "no_tokens")
    rec.redact()


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
