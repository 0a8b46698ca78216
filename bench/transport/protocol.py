"""The read seam of bench's HTTP client: an asyncio Protocol that stamps every read the moment it arrives, and the
body pump that decodes a kernel-stamped chunked body in the read callback itself.

:class:`StampProtocol` takes user-space stamps (``perf_counter_ns`` in ``data_received``);
:class:`bench.transport.kernel_stamps.KernelStampProtocol` subclasses it with the kernel's receive time.
:mod:`bench.transport.http` builds HTTP/1.1 on top of either.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from bench.errors import FastIOError, FastTimeout
from bench.transport.chunked import ChunkedDecoder

__all__ = ["BodyPump", "StampProtocol"]


class StampProtocol(asyncio.Protocol):
    """Queues every read as ``(perf_counter_ns at arrival, bytes)``; parses nothing. Its reads carry user-space
    stamps (``stamp_source = "user"``); :class:`bench.transport.kernel_stamps.KernelStampProtocol` is the kernel-stamped one."""

    __slots__ = ("transport", "chunks", "waiter", "closed", "exc", "_drain", "pump")
    stamp_source = "user"
    # True where the stamp does not depend on when Python reads (kernel stamps): a response body may then be
    # decoded in the read callback itself (:class:`BodyPump`); user-space stamps must be taken for every ready
    # socket before any decoding, so those connections queue their reads for the reading task instead
    pumps = False

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[tuple[int, bytes]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.exc: BaseException | None = None
        self._drain: asyncio.Future[None] | None = None
        self.pump: BodyPump | None = None  # set while a body is decoded in the read callback

    # --- called by the event loop -------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        self.chunks.append((t, data))
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.exc = exc
        if self.pump is not None:
            self.pump.lost()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    # --- called by the reading task -----------------------------------------------------------------------------
    async def drain(self, timeout: float | None) -> None:
        d = self._drain
        if d is None or d.done() or self.closed:
            return
        try:
            await asyncio.wait_for(asyncio.shield(d), timeout)
        except TimeoutError:
            raise FastTimeout("timed out writing the request") from None

    async def next_chunk(self, timeout: float | None) -> tuple[int, bytes] | None:
        """The next stamped read, or None once the connection is closed and everything was read."""
        if self.chunks:
            return self.chunks.popleft()
        if self.closed:
            return None
        loop = asyncio.get_running_loop()
        w = self.waiter = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(timeout, _expire, w)
        try:
            await w
        finally:
            self.waiter = None
            if handle is not None:
                handle.cancel()
        if self.chunks:
            return self.chunks.popleft()
        return None  # closed


def _expire(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_exception(FastTimeout("no byte within the read timeout"))


class BodyPump:
    """Decodes a chunked body in the read callback of a kernel-stamped connection (``StampProtocol.pumps``):
    each read is framed and handed to ``sink(t_ns, body_bytes)`` there and then, so the reading task is not woken
    for every read (a future, a timer and two generator steps per read, most of the per-read cost at one event per
    read). ``sink`` returns True when it has the whole answer (an SSE ``[DONE]``); the pump then detaches and
    :meth:`FastResponse.close_after_done` reads what is left as before. The read timeout is one timer per timeout
    period (re-armed from the last read), not one per read."""

    __slots__ = ("proto", "dec", "sink", "fut", "last_ns", "timeout", "timer")

    def __init__(self, proto: StampProtocol, dec: ChunkedDecoder, sink: Any, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self.proto = proto
        self.dec = dec
        self.sink = sink
        self.fut: asyncio.Future[int | None] = loop.create_future()
        self.last_ns = time.perf_counter_ns()
        self.timeout = timeout
        self.timer = loop.call_later(timeout, self._check) if timeout is not None else None

    def start(self) -> None:
        """Take the reads already queued, then every read as it arrives."""
        proto = self.proto
        while proto.chunks and not self.fut.done():
            t, data = proto.chunks.popleft()
            self.data(t, data)
        if self.fut.done():
            return
        if proto.closed:
            self.lost()
        else:
            proto.pump = self

    def data(self, t: int, data: bytes) -> None:
        """One read (called by the protocol)."""
        self.last_ns = t
        dec = self.dec
        try:
            body = dec.feed(data)
        except ValueError as e:
            self._fail(FastIOError(f"invalid chunked body: {e}"))
            return
        try:
            stop = bool(body) and self.sink(t, body)
        except Exception as e:  # noqa: BLE001 - the sink's own error (a body it cannot decode) goes to the reader
            self._fail(e)
            return
        if stop:
            self._end(t)
        elif dec.done:
            self._end(None)

    def lost(self) -> None:
        """The connection closed (called by the protocol) before the body ended."""
        if not self.fut.done():
            self._fail(FastIOError(cut_text(self.proto)))

    def detach(self) -> None:
        if self.proto.pump is self:
            self.proto.pump = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _end(self, t: int | None) -> None:
        self.detach()
        if not self.fut.done():
            self.fut.set_result(t)

    def _fail(self, e: BaseException) -> None:
        self.detach()
        if not self.fut.done():
            self.fut.set_exception(e)

    def _check(self) -> None:
        assert self.timeout is not None
        idle = (time.perf_counter_ns() - self.last_ns) / 1e9
        if idle >= self.timeout:
            self.timer = None
            self._fail(FastTimeout("no byte within the read timeout"))
        else:
            self.timer = asyncio.get_running_loop().call_later(self.timeout - idle, self._check)


def cut_text(proto: StampProtocol) -> str:
    """h11's words for a chunked body cut short, with the connection's error when it had one."""
    msg = "peer closed connection without sending complete message body: incomplete chunked read"
    return f"{msg} ({exc_text(proto.exc)})" if proto.exc is not None else msg


def exc_text(e: BaseException) -> str:
    """An exception's first line (at most 300 characters), or its class name."""
    return (str(e).strip() or type(e).__name__).splitlines()[0][:300]
