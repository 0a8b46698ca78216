"""Issue 12, the client's share: hostile servers of our own on loopback (raw asyncio and aiohttp).

Each kind of fault has its test: streams that stay open after ``[DONE]``, non-message events, compressed streams,
a canary API key echoed back everywhere a server can put it, set-up calls that never answer, a ``/tokenize`` that
fails after its first success, TLS with a private CA, parsing kept off the stamping path, and the lag monitor.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gzip
import json
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.cli.app import main
from bench.client import ClientSettings, RequestSpec, discover_model, make_http_client, stream_request
from bench.client import events as client_mod
from bench.errors import BenchError, ConfigError, ServerError, TokenizerError
from bench.records import RequestRecord
from bench.redaction import add_secret, redact
from bench.server.info import discover_server
from bench.server.tokenizer import HttpTokenizer
from bench.session.loop_lag import LagMonitor, lag_warning
from bench.transport.sse import SSEEvent, SSELog
from tests.transport.test_http import Server, read_request

BOTH = pytest.mark.parametrize("fast_io", [True, False], ids=["fastio", "httpx"])


def chunk(text: str, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}


def sse(*objs: Any) -> bytes:
    return b"".join(f"data: {o if isinstance(o, str) else json.dumps(o)}\n\n".encode() for o in objs)


STREAM = sse(chunk("a"), chunk("b"), chunk("c", "stop"), "[DONE]")


async def one(base: str, settings_: ClientSettings | None = None, **kw: Any) -> RequestRecord:
    async with make_http_client(settings_ or ClientSettings()) as client:
        return await stream_request(client, base, RequestSpec("r", "chat", {"messages": []}), model="m", **kw)


# ---- [DONE] ends the response -------------------------------------------------------------------------------------
def _lingering(framing: str, linger_s: float, seen: list[float]) -> Any:
    """Sends a complete stream, then keeps the connection (and, unless 'terminated', the body) open."""

    async def h(reader, writer, i):
        await read_request(reader)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if framing in ("chunked", "terminated"):
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(STREAM), STREAM))
            if framing == "terminated":
                writer.write(b"0\r\n\r\n")
        elif framing == "sized":
            writer.write(head + b"Content-Length: %d\r\n\r\n" % (len(STREAM) + 500) + STREAM)
        else:  # close-delimited
            writer.write(head + b"Connection: close\r\n\r\n" + STREAM)
        await writer.drain()
        t0 = time.monotonic()
        try:
            while await asyncio.wait_for(reader.read(1024), linger_s):
                pass  # a second request on a reused connection: ignore (the test sends one per connection)
            seen.append(time.monotonic() - t0)  # the client closed its side
        except ConnectionResetError:  # bench's stamping transport closes with a reset (no TIME_WAIT on its side)
            seen.append(time.monotonic() - t0)
        except TimeoutError:
            pass

    return h


@BOTH
@pytest.mark.parametrize("framing", ["chunked", "sized", "close"])
@pytest.mark.parametrize("read_timeout", [None, 1.0])
def test_stream_ends_at_done_when_the_server_lingers(fast_io, framing, read_timeout) -> None:
    """The server keeps the body open 5 s after [DONE]: the record is complete at [DONE], e2e ends there, and
    the connection is closed by bench (it used to hang for the linger, or time out as a failure)."""
    seen: list[float] = []

    async def main_():
        async with Server(_lingering(framing, 5.0, seen)) as srv:
            t0 = time.monotonic()
            rec = await one(srv.url + "/v1", ClientSettings(fast_io=fast_io, read_timeout_s=read_timeout))
            took = time.monotonic() - t0
            await asyncio.sleep(0.1)
            return rec, took

    rec, took = asyncio.run(main_())
    assert rec.ok, rec.error
    assert rec.done and [e.content for e in rec.events if e.content] == ["a", "b", "c"]
    assert took < 2.5  # not the 5 s linger
    assert rec.end_ns is not None and rec.end_ns / 1e6 < 1000
    assert rec.end_ns <= rec.events[-1].t_ns + 50e6  # e2e ends at [DONE]: the last event's read
    assert seen and seen[0] < 2.0  # bench closed the connection


@BOTH
def test_connection_is_reused_when_the_body_ends_after_done(fast_io) -> None:
    """A healthy server ends the chunked body right after [DONE]: the connection goes back to the pool."""

    async def h(reader, writer, i):
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(STREAM), STREAM))
            await writer.drain()
            await asyncio.sleep(0.002)  # the terminator comes in a later write
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def main_():
        async with Server(h) as srv:
            async with make_http_client(ClientSettings(fast_io=fast_io)) as client:
                for i in range(3):
                    rec = await stream_request(client, srv.url + "/v1", RequestSpec(f"r{i}", "chat", {}), model="m")
                    assert rec.ok, rec.error
            return srv.connections

    assert asyncio.run(main_()) == 1


def test_events_after_done_are_ignored() -> None:
    rec = RequestRecord("r", "chat", "m")
    raw = [SSEEvent(1, json.dumps(chunk("a", "stop"))), SSEEvent(2, "[DONE]"), SSEEvent(3, "garbage")]
    client_mod._parse_events(rec, raw)
    client_mod._finish(rec)
    assert rec.ok and rec.done and len(rec.events) == 1


# ---- events that are not messages ---------------------------------------------------------------------------------
def _serve_bytes(body: bytes, headers: bytes = b"Content-Type: text/event-stream\r\n") -> Any:
    async def h(reader, writer, i):
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

    return h


def _serve_one(body: bytes, headers: bytes = b"Content-Type: text/event-stream\r\n", fast_io: bool = True,
               **kw: Any) -> RequestRecord:
    async def main_():
        async with Server(_serve_bytes(body, headers)) as srv:
            return await one(srv.url + "/v1", ClientSettings(fast_io=fast_io), **kw)

    return asyncio.run(main_())


@BOTH
def test_ping_events_with_plain_text_are_not_failures(fast_io) -> None:
    body = (b"event: ping\ndata: hello there\n\n" + sse(chunk("a")) + b"event: keepalive\ndata: {not json\n\n"
            + sse(chunk("b", "stop"), "[DONE]"))
    rec = _serve_one(body, fast_io=fast_io)
    assert rec.ok, rec.error
    assert [e.content for e in rec.events] == ["a", "b"]


def test_non_json_message_event_is_still_a_failure() -> None:
    rec = _serve_one(sse(chunk("a"), "hello there", chunk("b", "stop"), "[DONE]"))
    assert rec.error_kind == "bad_json" and "hello there" in (rec.error or "")
    rec = _serve_one(b"event: error\ndata: overloaded\n\n" + STREAM)
    assert rec.error_kind == "stream_error" and "overloaded" in (rec.error or "")


# ---- compressed streams -------------------------------------------------------------------------------------------
@BOTH
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
def test_compressed_stream_is_decoded(fast_io, encoding) -> None:
    if encoding == "gzip":
        body = gzip.compress(STREAM)
    else:
        z = zlib.compressobj(wbits=zlib.MAX_WBITS if encoding == "deflate" else -zlib.MAX_WBITS)
        body = z.compress(STREAM) + z.flush()
    name = encoding.split("-")[0].encode()
    rec = _serve_one(body, b"Content-Type: text/event-stream\r\nContent-Encoding: " + name + b"\r\n", fast_io)
    assert rec.ok, rec.error
    assert [e.content for e in rec.events if e.content] == ["a", "b", "c"]


@BOTH
def test_unknown_encoding_is_refused_naming_it(fast_io) -> None:
    rec = _serve_one(b"\x00\x01junk", b"Content-Type: text/event-stream\r\nContent-Encoding: br\r\n", fast_io)
    assert not rec.ok and rec.error_kind == "protocol"
    assert "Content-Encoding: br" in (rec.error or "")


def test_compressed_json_error_body_is_decoded() -> None:
    body = gzip.compress(b'{"error": {"message": "model is loading"}}')

    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def main_():
        async with Server(h) as srv:
            return await one(srv.url + "/v1")

    rec = asyncio.run(main_())
    assert rec.error == "HTTP 503: model is loading"


# ---- nothing a server sends raises --------------------------------------------------------------------------------
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["choices", "delta", "content", "text", "index", "finish_reason", "usage",
                                          "error", "message", "tool_calls", "function", "arguments", "sim",
                                          "timings", "reasoning", "code", "x"]), inner, max_size=5),
                     max_leaves=20)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["message", "message", "error", "ping"]),
                          _JSON.map(json.dumps) | st.text(max_size=20)), max_size=8))
def test_event_parsing_never_raises(events) -> None:
    from bench.measure.metrics import request_metrics

    rec = RequestRecord("r", "chat", "m", sent_ns=1)
    client_mod._parse_events(rec, [SSEEvent(i, data, kind) for i, (kind, data) in enumerate(events)])
    client_mod._finish(rec)
    json.dumps(rec.to_dict())
    request_metrics(rec)


def test_deeply_nested_json_is_a_failure_not_a_crash() -> None:
    rec = _serve_one(sse("[" * 100_000, chunk("a", "stop"), "[DONE]"))
    assert rec.error_kind == "bad_json"


# ---- secrets ------------------------------------------------------------------------------------------------------
KEY = "sk-canary-" + secrets.token_hex(16)


def variants(key: str) -> list[str]:
    """The key as a hostile server echoes it: verbatim, split by a newline, split by spaces and tabs."""
    return [key, key[:9] + "\n" + key[9:], key[:5] + " " + key[5:14] + "\n\t" + key[14:]]


def assert_clean(text: str, where: str = "") -> None:
    squeezed = re.sub(r"\s|\\[nrt]", "", text)
    assert KEY not in squeezed, where
    half = len(KEY) // 2
    assert KEY[:half + 1] not in text and KEY[half:] not in text, where


def _key(request: web.Request) -> str:
    return request.headers.get("Authorization", "")[len("Bearer "):]


STATE = web.AppKey("state", dict)


def _body_for(ctype: str, text: str) -> tuple[bytes, str]:
    if ctype == "json":
        return json.dumps({"error": {"message": f"Incorrect API key provided: {text}", "code": 401}}).encode(), \
            "application/json"
    if ctype == "html":
        return f"<html><head><title>denied {text}</title></head><body>{text}</body></html>".encode(), "text/html"
    if ctype == "text":
        return f"bad key: {text}".encode(), "text/plain"
    return f"{text}".encode(), ""


def _error_response(mode: str, k: str, **kw: Any) -> web.Response:
    status, ctype, var = mode[1:].split("-")
    body, ct = _body_for(ctype, variants(k)[int(var)])
    return web.Response(status=int(status), body=body, headers={"Content-Type": ct} if ct else {}, **kw)


async def _models(request: web.Request) -> web.StreamResponse:
    mode, k = request.match_info["mode"], _key(request)
    if mode == "hang-models":
        await request.app[STATE]["release"].wait()
    if re.match(r"e\d", mode):
        return _error_response(mode, k)
    mid = k if mode == "key-model" else "m"
    return web.json_response({"data": [{"id": mid, "owned_by": k, "meta": {"n_ctx": 4096}}]})


async def _chat(request: web.Request) -> web.StreamResponse:
    mode, k = request.match_info["mode"], _key(request)
    if re.match(r"e\d", mode):
        return _error_response(mode, k, reason=f"No {k[:8]}")
    if mode == "ok200json":
        return web.json_response({"error": {"message": f"invalid key {variants(k)[1]}", "type": "auth"}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Echo": k})
    await resp.prepare(request)
    if mode == "sse-error-event":
        await resp.write(f"event: error\ndata: key {variants(k)[2]!r} rejected\n\n".encode())
    elif mode == "sse-error-obj":
        await resp.write(sse({"error": {"message": f"bad key {variants(k)[1]}"}}))
    else:  # a successful stream whose output is the key, a few characters per event
        echo = mode in ("echo-output", "key-model")
        pieces = [k[i:i + 3] for i in range(0, len(k), 3)] if echo else ["Hi", " there"]
        for p in pieces:
            await resp.write(sse(chunk(p, model=k, system_fingerprint=k)))
        await resp.write(sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces),
                                                       "note": k}}, "[DONE]"))
    await resp.write_eof()
    return resp


async def _tokenize(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state["tokenize"] = state.get("tokenize", 0) + 1
    if state["tokenize"] > 1 and request.match_info["mode"] in ("flaky", "x"):
        return web.Response(status=500, text=f"tokenizer crashed for {variants(_key(request))[1]}")
    data = await request.json()
    return web.json_response({"tokens": list(range(max(1, len(str(data.get("content", "")).split()))))})


async def _props(request: web.Request) -> web.StreamResponse:
    return web.json_response({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4,
                              "build_info": _key(request)})


def hostile_app(state: dict[str, Any]) -> web.Application:
    """Echoes the caller's Authorization header in every place it can; the mode is the first path segment:
    ``e<status>-<ctype>-<variant>`` (an error body), ``ok200json``, ``sse-error-event``, ``sse-error-obj``,
    ``echo-output`` (the key as output, model, usage), ``key-model`` (the key as model id and owner), ``ok``,
    ``hang-models`` (never answers /models); /tokenize fails after its first success in modes ``flaky`` and ``x``."""
    app = web.Application()
    app[STATE] = state
    app.router.add_get("/{mode}/v1/models", _models)
    app.router.add_post("/{mode}/v1/chat/completions", _chat)
    app.router.add_post("/{mode}/tokenize", _tokenize)
    app.router.add_get("/{mode}/props", _props)
    return app


class Hostile:
    """The hostile aiohttp server on loopback, in the current event loop."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Hostile:
        self.state["release"] = asyncio.Event()
        self.runner = web.AppRunner(hostile_app(self.state), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        self.state["release"].set()
        await self.runner.cleanup()


@contextlib.contextmanager
def serving_in_thread(make: Callable[[], Any]) -> Iterator[str]:
    """``make()`` (an async context manager with ``.url``: Hostile, a TLS Server) served on an event loop of its own
    in a thread, for tests that call the CLI's ``main`` (which runs its own loop); yields the URL, stops it after."""
    box: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with make() as srv:
            box["url"] = srv.url
            await stop.wait()

    th = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    th.start()
    for _ in range(200):
        if "url" in box:
            break
        time.sleep(0.01)
    try:
        yield box["url"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        th.join(5)


@pytest.fixture
def canary(monkeypatch) -> str:
    monkeypatch.setenv("BENCH_CANARY_KEY", KEY)
    return "BENCH_CANARY_KEY"


ERROR_MODES = [f"e{s}-{c}-{v}" for s in (400, 401, 403, 404, 422, 429, 500, 503) for c in ("json", "html", "text", "none")
               for v in (0, 1, 2)]
STREAM_MODES = ["ok200json", "sse-error-event", "sse-error-obj", "echo-output"]


@BOTH
def test_canary_key_never_in_a_record(canary, fast_io) -> None:
    """Every status and content type of error body, a 200 JSON error, SSE error events and objects, and the key
    echoed as output, as a model name, in usage and headers: no record (in memory or serialised) holds it."""

    async def main_():
        async with Hostile() as h:
            settings_ = ClientSettings(api_key_env=canary, fast_io=fast_io)
            async with make_http_client(settings_) as client:
                recs = []
                for mode in ERROR_MODES + STREAM_MODES:
                    spec = RequestSpec(mode, "chat", {"messages": []})
                    model = KEY if mode == "echo-output" else "m"
                    recs.append(await stream_request(client, f"{h.url}/{mode}/v1", spec, model=model))
                return recs

    for rec in asyncio.run(main_()):
        assert rec.error or rec.request_id == "echo-output", rec.request_id
        assert_clean(json.dumps(rec.to_dict()), rec.request_id)
        assert_clean(str(rec.error), rec.request_id)
        assert_clean(rec.model + "".join(e.content for e in rec.events), rec.request_id)
    echo = rec
    assert echo.ok and len("".join(e.content for e in echo.events)) == len(KEY)  # masked, lengths kept


def test_canary_key_never_in_setup_errors(canary) -> None:
    """/models errors, a model id or owner that is the key, /props echoing it, /tokenize failing with it."""

    async def main_():
        async with Hostile() as h:
            async with make_http_client(ClientSettings(api_key_env=canary)) as client:
                texts = []
                for mode in ERROR_MODES[::5]:
                    with pytest.raises((ServerError, ConfigError)) as e:  # 404: no OpenAI API at the URL
                        await discover_model(client, f"{h.url}/{mode}/v1")
                    texts.append(str(e.value))
                info = await discover_server(client, f"{h.url}/key-model/v1")
                texts.append(json.dumps(info))
                tok = HttpTokenizer(client, f"{h.url}/x", "m")
                assert await tok.count("a b c") == 3
                with pytest.raises(TokenizerError) as e:
                    await tok.count("a b c d")
                texts.append(str(e.value))
                assert "\n" not in str(e.value) and "HTTP 500" in str(e.value)
                return texts, info

    texts, info = asyncio.run(main_())
    assert info["routes"] == ["models", "props"] and info["context_size"] == 4096
    for t in texts:
        assert_clean(t)


def test_redaction_choke_points() -> None:
    add_secret(KEY)
    assert redact(f"a {KEY} b") == "a *** b"
    for v in variants(KEY):
        assert_clean(redact(f"x {v} y"))
        assert_clean(redact(json.dumps({"m": v})))
    assert_clean(redact("cut at the end: " + KEY[:20]))
    assert_clean(str(BenchError(f"oops {KEY}")))
    assert_clean(str(ServerError(f"oops {variants(KEY)[2]}")))
    rec = RequestRecord("r", "chat", KEY, error=f"bad {KEY}", usage={"k": KEY, KEY: 1})
    assert_clean(json.dumps(rec.to_dict()))


@pytest.mark.parametrize("mode", ["e401-json-1", "e500-html-2", "ok200json", "sse-error-event", "echo-output"])
@pytest.mark.parametrize("extra", [[], ["--json"], ["-v"]])
def test_canary_key_never_on_the_terminal(canary, capsys, caplog, mode, extra) -> None:
    """`bench probe` (table, --json, -v logging) against the hostile server: nothing printed or logged holds it."""
    caplog.set_level("DEBUG")

    with serving_in_thread(Hostile) as url:
        model = ["--model", KEY] if mode == "echo-output" else ["--model", "m"]
        args = [a for a in extra if a == "-v"] + ["probe", f"{url}/{mode}/v1", "--api-key-env", canary,
                                                  *model, *[a for a in extra if a != "-v"]]
        rc = main(args)
    out, err = capsys.readouterr()
    assert rc == (0 if mode == "echo-output" else 5), (out, err)
    for text in (out, err, caplog.text):
        assert_clean(text)


def test_canary_key_never_in_a_run_folder(canary, tmp_path, capsys) -> None:
    """`bench run` against a server echoing the key as output, model id, owner and build info: the results
    folder (records, results, CSV, Markdown) and the terminal never hold it."""
    with serving_in_thread(Hostile) as url:
        rc = main(["run", f"{url}/key-model/v1", "--api-key-env", canary, "--streams", "1", "--depths", "0",
                       "--repeats", "1", "--max-tokens", "4", "--prompt", "prose", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    files = list((tmp_path / "out").iterdir())
    assert rc == 0, err
    assert {f.name for f in files} >= {"records.jsonl", "results.json", "results.csv", "results.md"}
    assert "***" in (tmp_path / "out" / "records.jsonl").read_text()
    for text in [out, err] + [f.read_text(encoding="utf-8") for f in files]:
        assert_clean(text)


# ---- setup calls are bounded; the stream is not ----------------------------------------------------------------
def test_setup_calls_have_a_bounded_timeout_the_stream_none() -> None:
    c = make_http_client(ClientSettings())
    assert c.timeout.read == 30.0
    assert c.bench_stream_timeout.read is None  # type: ignore[attr-defined]

    async def main_():
        async with Hostile() as h:
            async with make_http_client(ClientSettings(setup_timeout_s=0.3)) as client:
                t0 = time.monotonic()
                with pytest.raises(ServerError, match="setup timeout"):
                    await discover_model(client, f"{h.url}/hang-models/v1")
                assert time.monotonic() - t0 < 5
                info = await discover_server(client, f"{h.url}/hang-models/v1")
                assert "models" not in info["routes"]

    asyncio.run(main_())


@BOTH
def test_generation_stream_is_not_bound_by_the_setup_timeout(fast_io) -> None:
    """A prefill that sends nothing for longer than the setup timeout is not cut: only --read-timeout bounds it."""

    async def h(reader, writer, i):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(STREAM))
        await writer.drain()
        await asyncio.sleep(0.6)
        writer.write(STREAM)
        await writer.drain()

    async def main_():
        async with Server(h) as srv:
            quiet = await one(srv.url + "/v1", ClientSettings(fast_io=fast_io, setup_timeout_s=0.2))
            bounded = await one(srv.url + "/v1", ClientSettings(fast_io=fast_io, read_timeout_s=0.2))
            return quiet, bounded

    quiet, bounded = asyncio.run(main_())
    assert quiet.ok, quiet.error
    assert bounded.error_kind == "timeout"


def test_tokenize_failing_after_first_success_raises_tokenizer_error_with_a_fallback() -> None:
    def handler(request):
        handler.n += 1  # type: ignore[attr-defined]
        if handler.n == 1:  # type: ignore[attr-defined]
            return httpx.Response(200, json={"tokens": list(range(100))})
        raise httpx.ReadTimeout("timed out", request=request)

    handler.n = 0  # type: ignore[attr-defined]

    async def main_():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            tok = HttpTokenizer(client, "http://srv")
            assert await tok.count("x" * 400) == 100
            with pytest.raises(TokenizerError, match="timed out") as e:
                await tok.count("y")
            assert isinstance(e.value, BenchError) and e.value.exit_code == 5
            fb = tok.fallback()
            assert fb is not None and fb.chars_per_token == 4.0 and await fb.count("z" * 40) == 10

    asyncio.run(main_())


# ---- TLS ----------------------------------------------------------------------------------------------------------
def _tls_server(tls_cert: tuple[str, str]) -> Server:
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*tls_cert)
    return Server(_serve_bytes(STREAM), ssl=ctx)


@BOTH
def test_tls_ca_bundle_and_insecure(tls_cert, fast_io, monkeypatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)

    async def main_():
        async with _tls_server(tls_cert) as srv:
            base = srv.url + "/v1"
            default = await one(base, ClientSettings(fast_io=fast_io))
            bundle = await one(base, ClientSettings(fast_io=fast_io, ca_bundle=tls_cert[0]))
            insecure = await one(base, ClientSettings(fast_io=fast_io, insecure=True))
            return default, bundle, insecure

    default, bundle, insecure = asyncio.run(main_())
    assert default.error_kind == "connect" and "CERTIFICATE_VERIFY_FAILED" in (default.error or "")
    assert bundle.ok, bundle.error
    assert insecure.ok, insecure.error


def test_tls_cli_options(tls_cert, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with serving_in_thread(lambda: _tls_server(tls_cert)) as url:
        base = url + "/v1"
        assert main(["probe", base, "--model", "m", "--ca-bundle", tls_cert[0]]) == 0
        capsys.readouterr()
        assert main(["--io", "httpx", "probe", base, "--model", "m", "--insecure"]) == 0
        err = capsys.readouterr().err
        assert "--insecure" in err and "--ca-bundle" in err  # the warning names the cause and the fix
        bad = tmp_path / "bad.pem"
        bad.write_text("not a certificate")
        assert main(["probe", base, "--model", "m", "--ca-bundle", str(bad)]) == 3
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--ca-bundle" in err
        assert main(["probe", base, "--model", "m", "--setup-timeout", "0"]) == 3


# ---- end-of-stream work stays off the stamping path; the lag monitor ---------------------------------------------
def test_end_of_stream_parsing_yields_to_the_loop() -> None:
    """100 responses of 500 events end in the same loop iteration (as at one decode step): their parsing is spread
    over many loop iterations, so the loop keeps polling sockets (stamping reads) in between. Before, each task
    parsed its response in one go and all of them ran in that one iteration."""
    raws = [[SSEEvent(i, json.dumps(chunk(f"t{i}"))) for i in range(500)] + [SSEEvent(500, "[DONE]")]
            for _ in range(100)]
    ticks = [0]

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0)

    async def parse(raw: list[SSEEvent]) -> tuple[RequestRecord, int]:
        rec = RequestRecord("r", "chat", "m")
        log = SSELog()
        log.add(raw)
        await client_mod._parse_sliced(rec, log)
        return rec, ticks[0]

    async def main_():
        t = asyncio.get_running_loop().create_task(ticker())
        await asyncio.sleep(0)
        out = await asyncio.gather(*(parse(r) for r in raws))
        t.cancel()
        return out

    out = asyncio.run(main_())
    assert all(rec.ok and len(rec.events) == 500 for rec, _ in out)
    done_at = sorted(n for _, n in out)
    assert done_at[-1] - done_at[0] >= 20  # the loop went round many times while they were parsed


def test_lag_monitor_sees_a_blocking_call() -> None:
    async def main_():
        mon = LagMonitor(interval_s=0.01)
        mon.start()
        await asyncio.sleep(0.1)
        time.sleep(0.15)  # the loop is blocked: the next wake-up is ~150 ms late
        await asyncio.sleep(0.1)
        return mon.stop()

    lag = asyncio.run(main_())
    assert set(lag) == {"p50_ms", "p99_ms", "max_ms", "samples"}
    assert lag["samples"] >= 10
    assert 120 <= lag["max_ms"] <= 1000
    assert lag["p50_ms"] < 10
    text = lag_warning(lag, workers=1, streams=512)
    assert text is not None and "--workers" in text
    assert lag_warning({"p50_ms": 0.1, "p99_ms": 0.5, "max_ms": 1.0, "samples": 100}) is None
    assert LagMonitor().stop()["p99_ms"] is None


def test_lag_monitor_leaves_out_a_paused_span() -> None:
    """Encoding a wave's images blocks the loop before anything is read: a paused span is not lag (a multimodal
    run warned "timestamps lag by up to 19.6 ms ... use --workers 2" while its ITL p99 was 20.19 ms of 20)."""
    async def main_(pause: bool) -> dict[str, Any]:
        mon = LagMonitor(interval_s=0.01)
        mon.start()
        await asyncio.sleep(0.05)
        if pause:
            mon.pause()
        time.sleep(0.3)  # blocked: without the pause the next wake-up is at least ~290 ms late
        if pause:
            mon.resume()
        await asyncio.sleep(0.05)
        return mon.stop()

    assert asyncio.run(main_(False))["max_ms"] >= 290
    lag = asyncio.run(main_(True))
    assert lag["samples"] >= 4 and lag["max_ms"] < 290


# ---- function sizes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["client/request.py", "client/events.py", "client/endpoint.py", "transport/http.py",
                                  "transport/protocol.py", "transport/sse.py", "redaction.py", "session/loop_lag.py"])
