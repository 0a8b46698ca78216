"""bench.transport.head: request heads and chunked response heads without h11, the same as h11's."""

from __future__ import annotations

import asyncio

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.transport import head as head_mod
from bench.transport.head import RequestHead, head_end, parse_chunked_head
from bench.transport.http import FastIOError, FastPool, _head_dict
from tests.transport.test_http import Server, read_request

_TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~", min_size=1,
                 max_size=12)
_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)


def _h11_request(method: str, target: str, items: list[tuple[str, str]], body: bytes) -> bytes:
    h = h11.Connection(h11.CLIENT)
    out = h.send(h11.Request(method=method, target=target, headers=[*items, ("Content-Length", str(len(body)))]))
    out += h.send(h11.Data(data=body)) if body else b""
    return out + (h.send(h11.EndOfMessage()) or b"")


def _h11_response(raw: bytes) -> tuple[int, str, dict[str, str]]:
    h = h11.Connection(h11.CLIENT)
    h.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    h.send(h11.EndOfMessage())
    h.receive_data(raw)
    ev = h.next_event()
    assert isinstance(ev, h11.Response)
    return ev.status_code, ev.reason.decode("latin-1"), _head_dict(ev.headers)


@settings(max_examples=200, deadline=None)
@given(names=st.lists(_TOKEN, max_size=6), values=st.lists(_VALUE, min_size=6, max_size=6),
       host_at=st.integers(0, 6), body=st.binary(max_size=40))
def test_request_bytes_are_h11s(names: list[str], values: list[str], host_at: int, body: bytes) -> None:
    items = [(k, v) for k, v in zip(names, values) if k.lower() not in ("content-length", "transfer-encoding", "host")]
    items.insert(min(host_at, len(items)), ("Host", "127.0.0.1:8000"))
    got = RequestHead.get("POST", "/v1/chat/completions", items)
    assert got is not None
    assert got.encode(body) == _h11_request("POST", "/v1/chat/completions", items, body)


def test_request_head_leaves_framing_headers_and_bad_headers_to_h11() -> None:
    assert RequestHead.get("POST", "/", [("Host", "x"), ("Transfer-Encoding", "chunked")]) is None
    assert RequestHead.get("POST", "/", [("Host", "x"), ("content-length", "3")]) is None
    with pytest.raises(h11.LocalProtocolError):
        RequestHead.get("POST", "/", [("Host", "x"), ("X-Bad", "a\r\nb")])
    assert RequestHead.get("POST", "/", [("Host", "x"), ("Connection", "close")]).close  # type: ignore[union-attr]
    assert not RequestHead.get("POST", "/", [("Host", "x")]).close  # type: ignore[union-attr]


@settings(max_examples=200, deadline=None)
@given(names=st.lists(_TOKEN, max_size=6), values=st.lists(_VALUE, min_size=6, max_size=6),
       status=st.integers(200, 599), reason=st.sampled_from(["", " OK", " Not Found", " a  b"]),
       pad=st.sampled_from(["", " ", "\t "]))
def test_chunked_head_parses_as_h11(names: list[str], values: list[str], status: int, reason: str,
                                     pad: str) -> None:
    lines = [f"{k}:{pad}{v}{pad}" for k, v in zip(names, values) if k.lower() not in ("content-length",
                                                                                       "transfer-encoding")]
    lines.insert(len(lines) // 2, "Transfer-Encoding: Chunked")
    raw = (f"HTTP/1.1 {status}{reason}\r\n" + "".join(ln + "\r\n" for ln in lines) + "\r\n").encode()
    assert head_end(raw + b"5\r\nhello") == len(raw)
    got = parse_chunked_head(raw)
    if status in (204, 304):
        assert got is None
    else:
        assert got == _h11_response(raw)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n folded\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
])
def test_other_heads_are_left_to_h11(raw: bytes) -> None:
    assert parse_chunked_head(raw) is None


def test_head_end() -> None:
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n") is None
    assert head_end(b"HTTP/1.1 200 OK\r\n\r\nbody") == 19
    assert head_end(b"HTTP/1.1 200 OK\nA: b\n\n") == -1  # bare LF: h11 reads it
    assert head_end(b"x" * (head_mod.MAX_HEAD + 1)) == -1


def _script(answers: list[bytes]):
    """A server answering the k-th request on a connection with ``answers[k]`` (raw bytes), in two writes split
    inside the head, so the head arrives in pieces."""

    async def h(reader, writer, i):
        for raw in answers:
            if await read_request(reader) is None:
                return
            writer.write(raw[:10])
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(raw[10:])
            await writer.drain()
        await reader.read()

    return h


async def _post(pool: FastPool, url: str) -> tuple[int, dict[str, str], bytes]:
    r = await pool.stream("POST", url + "/v1/x", [("Content-Type", "application/json")], b'{"a": 1}',
                          connect_timeout=2.0, read_timeout=2.0)
    try:
        return r.status_code, r.headers, await r.aread()
    finally:
        await r.aclose()


def test_heads_h11_must_read_keep_the_connection_in_use() -> None:
    """A 1xx, a sized body, a bare-LF head and then a chunked one, on one connection: the first three through
    h11 (made from the request sent without it), the last without, all four answered and the connection kept."""
    answers = [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
               b"HTTP/1.1 201 Created\nContent-Length: 3\n\nabc",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n"]

    async def main() -> None:
        async with Server(_script(answers)) as srv:
            pool = FastPool(stamps="user")
            got = [await _post(pool, srv.url) for _ in answers]
            await pool.aclose()
            assert [(s, b) for s, _, b in got] == [(200, b"hi"), (201, b"abc"), (200, b"xyz"), (200, b"ok")]
            assert got[3][1] == {"transfer-encoding": "chunked", "x-a": "2"}
            assert pool.connects == 1

    asyncio.run(main())


def test_a_head_cut_short_is_h11s_error() -> None:
    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Enc")
        await writer.drain()

    async def main() -> None:
        async with Server(h) as srv:
            pool = FastPool(stamps="user")
            with pytest.raises(FastIOError, match="peer unexpectedly closed connection"):
                await _post(pool, srv.url)
            await pool.aclose()

    asyncio.run(main())
