"""bench.transport.http: the Protocol-based HTTP/1.1 streaming client (stamps taken in data_received)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.transport.http import FastConnectError, FastIOError, FastPool, FastTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes] | None:
    """One request: (request line, headers lower-case, body), or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    hdrs = {}
    for ln in lines[1:]:
        if b":" in ln:
            k, v = ln.split(b":", 1)
            hdrs[k.decode().strip().lower()] = v.decode().strip()
    body = await reader.readexactly(int(hdrs.get("content-length", "0")))
    return lines[0], hdrs, body


class Server:
    """A scripted HTTP server: ``handler(reader, writer, connection_index)`` per connection."""

    def __init__(self, handler: Handler, ssl: Any = None) -> None:
        self.handler = handler
        self.ssl = ssl
        self.connections = 0
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        i = self.connections
        self.connections += 1
        try:
            await self.handler(reader, writer, i)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._on_conn, "127.0.0.1", 0, ssl=self.ssl)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.ssl else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def keepalive_handler(server_ref: list[Server], body: bytes = b"hello") -> Handler:
    """Answers every request on a connection with a Content-Length body, keeping the connection open."""

    async def h(reader, writer, i):
        while True:
            req = await read_request(reader)
            if req is None:
                return
            server_ref[0].requests.append(req)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
                         + body)
            await writer.drain()

    return h


async def _get(pool: FastPool, url: str, **kw) -> tuple[int, dict[str, str], bytes]:
    r = await pool.stream("POST", url + "/v1/x", {"Content-Type": "application/json"}, b'{"a": 1}',
                          connect_timeout=kw.get("connect_timeout", 2.0), read_timeout=kw.get("read_timeout"))
    try:
        return r.status_code, r.headers, await r.aread()
    finally:
        await r.aclose()


async def settled_connects(pool: FastPool, n: int) -> int:
    """``pool.connects`` once it reached ``n`` or 2 s passed: a connect started for a request that a connection
    given back served first finishes after that request (bench.transport.connector)."""
    for _ in range(400):
        if pool.connects >= n:
            break
        await asyncio.sleep(0.005)
    return pool.connects


def test_chunked_body_and_request_headers() -> None:
    async def h(reader, writer, i):
        req = await read_request(reader)
        srv.requests.append(req)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Multi: a\r\nX-Multi: b\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"3\r\nabc\r\n0\r\n\r\n")
        await writer.drain()
        await read_request(reader)

    async def main():
        global srv
        async with Server(h) as srv:
            pool = FastPool()
            r = await pool.stream("POST", srv.url + "/v1/chat/completions?x=1",
                                  [("Content-Type", "application/json"), ("Authorization", "Bearer k")],
                                  b'{"q": 1}', connect_timeout=2.0, read_timeout=None)
            assert r.status_code == 200 and r.status == 200
            assert r.headers["content-type"] == "text/event-stream"
            assert r.headers["x-multi"] == "a, b"
            pieces = [p async for p in r.aiter_stamped()]
            assert b"".join(d for _, d in pieces) == b"data: abc"
            assert all(isinstance(t, int) for t, _ in pieces)
            await r.aclose()
            line, hdrs, body = srv.requests[0]
            assert line == b"POST /v1/chat/completions?x=1 HTTP/1.1"
            assert hdrs["host"] == srv.url.split("//")[1]
            assert hdrs["content-length"] == "8" and body == b'{"q": 1}'
            assert hdrs["authorization"] == "Bearer k"
            await pool.aclose()

    asyncio.run(main())


def test_content_length_body_and_keepalive_reuse() -> None:
    ref: list[Server] = []

    async def main():
        async with Server(keepalive_handler(ref, b"x" * 1000)) as srv:
            ref.append(srv)
            pool = FastPool()
            for _ in range(3):
                status, _, body = await _get(pool, srv.url)
                assert status == 200 and body == b"x" * 1000
            assert srv.connections == 1 and pool.connects == 1
            assert len(srv.requests) == 3
            # concurrent requests: one takes the idle connection, each other one starts a connect (no cap; a
            # connection given back first may serve it, and its new one is then pooled: bench.transport.connector)
            got = await asyncio.gather(*(_get(pool, srv.url) for _ in range(5)))
            assert [s for s, _, _ in got] == [200] * 5
            assert await settled_connects(pool, 5) == 5
            await pool.aclose()

    asyncio.run(main())


def test_close_delimited_body_is_not_pooled() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart1")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"part2")
        await writer.drain()
        writer.close()

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            assert (await _get(pool, srv.url))[2] == b"part1part2"
            assert (await _get(pool, srv.url))[2] == b"part1part2"
            assert pool.connects == 2
            await pool.aclose()

    asyncio.run(main())


