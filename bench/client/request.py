"""The streaming client: one request to an OpenAI-compatible endpoint -> one :class:`RequestRecord`.

Timing rule: each network read is stamped with ``time.perf_counter_ns()`` the moment it arrives, before SSE
decoding or JSON parsing; every event gets the stamp of the read that completed it. Streams are read by
:mod:`bench.transport.http` (``ClientSettings.fast_io``, the default), which stamps in ``asyncio.Protocol.data_received``,
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
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from bench.client.endpoint import (
    _ERR_BODY_LIMIT,
    KEY_REFUSED,
    RequestSpec,
    StreamTap,
    _http_kind,
    error_from_body,
    exc_line,
    log,
    no_api_message,
)
from bench.client.events import _parse_sliced, _parse_whole
from bench.client.images import body_images
from bench.client.turns import take_turn
from bench.errors import ConfigError, EndpointUnreachable, FastLocalLimit, ServerError, UnreadableResponse
from bench.records import RequestRecord
from bench.redaction import add_secret
from bench.transport.http import FastConnectError, FastIOError, FastPool, FastTimeout, stamp_tracker
from bench.transport.limits import local_limit_text
from bench.transport.sse import SSEDecoder, SSELog

__all__ = ["stream_request", "require_ok", "DONE_GRACE_S"]

DONE_GRACE_S = 0.02  # after [DONE]: how long the rest of the body (chunked terminator) may take to be reusable


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
    if spec.endpoint == "chat":
        rec.images, rec.image_bytes = body_images(spec.body)
        choice = spec.body.get("tool_choice")
        rec.tool_forced = bool(spec.body.get("tools")) and (choice == "required" or isinstance(choice, dict))
    raw = SSELog()
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
                    raw: SSELog, tap: StreamTap | None) -> None:
    """Send the request and read the response into ``rec`` (status, end) and ``raw`` (SSE events). A wave of
    requests takes turns (bench.client.turns) to build and send theirs, sharing the loop with the streams already
    running (a request of an open-loop schedule sends at once: bench.client.turns.scheduled_task)."""
    await take_turn(send=True)
    url = base + ("/chat/completions" if spec.endpoint == "chat" else "/completions")
    payload = _payload(spec, model)
    timeout = _stream_timeout(client)
    fast: FastPool | None = getattr(client, "bench_fast_pool", None)
    response: Any = None  # httpx.Response or fastio.FastResponse
    src: Any = None  # where the reads' stamps come from (bench.transport.http.stamp_tracker)
    if tap is not None:
        tap.started = True
    try:
        if fast is not None:
            rec.stamp_source = fast.stamp_source
            target, headers = _fast_head(client, url)
            rec.sent_ns = time.perf_counter_ns()
            response = await fast.stream("POST", target, headers, payload, connect_timeout=timeout.connect,
                                         read_timeout=timeout.read)
            src = stamp_tracker(response)  # read again after the body: a read without a kernel stamp shows
        else:
            request = client.build_request("POST", url, content=payload, headers=JSON_HEADERS, timeout=timeout)
            target, headers = str(request.url), request.headers.multi_items()
            rec.sent_ns = time.perf_counter_ns()
            response = await client.send(request, stream=True)
        rec.status = response.status_code
        _log_response(spec, target, headers, len(payload), response)
        await _read_response(response, fast is not None, rec, raw, tap)
    finally:
        if src is not None:
            rec.stamp_source = src.stamp_source
        if response is not None:
            await response.aclose()


JSON_HEADERS = {"Content-Type": "application/json"}


def _fast_head(client: httpx.AsyncClient, url: str) -> tuple[str, list[tuple[str, str]]]:
    """The target URL and the headers (all but Content-Length, which the fast pool adds) of a POST to ``url`` as
    the client sends it: built once per client and URL, since building an httpx.Request per request took a fifth
    of a request's CPU at 2,000 req/s (benchmarks/results/schedule_accuracy-2026-12-04-h200.md)."""
    heads: dict[str, tuple[str, list[tuple[str, str]]]] | None = getattr(client, "bench_fast_heads", None)
    if heads is None:
        heads = {}
        client.bench_fast_heads = heads  # type: ignore[attr-defined]
    got = heads.get(url)
    if got is None:
        request = client.build_request("POST", url, content=b"", headers=JSON_HEADERS)
        items = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
        got = heads[url] = (str(request.url), items)
    return got


def _log_response(spec: RequestSpec, url: str, headers: list[tuple[str, str]], size: int, response: Any) -> None:
    if log.isEnabledFor(logging.DEBUG):
        hdrs = {k: ("Bearer ***" if k.lower() == "authorization" else v) for k, v in headers}
        log.debug("%s POST %s (%d bytes, headers %s) -> HTTP %d %s", spec.request_id, url, size, hdrs,
                  response.status_code, response.headers.get("content-type", ""))


