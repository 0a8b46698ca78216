"""The SSE decoder against the spec's rules, read by read."""

from __future__ import annotations

import random

from bench.transport.sse import SSEDecoder


def feed_all(chunks: list[bytes]) -> list[tuple[int, str, str]]:
    d = SSEDecoder()
    out = []
    for i, c in enumerate(chunks):
        out += [(e.t_ns, e.event, e.data) for e in d.feed(c, i)]
    out += [(e.t_ns, e.event, e.data) for e in d.close(len(chunks))]
    return out


def test_line_endings_all_kinds() -> None:
    for nl in (b"\n", b"\r\n", b"\r"):
        got = feed_all([b"data: a" + nl + nl + b"data: b" + nl + nl])
        assert [x[2] for x in got] == ["a", "b"]


def test_event_completes_at_the_read_with_the_blank_line() -> None:
    got = feed_all([b"data: {\"x\":", b"1}\n", b"\n"])
    assert got == [(2, "message", '{"x":1}')]


def test_cr_then_lf_in_next_read_is_one_line_end() -> None:
    got = feed_all([b"data: a\r", b"\n", b"\r\n"])
    assert got == [(2, "message", "a")]


def test_fields_comments_and_spacing() -> None:
    raw = b": ping\n\nretry: 3000\n\nid: 7\n\nevent: error\ndata:x\ndata:  y\n\ndata\n\n"
    d = SSEDecoder()
    evs = d.feed(raw, 5)
    assert [(e.event, e.data, e.id) for e in evs] == [("error", "x\n y", "7"), ("message", "", "7")]
    assert d.retry == 3000


def test_utf8_split_inside_a_character_and_bom() -> None:
    payload = "\ufeffdata: caf\u00e9 \u2603\n\n".encode()
    cut = payload.index("\u2603".encode()) + 1
    got = feed_all([payload[:cut], payload[cut:]])
    assert got == [(1, "message", "caf\u00e9 \u2603")]


def test_unterminated_event_is_returned_flagged_at_close() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: [DONE]", 1) == []
    tail = d.close(9)
    assert len(tail) == 1 and tail[0].data == "[DONE]" and tail[0].complete is False and tail[0].t_ns == 9


def test_any_split_gives_the_same_events() -> None:
    stream = (b"data: one\r\n\r\n: c\n\nevent: e\ndata: two\rdata: three\r\r" + b"data: four\n\n") * 3
    want = [x[1:] for x in feed_all([stream])]
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 12)))
        parts = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        assert [x[1:] for x in feed_all(parts)] == want


# ---- property tests: bench's decoder against a reference implementation of the WHATWG rules -----------------------

import re  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_EOL = re.compile(rb"\r\n|\r|\n")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(raw: bytes, cuts: list[int]) -> tuple[list[tuple[int, str, str, str | None]],
                                                      tuple[str, str, str | None] | None, int | None]:
    """The WHATWG "server-sent events" interpretation of a whole byte stream, written from the spec's prose.

    Returns (dispatched events as (read index, type, data, last id), the event pending at EOF or None, retry).
    The read index of an event is the read holding the first byte of the blank line's end (the CR or LF), the read
    a decoder can know the event is complete; reads are ``raw[cuts[i-1]:cuts[i]]``.
    """
    bounds = sorted({c for c in cuts if 0 < c < len(raw)})
    shift = 0
    if raw.startswith(b"\xef\xbb\xbf"):
        raw, shift = raw[3:], 3

    def read_of(pos: int) -> int:  # pos in the stream without its BOM
        return sum(1 for b in bounds if b <= pos + shift)

    data, etype, last_id, retry = "", "", None, None
    out: list[tuple[int, str, str, str | None]] = []

    def process(line: str) -> None:
        nonlocal data, etype, last_id, retry
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if ":" in line and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data += value + "\n"
        elif name == "event":
            etype = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)

    pos = 0
    for m in _EOL.finditer(raw):
        line = raw[pos:m.start()].decode("utf-8", "replace")
        if line:
            process(line)
        elif data:
            out.append((read_of(m.start()), etype or "message", data[:-1], last_id))
            data, etype = "", ""
        else:
            etype = ""
        pos = m.end()
    if pos < len(raw):
        process(raw[pos:].decode("utf-8", "replace"))  # bench keeps the unterminated last line (flagged at close)
    pending = (etype or "message", data[:-1], last_id) if data else None
    return out, pending, retry


