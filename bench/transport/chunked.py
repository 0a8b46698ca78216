"""An incremental decoder for HTTP/1.1 chunked bodies (RFC 9112 section 7.1), for bench.transport.http's hot path.

Why: streaming servers send each SSE event as its own chunk, so a 16-stream run at 100k events/s is 100k chunks/s.
h11 spends ~10-20 µs of Python per chunk (its state machine and event objects: half of the per-event cost in
``benchmarks/hotpath.py --profile``); this decoder does the same framing with a few ``bytes.find`` calls per
chunk. :class:`bench.transport.http.FastResponse` uses it for every chunked body (``benchmarks/hotpath.py`` measures the
difference). Its fast path (``_whole_chunks``) takes the whole chunks with a plain size line straight from the read,
one slice each; the size line is looked up in a table of those seen before (servers' sizes repeat), else checked to be
1-16 hex digits before ``int`` reads it; anything else goes to the general state machine, which applies the rules
and goes back to the fast path at the next chunk (a read that starts inside a chunk, as most reads of a fast stream
do, costs the general loop one chunk, not the whole read).

Rules: ``chunk-size`` is hex digits, optionally followed by ``;`` extensions (ignored) and optional whitespace,
ended by CRLF (a bare LF is accepted, as h11 does); chunk data is followed by CRLF; ``0`` ends the body, then
trailer fields until an empty line. A malformed body raises :class:`ValueError` with the cause.
"""

from __future__ import annotations

import re

__all__ = ["ChunkedDecoder"]

_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3
MAX_SIZE_LINE = 4096
_SIZE_RE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;.*)?\Z", re.S)
MAX_SIZES = 1024
_SIZES: dict[bytes, int] = {}  # plain size lines seen (up to their LF, a CR included) -> chunk size: _plain_size


class ChunkedDecoder:
    """``feed(data) -> body bytes`` (possibly empty); ``done`` once the last chunk and trailers were read;
    ``rest`` holds bytes after the body (the next response on a kept-alive connection)."""

    __slots__ = ("_buf", "_left", "_state", "done", "rest")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0
        self._state = _SIZE
        self.done = False
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.rest += data
            return b""
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        if self._state == _SIZE:
            pos = _whole_chunks(buf, 0, n, out)
            if pos == n:  # the fast path took the whole read (the usual case)
                self._buf = b""
                return out[0] if len(out) == 1 else b"".join(out)
        return self._framing(buf, pos, n, out)

    def _framing(self, buf: bytes, pos: int, n: int, out: list[bytes]) -> bytes:
        """The general loop, one state at a time from ``pos``, after what the fast path put in ``out``."""
        while pos < n and not self.done:
            st = self._state
            if st == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._state = _DATA_END
            elif st == _DATA_END:
                end = self._line_end(buf, pos)
                if end is None:
                    break
                if end[0] != pos:
                    raise ValueError("chunk data not followed by CRLF")
                self._state = _SIZE
                pos = _whole_chunks(buf, end[1], n, out)  # back on the fast path after a chunk split by a read
            else:
                end = self._line_end(buf, pos)
                if end is None:
                    break
                line = buf[pos:end[0]]
                pos = end[1]
                if st == _SIZE:
                    self._size_line(line)
                elif not line:  # the empty line after the trailers
                    self.done = True
        self._buf = buf[pos:] if not self.done else b""
        if self.done:
            self.rest = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def _size_line(self, line: bytes) -> None:
        m = _SIZE_RE.match(line)
        if m is None:
            raise ValueError(f"bad chunk size line {line[:40]!r}")
        self._left = int(m.group(1), 16)
        self._state = _DATA if self._left else _TRAILER

    def _line_end(self, buf: bytes, pos: int) -> tuple[int, int] | None:
        """(end of line, start of next) from ``pos``, or None when the line is not complete yet."""
        lf = buf.find(b"\n", pos)
        if lf < 0:
            if len(buf) - pos > MAX_SIZE_LINE:
                raise ValueError("chunk framing line too long")
            return None
        end = lf - 1 if lf > pos and buf[lf - 1] == 13 else lf
        return end, lf + 1


def _whole_chunks(buf: bytes, pos: int, n: int, out: list[bytes]) -> int:
    """The fast path: take every complete non-last chunk with a plain size line (what servers send: one SSE event
    per chunk, one or many per read) from ``pos`` (a chunk's size line) on; returns where the general loop goes on
    (at a partial chunk, an extension, the last chunk or anything malformed, which the general loop then reports)."""
    find, sizes = buf.find, _SIZES
    while True:
        lf = find(b"\n", pos)
        if lf < 0:
            return pos
        line = buf[pos:lf]
        size = sizes.get(line)
        if size is None:
            size = _plain_size(line)
            if size is None:
                return pos
        start = lf + 1
        stop = start + size
        if size == 0 or stop >= n:
            return pos
        c = buf[stop]
        if c == 10:
            pos = stop + 1
        elif c == 13 and stop + 1 < n and buf[stop + 1] == 10:
            pos = stop + 2
        else:
            return pos
        out.append(buf[start:stop])
        if pos == n:
            return pos


def _plain_size(line: bytes) -> int | None:
    """The size of a size line (up to its LF) that is plain hex digits, 1 to 16 of them, before an optional CR; else
    None. ``int`` alone would also take ``0x``, ``_``, signs and whitespace. Remembers the first ``MAX_SIZES``."""
    digits = line[:-1] if line[-1:] == b"\r" else line
    if not 0 < len(digits) <= 16 or digits.strip(b"0123456789abcdefABCDEF"):
        return None
    size = int(digits, 16)
    if len(_SIZES) < MAX_SIZES:
        _SIZES[line] = size
    return size