async def _read_response(response: Any, fast: bool, rec: RequestRecord, raw: SSELog,
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
        if fast and response.can_pump:  # decoded in the read callback (kernel stamps: bench.transport.http.BodyPump)
            t_done = await response.pump(sink.feed)
            if t_done is None:
                sink.flush()
        else:
            t_done = await _read_sse(stamped, sink)
    finally:
        t_end = time.perf_counter_ns()
        if t_done is None:
            raw.add(sink.dec.close(t_end))
        rec.end_ns = (t_done if t_done is not None else t_end) - rec.sent_ns
    await _after_done(response, stamped, fast)


class _SSESink:
    """Body bytes -> SSE events in ``raw`` (decoded when compressed), counted on ``tap``; :meth:`feed` says when
    ``[DONE]`` arrived. The same code whether the reading task feeds it or the read callback does."""

    __slots__ = ("inflate", "dec", "raw", "tap")

    def __init__(self, inflate: Any, raw: SSELog, tap: StreamTap | None) -> None:
        self.inflate = inflate
        self.dec = SSEDecoder()
        self.raw = raw
        self.tap = tap

    def feed(self, t: int, chunk: bytes) -> bool:
        """One body piece stamped ``t``; True once it completed the ``[DONE]`` event."""
        if self.inflate is not None:
            chunk = _inflate(self.inflate, chunk)
        raw = self.raw
        n = self.dec.feed_log(chunk, t, raw)
        if n:
            if self.tap is not None:
                self.tap.events += n
            data = raw.data
            if (len(data[-1]) if n == 1 else min(map(len, data[-n:]))) < 16:  # a chunk's JSON is longer
                return _done_in(raw, len(data) - n)
        return False

    def flush(self) -> None:
        """The body ended: what the compressed stream still held."""
        if self.inflate is not None:
            self.dec.feed_log(_inflate(self.inflate, b"", final=True), time.perf_counter_ns(), self.raw)


def _done_in(raw: SSELog, start: int) -> bool:
    """True when a ``message`` event from ``start`` on is ``[DONE]``."""
    for i in range(start, len(raw)):
        d = raw.data[i]
        if len(d) < 16 and d.strip() == "[DONE]" and i not in raw.other_at:
            return True
    return False


async def _read_sse(stamped: Any, sink: _SSESink) -> int | None:
    """Feed the stamped reads to ``sink`` until the body ends (None) or ``[DONE]`` arrives (its stamp)."""
    async for t, chunk in stamped:
        if sink.feed(t, chunk):
            return int(t)
    sink.flush()
    return None


async def _after_done(response: Any, stamped: Any, fast: bool) -> None:
    """After ``[DONE]`` (or the end of the body): let the connection go back to the pool if the rest of the body
    arrives within :data:`DONE_GRACE_S`, else close it. Never waits longer, never raises for the server's sake.
    Responses that end together take turns (bench.client.turns), so the other streams' reads go on meanwhile."""
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


def _local_limit(e: BaseException, base: str) -> str | None:
    """The line for a connect that failed on this machine's limits (no local port, no file descriptor), from the
    stamping transport (:class:`FastLocalLimit`) or from the OSError under httpx's error; else None."""
    if isinstance(e, FastLocalLimit):
        return exc_line(e)
    seen: BaseException | None = e
    for _ in range(8):  # httpx -> httpcore -> OSError
        if seen is None:
            return None
        text = local_limit_text(seen, base)
        if text:
            return text
        seen = seen.__cause__ or seen.__context__
    return None


def _record_failure(rec: RequestRecord, e: BaseException, base: str) -> None:
    """The record's error for a network or protocol failure (order matters: connect errors are timeouts too)."""
    if isinstance(e, UnreadableResponse):
        rec.error, rec.error_kind = str(e), e.kind
    elif isinstance(e, _CONNECT) and (limit := _local_limit(e, base)):
        rec.error, rec.error_kind = limit, "client_limit"
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


def require_ok(rec: RequestRecord, base: str = "", what: str = "request") -> None:
    """Raise the error matching a failed record (``bench probe``, a run's set-up probes).

    Raises:
        EndpointUnreachable: connection failure.
        ConfigError: the request's path answered 404 (no OpenAI API at ``base``: a typo in the URL's path), or
            this machine had no local port or file descriptor left for it (``client_limit``).
        ServerError: any other failure.
    """
    if rec.ok:
        return
    if rec.error_kind == "connect":
        raise EndpointUnreachable(rec.error or "cannot connect")
    if rec.error_kind == "client_limit":  # this machine's limit, not the endpoint's: the line names the fix
        raise ConfigError(rec.error or "no local port or file descriptor left")
    if rec.status == 404 and base:
        path = "/chat/completions" if rec.endpoint == "chat" else "/completions"
        raise ConfigError(no_api_message(base, f"POST {path}"))
    cure = f"; {KEY_REFUSED}" if rec.status in (401, 403) else ""
    raise ServerError(f"{what} failed: {rec.error}{cure}")