def test_no_function_over_60_lines(name) -> None:
    tree = ast.parse((Path(client_mod.__file__).parents[1] / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno + 1 <= 60, node.name  # type: ignore[operator]


def test_uncaught_traceback_is_redacted(capsys) -> None:
    import sys

    from bench.redaction import install_excepthook

    add_secret(KEY)
    old = sys.excepthook
    try:
        install_excepthook()
        try:
            raise RuntimeError(f"boom {variants(KEY)[1]}")
        except RuntimeError as e:
            sys.excepthook(type(e), e, e.__traceback__)
    finally:
        sys.excepthook = old
    err = capsys.readouterr().err
    assert "RuntimeError" in err
    assert_clean(err)


def test_run_with_tokenize_failing_after_first_success_is_not_a_traceback(canary, tmp_path, capsys) -> None:
    """/tokenize answers once, then fails with the key in its body: `bench run` never shows a traceback or the key
    (today it stops with one line and exit 5; with the runner's fallback to the estimator it completes)."""
    with serving_in_thread(Hostile) as url:
        rc = main(["run", f"{url}/flaky/v1", "--api-key-env", canary, "--streams", "1", "--depths", "0",
                       "--repeats", "1", "--max-tokens", "4", "--prompt", "prose", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc in (0, 5), err
    assert "Traceback" not in err
    if rc == 5:
        assert len(err.strip().splitlines()) == 1 and "tokenize" in err
    assert_clean(out + err)


def test_lag_warning_knows_kernel_stamps_and_when_workers_cannot_help() -> None:
    """Kernel stamps are not moved by the loop: 8 ms of lag with 12 ms between a stream's events draws nothing
    (user stamps: a warning); lag over half the gap does; one stream per reader is not helped by more workers."""
    lag = {"p50_ms": 1.0, "p99_ms": 8.0, "max_ms": 9.0, "samples": 500}
    assert lag_warning(lag, workers=1, streams=8, kernel=True, gap_ms=20.0) is None
    user = lag_warning(lag, workers=1, streams=8, kernel=False, gap_ms=20.0)
    assert user is not None and "too busy to stamp" in user and "--workers 2" in user
    near = lag_warning(lag, workers=1, streams=8, kernel=True, gap_ms=12.0)
    assert near is not None and "half the gap" in near and "--workers 2" in near
    assert lag_warning(lag, workers=1, streams=8, kernel=True, gap_ms=None) is not None  # gap unknown: 5 ms
    one = lag_warning(lag, workers=1, streams=1)
    assert one is not None and "cannot help" in one and "--workers" not in one


def test_stamp_context_reads_the_stamp_source_and_the_median_gap() -> None:
    from types import SimpleNamespace as NS

    from bench.session.loop_lag import stamp_context

    recs = [NS(stamp_source="kernel"), NS(stamp_source="kernel")]
    itl = {"n": 5, "mean": 15.2, "median": 12.0, "p99": 29.3}  # the cell summary's itl_ms
    assert stamp_context(recs, itl) == {"kernel": True, "gap_ms": 12.0}
    assert stamp_context(recs + [NS(stamp_source="user")], None) == {"kernel": False, "gap_ms": None}
    assert stamp_context([], itl)["kernel"] is False
