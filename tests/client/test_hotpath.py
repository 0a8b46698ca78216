"""The hot path's optional pieces give the same records as the pure-Python path: orjson vs json parsing of
events, the SSE decoder's LF-only fast path vs its general line splitter, uvloop vs asyncio's loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
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
    (blocks of 64 events per write, so a stream of 150 tokens spans three writes and a partial one; a stream of
    one token is one write). It answers a model probe, and 404 to what it does not serve."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import blastserver

    async def main() -> tuple[list[RequestRecord], int]:
        server = await asyncio.get_running_loop().create_server(blastserver._Conn, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        c = make_http_client(ClientSettings(), 2)
        try:
            recs = []
            for i, n in enumerate((150, 1, 150)):  # one after the other: each reuses the first's connection
                spec = RequestSpec(f"b{i}", "chat", {"messages": [{"role": "user", "content": "x"}],
                                                      "max_tokens": n})
                recs.append(await stream_request(c, base, spec, model=MODEL))
            async with httpx.AsyncClient() as h:
                models, other = await h.get(base + "/models"), await h.get(base + "/props")
            assert models.json()["data"][0]["id"] == "bench-sim" and other.status_code == 404
            return recs, c.bench_fast_pool.connects  # type: ignore[attr-defined]
        finally:
            await c.aclose()
            server.close()

    recs, connects = asyncio.run(main())
    for r, n in zip(recs, (150, 1, 150)):
        text = [e for e in r.events if e.has_text]
        assert r.ok and r.done and r.finish_reason == "length" and r.usage["completion_tokens"] == n
        assert len(text) == n and all(e.tokens == 1 and e.write_ns is not None for e in text)
    assert connects == 1


# ---- the read path as a whole (chunked framing -> SSE decoding -> the stream's SSELog -> [DONE]), under any split
# of the same bytes into reads: the same events, each stamped with the read that completed it (the reference's) ----

from dataclasses import asdict  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bench.client.request import _SSESink  # noqa: E402
from bench.transport.chunked import ChunkedDecoder  # noqa: E402
from bench.transport.sse import SSEEvent, SSELog  # noqa: E402
from tests.transport.test_sse import reference  # noqa: E402

_TEXT = st.text(st.sampled_from(list('ab {}":,é☃😀[DONE]\\')), max_size=12)
_JSON = st.builds(lambda v, i: json.dumps({"choices": [{"index": 0, "delta": {"content": v}}], "sim": {"tokens": i}},
                                          ensure_ascii=False), _TEXT, st.integers(0, 3))
_SERVER_EVENT = st.one_of(
    st.builds("data: {}\n\n".format, _JSON), st.builds("data: {}\n\n".format, _JSON),  # what servers send
    st.builds("data: {}\n\n".format, _TEXT), st.sampled_from(["data: [DONE]\n\n", "data:  [DONE] \n\n", "data:\n\n"]),
    st.builds("event: ping\ndata: {}\n\n".format, _TEXT), st.builds("event: error\ndata: {}\n\n".format, _TEXT),
    st.sampled_from([": keep-alive\n\n", "\n", "id: 4\n", "retry: 5\n", "data: a\ndata: b\n\n", "data: x"]),
    st.builds("data: {}\r\n\r\n".format, _TEXT))
SERVER_STREAMS = st.lists(_SERVER_EVENT, max_size=30).map(lambda evs: "".join(evs).encode())
READ_PATH = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _chunked(body: bytes, cuts: list[int]) -> tuple[bytes, list[int]]:
    """``body`` as a chunked body cut into chunks at ``cuts``, and where each body byte sits in it."""
    bounds = sorted({c for c in cuts if 0 < c < len(body)})
    out, where = b"", []
    for a, b in zip([0, *bounds], [*bounds, len(body)], strict=True):
        if a < b:
            out += b"%x\r\n" % (b - a)
            where += range(len(out), len(out) + b - a)
            out += body[a:b] + b"\r\n"
    return out + b"0\r\n\r\n", where


def _read_path(wire: bytes, cuts: list[int]) -> tuple[list[SSEEvent], int | None, list[SSEEvent]]:
    """The wire cut into reads (read i stamped i) through bench's read path: the log's events, the stamp at which
    the sink saw [DONE] (first), and the same body pieces through SSEDecoder.feed (the event-object API)."""
    bounds = sorted({c for c in cuts if 0 < c < len(wire)})
    reads = [wire[a:b] for a, b in zip([0, *bounds], [*bounds, len(wire)], strict=True)]
    chunks, log, plain = ChunkedDecoder(), SSELog(), SSEDecoder()
    sink = _SSESink(None, log, None)
    done, evs = None, []
    for i, r in enumerate(reads):
        body = chunks.feed(r)
        if body:
            if sink.feed(i, body) and done is None:
                done = i
            evs += plain.feed(body, i)
    assert chunks.done
    log.add(sink.dec.close(len(reads)))
    return log.events(), done, evs + plain.close(len(reads))


@READ_PATH
@given(SERVER_STREAMS, st.lists(st.integers(0, 2000), max_size=12), st.lists(st.integers(0, 2000), max_size=20))
def test_any_reads_give_the_same_events_and_stamps(body: bytes, chunk_cuts: list[int], read_cuts: list[int]) -> None:
    wire, where = _chunked(body, chunk_cuts)
    reads = sorted({c for c in read_cuts if 0 < c < len(wire)})

    def read_of(pos: int) -> int:  # the read holding body byte ``pos``
        return sum(1 for c in reads if c <= where[pos])

    events, pending, _ = reference(body, list(range(1, len(body))))  # an event's "read" is its completing byte
    want = [(read_of(p), kind, data) for p, kind, data, _id in events]
    if pending is not None:
        want.append((len(reads) + 1, pending[0], pending[1]))
    got, done, plain = _read_path(wire, read_cuts)
    assert [(e.t_ns, e.event, e.data) for e in got] == want
    assert [(e.t_ns, e.event, e.data) for e in plain] == want
    first_done = next((t for t, kind, data in want if kind == "message" and data.strip() == "[DONE]"), None)
    assert done == (first_done if first_done != len(reads) + 1 else None)


def _record(raw: list[SSEEvent], step: int) -> dict[str, Any]:
    log = SSELog()
    log.add(raw)
    rec = RequestRecord("r", "chat", "m")
    for i in range(0, max(len(log), 1), step):
        if client_mod._parse_log(rec, log, i, i + step):
            break
    client_mod._finish(rec)
    return asdict(rec)


_PARSED_EVENT = st.one_of(st.builds(lambda d: ("message", d), _JSON), st.builds(lambda d: ("message", d), _JSON),
                          st.sampled_from([("message", "[DONE]"), ("message", " "), ("message", "x"),
                                           ("ping", "{}"), ("error", "boom"), ("other", "[DONE]")]),
                          st.builds(lambda d: ("ping", d), _JSON))


@READ_PATH
@given(st.lists(_PARSED_EVENT, max_size=40), st.integers(1, 9))
def test_parsing_a_log_in_slices_gives_the_record_of_one_pass(events: list[tuple[str, str]], step: int) -> None:
    """The end-of-stream worker parses a stream's log :data:`PARSE_SLICE` events at a time; with events of other
    types (ping, error) anywhere, any slice size gives the record parsing the events one by one gives."""
    raw = [SSEEvent(100 + i, data, kind) for i, (kind, data) in enumerate(events)]
    one_by_one = RequestRecord("r", "chat", "m")
    for ev in raw:
        if client_mod._parse_events(one_by_one, [ev]):
            break
    client_mod._finish(one_by_one)
    assert _record(raw, step) == _record(raw, 10_000) == asdict(one_by_one)


def test_hotpath_host_figures_are_over_the_union_of_the_waves() -> None:
    """hotpath --procs: the host's events/s is every process's events over the span from the first wave's start to
    the last one's end (not the sum of the processes' own rates), with the share of that span all waves ran."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import hotpath

    rows = [{"t0": 10.0, "t1": 12.0, "events": 200_000, "events_per_s": 100_000.0, "cpu_s": 2.0, "failed": 0},
            {"t0": 11.0, "t1": 14.0, "events": 300_000, "events_per_s": 100_000.0, "cpu_s": 3.0, "failed": 1}]
    h = hotpath.host_figures(rows)
    assert h["span_s"] == 4.0 and h["events_per_s"] == 125_000.0 and h["sum_of_rates"] == 200_000.0
    assert h["overlap"] == 0.25 and h["failed"] == 1 and h["procs"] == 2
    apart = hotpath.host_figures([dict(rows[0]), dict(rows[1], t0=13.0)])
    assert apart["overlap"] == 0.0