def test_idle_connection_expires() -> None:
    ref: list[Server] = []

    async def main():
        async with Server(keepalive_handler(ref)) as srv:
            ref.append(srv)
            pool = FastPool(keepalive_expiry=0.05)
            await _get(pool, srv.url)
            await asyncio.sleep(0.1)
            await _get(pool, srv.url)
            assert pool.connects == 2
            await pool.aclose()

    asyncio.run(main())


def test_stale_connection_is_retried_once() -> None:
    """The server closes a kept-alive connection when the next request arrives, without a response (the race
    llama.cpp has right after a stream): the request is sent again on a fresh connection."""

    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # second request on this connection: drop it
        writer.transport.abort()

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            assert await _get(pool, srv.url) == (200, {"content-length": "2"}, b"ok")
            assert (await _get(pool, srv.url))[2] == b"ok"
            assert pool.connects == 2 and srv.connections == 2
            await pool.aclose()

    asyncio.run(main())


def test_idle_connection_closed_by_server_is_not_reused() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive promised, then closed while idle

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            await _get(pool, srv.url)
            await asyncio.sleep(0.05)
            assert (await _get(pool, srv.url))[2] == b"ok"
            assert pool.connects == 2
            await pool.aclose()

    asyncio.run(main())


def test_fresh_connection_closed_without_response_is_an_error() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        writer.close()

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            with pytest.raises(FastIOError, match="without sending a response"):
                await _get(pool, srv.url)
            assert srv.connections == 1  # no retry on a fresh connection
            await pool.aclose()

    asyncio.run(main())


def test_connect_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main():
        pool = FastPool()
        with pytest.raises(FastConnectError):
            await _get(pool, f"http://127.0.0.1:{port}")
        await pool.aclose()

    asyncio.run(main())


def test_read_timeout() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(2)

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            t0 = time.perf_counter()
            with pytest.raises(FastTimeout):
                await _get(pool, srv.url, read_timeout=0.2)
            assert 0.15 < time.perf_counter() - t0 < 1.5
            await pool.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_cut_mid_body(framing) -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nabc")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
        await writer.drain()
        writer.close()

    async def main():
        async with Server(h) as srv:
            pool = FastPool()
            r = await pool.stream("POST", srv.url + "/", {}, b"", connect_timeout=2.0, read_timeout=5.0)
            got = b""
            with pytest.raises(FastIOError, match="peer closed connection without sending complete message body"):
                async for _, d in r.aiter_stamped():
                    got += d
            assert got.startswith(b"hello")
            await r.aclose()
            await pool.aclose()

    asyncio.run(main())


def test_stamps_are_taken_when_bytes_arrive() -> None:
    """Two writes 50 ms apart get stamps ~50 ms apart, even when the reader only gets to them 300 ms later."""

    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        await writer.drain()
        srv.writes.append(time.perf_counter_ns())
        await asyncio.sleep(0.05)
        writer.write(b"def")
        await writer.drain()
        srv.writes.append(time.perf_counter_ns())

    async def main():
        global srv
        async with Server(h) as srv:
            srv.writes = []
            pool = FastPool()
            r = await pool.stream("POST", srv.url + "/", {}, b"", connect_timeout=2.0, read_timeout=None)
            await asyncio.sleep(0.3)  # busy elsewhere: both reads are queued by now
            got = [p async for p in r.aiter_stamped()]
            assert b"".join(d for _, d in got) == b"abcdef"
            t_first, t_last = got[0][0], got[-1][0]
            assert 35e6 < t_last - t_first < 150e6
            assert abs(t_last - srv.writes[1]) < 30e6  # stamped on arrival, not 300 ms later
            await pool.aclose()

    asyncio.run(main())


def _server_ctx(tls_cert: tuple[str, str]) -> Any:
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*tls_cert)
    return ctx


def test_https_keepalive_and_verification(tls_cert) -> None:
    import ssl

    async def main():
        ref: list[Server] = []
        async with Server(keepalive_handler(ref), ssl=_server_ctx(tls_cert)) as srv:
            ref.append(srv)
            trusting = ssl.create_default_context(cafile=tls_cert[0])
            pool = FastPool(ssl_context=trusting)
            for _ in range(3):
                status, _, body = await _get(pool, srv.url + "/x")
                assert status == 200 and body == b"hello"
            assert pool.connects == 1  # TLS connection reused
            await pool.aclose()
            with pytest.raises(FastConnectError):  # httpx's default trust store does not know this certificate
                await _get(FastPool(), srv.url + "/x")

    asyncio.run(main())


