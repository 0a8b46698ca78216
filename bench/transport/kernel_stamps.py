"""Kernel receive timestamps for bench.transport.http's reads: the time the kernel received the bytes, not the time Python
got to them.

Why: a user-space stamp (``perf_counter_ns()`` in ``data_received``) is late by however long the event loop took to
reach that socket. When N streams receive a token at the same instant, the k-th is stamped after k reads' worth of
Python work (``benchmarks/results/fidelity.md``: p99 593 ms at 2,048 streams in one process). On Linux the kernel
stamps every received TCP segment in its receive path; with the socket option ``SO_TIMESTAMPNS`` set, ``recvmsg``
returns that stamp (of the last segment the call consumed) as ancillary data (``SCM_TIMESTAMPNS``), so the stamp
no longer depends on when Python read the socket.

:class:`KernelStampProtocol` is a drop-in for ``bench.transport.http.StampProtocol`` (same seam: ``transport``
with ``write``/``close``/``is_closing``/``get_extra_info``, ``drain``, ``next_chunk(timeout) -> (t_ns, bytes) |
None``, ``chunks``, ``closed``, ``exc``): a non-blocking socket read by ``loop.add_reader`` with ``recvmsg_into``.
For ``https://`` it does TLS itself through :class:`ssl.MemoryBIO` over the raw socket (asyncio's SSL transport
hides the socket reads); the decrypted bytes keep the kernel stamp of the ``recvmsg`` that delivered the bytes they
were decrypted from (the read that completed the TLS record).

Clock: the kernel stamps with ``CLOCK_REALTIME``; bench's clock is ``perf_counter_ns`` (``CLOCK_MONOTONIC``).
:class:`ClockOffset` measures ``realtime - monotonic`` by reading ``time.time_ns()`` between two
``perf_counter_ns()`` reads, keeping the narrowest bracket of a burst (uncertainty = half its width, typically
well under 1 µs), and re-measures every ``refresh_s`` (1 s) while reads arrive, so an NTP slew or step during a
long run is followed. A converted stamp is never later than the user-space stamp of the same read (clamped: the
kernel stamped first by construction, any excess is offset error).

Limits: when Python falls behind one stream by more than the gap between two of its events, the kernel coalesces
them and one ``recvmsg`` returns both with the later segment's stamp (still earlier than a user stamp). A read that
carries no stamp gets the user-space stamp and the connection's :attr:`~KernelStampProtocol.stamp_source` becomes
``"user"``. Elsewhere (not Linux, or the option refused) bench.transport.http keeps its user-space stamps:
:func:`kernel_stamps_supported`.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import ssl
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from bench.errors import FastConnectError
from bench.transport.limits import local_limit, reset_on_close
from bench.transport.protocol import StampProtocol

__all__ = ["ClockOffset", "KernelStampProtocol", "kernel_stamps_supported", "open_kernel_stamped", "CLOCK",
           "clock_report", "SO_TIMESTAMPNS", "READ_LAG_NS"]

# Linux's generic socket option numbers (asm-generic/socket.h; x86, arm, riscv, ...). Python's socket module does
# not export them. SCM_TIMESTAMPNS == SO_TIMESTAMPNS; the "old" variant returns a native struct timespec.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
_GENERIC_ARCHES = ("x86_64", "amd64", "aarch64", "arm64", "riscv64", "i686", "i386", "armv7l", "s390x", "ppc64le")
_TIMESPEC = struct.Struct("@ll")  # time_t, long: native struct timespec
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
READ_SIZE = 256 * 1024  # as asyncio's selector transports
_SOL_SOCKET = socket.SOL_SOCKET
_TIMESPEC_SIZE = _TIMESPEC.size
_unpack_timespec = _TIMESPEC.unpack_from
_supported: bool | None = None
_keeper: socket.socket | None = None


def kernel_stamps_supported() -> bool:
    """True when this system gives TCP receive stamps (Linux, a known socket-option layout, the option accepted);
    probed once."""
    global _supported
    if _supported is None:
        _supported = False
        if sys.platform.startswith("linux") and platform.machine().lower() in _GENERIC_ARCHES and _ANC_SIZE:
            global _keeper
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                _supported = s.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS) == 1
                # kept open: the kernel turns receive stamping on for the whole system lazily (a deferred work item
                # after the first socket asks) and off when the last such socket closes; keeping one open from
                # the probe on means the first reads of the first connection are stamped too
                _keeper = s
            except OSError:
                _supported = False
    return _supported


# ---------------------------------------------------------------------------------------------------------------
# CLOCK_REALTIME -> perf_counter_ns
# ---------------------------------------------------------------------------------------------------------------
class ClockOffset:
    """``realtime - perf_counter`` in ns, measured with bracketed reads.

    Attributes:
        offset_ns: the last measured offset (``realtime = perf + offset_ns``).
        uncertainty_ns: half the width of the bracket it came from.
        measured_at: ``perf_counter_ns`` of the last measurement.
        measurements: how many measurements were made.
        min_offset_ns / max_offset_ns: the range of offsets seen (a step or slew of the realtime clock shows here).

    Args:
        samples: brackets per measurement (the narrowest counts).
        refresh_s: :meth:`maybe_refresh` re-measures when the last measurement is older than this.
        realtime / perf: the clocks (for tests; default ``time.time_ns`` / ``time.perf_counter_ns``).
    """

    __slots__ = ("samples", "refresh_ns", "realtime", "perf", "offset_ns", "uncertainty_ns", "measured_at",
                 "measurements", "min_offset_ns", "max_offset_ns", "max_uncertainty_ns")

    def __init__(self, samples: int = 16, refresh_s: float = 1.0, realtime: Callable[[], int] = time.time_ns,
                 perf: Callable[[], int] = time.perf_counter_ns) -> None:
        self.samples = max(1, samples)
        self.refresh_ns = int(refresh_s * 1e9)
        self.realtime = realtime
        self.perf = perf
        self.measurements = 0
        self.min_offset_ns = self.max_offset_ns = 0
        self.max_uncertainty_ns = 0
        self.offset_ns = self.uncertainty_ns = self.measured_at = 0
        self.measure()

    def measure(self) -> tuple[int, int]:
        """Measure now; returns ``(offset_ns, uncertainty_ns)``."""
        rt, pf = self.realtime, self.perf
        best_w = -1
        best_off = 0
        p1 = 0
        for _ in range(self.samples):
            p0 = pf()
            r = rt()
            p1 = pf()
            w = p1 - p0
            if best_w < 0 or w < best_w:
                best_w = w
                best_off = r - (p0 + p1) // 2
        self.offset_ns = best_off
        self.uncertainty_ns = (best_w + 1) // 2
        self.measured_at = p1
        if self.measurements == 0:
            self.min_offset_ns = self.max_offset_ns = best_off
        else:
            self.min_offset_ns = min(self.min_offset_ns, best_off)
            self.max_offset_ns = max(self.max_offset_ns, best_off)
        self.max_uncertainty_ns = max(self.max_uncertainty_ns, self.uncertainty_ns)
        self.measurements += 1
        return best_off, self.uncertainty_ns

    def maybe_refresh(self, now_perf_ns: int) -> None:
        """Re-measure when the last measurement is older than ``refresh_s``."""
        if now_perf_ns - self.measured_at > self.refresh_ns:
            self.measure()

    def to_perf(self, realtime_ns: int) -> int:
        """A ``CLOCK_REALTIME`` stamp on the ``perf_counter_ns`` clock."""
        return realtime_ns - self.offset_ns

    def report(self) -> dict[str, Any]:
        """JSON-able summary: offset, its uncertainty, how often measured and how far it moved (all ns)."""
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns,
                "max_uncertainty_ns": self.max_uncertainty_ns, "measurements": self.measurements,
                "drift_ns": self.max_offset_ns - self.min_offset_ns, "refresh_s": self.refresh_ns / 1e9}


CLOCK = ClockOffset()  # one per process: every connection converts with it
# bench's own lateness: user-space stamp - kernel stamp of each read (ns), the last 64k reads of this process
READ_LAG_NS: deque[int] = deque(maxlen=65536)
_append_lag = READ_LAG_NS.append


def clock_report() -> dict[str, Any]:
    """:meth:`ClockOffset.report` of this process's clock (for results.json's run section)."""
    return CLOCK.report()


_local = threading.local()


def _read_buffer() -> tuple[bytearray, memoryview]:
    """This thread's receive buffer: one per event-loop thread, shared by its connections (a read is copied out
    before the next runs), instead of 256 KiB per connection."""
    b = getattr(_local, "buf", None)
    if b is None:
        buf = bytearray(READ_SIZE)
        b = _local.buf = (buf, memoryview(buf))
    return b


# ---------------------------------------------------------------------------------------------------------------
# the protocol
# ---------------------------------------------------------------------------------------------------------------
class KernelStampProtocol(StampProtocol):
    """One TCP connection read with ``recvmsg`` and stamped by the kernel (module docstring). It is its own
    ``transport``. ``stamp_source`` is ``"kernel"`` while every read carried a kernel stamp."""

    __slots__ = ("loop", "sock", "tls", "_in", "_out", "_wbuf", "_closing", "_bufs", "_view", "clock",
                 "stamp_source", "user_reads", "last_user_ns")
    pumps = True  # a kernel stamp does not move with the event loop: bodies may be decoded in the read callback

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, tls: ssl.SSLObject | None = None,
                 incoming: ssl.MemoryBIO | None = None, outgoing: ssl.MemoryBIO | None = None,
                 clock: ClockOffset | None = None) -> None:
        super().__init__()
        self.transport = self  # type: ignore[assignment]
        self.loop = loop
        self.sock = sock
        self.tls = tls
        self._in = incoming
        self._out = outgoing
        self._wbuf = bytearray()
        self._closing = False
        buf, self._view = _read_buffer()
        self._bufs = [buf]  # recvmsg_into's buffer list, made once
        self.clock = clock or CLOCK
        self.stamp_source = "kernel"
        self.user_reads = 0  # reads that came without a kernel stamp
        self.last_user_ns = 0  # the user-space stamp of the last read (for tests and diagnostics)

    def start(self) -> None:
        """Begin reading (after connect and any TLS handshake)."""
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
        if self._in is not None and self._in.pending:
            self._decrypt(time.perf_counter_ns())

    # --- transport-like -----------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if self.tls is not None:
            try:
                self.tls.write(data)
            except ssl.SSLError as e:
                self._lost(e)
                return
            self._flush_tls()
        else:
            self._send(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._lost(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self.sock
        if name == "ssl_object":
            return self.tls
        return default

    # --- writing ------------------------------------------------------------------------------------------------
    def _flush_tls(self) -> None:
        assert self._out is not None
        out = self._out.read()
        if out:
            self._send(out)

    def _send(self, data: bytes) -> None:
        if not self._wbuf:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._lost(e)
                return
            if n == len(data):
                return
            data = data[n:]
            self.loop.add_writer(self.sock.fileno(), self._on_writable)
            self.pause_writing()
        self._wbuf += data

    def _on_writable(self) -> None:
        try:
            n = self.sock.send(self._wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        del self._wbuf[:n]
        if not self._wbuf:
            self.loop.remove_writer(self.sock.fileno())
            self.resume_writing()

    # --- reading ------------------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            n, anc, _flags, _addr = self.sock.recvmsg_into(self._bufs, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        t = t_user = self.last_user_ns = time.perf_counter_ns()
        if n == 0:
            self._lost(None)
            return
        kernel = False
        if anc:
            level, kind, raw = anc[0]  # the one control message asked for (SO_TIMESTAMPNS)
            if level == _SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(raw) >= _TIMESPEC_SIZE:
                sec, nsec = _unpack_timespec(raw)
                clock = self.clock
                if t_user - clock.measured_at > clock.refresh_ns:  # clock.maybe_refresh, inlined (once a read)
                    clock.measure()
                t = sec * 1_000_000_000 + nsec - clock.offset_ns
                if t > t_user:
                    t = t_user
                _append_lag(t_user - t)
                kernel = True
        if not kernel:
            self.user_reads += 1
            self.stamp_source = "user"
        data = self._view[:n].tobytes()
        if self.tls is not None:
            assert self._in is not None
            self._in.write(data)
            self._decrypt(t)
        else:
            self._deliver(t, data)

    def _decrypt(self, t: int) -> None:
        tls = self.tls
        assert tls is not None
        got: list[bytes] = []
        while True:
            try:
                piece = tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify: the peer ends the connection
                piece = b""
            except ssl.SSLError as e:
                self._lost(e)
                return
            if not piece:
                if got:
                    self._deliver(t, b"".join(got))
                self._lost(None)
                return
            got.append(piece)
        self._flush_tls()  # a key update or other post-handshake message may want an answer
        if got:
            self._deliver(t, b"".join(got) if len(got) > 1 else got[0])

    def _deliver(self, t: int, data: bytes) -> None:
        """A stamped read (decrypted for TLS) to the body pump when one is attached, else to the queue."""
        if self.pump is not None:
            self.pump.data(t, data)
        else:
            self.chunks.append((t, data))
            self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _lost(self, exc: BaseException | None) -> None:
        if self._closing:
            return
        self._closing = True
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
        self.sock.close()
        self.connection_lost(exc)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# connecting
# ---------------------------------------------------------------------------------------------------------------
async def open_kernel_stamped(host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                              server_hostname: str | None = None,
                              timeout: float | None = None) -> KernelStampProtocol:
    """Connect (and for ``ssl_context``, handshake) a TCP socket with ``SO_TIMESTAMPNS`` on and return its
    protocol, reading. Raises :class:`~bench.transport.http.FastConnectError` when the connect or handshake fails or
    takes longer than ``timeout`` seconds."""
    try:
        return await asyncio.wait_for(_open(host, port, ssl_context, server_hostname or host), timeout)
    except TimeoutError:
        raise FastConnectError(f"connect timed out after {timeout:g} s") from None
    except OSError as e:  # ssl.SSLError included (certificate verification, handshake)
        raise local_limit(e, host, port) or FastConnectError((str(e).strip() or type(e).__name__).splitlines()[0][:300]) from None


async def _open(host: str, port: int, ctx: ssl.SSLContext | None, server_hostname: str) -> KernelStampProtocol:
    loop = asyncio.get_running_loop()
    sock = await _tcp_connect(loop, host, port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        reset_on_close(sock)
        if ctx is None:
            proto = KernelStampProtocol(loop, sock)
        else:
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname=server_hostname)
            await _handshake(loop, sock, tls, incoming, outgoing)
            proto = KernelStampProtocol(loop, sock, tls, incoming, outgoing)
    except BaseException:
        sock.close()
        raise
    proto.start()
    return proto


async def _tcp_connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    if not infos:
        raise OSError(f"no address for {host!r}")
    last: OSError | None = None
    for family, kind, proto, _name, addr in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
        except BaseException:
            sock.close()
            raise
    assert last is not None
    raise last


async def _handshake(loop: asyncio.AbstractEventLoop, sock: socket.socket, tls: ssl.SSLObject,
                     incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
    while True:
        try:
            tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        out = outgoing.read()
        if out:
            await loop.sock_sendall(sock, out)
        if done:
            return
        data = await loop.sock_recv(sock, READ_SIZE)
        if not data:
            raise ConnectionResetError("server closed the connection during the TLS handshake")
        incoming.write(data)
