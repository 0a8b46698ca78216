"""bench.transport.kernel_stamps: kernel receive stamps (SO_TIMESTAMPNS) for bench.transport.http's reads.

What is checked: the stamp source is chosen (kernel on Linux by default, user when asked or unsupported) and
recorded on every record; the CLOCK_REALTIME -> perf_counter conversion is right (fake clocks with a known
offset, and a crafted ancillary stamp); a kernel stamp is never later than the user-space stamp of the same read
and stays at the arrival time when the event loop reads late; the TLS path (MemoryBIO over the raw socket).

Tolerances: loopback delivery is microseconds; the box is shared, so "at the write" is checked as within 5 ms,
and "late user stamp" by a 150 ms stall against a >= 100 ms gap.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Any

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.records import RequestRecord
from bench.sim import SimConfig
from bench.transport import kernel_stamps as kstamp
from bench.transport.http import FastIOError, FastPool, FastTimeout, StampProtocol
from bench.transport.kernel_stamps import ClockOffset, KernelStampProtocol, kernel_stamps_supported
from tests.transport.test_http import Server, _chunk, _chunked_handler, _server_ctx, _sse_handler

needs_kernel = pytest.mark.skipif(not kernel_stamps_supported(), reason="no SO_TIMESTAMPNS on this system")
MODEL = "bench-sim"


# --- the clock offset ------------------------------------------------------------------------------------------
class FakeClocks:
    """perf advances 100 ns per read, with one slow read (5 µs) every 4th bracket; realtime = perf + K."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.t = 1_000_000
        self.n = 0

    def perf(self) -> int:
        self.t += 100
        return self.t

    def realtime(self) -> int:
        self.n += 1
        self.t += 5000 if self.n % 4 == 0 else 100
        return self.t + self.k


def test_offset_with_a_known_offset() -> None:
    k = 1_700_000_000_123_456_789
    fc = FakeClocks(k)
    c = ClockOffset(samples=8, realtime=fc.realtime, perf=fc.perf)
    # the narrowest bracket is 200 ns wide around a realtime read taken at its middle: exact, +-100 ns
    assert c.offset_ns == k and c.uncertainty_ns == 100
    assert c.to_perf(k + 5_000_000) == 5_000_000
    fc.k = k + 3_000  # the realtime clock steps by 3 µs: the next refresh follows it
    c.maybe_refresh(c.measured_at + 10)
    assert c.measurements == 1  # not due yet
    c.maybe_refresh(c.measured_at + 2_000_000_000)
    assert c.measurements == 2 and c.offset_ns == k + 3_000
    rep = c.report()
    assert rep["drift_ns"] == 3_000 and rep["uncertainty_ns"] == 100 and rep["measurements"] == 2


def test_offset_of_the_real_clocks() -> None:
    c = ClockOffset()
    p = time.perf_counter_ns()
    r = time.time_ns()
    assert abs(c.to_perf(r) - p) < 1_000_000  # the same instant, on the perf clock, within 1 ms
    assert 0 < c.uncertainty_ns < 1_000_000


class _FakeSock:
    """Returns one crafted ``recvmsg_into`` result: payload plus an SCM_TIMESTAMPNS of ``sec, nsec``."""

    def __init__(self, payload: bytes, anc: list[tuple[int, int, bytes]]) -> None:
        self.payload = payload
        self.anc = anc

    def recvmsg_into(self, bufs: list[bytearray], ancsize: int) -> tuple[int, list, int, Any]:
        bufs[0][: len(self.payload)] = self.payload
        return len(self.payload), self.anc, 0, None

    def fileno(self) -> int:
        return -1