def test_pool_rejects_other_schemes() -> None:
    async def main():
        with pytest.raises(ValueError):
            await FastPool().stream("POST", "ftp://x/v1", {}, b"", connect_timeout=1, read_timeout=None)

    asyncio.run(main())


def _sse_handler(events: list[dict], gap_s: float = 0.02) -> Handler:
    async def h(reader, writer, i):
        while True:
            req = await read_request(reader)
            if req is None:
                return
            srv.requests.append(req)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for ev in events:
                data = f"data: {json.dumps(ev)}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                srv.writes.append(time.perf_counter_ns())
                await asyncio.sleep(gap_s)
            writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            await writer.drain()

    return h


def _chunk(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_stream_request_uses_fast_path_and_closes_pool(monkeypatch) -> None:
    monkeypatch.setenv("FASTIO_TEST_KEY", "sk-test-1234")
    events = [_chunk("a"), _chunk("b"), _chunk("c", "stop")]

    async def main():
        global srv
        async with Server(_sse_handler(events)) as srv:
            srv.writes = []
            settings = ClientSettings(api_key_env="FASTIO_TEST_KEY", extra_headers={"X-Extra": "1"})
            async with make_http_client(settings) as client:
                pool = client.bench_fast_pool
                assert isinstance(pool, FastPool)
                recs = []
                for i in range(2):
                    recs.append(await stream_request(client, srv.url + "/v1", RequestSpec(f"r{i}", "chat",
                                                     {"messages": []}), model="m", secret="sk-test-1234"))
                assert pool.connects == 1  # the second request reused the connection
            assert client.bench_fast_pool is None and pool._closed
            for rec in recs:
                assert rec.ok, rec.error
                assert [e.content for e in rec.events if e.content] == ["a", "b", "c"]
                assert rec.done and rec.finish_reason == "stop" and rec.status == 200
            # the event stamps are the arrival times of the server's writes (same loop: well under 20 ms late);
            # ``w`` is taken after the write returned, and a kernel stamp (the default on Linux) inside it
            for w, e in zip(srv.writes[:3], recs[0].events):
                assert -2e6 <= recs[0].sent_ns + e.t_ns - w < 20e6
            line, hdrs, body = srv.requests[0]
            assert line == b"POST /v1/chat/completions HTTP/1.1"
            assert hdrs["authorization"] == "Bearer sk-test-1234" and hdrs["x-extra"] == "1"
            assert hdrs["accept"] == "text/event-stream" and hdrs["accept-encoding"] == "identity"
            assert hdrs["content-type"] == "application/json"
            sent = json.loads(body)
            assert sent["model"] == "m" and sent["stream"] is True

    asyncio.run(main())


def test_stream_request_fast_path_errors() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        if i == 0:
            body = b'{"error": {"message": "bad key"}}'
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
        else:
            data = f"data: {json.dumps(_chunk('a'))}\n\n".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 9999\r\n\r\n"
                         + data)
        await writer.drain()
        writer.close()

    async def main():
        async with Server(h) as srv:
            async with make_http_client(ClientSettings()) as client:
                spec = RequestSpec("r", "chat", {"messages": []})
                rec = await stream_request(client, srv.url + "/v1", spec, model="m")
                assert rec.error_kind == "http_4xx" and rec.error == "HTTP 401: bad key"
                rec = await stream_request(client, srv.url + "/v1", spec, model="m")
                assert rec.error_kind == "incomplete"
                assert "peer closed connection without sending complete message body" in rec.error
                assert [e.content for e in rec.events] == ["a"]
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        async with make_http_client(ClientSettings(connect_timeout_s=2.0)) as client:
            rec = await stream_request(client, f"http://127.0.0.1:{port}/v1", RequestSpec("r", "chat", {}), model="m")
            assert rec.error_kind == "connect"

    asyncio.run(main())


def test_fast_io_off_uses_httpx() -> None:
    async def main():
        async with make_http_client(ClientSettings(fast_io=False)) as client:
            assert getattr(client, "bench_fast_pool", None) is None

    asyncio.run(main())


