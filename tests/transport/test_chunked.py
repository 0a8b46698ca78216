"""bench.transport.chunked: incremental HTTP/1.1 chunked-body decoding, split at every byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.transport.chunked import ChunkedDecoder


def _encode(pieces: list[bytes], ext: bool = False) -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if ext else b"", p) for p in pieces if p)
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


def _feed_split(raw: bytes, cut: int) -> tuple[bytes, ChunkedDecoder]:
    d = ChunkedDecoder()
    return d.feed(raw[:cut]) + d.feed(raw[cut:]), d


@pytest.mark.parametrize("ext", [False, True])
def test_every_split_point(ext: bool) -> None:
    pieces = [b"data: {\"a\":1}\n\n", b"x" * 300, b"\r\n\r\n", b"data: [DONE]\n\n"]
    raw = _encode(pieces, ext) + b"HTTP/1.1 200 OK\r\n"
    for cut in range(len(raw) + 1):
        body, d = _feed_split(raw, cut)
        assert body == b"".join(pieces) and d.done and d.rest == b"HTTP/1.1 200 OK\r\n", cut


def test_bare_lf_and_byte_by_byte() -> None:
    raw = b"3\nabc\n0\n\n"
    d = ChunkedDecoder()
    assert b"".join(d.feed(raw[i:i + 1]) for i in range(len(raw))) == b"abc" and d.done


@pytest.mark.parametrize("raw", [b"zz\r\nabc\r\n", b"3\r\nabcX\r\n", b"\r\n", b"1" * 5000])
def test_malformed(raw: bytes) -> None:
    with pytest.raises(ValueError):
        ChunkedDecoder().feed(raw)


@pytest.mark.parametrize("raw", [b"3\r\nabc\rX0\r\n\r\n", b"3\r\nabc\r\r\n0\r\n\r\n", b"3\r\nabcX\n0\r\n\r\n",
                                 b"3\r\nabc\r"])
@pytest.mark.parametrize("before", [b"", b"1\r\nx\r\n"])
def test_data_not_followed_by_crlf(raw: bytes, before: bytes) -> None:
    """A CR after the data must be followed by LF (the fast path must not take CR and any byte)."""
    d = ChunkedDecoder()
    with pytest.raises(ValueError, match="chunk data not followed by CRLF"):
        d.feed(before + raw)
        d.feed(b"X\r\n0\r\n\r\n")


@given(st.lists(st.binary(max_size=40), max_size=8), st.lists(st.integers(0, 400), max_size=6))
def test_any_pieces_any_reads(pieces: list[bytes], cuts: list[int]) -> None:
    raw = _encode(pieces)
    d = ChunkedDecoder()
    out, last = b"", 0
    for c in sorted(min(c, len(raw)) for c in cuts):
        out += d.feed(raw[last:c])
        last = c
    out += d.feed(raw[last:])
    assert out == b"".join(pieces) and d.done and d.rest == b""


@pytest.mark.parametrize("raw", [b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"3\nabc\n2\nde\n0\n\n", b"3\r\nabc\n2\nde\r\n0\r\n\r\n"])
def test_whole_body_in_one_read_without_trailers(raw: bytes) -> None:
    """The fast path (many whole chunks per read) hands the last chunk to the general loop, which ends the body."""
    d = ChunkedDecoder()
    assert d.feed(raw + b"NEXT") == b"abcde" and d.done and d.rest == b"NEXT"


# size lines int(line, 16) takes but the framing refuses: the fast path must hand them to the general loop's check
_NOT_PLAIN = [b"0x3", b"0X3", b"+3", b"-3", b" 3", b"\x0b3", b"3\x0b", b"\x0c3", b"3\r", b"1_0", b"0_3", b"0" * 16 + b"3",
              b"\xd9\xa3", b"3\x00", b""]


@pytest.mark.parametrize("line", _NOT_PLAIN)
@pytest.mark.parametrize("before", [b"", b"1\r\nx\r\n"])
def test_size_lines_int_would_take_are_refused(line: bytes, before: bytes) -> None:
    raw = before + line + b"\r\nabc\r\n0\r\n\r\n"
    for cut in (len(raw), len(before) + len(line) + 2, len(before) + len(line) + 7):
        d = ChunkedDecoder()
        with pytest.raises(ValueError, match="bad chunk size line"):
            d.feed(raw[:cut])
            d.feed(raw[cut:])


@pytest.mark.parametrize("line", [b"3", b"03", b"0" * 15 + b"3", b"3 ", b"3\t", b"3;x=1", b"3 ;x"])
@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_size_lines_the_framing_takes(line: bytes, eol: bytes) -> None:
    befores = [(b"", b""), (b"1\r\nx\r\n", b"x"), (b"A\r\n" + b"y" * 10 + b"\r\n", b"y" * 10), (b"a\nzzzzzzzzzz\n", b"z" * 10)]
    for before, body in befores:
        raw = before + line + eol + b"abc" + eol + b"0" + eol + eol
        for cut in range(len(raw) + 1):
            d = ChunkedDecoder()
            assert d.feed(raw[:cut]) + d.feed(raw[cut:]) == body + b"abc" and d.done and d.rest == b"", (before, cut)


def test_fast_path_resumes_after_a_chunk_split_by_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that starts inside a chunk (most reads of a fast stream) goes back to the fast path once that chunk
    ends: the general loop reads one size line per read, not every one after it."""
    pieces = [b"data: {\"i\":%d}\n\n" % i for i in range(200)]
    raw = _encode(pieces)
    lines: list[bytes] = []
    real = ChunkedDecoder._size_line
    monkeypatch.setattr(ChunkedDecoder, "_size_line", lambda self, line: (lines.append(line), real(self, line))[1])
    d = ChunkedDecoder()
    cuts = [0, 7, len(raw) // 3 + 1, 2 * len(raw) // 3 + 5, len(raw)]
    out = b"".join(d.feed(raw[a:b]) for a, b in zip(cuts, cuts[1:], strict=False))
    assert out == b"".join(pieces) and d.done
    assert len(lines) <= 2 * len(cuts), lines