def test_ancillary_stamp_converted_with_known_offset() -> None:
    clock = ClockOffset()
    clock.offset_ns, clock.measured_at = 1_000_000_000_000_000_000, time.perf_counter_ns()  # 1e18: known
    clock.refresh_ns = 10**15  # no refresh during the test
    t_arrival = time.perf_counter_ns() - 2_000_000  # 2 ms ago, on the perf clock
    rt = t_arrival + clock.offset_ns
    anc = [(socket.SOL_SOCKET, kstamp.SCM_TIMESTAMPNS, kstamp._TIMESPEC.pack(rt // 10**9, rt % 10**9))]
    loop = asyncio.new_event_loop()
    try:
        p = KernelStampProtocol(loop, _FakeSock(b"hello", anc), clock=clock)  # type: ignore[arg-type]
        p._on_readable()
        assert list(p.chunks) == [(t_arrival, b"hello")] and p.stamp_source == "kernel"
        # a stamp "in the future" (offset error) is clamped to the user-space stamp of the read
        rt2 = time.perf_counter_ns() + 10**9 + clock.offset_ns
        p.sock = _FakeSock(b"x", [(socket.SOL_SOCKET, kstamp.SCM_TIMESTAMPNS,
                                   kstamp._TIMESPEC.pack(rt2 // 10**9, rt2 % 10**9))])  # type: ignore[assignment]
        p._on_readable()
        assert p.chunks[-1] == (p.last_user_ns, b"x")
        # a read without a stamp: user-space stamp, and the connection says so
        p.sock = _FakeSock(b"y", [])  # type: ignore[assignment]
        p._on_readable()
        assert p.chunks[-1] == (p.last_user_ns, b"y") and p.stamp_source == "user" and p.user_reads == 1
    finally:
        loop.close()


# --- real sockets ----------------------------------------------------------------------------------------------
def _late_reader_handler(writes: list[int], gap_s: float) -> Any:
    async def h(reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
        await writer.drain()
        for piece in (b"abc", b"def"):
            await asyncio.sleep(gap_s)
            writes.append(time.perf_counter_ns())
            writer.write(piece)
            await writer.drain()
        await reader.read()
        writer.close()
    return h


@needs_kernel
def test_kernel_stamp_precedes_user_stamp_of_the_same_read() -> None:
    """The server (its own thread and loop) writes 'abc' then 'def' 100 ms apart; the client's loop is blocked
    for 150 ms after each arrives, so user stamps are late; kernel stamps stay at the writes."""
    import threading

    writes: list[int] = []
    started = threading.Event()
    info: dict[str, Any] = {}

    def serve() -> None:
        async def run() -> None:
            srv = await asyncio.start_server(_late_reader_handler(writes, 0.1), "127.0.0.1", 0)
            info["port"] = srv.sockets[0].getsockname()[1]
            info["stop"] = asyncio.get_running_loop().create_future()
            started.set()
            await info["stop"]
            srv.close()

        loop = asyncio.new_event_loop()
        info["loop"] = loop
        loop.run_until_complete(run())
        loop.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    assert started.wait(5)

    async def main() -> tuple[Any, list[tuple[int, bytes]], list[int]]:
        pool = FastPool()
        r = await pool.stream("GET", f"http://127.0.0.1:{info['port']}/", {}, b"", connect_timeout=5.0,
                              read_timeout=10.0)
        proto = r._conn.proto  # type: ignore[union-attr]
        got, users = [], []
        while len(got) < 2:
            time.sleep(0.15)  # the loop is busy: the next piece arrives meanwhile
            item = await proto.next_chunk(5.0)
            assert item is not None
            got.append(item)
            users.append(proto.last_user_ns)
        await r.aclose()
        await pool.aclose()
        return proto, got, users

    try:
        proto, got, users = asyncio.run(main())
    finally:
        info["loop"].call_soon_threadsafe(info["stop"].set_result, None)
        th.join(5)
    assert isinstance(proto, KernelStampProtocol) and proto.stamp_source == "kernel"
    body = [d for _, d in got]
    assert body[-1].endswith(b"def")
    for (t, _), u in zip(got, users):
        assert t <= u  # never later than the user stamp of the same read
    t_def = got[-1][0]
    assert 0 <= t_def - writes[-1] < 5e6  # at the write (loopback: µs), not when the loop got to it
    assert users[-1] - t_def > 40e6  # the user stamp of that read is late by the stall


# --- stamp source chosen and recorded --------------------------------------------------------------------------
async def _sim_records(base: str, settings: ClientSettings, n: int) -> list[RequestRecord]:
    client = make_http_client(settings, n)
    try:
        specs = [RequestSpec(f"k{i}", "chat", {"messages": [{"role": "user", "content": f"k {i}"}],
                                               "max_tokens": 8}) for i in range(n)]
        return list(await asyncio.gather(*(stream_request(client, base, s, model=MODEL) for s in specs)))
    finally:
        await client.aclose()


SIM_CONFIG = SimConfig(decode_step_ms=10.0, prefill_tok_s=1e6)  # the shared `sim` fixture


@needs_kernel
def test_default_is_kernel_on_linux_and_recorded(sim: str) -> None:
    recs = asyncio.run(_sim_records(sim, ClientSettings(), 4))
    assert all(r.ok for r in recs), [r.error for r in recs]
    assert {r.stamp_source for r in recs} == {"kernel"}
    for r in recs:
        assert RequestRecord.from_dict(r.to_dict()).stamp_source == "kernel"
        for e in r.events:
            if e.write_ns is not None:  # the sim stamps just before its write; the kernel receives after it
                assert 0 <= r.sent_ns + e.t_ns - e.write_ns < 5e6


def test_user_stamps_when_asked_or_unsupported(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = asyncio.run(_sim_records(sim, ClientSettings(stamps="user"), 2))
    assert all(r.ok for r in recs) and {r.stamp_source for r in recs} == {"user"}
    monkeypatch.setattr(kstamp, "_supported", False)  # a system without kernel stamps: fall back
    recs = asyncio.run(_sim_records(sim, ClientSettings(), 2))
    assert all(r.ok for r in recs) and {r.stamp_source for r in recs} == {"user"}
    recs = asyncio.run(_sim_records(sim, ClientSettings(fast_io=False), 1))  # httpx reads: user stamps
    assert recs[0].ok and recs[0].stamp_source == "user"
    assert RequestRecord.from_dict({k: v for k, v in recs[0].to_dict().items() if k != "stamp_source"}
                                   ).stamp_source == "user"  # records written before the field existed
    with pytest.raises(ValueError):
        FastPool(stamps="hardware")


# --- TLS -------------------------------------------------------------------------------------------------------
@needs_kernel
def test_tls_over_memory_bio(tls_cert) -> None:
    events = [_chunk("a"), _chunk("b"), _chunk("c", "stop")]

    async def main() -> None:
        import tests.transport.test_http as tf

        async with Server(_sse_handler(events, gap_s=0.01), ssl=_server_ctx(tls_cert)) as srv:
            tf.srv = srv  # the handler reads the module global
            srv.writes = []  # type: ignore[attr-defined]
            trusting = ssl.create_default_context(cafile=tls_cert[0])
            pool = FastPool(ssl_context=trusting)
            for _ in range(2):
                r = await pool.stream("POST", srv.url + "/v1/chat/completions", {}, b"{}", connect_timeout=5.0,
                                      read_timeout=10.0)
                proto = r._conn.proto  # type: ignore[union-attr]
                assert isinstance(proto, KernelStampProtocol) and proto.tls is not None
                got = [p async for p in r.aiter_stamped()]
                body = b"".join(d for _, d in got)
                assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
                assert proto.stamp_source == "kernel"
            assert pool.connects == 1  # the TLS connection was reused
            # stamps precede the server's post-write stamps by at most its write time, never trail by much
            for w, (t, _) in zip(srv.writes[-3:], got[:3]):  # type: ignore[attr-defined]
                assert -2e6 <= t - w < 20e6
            await pool.aclose()
            bad = FastPool()  # the default trust store does not know the certificate
            from bench.transport.http import FastConnectError

            with pytest.raises(FastConnectError):
                await bad.stream("GET", srv.url + "/", {}, b"", connect_timeout=5.0, read_timeout=5.0)

    asyncio.run(main())


def test_user_protocol_has_the_same_seam() -> None:
    for name in ("drain", "next_chunk", "chunks", "closed", "exc", "transport", "stamp_source"):
        assert hasattr(KernelStampProtocol, name) and hasattr(StampProtocol, name)
    assert StampProtocol.stamp_source == "user"


@needs_kernel
def test_a_body_read_without_kernel_stamp_makes_the_record_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's stamp_source is read after the body: one unstamped read there turns it to "user"."""
    events = [_chunk("a"), _chunk("b"), _chunk("c", "stop")]
    orig = KernelStampProtocol._on_readable
    calls = {"n": 0}

    def on_readable(self: KernelStampProtocol) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # from the second read on (the body), no ancillary stamp is recognised
            monkeypatch.setattr(kstamp, "SCM_TIMESTAMPNS", -1)
        orig(self)

    monkeypatch.setattr(KernelStampProtocol, "_on_readable", on_readable)

    async def main() -> RequestRecord:
        import tests.transport.test_http as tf

        async with Server(_sse_handler(events, gap_s=0.02)) as srv:
            tf.srv = srv
            srv.writes = []  # type: ignore[attr-defined]
            c = make_http_client(ClientSettings(), 1)
            try:
                return await stream_request(c, srv.url + "/v1", RequestSpec("u", "chat", {"messages": []}),
                                            model="m")
            finally:
                await c.aclose()

    rec = asyncio.run(main())
    assert rec.ok, rec.error
    assert calls["n"] >= 3 and rec.stamp_source == "user"


# --- decoding in the read callback (bench.transport.http.BodyPump) -----------------------------------------------------
def _ch(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _pumped(pool: FastPool, url: str, sink: Any, timeout: float = 5.0) -> tuple[Any, int | None]:
    r = await pool.stream("POST", url + "/", {}, b"", connect_timeout=2.0, read_timeout=timeout)
    assert r.can_pump
    return r, await r.pump(sink)


@needs_kernel
def test_pump_decodes_in_the_read_callback_and_pools_the_connection() -> None:
    """Every piece that arrives while pump() waits reaches the sink from the read callback (no task is running
    there); the body's end gives the connection back to the pool."""
    parts: list[bytes | float] = [_ch(b"a"), 0.1, _ch(b"b"), 0.1, _ch(b"c") + b"0\r\n\r\n"]
    seen: list[tuple[int, bytes, Any]] = []

    def sink(t: int, data: bytes) -> bool:
        seen.append((t, data, asyncio.current_task()))
        return False

    async def main() -> None:
        async with Server(_chunked_handler([], parts)) as srv:
            pool = FastPool()
            for _ in range(2):
                seen.clear()
                r, t = await _pumped(pool, srv.url, sink)
                assert t is None and r._done and r._conn is None
                # the first piece came with the head (queued, taken by pump() itself); the later ones are written
                # 100 ms apart, so each arrives on its own, in the read callback
                assert [d for _, d, _ in seen] == [b"a", b"b", b"c"] and {task for *_, task in seen[1:]} == {None}
                assert [x[0] for x in seen] == sorted(x[0] for x in seen)
            assert pool.connects == 1  # pooled after the first body, reused by the second
            await pool.aclose()

    asyncio.run(main())


@needs_kernel
def test_pump_stops_when_the_sink_has_the_answer_and_leaves_the_rest_to_close_after_done() -> None:
    parts: list[bytes | float] = [_ch(b"data: x\n\n"), 0.02, _ch(b"data: [DONE]\n\n"), 0.05, b"0\r\n\r\n"]

    async def main() -> None:
        async with Server(_chunked_handler([], parts)) as srv:
            pool = FastPool()
            r, t = await _pumped(pool, srv.url, lambda t, d: b"[DONE]" in d)
            assert t is not None and not r._done and r._conn.proto.pump is None  # type: ignore[union-attr]
            await r.close_after_done(2.0)  # the terminator comes 50 ms later: read through the queue as before
            assert r._done and sum(len(c) for c in pool._idle.values()) == 1
            await pool.aclose()

    asyncio.run(main())


@needs_kernel
def test_pump_read_timeout_counts_from_the_last_read() -> None:
    """Reads 0.25 s apart never trip a 0.5 s timeout, though they span more than it (the one timer is re-armed
    from the last read); silence after them does, once."""
    parts: list[bytes | float] = [_ch(b"a"), 0.25, _ch(b"b"), 0.25, _ch(b"c"), 0.25, _ch(b"d"), 3.0, b"0\r\n\r\n"]
    got: list[bytes] = []

    async def main() -> None:
        async with Server(_chunked_handler([], parts)) as srv:
            pool = FastPool()
            t0 = time.monotonic()
            with pytest.raises(FastTimeout):
                await _pumped(pool, srv.url, lambda t, d: got.append(d) or False, timeout=0.5)
            assert got == [b"a", b"b", b"c", b"d"] and time.monotonic() - t0 < 2.5
            assert not any(pool._idle.values())  # a timed-out connection is not pooled
            await pool.aclose()

    asyncio.run(main())


@needs_kernel
def test_pump_errors_reach_the_reading_task() -> None:
    """A body cut short, malformed framing and the sink's own exception each fail the awaiting task with their
    own error (a sink's ValueError is not taken for bad framing)."""

    async def run(parts: list[bytes | float], sink: Any, close: bool = True) -> BaseException:
        async with Server(_chunked_handler([], parts, close=close)) as srv:
            pool = FastPool()
            try:
                await _pumped(pool, srv.url, sink)
            except Exception as e:
                return e
            finally:
                await pool.aclose()
        raise AssertionError("no error")

    async def main() -> None:
        cut = await run([_ch(b"a"), 0.02], lambda t, d: False)
        assert isinstance(cut, FastIOError) and "incomplete chunked read" in str(cut)
        bad = await run([_ch(b"a"), b"zz\r\n"], lambda t, d: False)
        assert isinstance(bad, FastIOError) and "invalid chunked body" in str(bad)

        def boom(t: int, d: bytes) -> bool:
            raise ValueError("sink says no")

        own = await run([_ch(b"a"), 0.02, b"0\r\n\r\n"], boom, close=False)
        assert type(own) is ValueError and str(own) == "sink says no"

    asyncio.run(main())


def test_tls_bytes_before_close_notify_reach_the_pump() -> None:
    """The last decrypted bytes of a read that also carried the peer's close_notify go to the attached pump
    (the body may end in them), and only then is the connection lost."""

    class Tls:  # decrypts to one piece, then the peer's close_notify
        def __init__(self) -> None:
            self.pieces = [b"0\r\n\r\n"]

        def read(self, n: int) -> bytes:
            if self.pieces:
                return self.pieces.pop(0)
            raise ssl.SSLZeroReturnError()

    class Pump:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def data(self, t: int, d: bytes) -> None:
            self.seen.append(f"data {t} {d!r}")

        def lost(self) -> None:
            self.seen.append("lost")

    async def main() -> list[str]:
        a, b = socket.socketpair()
        b.close()
        p = KernelStampProtocol(asyncio.get_running_loop(), a, Tls(), ssl.MemoryBIO(), ssl.MemoryBIO())  # type: ignore[arg-type]
        pump = Pump()
        p.pump = pump  # type: ignore[assignment]
        p._decrypt(123)
        return pump.seen

    assert asyncio.run(main()) == ["data 123 b'0\\r\\n\\r\\n'", "lost"]


def test_the_pool_probes_kernel_stamps_when_made_not_in_the_first_requests_queue_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe (a socket, a few ms) ran inside the first request's ``queue_ms``: a lone ``bench probe`` showed
    4-6 ms of "client queueing" where docs/metrics.md says ~0."""
    monkeypatch.setattr(kstamp, "_supported", None)
    FastPool(stamps="user")
    assert kstamp._supported is None  # user stamps asked: nothing probed
    FastPool()
    assert kstamp._supported is not None
