"""A minimal HTTP/1.1 streaming client on asyncio Protocols that stamps every read the moment it arrives.

Why: through httpx/httpcore/anyio/h11 each network read costs ~150-250 µs of Python before the caller sees it. When
a server writes one event to each of N streams at the same instant (every decode step of a batching engine), the
k-th stream's stamp taken after that stack is late by about k x 200 µs. Here the stamp is taken in
:meth:`StampProtocol.data_received`, which the event loop calls for every ready socket in one pass before any
task runs; it only stamps, queues ``(t_ns, bytes)`` and wakes the waiting reader. HTTP parsing happens later, in
the reading task, and every body piece keeps the stamp of the read that completed it: a request's head and a chunked
response's head by :mod:`bench.transport.head`, any other head and sized or close-delimited bodies by ``h11``.

Kernel stamps: on Linux (``FastPool(stamps="auto")``, the default) connections are opened by :mod:`bench.transport.kernel_stamps`
instead, whose protocol has the same seam but stamps each read with the kernel's receive time (``SO_TIMESTAMPNS``),
so a busy event loop no longer makes stamps late; TLS is then done by bench.transport.kernel_stamps over the raw socket. Each
response's connection says which it got (``stamp_tracker(response).stamp_source``: ``"kernel"`` or ``"user"``).

Scope: ``http://`` and ``https://`` (TLS through asyncio's SSL transport, verified like httpx: its default context,
certifi's CA bundle and ``SSL_CERT_FILE``; ``data_received`` then gets decrypted bytes, stamped as they come out of
the TLS layer), HTTP/1.1, one request per connection at a time, a keep-alive pool per ``(scheme, host, port)`` with
no cap on connections. Errors:

* :class:`FastConnectError` - the TCP connect failed or timed out (:class:`FastLocalLimit` when this machine ran out
  of local ports or file descriptors: :mod:`bench.transport.limits`);
* :class:`FastTimeout` - no byte for ``read_timeout`` seconds (or the request could not be written in time);
* :class:`FastIOError` - anything else: the connection broke or the response is not valid HTTP/1.1 (the message
  names the cause, e.g. ``peer closed connection without sending complete message body``).

A caller that has the whole answer before the body ends (an SSE stream's ``data: [DONE]``, with a server that
keeps the body open) calls :meth:`FastResponse.close_after_done`: the connection is pooled again if the body ends
within a short grace, else closed; it never waits for the peer beyond that.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import h11

from bench.errors import FastConnectError, FastIOError, FastTimeout, StaleConnection
from bench.transport.chunked import ChunkedDecoder
from bench.transport.connector import Opener, open_many
from bench.transport.head import RequestHead, head_end, parse_chunked_head, replay_h11
from bench.transport.limits import local_limit, reset_on_close
from bench.transport.protocol import BodyPump, StampProtocol, cut_text, exc_text

__all__ = ["FastIOError", "FastConnectError", "FastTimeout", "FastPool", "FastResponse", "BodyPump",
           "stamp_tracker"]

STAMP_CHOICES = ("auto", "kernel", "user")
PRECONNECT_PARALLEL = 32  # FastPool.preconnect's connects in flight at once
KEEPALIVE_EXPIRY_S = 2.0  # well under common server idle timeouts (llama.cpp / uvicorn: 5 s)
WRITE_TIMEOUT_S = 60.0  # as make_http_client's httpx write timeout
CHUNKED_FRAMING = True  # chunked bodies framed by bench.transport.chunked; False: by h11 (benchmarks/hotpath.py's +h11)
PUMP_BODIES = True  # kernel-stamped chunked bodies decoded in the read callback (BodyPump); False: hotpath's +queue


class _Conn:
    """One TCP connection with its h11 state: None while no exchange needed h11 (bench.transport.head wrote the
    request and read a chunked response's head); ``sent``: the request of the current exchange then (method,
    target, headers without Content-Length) and its head, from which h11's state is made when h11 must read the
    response (:meth:`FastPool._head_by_h11`)."""

    __slots__ = ("key", "proto", "h11", "idle_since", "got_bytes", "sent")

    def __init__(self, key: tuple[str, str, int], proto: StampProtocol) -> None:
        self.key = key
        self.proto = proto
        self.h11: h11.Connection | None = None
        self.idle_since = 0.0
        self.got_bytes = False  # any byte received in the current request/response cycle
        self.sent: tuple[str, str, list[tuple[str, str]], RequestHead] | None = None

    def close(self) -> None:
        tr = self.proto.transport
        if tr is not None and not tr.is_closing():
            tr.close()

    @property
    def usable(self) -> bool:
        tr = self.proto.transport
        return not self.proto.closed and not self.proto.chunks and tr is not None and not tr.is_closing()


class FastResponse:
    """A streamed response: ``status_code``, ``headers`` (dict, lower-case names; repeated headers joined with
    ``", "``), the body as stamped pieces (:meth:`aiter_stamped`) or whole (:meth:`aread`)."""

    def __init__(self, pool: FastPool, conn: _Conn, status: int, headers: dict[str, str], reason: str,
                 read_timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status_code = status
        self.reason_phrase = reason
        self.headers = headers
        self._read_timeout = read_timeout
        self._t = 0  # stamp of the last read fed to h11
        self._done = False
        # chunked bodies are framed by bench.transport.chunked (a few bytes.find per chunk) instead of h11's state machine
        # (~10-20 µs of Python per chunk, one chunk per SSE event): set by FastPool._read_head
        self._chunked: ChunkedDecoder | None = None
        self._keep_alive = True

    @property
    def status(self) -> int:
        return self.status_code

    async def aiter_stamped(self) -> AsyncIterator[tuple[int, bytes]]:
        """Body pieces as ``(perf_counter_ns of the read that completed the piece, bytes)``. Raises
        :class:`FastIOError` / :class:`FastTimeout` when the body is cut or the server goes silent."""
        conn = self._conn
        if conn is None or self._done:
            return
        if self._chunked is not None:
            async for piece in self._iter_chunked(conn, self._chunked):
                yield piece
            return
        h = conn.h11
        assert h is not None  # a body not framed by bench.transport.chunked: h11 read its head
        proto = conn.proto
        timeout = self._read_timeout
        try:
            while True:
                try:
                    ev = h.next_event()
                except h11.RemoteProtocolError as e:
                    raise FastIOError(_h11_text(e, proto)) from None
                if ev is h11.NEED_DATA:
                    item = await proto.next_chunk(timeout)
                    try:
                        if item is None:
                            h.receive_data(b"")
                        else:
                            self._t, data = item
                            h.receive_data(data)
                    except h11.RemoteProtocolError as e:
                        raise FastIOError(_h11_text(e, proto)) from None
                    continue
                if isinstance(ev, h11.Data):
                    yield self._t, bytes(ev.data)
                elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)) or ev is h11.PAUSED:
                    # end of the body (close-delimited: ConnectionClosed; PAUSED cannot come first: be safe)
                    self._done = True
                    self._release()
                    return
        finally:
            if not self._done:
                self._discard()

    async def _iter_chunked(self, conn: _Conn, dec: ChunkedDecoder) -> AsyncIterator[tuple[int, bytes]]:
        """:meth:`aiter_stamped` for a chunked body: the bytes h11 read past the head first, then every read."""
        proto = conn.proto
        try:
            while not dec.done:
                item = await proto.next_chunk(self._read_timeout)
                if item is None:
                    raise FastIOError(cut_text(proto))
                self._t = item[0]
                body = self._feed_chunked(dec, item[1])
                if body:
                    yield self._t, body
            self._done = True
            self._release_chunked(dec)
        finally:
            if not self._done:
                self._discard()

    @staticmethod
    def _feed_chunked(dec: ChunkedDecoder, data: bytes) -> bytes:
        try:
            return dec.feed(data)
        except ValueError as e:
            raise FastIOError(f"invalid chunked body: {e}") from None

    def _release_chunked(self, dec: ChunkedDecoder) -> None:
        """The chunked body ended: the connection goes back to the pool with a fresh state (no h11 state: the next
        exchange makes one if it needs it) if nothing followed the body and neither side asked to close, else it
        is closed."""
        conn = self._conn
        if conn is None:
            return
        if dec.rest or not self._keep_alive or (conn.h11 is not None and conn.h11.our_state is not h11.DONE):
            self._discard()
            return
        conn.h11 = None
        self._conn = None
        self._pool._put_back(conn, renewed=True)

    @property
    def can_pump(self) -> bool:
        """True when :meth:`pump` decodes in the read callback: a chunked body on a kernel-stamped connection."""
        conn = self._conn
        return (self._chunked is not None and not self._done and conn is not None and conn.proto.pumps
                and PUMP_BODIES)

    async def pump(self, sink: Any) -> int | None:
        """Hand every body piece to ``sink(t_ns, bytes) -> bool`` from the read callback (:class:`BodyPump`;
        only where :attr:`can_pump`). Returns the stamp of the piece for which ``sink`` returned True (the
        connection is then left for :meth:`close_after_done`), or None once the body ended (the connection is
        pooled again or closed). Raises as :meth:`aiter_stamped` does, and what ``sink`` raised."""
        conn, dec = self._conn, self._chunked
        assert conn is not None and dec is not None and self.can_pump
        p = BodyPump(conn.proto, dec, sink, self._read_timeout)
        try:
            p.start()
            t = await p.fut
        except BaseException:
            self._discard()
            raise
        finally:
            p.detach()
        if t is None:
            self._done = True
            self._release_chunked(dec)
        return t

    async def close_after_done(self, grace: float) -> None:
        """The caller has the whole answer (an SSE stream's ``[DONE]``) but the body may not have ended: read and
        drop what is left of it for up to ``grace`` seconds, then give the connection back if the body ended
        (e.g. the chunked terminator came), else close it. Never raises; never waits longer than ``grace``."""
        conn = self._conn
        if conn is None or self._done:
            return
        if self._chunked is not None:
            await self._drain_chunked(conn, self._chunked, grace)
            return
        h, proto = conn.h11, conn.proto
        assert h is not None  # not chunked: h11 read the head
        deadline = time.monotonic() + grace
        try:
            while True:
                ev = h.next_event()
                if ev is h11.NEED_DATA:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    item = await proto.next_chunk(left)
                    h.receive_data(b"" if item is None else item[1])
                elif isinstance(ev, h11.EndOfMessage):
                    self._done = True
                    self._release()
                    return
                elif not isinstance(ev, h11.Data):
                    break  # closed or paused: not reusable
        except (h11.RemoteProtocolError, FastIOError):
            pass
        self._discard()

    async def _drain_chunked(self, conn: _Conn, dec: ChunkedDecoder, grace: float) -> None:
        deadline = time.monotonic() + grace
        try:
            while not dec.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                item = await conn.proto.next_chunk(left)
                if item is None:
                    break
                self._feed_chunked(dec, item[1])
        except FastIOError:
            pass
        if dec.done:
            self._done = True
            self._release_chunked(dec)
        else:
            self._discard()

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body pieces without stamps (httpx's ``aiter_raw`` shape)."""
        async for _t, data in self.aiter_stamped():
            yield data

    async def aread(self) -> bytes:
        """The whole body."""
        buf = bytearray()
        async for _t, data in self.aiter_stamped():
            buf += data
        return bytes(buf)

    async def aclose(self) -> None:
        """Give the connection back (body fully read and reusable) or close it."""
        if not self._done:
            self._discard()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._put_back(conn)

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        self._done = True
        if conn is not None:
            conn.close()


def _h11_text(e: BaseException, proto: StampProtocol) -> str:
    msg = str(e).strip() or type(e).__name__
    if proto.exc is not None and "peer closed" in msg:
        msg = f"{msg} ({exc_text(proto.exc)})"
    return msg


def _pool_key(url: str) -> tuple[str, str, int]:
    """The pool's key of ``url``'s server: scheme, host, port."""
    parts = urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


class FastPool:
    """Keep-alive connections per ``(host, port)``; no cap on their number. A request that finds none idle takes
    the first of a connection another request gives back and a new one, new ones opening at a bounded pace
    (:mod:`bench.transport.connector`).

    Args:
        keepalive_expiry: idle connections older than this (seconds) are closed instead of reused.
        ssl_context: for ``https://``; None: httpx's default context, made on first use.
        stamps: ``"auto"`` (default): kernel receive stamps (:mod:`bench.transport.kernel_stamps`) where the system gives them,
            else user-space stamps; ``"kernel"``: the same, named explicitly (falls back like auto, the record
            says which it got); ``"user"``: user-space stamps in ``data_received`` always.
    """

    def __init__(self, keepalive_expiry: float = KEEPALIVE_EXPIRY_S, ssl_context: Any = None,
                 stamps: str = "auto") -> None:
        if stamps not in STAMP_CHOICES:
            raise ValueError(f"stamps must be one of {', '.join(STAMP_CHOICES)}, got {stamps!r}")
        self.keepalive_expiry = keepalive_expiry
        self.stamps = stamps  # "auto": kernel receive stamps where bench.transport.kernel_stamps supports them, else "user"
        self.ssl_context = ssl_context  # for https://; None: httpx's default context, made on first use
        self._idle: dict[tuple[str, str, int], deque[_Conn]] = {}
        self._closed = False
        self.connects = 0  # connections opened (for tests and diagnostics)
        self._opener: Opener[tuple[str, str, int], _Conn] = Opener(self._connect, self._park, self._give_back)
        if stamps != "user":  # probed now, not inside the first request's queue time (it took 4 ms there)
            from bench.transport.kernel_stamps import kernel_stamps_supported

            kernel_stamps_supported()

    async def stream(self, method: str, url: str, headers: Mapping[str, str] | Iterable[tuple[str, str]],
                     body: bytes, *, connect_timeout: float | None,
                     read_timeout: float | None) -> FastResponse:
        """Send one request and return once the response head arrived.

        ``headers`` are sent as given; ``Host`` and ``Content-Length`` are added when absent. A reused keep-alive
        connection that fails before any response byte is retried once on a fresh connection.
        """
        if self._closed:
            raise FastIOError("the connection pool is closed")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"fastio handles http:// and https:// URLs only, not {url!r}")
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        if not any(k.lower() == "host" for k, _ in items):
            items.insert(0, ("Host", parts.netloc.rsplit("@", 1)[-1]))
        key = (parts.scheme, host, port)
        conn = self._take_idle(key)
        fresh = False
        if conn is None:
            conn, fresh = await self._opener.get(key, connect_timeout)
        if not fresh:
            try:
                return await self._exchange(conn, method, target, items, body, read_timeout, reused=True)
            except StaleConnection:
                pass  # the server closed the idle connection: nothing reached it, send again
            conn = await self._connect(key, connect_timeout)
        return await self._exchange(conn, method, target, items, body, read_timeout, reused=False)

    async def preconnect(self, url: str, n: int, *, timeout: float) -> int:
        """Open up to ``n`` connections to ``url``'s server, ``PRECONNECT_PARALLEL`` at a time, within ``timeout``
        seconds, and pool them idle (no request is sent on them), so the requests that follow find them open (a
        wave's: one per stream, as many as the wave opens anyway; never more than will be used at once, since a
        server with a thread per connection leaves the extra ones unserved).
        Returns how many were pooled (the rest are left to the requests). At most ``PRECONNECT_PARALLEL`` at once:
        thousands overflowed a short listen queue (aiohttp's: 128), the dropped connects retried a second later."""
        if n <= 0 or timeout <= 0 or self._closed:
            return 0
        key = _pool_key(url)
        conns = await open_many(lambda: self._connect(key, timeout), n, PRECONNECT_PARALLEL, timeout)
        if self._closed:  # closed while they opened
            for c in conns:
                c.close()
            return 0
        now = time.monotonic()
        for c in conns:
            c.idle_since = now
        self._idle.setdefault(key, deque()).extend(conns)
        return len(conns)

    def idle_count(self, url: str) -> int:
        """Idle pooled connections to ``url``'s server that a request could take now (the expired and the closed
        ones are closed and dropped first)."""
        conns = self._idle.get(_pool_key(url))
        if not conns:
            return 0
        now = time.monotonic()
        for _ in range(len(conns)):  # one pass in order: each kept one goes back to the end
            c = conns.popleft()
            if c.usable and now - c.idle_since <= self.keepalive_expiry:
                conns.append(c)
            else:
                c.close()
        return len(conns)

    @property
    def stamp_source(self) -> str:
        """The stamp source new connections get: ``"kernel"`` or ``"user"``."""
        if self.stamps == "user":
            return "user"
        from bench.transport.kernel_stamps import kernel_stamps_supported

        return "kernel" if kernel_stamps_supported() else "user"

    async def aclose(self) -> None:
        """Close every idle connection (:meth:`drop_idle`); connections in use close when their response does."""
        self._closed = True
        self._opener.close(FastIOError("the connection pool is closed"))
        self.drop_idle()

    def drop_idle(self) -> int:
        """Close every idle keep-alive connection (with a reset, as every close here: :func:`reset_on_close`), so
        that none holds a local port while other processes read the streams. Returns how many were closed."""
        idle, self._idle = self._idle, {}
        n = 0
        for conns in idle.values():
            for c in conns:
                c.close()
                n += 1
        return n

    # --- internals ----------------------------------------------------------------------------------------------
    def _take_idle(self, key: tuple[str, str, int]) -> _Conn | None:
        """The most recently used idle connection (last in, first out), closing the expired ones on the way.

        A server that binds a thread to each kept-alive connection (llama.cpp's llama-server) serves only as many
        as it has HTTP threads; one beyond them waits until another is idle for the server's keep-alive timeout
        (5 s). The most recent one is one the server serves; the others expire. Taken in turn, with connections
        opened ahead, llama-server kept a request waiting 5 s (benchmarks/results/pool_order-2026-12-05-vm.md)."""
        conns = self._idle.get(key)
        if not conns:
            return None
        now = time.monotonic()
        while conns:
            c = conns.pop()
            if c.usable and now - c.idle_since <= self.keepalive_expiry:
                return c
            c.close()
        return None

    def _put_back(self, conn: _Conn, *, renewed: bool = False) -> None:
        """Pool ``conn`` again; ``renewed``: its state is already a fresh one (a body bench.transport.chunked framed)."""
        h = conn.h11
        if self._closed or not conn.usable:
            conn.close()
            return
        if not renewed and h is not None:
            if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                conn.close()
                return
            try:
                h.start_next_cycle()
            except h11.LocalProtocolError:
                conn.close()
                return
        conn.got_bytes = False
        if self._opener.offer(conn.key, conn):
            return
        conn.idle_since = time.monotonic()
        conns = self._idle.setdefault(conn.key, deque())
        # drop the expired ones here too (the oldest come first), so a long run does not keep dead sockets around
        while conns and (conn.idle_since - conns[0].idle_since > self.keepalive_expiry or not conns[0].usable):
            conns.popleft().close()
        conns.append(conn)

    def _park(self, conn: _Conn) -> None:
        """Pool a new connection no request waits for any more where it is taken last: the server may not serve it
        yet (a thread per connection), the ones given back it does."""
        if self._closed or not conn.usable:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, deque()).appendleft(conn)

    def _give_back(self, conn: _Conn, fresh: bool) -> None:
        """A connection handed to a request that was cancelled before it took it."""
        if fresh:
            self._park(conn)
        else:
            self._put_back(conn, renewed=True)

    async def _connect(self, key: tuple[str, str, int], timeout: float | None) -> _Conn:
        scheme, host, port = key
        if scheme == "https" and self.ssl_context is None:
            import httpx

            self.ssl_context = httpx.create_ssl_context()  # the same verification as the httpx path
        if self.stamps != "user":
            from bench.transport import kernel_stamps as kstamp

            if kstamp.kernel_stamps_supported():
                kp = await kstamp.open_kernel_stamped(host, port, timeout=timeout, server_hostname=host,
                                                      ssl_context=self.ssl_context if scheme == "https" else None)
                self.connects += 1
                return _Conn(key, kp)
        loop = asyncio.get_running_loop()
        proto = StampProtocol()
        tls: dict[str, Any] = {"ssl": self.ssl_context, "server_hostname": host} if scheme == "https" else {}
        try:
            await asyncio.wait_for(loop.create_connection(lambda: proto, host, port, **tls), timeout)
        except TimeoutError:
            raise FastConnectError(f"connect timed out after {timeout:g} s") from None
        except OSError as e:
            raise local_limit(e, host, port) or FastConnectError(exc_text(e)) from None
        sock = proto.transport.get_extra_info("socket") if proto.transport else None
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            reset_on_close(sock)
        self.connects += 1
        return _Conn(key, proto)

    async def _exchange(self, conn: _Conn, method: str, target: str, headers: list[tuple[str, str]], body: bytes,
                        read_timeout: float | None, *, reused: bool) -> FastResponse:
        """Write the request on ``conn`` and read up to the response head. On a reused connection, a failure
        before any response byte raises :class:`StaleConnection`."""
        ok = False
        try:
            await self._send_request(conn, method, target, headers, body, reused=reused)
            resp = await self._read_head(conn, read_timeout, reused=reused)
            ok = True
            return resp
        finally:
            if not ok:
                conn.close()

    async def _send_request(self, conn: _Conn, method: str, target: str, headers: list[tuple[str, str]],
                            body: bytes, *, reused: bool) -> None:
        """Write the request: its head from bench.transport.head on a connection with no h11 state (the same bytes
        as h11's), else through h11 (``Content-Length`` added unless a framing header is there)."""
        if reused and not conn.usable:
            raise StaleConnection("idle connection closed by the server")
        try:
            head = RequestHead.get(method, target, headers) if conn.h11 is None else None
            if head is not None:
                conn.sent = (method, target, headers, head)
                out = head.encode(body)
            else:
                out = _h11_request(conn, method, target, headers, body)
        except h11.LocalProtocolError as e:
            raise FastIOError(f"cannot send request: {e}") from None
        tr = conn.proto.transport
        if tr is None or tr.is_closing():
            raise (StaleConnection if reused else FastIOError)("connection closed before the request was sent")
        tr.write(out)
        await conn.proto.drain(WRITE_TIMEOUT_S)

    async def _read_head(self, conn: _Conn, read_timeout: float | None, *, reused: bool) -> FastResponse:
        """Read the response head: a chunked HTTP/1.1 one by bench.transport.head, any other by h11
        (:meth:`_head_by_h11`); the stamp of the read that completed it is kept."""
        if conn.h11 is not None:
            return await self._head_by_h11(conn, read_timeout, reused=reused)
        proto, buf, t = conn.proto, b"", 0
        while True:
            item = await proto.next_chunk(read_timeout)
            if item is None:
                if not conn.got_bytes:
                    _no_response(conn, reused)
                return await self._head_by_h11(conn, read_timeout, reused=reused, pending=buf, eof=True, t=t)
            conn.got_bytes = True
            t, data = item
            buf = buf + data if buf else data
            end = head_end(buf)
            if end is None:
                continue
            got = parse_chunked_head(buf[:end]) if end > 0 and CHUNKED_FRAMING else None
            if got is None:
                return await self._head_by_h11(conn, read_timeout, reused=reused, pending=buf, t=t)
            resp = FastResponse(self, conn, got[0], got[2], got[1], read_timeout)
            resp._t = t
            if end < len(buf):  # the body's first bytes go back to the front of the reads, with the head's stamp
                proto.chunks.appendleft((t, buf[end:]))
            resp._chunked = ChunkedDecoder()
            assert conn.sent is not None
            resp._keep_alive = "close" not in got[2].get("connection", "").lower() and not conn.sent[3].close
            return resp

    async def _head_by_h11(self, conn: _Conn, read_timeout: float | None, *, reused: bool, pending: bytes = b"",
                           eof: bool = False, t: int = 0) -> FastResponse:
        """Read until h11 has the response head (skipping 1xx). A connection with no h11 state gets one that
        has sent the request, and ``pending`` (the reads so far; ``eof``: then the end of the connection)."""
        if conn.h11 is None:
            assert conn.sent is not None
            conn.h11 = replay_h11(*conn.sent[:3])
            conn.h11.receive_data(pending)
            if eof:
                conn.h11.receive_data(b"")
        h = conn.h11
        while True:
            try:
                ev = h.next_event()
            except h11.RemoteProtocolError as e:
                if reused and not conn.got_bytes:
                    raise StaleConnection(str(e)) from None
                raise FastIOError(_h11_text(e, conn.proto)) from None
            if ev is h11.NEED_DATA:
                t = await self._feed_head(conn, read_timeout, reused=reused) or t
                continue
            if isinstance(ev, h11.InformationalResponse):
                continue
            if isinstance(ev, h11.Response):
                resp = FastResponse(self, conn, ev.status_code, _head_dict(ev.headers), ev.reason.decode("latin-1"),
                                    read_timeout)
                resp._t = t
                _frame_chunked(resp, conn, ev)
                return resp
            if isinstance(ev, h11.ConnectionClosed):
                raise FastIOError("server disconnected without sending a response")
            raise FastIOError(f"unexpected HTTP event {type(ev).__name__}")  # pragma: no cover

    async def _feed_head(self, conn: _Conn, read_timeout: float | None, *, reused: bool) -> int | None:
        """One read into h11 while waiting for the head; its stamp, or None at EOF."""
        proto, h = conn.proto, conn.h11
        assert h is not None
        item = await proto.next_chunk(read_timeout)
        try:
            if item is None:
                if not conn.got_bytes:
                    _no_response(conn, reused)
                h.receive_data(b"")
                return None
            conn.got_bytes = True
            h.receive_data(item[1])
            return item[0]
        except h11.RemoteProtocolError as e:
            raise FastIOError(_h11_text(e, proto)) from None


