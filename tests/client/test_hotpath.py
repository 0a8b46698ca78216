"""The hot path's optional pieces give the same records as the pure-Python path: orjson vs json parsing of
events, the SSE decoder's LF-only fast path vs its general line splitter, uvloop vs asyncio's loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.client import events as client_mod
from bench.records import RequestRecord
from bench.sim import SimConfig
from bench.transport.sse import SSEDecoder

MODEL = "bench-sim"


SIM_CONFIG = SimConfig(decode_step_ms=2.0, prefill_tok_s=1e7, seed=7)  # the shared `sim` fixture


async def _records(base: str, n: int = 3) -> list[RequestRecord]:
    c = make_http_client(ClientSettings(), n)
    try:
        sp = [RequestSpec(f"h{i}", "chat", {"messages": [{"role": "user", "content": f"hot {i}"}], "max_tokens": 12})
              for i in range(n)]
        return list(await asyncio.gather(*(stream_request(c, base, s, model=MODEL) for s in sp)))
    finally:
        await c.aclose()


def _shape(recs: list[RequestRecord]) -> list[Any]:
    return [(r.ok, r.done, r.finish_reason, r.usage is not None, [(bool(e.content), e.tokens) for e in r.events])
            for r in recs]


def test_json_and_orjson_give_the_same_records(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = asyncio.run(_records(sim))
    monkeypatch.setattr(client_mod, "_loads", json.loads)
    slow = asyncio.run(_records(sim))
    assert all(r.ok for r in fast + slow)
    assert _shape(fast) == _shape(slow)


def test_uvloop_gives_the_same_records(sim: str) -> None:
    uvloop = pytest.importorskip("uvloop")
    a = asyncio.run(_records(sim))
    b = uvloop.run(_records(sim))
    assert all(r.ok for r in a + b) and _shape(a) == _shape(b)
    assert {r.stamp_source for r in a} == {r.stamp_source for r in b}


@pytest.mark.parametrize("sep", ["\n", "\r\n", "\r"])
def test_sse_fast_path_matches_general_path(sep: str) -> None:
    text = f"data: a{sep}data: b{sep}{sep}: ping{sep}event: x{sep}data: c{sep}{sep}data: d"
    raw = text.encode()
    for cut in range(1, len(raw)):
        dec = SSEDecoder()
        evs = dec.feed(raw[:cut], 1) + dec.feed(raw[cut:], 2) + dec.close(3)
        assert [(e.data, e.event, e.complete) for e in evs] == [("a\nb", "message", True), ("c", "x", True),
                                                                ("d", "message", False)]


def test_blastserver_streams_are_what_a_sim_stream_records() -> None:
    """benchmarks/blastserver.py (hotpath's --source blast) sends streams bench records like a sim's: every token
    one content event with the sim's stamps, the finish reason and usage, [DONE], and the connection kept alive
    (blocks of 64 events per write, so a stream of 150 tokens spans three writes and a partial one)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import blastserver

    async def main() -> tuple[list[RequestRecord], int]:
        server = await asyncio.start_server(blastserver._serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        c = make_http_client(ClientSettings(), 2)
        try:
            recs = []
            for i in range(2):  # one after the other: the second reuses the first's connection
                spec = RequestSpec(f"b{i}", "chat", {"messages": [{"role": "user", "content": "x"}],
                                                      "max_tokens": 150})
                recs.append(await stream_request(c, base, spec, model=MODEL))
            return recs, c.bench_fast_pool.connects  # type: ignore[attr-defined]
        finally:
            await c.aclose()
            server.close()

    recs, connects = asyncio.run(main())
    for r in recs:
        text = [e for e in r.events if e.has_text]
        assert r.ok and r.done and r.finish_reason == "length" and r.usage["completion_tokens"] == 150
        assert len(text) == 150 and all(e.tokens == 1 and e.write_ns is not None for e in text)
    assert connects == 1