def test_stream_request_over_https_is_stamped_on_arrival(tls_cert, monkeypatch) -> None:
    """https:// streams take the fast path too, verified like httpx (SSL_CERT_FILE is honoured)."""
    monkeypatch.setenv("SSL_CERT_FILE", tls_cert[0])
    events = [_chunk(" a"), _chunk(" b"), _chunk(" c"), _chunk("", "stop")]

    async def main():
        global srv
        async with Server(_sse_handler(events, gap_s=0.05), ssl=_server_ctx(tls_cert)) as srv:
            srv.writes = []
            async with make_http_client(ClientSettings()) as client:
                spec = RequestSpec("r1", "chat", {"messages": [{"role": "user", "content": "x"}]})
                rec = await stream_request(client, srv.url + "/v1", spec, model="m")
                assert rec.ok, rec.error
                assert [e.content for e in rec.events if e.has_text] == [" a", " b", " c"]
                gaps = [(b.t_ns - a.t_ns) / 1e6 for a, b in zip(rec.events, rec.events[1:])]
                assert all(30 < g < 150 for g in gaps[:2]), gaps

    asyncio.run(main())


def _chunked_handler(server_ref: list[Server], parts: list[bytes | float], head_extra: bytes = b"",
                     close: bool = False) -> Handler:
    """Answers every request on a connection with a chunked body written as ``parts`` (one write each, 5 ms apart),
    the first part in the same write as the head; a float in ``parts`` is a pause of that many seconds more.
    ``close``: the server closes the connection after the first answer. Requests are recorded on ``server_ref[0]``
    when one is given."""
    first = parts[0]
    assert isinstance(first, bytes)

    async def h(reader, writer, i):
        while True:
            req = await read_request(reader)
            if req is None:
                return
            if server_ref:
                server_ref[0].requests.append(req)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + head_extra
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n" + first)
            for p in parts[1:]:
                await writer.drain()
                await asyncio.sleep(p if isinstance(p, float) else 0.005)
                if not isinstance(p, float):
                    writer.write(p)
            await writer.drain()
            if close:
                return

    return h


@pytest.mark.parametrize("stamps", ["kernel", "user"])
@pytest.mark.parametrize("parts", [
    [b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"],                      # all with the head
    [b"5\r", b"\nhel", b"lo\r", b"\n6;ext=1\r\n wo", b"rld\r\n0\r\n", b"\r\n"],  # split everywhere
    [b"", b"5\nhello\n6\n world\n0\nTrailer: x\n\n"],                # bare LF and a trailer
    [b"B\r\nhello world\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n"],           # hex size, two trailers
])
def test_chunked_bodies_framed_by_bench_chunked_reuse_the_connection(parts, stamps) -> None:
    ref: list[Server] = []

    async def main():
        async with Server(_chunked_handler(ref, parts)) as srv:
            ref.append(srv)
            pool = FastPool(stamps=stamps)
            for _ in range(3):
                code, _, body = await _get(pool, srv.url, read_timeout=5.0)
                assert code == 200 and body == b"hello world"
            assert pool.connects == 1 and srv.connections == 1 and len(srv.requests) == 3
            await pool.aclose()

    asyncio.run(main())


def test_chunked_body_with_connection_close_is_not_pooled() -> None:
    ref: list[Server] = []

    async def main():
        async with Server(_chunked_handler(ref, [b"2\r\nok\r\n0\r\n\r\n"], b"Connection: close\r\n")) as srv:
            ref.append(srv)
            pool = FastPool()
            for _ in range(2):
                assert (await _get(pool, srv.url, read_timeout=5.0))[2] == b"ok"
            assert pool.connects == 2
            await pool.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("bad", [b"zz\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n"])
def test_malformed_chunked_body_is_an_error(bad) -> None:
    ref: list[Server] = []

    async def main():
        async with Server(_chunked_handler(ref, [bad])) as srv:
            ref.append(srv)
            pool = FastPool()
            with pytest.raises(FastIOError, match="invalid chunked body"):
                await _get(pool, srv.url, read_timeout=5.0)
            assert pool.connects == 1 and not any(pool._idle.values())  # the broken connection is not pooled
            await pool.aclose()

    asyncio.run(main())


def test_close_after_done_pools_a_chunked_connection_when_the_terminator_follows() -> None:
    ref: list[Server] = []
    sse = b"data: [DONE]\n\n"
    parts = [b"%x\r\n%s\r\n" % (len(sse), sse), b"0\r\n\r\n"]

    async def main():
        async with Server(_chunked_handler(ref, parts)) as srv:
            ref.append(srv)
            pool = FastPool()
            for _ in range(2):
                r = await pool.stream("POST", srv.url + "/", {}, b"", connect_timeout=2.0, read_timeout=5.0)
                stamped = r.aiter_stamped()  # held, as bench.client.request holds it, until close_after_done is done
                async for _, d in stamped:
                    assert d == sse
                    break
                await r.close_after_done(1.0)
                await stamped.aclose()
                await r.aclose()
            assert pool.connects == 1
            await pool.aclose()

    asyncio.run(main())