def _no_response(conn: _Conn, reused: bool) -> None:
    """The connection ended before any byte of the response: a stale pooled one, or an error."""
    if reused:
        raise StaleConnection("server closed the connection without sending a response")
    proto = conn.proto
    raise FastIOError("server disconnected without sending a response"
                      + (f" ({exc_text(proto.exc)})" if proto.exc else ""))


def _h11_request(conn: _Conn, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """The request's bytes through the connection's h11 state (made when it has none)."""
    if conn.h11 is None:
        conn.h11 = h11.Connection(h11.CLIENT)
    h = conn.h11
    if not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers):
        headers = [*headers, ("Content-Length", str(len(body)))]
    out = h.send(h11.Request(method=method, target=target, headers=headers)) or b""
    if body:
        out += h.send(h11.Data(data=body)) or b""
    out += h.send(h11.EndOfMessage()) or b""
    return out


def _frame_chunked(resp: FastResponse, conn: _Conn, ev: h11.Response) -> None:
    """Hand a chunked body to bench.transport.chunked: what h11 read past the head is read first. Other bodies (length- or
    close-delimited, none) stay with h11: they cost one h11 event per read, not per SSE event."""
    if not CHUNKED_FRAMING or ev.http_version != b"1.1" or resp.status_code in (204, 304):
        return
    codings = [c.strip() for c in resp.headers.get("transfer-encoding", "").lower().split(",")]
    if codings != ["chunked"]:
        return  # h11 refuses other transfer codings; leave the error to it
    assert conn.h11 is not None
    data, closed = conn.h11.trailing_data
    if data:  # what h11 had read past the head goes back to the front of the reads, with the head's stamp
        conn.proto.chunks.appendleft((resp._t, bytes(data)))
    resp._chunked = ChunkedDecoder()
    resp._keep_alive = "close" not in resp.headers.get("connection", "").lower() and not closed


def _head_dict(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Response headers as a dict of lower-case names; a repeated header's values joined with ``", "``."""
    hdrs: dict[str, str] = {}
    for name, value in headers:
        k = name.decode("latin-1")
        v = value.decode("latin-1")
        hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
    return hdrs


def stamp_tracker(response: Any) -> Any:
    """An object whose ``stamp_source`` says, whenever read, where the stamps of ``response``'s connection came
    from so far (its protocol; take it while the response is open, read it after the body)."""
    conn = getattr(response, "_conn", None)
    proto = getattr(conn, "proto", None)
    return proto if proto is not None else StampProtocol