def test_a_usage_count_that_does_not_follow_the_prompt_is_not_calibrated_on(tmp_path: Path) -> None:
    """A server without /tokenize whose usage.prompt_tokens is a fixed number (benchmarks/blastserver.py says 8 for
    any prompt) gives the two calibration probes the same count. bench learned 4,000 chars/token from that and sent
    prompts of 28 KB for ``--input-tokens 16``, silently; now it keeps 4 chars/token and says why."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    srv = subprocess.Popen([sys.executable, str(root / "benchmarks" / "blastserver.py"), "--port", "0"],
                           stdout=subprocess.PIPE, text=True)
    try:
        base = (srv.stdout.readline() if srv.stdout else "").split()[-1]
        p = subprocess.run([sys.executable, "-m", "bench", "run", base, "--rate", "20", "--duration", "1",
                            "--max-tokens", "1", "--input-tokens", "16", "--out", str(tmp_path / "r"), "--json"],
                           cwd=root, capture_output=True, text=True, timeout=120)
    finally:
        srv.terminate()
        srv.wait()
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["run"]["tokenizer"] == "default-ratio"
    said = "the server counted 8 and 8 prompt tokens for two probes 4001 characters apart (no ratio)"
    assert said in p.stderr and said in json.dumps(res)
    sent = [json.loads(line) for line in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    assert any(r["meta"].get("phase") == "measure" for r in sent)