def run_bench(raw: bytes, cuts: list[int]) -> tuple[list[tuple[int, str, str, str | None]],
                                                     tuple[str, str, str | None] | None, int | None]:
    d = SSEDecoder()
    bounds = sorted({c for c in cuts if 0 < c < len(raw)})
    parts = [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)])]
    out = []
    for i, p in enumerate(parts):
        out += [(e.t_ns, e.event, e.data, e.id) for e in d.feed(p, i)]
    tail = d.close(len(parts))
    assert all(e.complete for e in d.close(99)) and len(tail) <= 1
    pending = (tail[0].event, tail[0].data, tail[0].id) if tail else None
    if tail:
        assert tail[0].complete is False and tail[0].t_ns == len(parts)
    return out, pending, d.retry


_NAMES = st.sampled_from(["data", "data", "data", "event", "id", "retry", "dat", "Data", "", " data", "data "])
_SEPS = st.sampled_from([":", ": ", ":  ", "", "::", ": :"])
_DIGITS = st.text(st.sampled_from(list("0123456789²٣𝟘")), min_size=1, max_size=4)  # digits, some not ASCII
_VALUE = st.one_of(st.text(st.sampled_from(list("ab {}\"[DONE]:é☃😀²٣𝟘\x00\ufeff\u2028\x85 0123456789")), max_size=10),
                   _DIGITS)
