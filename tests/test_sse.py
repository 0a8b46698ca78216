"""The SSE decoder against the spec's rules, read by read."""

from __future__ import annotations

import random

from bench.sse import SSEDecoder


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
