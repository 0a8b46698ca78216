"""HTTP/1.1 heads without h11 for the common exchange: the request's head bytes, and a chunked response's head.

Why: h11 validates and serializes every request (its header regexes, event objects and state machine) and parses
every response head the same way: ~40-60 µs of Python per request, the largest share of an open-loop request's
CPU (benchmarks/results/openloop-cpu-2026-12-04-vm.md). Here a request head is built once per (method, URL,
headers), checked by h11 then, and reused with the body's ``Content-Length``; a response head that is plain HTTP/1.1
with a chunked body (every SSE stream of an OpenAI-compatible server) is parsed by two regular expressions, the
same as h11's. Anything else (1xx, a sized or close-delimited body, HTTP/1.0, a head h11 would refuse or that does
not end in CRLF CRLF) is left to h11 (:func:`replay_h11`), so its answers and error messages stay h11's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import h11

__all__ = ["RequestHead", "parse_chunked_head", "replay_h11", "head_end", "MAX_HEAD"]

MAX_HEAD = 16 * 1024  # h11's limit on an incomplete head (bytes): past it, h11 says so
_CACHE_MAX = 256

# h11's grammar (h11/_abnf.py), status line restricted to HTTP/1.1
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_VCHAR = rb"[^\x00\s]"
_CONTENT = rb"%s+(?:[ \t]+%s+)*" % (_VCHAR, _VCHAR)
_FIELD = re.compile(rb"(%s):[ \t]*((?:%s)?)[ \t]*" % (_TOKEN, _CONTENT))
_STATUS = re.compile(rb"HTTP/1\.1 ([0-9]{3})(?: ((?:[ \t]|%s)*))?" % _VCHAR)


class RequestHead:
    """A request's head bytes up to (not including) its ``Content-Length`` line, for one method, target and header
    list (``Host`` included, no framing header), checked by h11 once (:meth:`get`). ``close``: the request asks the
    server to close the connection after the response."""

    __slots__ = ("prefix", "close")
    _cache: dict[tuple[str, str, tuple[tuple[str, str], ...]], RequestHead] = {}

    def __init__(self, prefix: bytes, close: bool) -> None:
        self.prefix = prefix
        self.close = close

    @classmethod
    def get(cls, method: str, target: str, items: Sequence[tuple[str, str]]) -> RequestHead | None:
        """The head for these headers, or None when h11 should write the request (a framing header among them).
        Raises ``h11.LocalProtocolError`` where h11 would refuse the request."""
        key = (method, target, tuple(items))
        got = cls._cache.get(key)
        if got is not None:
            return got
        if any(k.lower() in ("content-length", "transfer-encoding") for k, _ in items):
            return None
        h11.Request(method=method, target=target, headers=[*items, ("Content-Length", "0")])  # h11's checks
        out = [b"%s %s HTTP/1.1\r\n" % (method.encode("ascii"), target.encode("ascii"))]
        lines = [b"%s: %s\r\n" % (k.encode("ascii"), v.encode("ascii")) for k, v in items]
        hosts = [k.lower() == "host" for k, _ in items]
        out += [ln for ln, h in zip(lines, hosts) if h] + [ln for ln, h in zip(lines, hosts) if not h]  # as h11
        close = any(k.lower() == "connection" and "close" in v.lower() for k, v in items)
        if len(cls._cache) >= _CACHE_MAX:
            cls._cache.clear()
        got = cls._cache[key] = RequestHead(b"".join(out), close)
        return got

    def encode(self, body: bytes) -> bytes:
        """The whole request: head, ``Content-Length``, body (as h11 writes it)."""
        return b"%sContent-Length: %d\r\n\r\n%s" % (self.prefix, len(body), body)


def head_end(buf: bytes) -> int | None:
    """Where the response head in ``buf`` ends (the index after its CRLF CRLF); -1 when h11 should read it (a
    head h11 might end otherwise, or longer than h11 takes); None when more bytes are needed."""
    end = buf.find(b"\r\n\r\n")
    if end >= 0:
        return end + 4
    if b"\n\n" in buf or b"\n\r\n" in buf or len(buf) > MAX_HEAD:
        return -1
    return None


def parse_chunked_head(head: bytes) -> tuple[int, str, dict[str, str]] | None:
    """``(status, reason, headers)`` of an HTTP/1.1 response head (``head``: up to its CRLF CRLF) whose body is
    chunked and whose status has a body (2xx-5xx but 204 and 304); the headers as h11 gives them, joined as
    :func:`bench.transport.http._head_dict` does. None for any other head (h11 reads it)."""
    if len(head) > MAX_HEAD:
        return None
    lines = head[:-4].split(b"\r\n")
    m = _STATUS.fullmatch(lines[0])
    if m is None:
        return None
    status = int(m[1])
    if status < 200 or status in (204, 304):
        return None
    hdrs: dict[str, str] = {}
    te = 0
    for line in lines[1:]:
        f = _FIELD.fullmatch(line)
        if f is None:
            return None
        k = f[1].decode("latin-1").lower()
        v = f[2].decode("latin-1")
        if k == "transfer-encoding":
            v = v.lower()
            te += 1
            if v != "chunked":
                return None
        elif k == "content-length":
            return None
        hdrs[k] = f"{hdrs[k]}, {v}" if k in hdrs else v
    if te != 1:
        return None
    return status, (m[2] or b"").decode("latin-1"), hdrs


def replay_h11(method: str, target: str, items: Sequence[tuple[str, str]]) -> h11.Connection:
    """An h11 client state that has sent this request (body left out: h11 reads the response the same way), for
    a response head :func:`parse_chunked_head` left to h11."""
    h = h11.Connection(h11.CLIENT)
    h.send(h11.Request(method=method, target=target, headers=[*items, ("Content-Length", "0")]))
    h.send(h11.EndOfMessage())
    return h