_EOLS = st.sampled_from(["\n", "\r", "\r\n"])
_LINE = st.builds(lambda n, s, v, e: (n + s + v + e).encode(), _NAMES, _SEPS, _VALUE, _EOLS)
_JUNK = st.sampled_from([b"\xff", b"\xe2\x82", b"\xc3", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xef\xbb\xbf", b"\x80"])
_RETRY = st.builds(lambda v, e: f"retry: {v}{e}".encode(), _DIGITS, _EOLS)
_ITEM = st.one_of(_LINE, _LINE, _EOLS.map(str.encode), st.just(b": ping\n"), _JUNK, _RETRY)
STREAMS = st.builds(lambda bom, items: (b"\xef\xbb\xbf" if bom else b"") + b"".join(items),
                    st.booleans(), st.lists(_ITEM, max_size=25))

# LF-only streams, as servers send them: the decoder's fast path (whole events split on blank lines, one-line
# ``data: `` events dispatched directly) sees only these, since one CR anywhere in a read takes the general path
_LF_LINE = st.builds(lambda n, s, v: (n + s + v + "\n").encode(), _NAMES, _SEPS, _VALUE.filter(lambda v: "\r" not in v))
_LF_ITEM = st.one_of(_LF_LINE, _LF_LINE, st.just(b"\n"), st.just(b"data: x\n\n"), st.just(b": ping\n"),
                     st.just(b"event: e\n"), st.just(b"id: 7\n"), _JUNK)
LF_STREAMS = st.builds(lambda bom, items: (b"\xef\xbb\xbf" if bom else b"") + b"".join(items),
                       st.booleans(), st.lists(_LF_ITEM, max_size=25))


@FUZZ
@given(LF_STREAMS, st.data())
def test_decoder_matches_reference_on_lf_only_streams(raw, data) -> None:
    cuts = data.draw(st.lists(st.integers(0, max(len(raw), 1)), max_size=12))
    assert run_bench(raw, cuts) == reference(raw, cuts)


@FUZZ
@given(STREAMS, st.data())
def test_decoder_matches_reference_on_random_cuts(raw, data) -> None:
    cuts = data.draw(st.lists(st.integers(0, max(len(raw), 1)), max_size=12))
    assert run_bench(raw, cuts) == reference(raw, cuts)


@settings(max_examples=40, deadline=None)
@given(STREAMS)
def test_decoder_matches_reference_at_every_cr_lf_and_inside_characters(raw) -> None:
    """Two reads, cut at every byte next to a CR or LF and inside every multi-byte character."""
    points = set()
    for i, b in enumerate(raw):
        if b in (0x0D, 0x0A):
            points.update((i, i + 1))
        elif b >= 0x80:
            points.add(i + 1)  # after a lead or continuation byte: inside the character (or after it)
    for c in sorted(points):
        assert run_bench(raw, [c]) == reference(raw, [c]), c


def test_every_single_cut_of_a_dense_stream() -> None:
    raw = ("\ufeffdata: caf\u00e9\r\n\r\nevent: x\rdata: \u2603\r\rid: 1\nretry: \u00b2\ndata:\U0001F600\n\n"
           "data: [DONE]\r\n\r\n").encode() + b"data: \xe2\x82\n\n"
    for c in range(len(raw) + 1):
        assert run_bench(raw, [c]) == reference(raw, [c]), c


@FUZZ
@given(st.one_of(st.binary(max_size=300), STREAMS), st.lists(st.integers(0, 300), max_size=10))
def test_decoder_never_raises(raw, cuts) -> None:
    run_bench(raw, cuts)


def test_retry_with_non_ascii_digits_is_ignored() -> None:
    d = SSEDecoder()
    for value in ("\u00b2", "\u0663", "\U0001d7d8", "1\u00b2", "", "-1", " 5"):
        d.feed(f"retry: {value}\n\n".encode(), 0)  # used to raise ValueError on '²' (str.isdigit)
        assert d.retry is None
    d.feed(b"retry: 250\n\n", 0)
    assert d.retry == 250


# ---- the clean-state fast path (SSEDecoder._plain): a read ending with an empty line, after a read that left
# nothing pending, skips the incremental UTF-8 decoder and the line loop; whatever a read leaves pending must keep the
# next read off it. Every sequence of three reads from these pieces, against the reference --------------------------

_PIECES = [
    b"data: 0\n\n",                          # leaves the decoder clean
    b"\xef\xbb\xbfdata: bom\n\n",            # a BOM: dropped only at the very start
    b"data: a\n", b"data", b"event: e\n",   # pending data, a partial line, a pending event type
    b"id: 7\n", b"id: 8\n\n", b": c\n", b"retry: 5\n\n",  # id carried into later events; lines that leave nothing
    b"data: b\n\ndata: c\n\n",              # several one-line events
    b"data: d\n\n\n\ndata: e\n\n", b"data: f\n\nevent: g\ndata: h\n\n", b"id: 9\ndata: i\n\ndata: j\n\n",
    b"data: caf\xc3", b"\xa9\n\n", b"\xef\xbb", b"\xbf", b"data: \xe2\x98\x83\n\n", b"data: \xff\n\n",  # split UTF-8
    b"\r", b"\n", b"\n\n", b"data: x\r\n\r\n", b"data: k\r",  # CR line ends, a CR pending before an LF
    b"data: l\rdata: m\n\n", b"data: n\r\n\n",  # a CR inside a read that ends with an empty line
]


def test_fast_path_against_the_reference_after_any_pending_state() -> None:
    for a in _PIECES:
        for b in _PIECES:
            for c in _PIECES:
                raw = a + b + c
                cuts = [len(a), len(a) + len(b)]
                assert run_bench(raw, cuts) == reference(raw, cuts), (a, b, c)


def test_fast_path_events() -> None:
    d = SSEDecoder()
    assert d.feed(b"\xef\xbb\xbfid: 7\n\n", 0) == []
    evs = d.feed(b"data: a\n\ndata: b\n\n", 1)
    assert [(e.t_ns, e.data, e.event, e.id) for e in evs] == [(1, "a", "message", "7"), (1, "b", "message", "7")]
    evs = d.feed(b"data: c\n\nid: 8\ndata: d\n\ndata: e\n\n", 2)
    assert [(e.data, e.id) for e in evs] == [("c", "7"), ("d", "8"), ("e", "8")]
    assert d.feed(b"data: caf\xc3", 3) == [] and [e.data for e in d.feed(b"\xa9\n\n", 4)] == ["caf\u00e9"]
    assert d.feed(b"event: x\n", 5) == [] and [e.event for e in d.feed(b"data: f\n\n", 6)] == ["x"]
