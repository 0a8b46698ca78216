"""bench.chunked: incremental HTTP/1.1 chunked-body decoding, split at every byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.chunked import ChunkedDecoder


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
