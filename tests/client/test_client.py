"""Client behaviour that needs no engine: URLs, pool size, API key hygiene, unreachable endpoints, and the parsing
of chunks into the request record."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.cli.app import main
from bench.client import ClientSettings, make_http_client, normalize_url, root_url
from bench.client import events as client_mod
from bench.errors import ConfigError
from bench.records import RequestRecord
from bench.redaction import redact, secrets
from bench.tools.replay import Case, serve_case
from bench.transport.sse import SSEEvent

KEY = "sk-test-0123456789abcdefSECRET"


def test_normalize_url() -> None:
    assert normalize_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_url("http://h:8000/") == "http://h:8000/v1"
    assert normalize_url("h:8000") == "http://h:8000/v1"
    assert normalize_url("https://api.x.com/openai/v1/") == "https://api.x.com/openai/v1"
    assert root_url("http://h:1/v1") == "http://h:1"
    with pytest.raises(ConfigError):
        normalize_url("ftp://h/v1")
    for url in ("http://h:8000/v1?api-version=2024-06-01", "http://h:8000/v1#top"):  # was dropped silently
        with pytest.raises(ConfigError, match="is not supported"):
            normalize_url(url)


@pytest.mark.parametrize("url", ["http://[::1:46555/v1", "http://[zz]:80/v1", "http://h:99999/v1", "", "  "])
def test_a_url_that_does_not_parse_is_one_line_and_exit_3(url: str, capsys) -> None:
    with pytest.raises(ConfigError):
        normalize_url(url)
    assert main(["probe", url]) == 3  # "" is not a request for the embedded endpoint
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "URL" in err


def test_a_password_in_the_url_is_redacted_like_the_key() -> None:
    assert normalize_url("http://bob:pw-in-url-4711@h:8000") == "http://bob:pw-in-url-4711@h:8000/v1"
    assert "pw-in-url-4711" in secrets()
    assert "pw-in-url-4711" not in redact("probe http://bob:pw-in-url-4711@h:8000/v1 (chat)")


def test_pool_never_caps_concurrency() -> None:
    c = make_http_client(ClientSettings(), concurrency=1000)
    pool = c._transport.inner._pool  # httpx internals: the only way to see the limit it was given
    assert pool._max_connections is None or pool._max_connections >= 1000


def _echo_key_case(status: int) -> Case:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}", "code": "invalid_api_key"}})
    return Case("key", "echoes the key", "chat", status, {"content-type": "application/json"},
                ((1.0, body.encode()),), {})


@pytest.mark.parametrize("as_json, verbose", [(True, False), (False, False), (False, True)])
def test_api_key_never_printed(monkeypatch, capsys, caplog, as_json, verbose) -> None:
    monkeypatch.setenv("BENCH_TEST_KEY", KEY)
    caplog.set_level("DEBUG", logger="bench")
    with serve_case(_echo_key_case(401)) as base:
        args = (["-v"] if verbose else []) + ["probe", base, "--model", "m", "--api-key-env", "BENCH_TEST_KEY"]
        rc = main(args + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc == 5
    assert KEY not in out and KEY not in err and KEY not in caplog.text
    assert "Bearer ***" in caplog.text  # the request was logged, with the key hidden
    assert "401" in err and "--api-key-env" in err  # the cure named with the failure
    if not verbose:
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, warned", [(["--api-key-env", "BENCH_KEY_TYPO"], "BENCH_KEY_TYPO"),
                                          (["--api-key-env", "OPENAI_API_KEY"], "OPENAI_API_KEY"),
                                          (["--api-key-env", "BENCH_TEST_KEY"], None),  # set: silent
                                          ([], None)])  # the default variable, unset: silent
def test_an_unset_variable_named_by_api_key_env_is_warned(monkeypatch, capsys, sim, argv, warned) -> None:
    """`--api-key-env NAME` naming an unset variable once sent no key, silently; now a warning names the variable
    (never a key). The default (OPENAI_API_KEY) unset, not given on the command line, stays silent."""
    monkeypatch.delenv("BENCH_KEY_TYPO", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("BENCH_TEST_KEY", KEY)
    assert main(["probe", sim, "--json", *argv]) == 0
    err = capsys.readouterr().err
    if warned is None:
        assert "api-key-env" not in err
    else:
        assert f"warning --api-key-env {warned}: that environment variable is not set" in err and KEY not in err


def test_unreachable_url_is_one_line_and_exit_4(capsys) -> None:
    rc = main(["probe", "http://127.0.0.1:9/v1", "--connect-timeout", "2"])
    err = capsys.readouterr().err
    assert rc == 4
    assert len(err.strip().splitlines()) == 1 and "cannot reach" in err


def test_bad_option_is_exit_3(capsys) -> None:
    assert main(["probe", "http://127.0.0.1:9/v1", "--max-tokens", "0"]) == 3
    assert "--max-tokens" in capsys.readouterr().err


# ---- chunk parsing: _parse_events's fast path for the common chunk, _absorb for every other -------------------------
HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _parsed(*chunks: Any) -> RequestRecord:
    rec = RequestRecord("r", "chat", "m", sent_ns=10)
    client_mod._parse_events(rec, [SSEEvent(100 + i, c if isinstance(c, str) else json.dumps({**HEAD, **c}))
                                   for i, c in enumerate(chunks)])
    return rec


def _texts(rec: RequestRecord) -> list[tuple[str, str, str]]:
    return [(e.content, e.reasoning, e.tool) for e in rec.events]


def _chat(delta: Any, **choice: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None, **choice}]}


@pytest.mark.parametrize("chunk, texts", [
    (_chat({"content": "a"}), [("a", "", "")]),
    (_chat({"content": 5}), [("", "", "")]),  # not a str: ignored
    (_chat({"content": ["a"]}), [("", "", "")]),
    (_chat({"content": None, "role": "assistant"}), [("", "", "")]),
    (_chat(None), [("", "", "")]),  # delta null
    (_chat({}, message={"content": "m"}), [("m", "", "")]),  # an empty delta: the message is read
    (_chat(None, message={"content": "m"}), [("m", "", "")]),
    ({"choices": [{"index": 0, "message": {"content": "m"}, "text": "t"}]}, [("mt", "", "")]),
    (_chat({"content": "a"}, text="t"), [("at", "", "")]),  # content, then text
    (_chat({"content": "a", "reasoning_content": "r", "reasoning": "s"}), [("a", "rs", "")]),
    (_chat({"reasoning_content": "r"}), [("", "r", "")]),
    (_chat({"reasoning_content": "r", "reasoning": "s", "tool_calls": [{"function": {"arguments": "x"}}]}),
     [("", "rs", "x")]),
    (_chat({"reasoning": "r"}), [("", "r", "")]),
    (_chat({"reasoning": 3, "content": "a"}), [("a", "", "")]),
    (_chat({"content": "a", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}, 7, {"function": 1}]}),
     [("a", "", "f{}")]),
    (_chat({"tool_calls": []}), [("", "", "")]),
    ({"choices": [{"index": 1, "delta": {"content": "b"}}]}, [("", "", "")]),  # index 1 only: no text
    ({"choices": [{"index": False, "delta": {"content": "b"}}]}, [("b", "", "")]),  # == 0, as before
    ({"choices": [{"delta": {"content": "b"}}]}, [("b", "", "")]),  # no index: choice 0
    ({"choices": [{"index": 1, "delta": {"content": "b"}}, {"index": 0, "delta": {"content": "a"}}]},
     [("a", "", "")]),
    ({"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 0, "text": "b"}]}, [("ab", "", "")]),
    ({"choices": []}, [("", "", "")]),
    ({"choices": ["x"]}, [("", "", "")]),
    ({"choices": {"index": 0}}, [("", "", "")]),
    ({"choices": [{"index": 0, "text": " w", "logprobs": None, "finish_reason": None}]}, [(" w", "", "")]),
    ({"choices": [{"index": 0, "text": None}]}, [("", "", "")]),
    ({"choices": [{"index": 0, "text": 1}]}, [("", "", "")]),
])
def test_chunk_text(chunk: dict[str, Any], texts: list[tuple[str, str, str]]) -> None:
    rec = _parsed(chunk)
    assert _texts(rec) == texts and rec.error is None
    assert rec.finish_reason is None and rec.usage is None and rec.timings is None
    assert rec.events[0].t_ns == 90


def test_sim_fields_are_ints_only() -> None:
    rec = _parsed({**_chat({"content": "a"}), "sim": {"sched_ns": 5, "write_ns": 6, "tokens": 1}},
                  {**_chat({"content": "b"}), "sim": {"sched_ns": 5.0, "write_ns": None, "tokens": True}},
                  {**_chat({"content": "c"}), "sim": [1]},
                  {**_chat({"tool_calls": [{"function": {"arguments": "x"}}]}), "sim": {"tokens": 2}})
    assert [(e.sched_ns, e.write_ns, e.tokens) for e in rec.events] == [(5, 6, 1), (None, None, None),
                                                                        (None, None, None), (None, None, 2)]
    assert _texts(rec)[3] == ("", "", "x")


def test_usage_timings_and_finish_reason_keep_the_last_good_one() -> None:
    u1, u2 = {"completion_tokens": 1}, {"completion_tokens": 2}
    rec = _parsed({**_chat({"content": "a"}), "usage": u1}, {**_chat({"content": "b"}), "usage": None},
                  {**_chat({"content": "c"}, finish_reason="length"), "usage": u2},
                  {**_chat({"content": "d"}, finish_reason=""), "usage": {}}, _chat({"content": "e"}),
                  {**_chat({"content": "f"}), "usage": {}, "timings": {"predicted_n": 4}},
                  {**_chat({}, finish_reason=None), "usage": [1], "timings": {}})
    assert rec.usage == u2 and rec.timings == {"predicted_n": 4} and rec.finish_reason == "length"
    assert "".join(e.content for e in rec.events) == "abcdef"
    assert _parsed(_chat({"content": "a"}, finish_reason=7)).finish_reason == "7"
    assert _parsed({**_chat({"content": "a"}), "timings": [1]}).timings is None


@pytest.mark.parametrize("err, kind", [({"message": "boom", "code": 500}, "stream_error"), ("boom", "stream_error"),
                                       (None, None), ("", None), ({}, None)])
def test_error_object_in_a_chunk(err: Any, kind: str | None) -> None:
    rec = _parsed({**_chat({"content": "a"}), "error": err})
    assert rec.error_kind == kind
    assert len(rec.events) == (0 if kind else 1)


def test_events_that_carry_no_chunk() -> None:
    rec = RequestRecord("r", "chat", "m")
    ok = json.dumps(_chat({"content": "a"}))
    assert not client_mod._parse_events(rec, [SSEEvent(1, ""), SSEEvent(2, "  "), SSEEvent(3, ok, "ping"),
                                              SSEEvent(4, ok), SSEEvent(5, "x", "other")])
    assert rec.error is None and _texts(rec) == [("a", "", "")]
    assert client_mod._parse_events(rec, [SSEEvent(6, " [DONE] "), SSEEvent(7, ok)]) and len(rec.events) == 1
    for data, kind in (("{bad", "bad_json"), ("[1]", "bad_json"), ("null", "bad_json"), ("x", "bad_json")):
        rec = RequestRecord("r", "chat", "m")
        client_mod._parse_events(rec, [SSEEvent(1, data)])
        assert rec.error_kind == kind and not rec.events, data
    rec = RequestRecord("r", "chat", "m")
    client_mod._parse_events(rec, [SSEEvent(1, "overloaded", "error")])
    assert rec.error_kind == "stream_error" and "overloaded" in (rec.error or "")


_ODD = st.none() | st.booleans() | st.integers(-1, 2) | st.text(max_size=2) | st.just([]) | st.just({}) | st.just([1])
_TXT = st.text(max_size=3) | _ODD
_CALLS = st.lists(st.fixed_dictionaries({}, optional={"function": st.fixed_dictionaries(
    {}, optional={"name": _TXT, "arguments": _TXT}) | _ODD}) | _ODD, max_size=2) | _ODD
_DELTA = st.fixed_dictionaries({}, optional={"content": _TXT, "reasoning_content": _TXT, "reasoning": _TXT,
                                             "tool_calls": _CALLS, "role": _TXT}) | _ODD
_CHOICE = st.fixed_dictionaries({}, optional={"index": st.sampled_from([0, 1, False, 0.0, "0", None]), "delta": _DELTA,
                                              "message": _DELTA, "text": _TXT, "finish_reason": _TXT}) | _ODD
_COMMON = st.fixed_dictionaries({"index": st.just(0), "delta": st.fixed_dictionaries({}, optional={
    "content": _TXT, "reasoning_content": _TXT, "reasoning": _TXT, "tool_calls": _CALLS, "role": _TXT})},
    optional={"text": _TXT, "message": _DELTA, "finish_reason": _TXT})
_CHUNK = st.fixed_dictionaries({}, optional={
    "choices": st.lists(_COMMON, min_size=1, max_size=1) | st.lists(_CHOICE, min_size=1, max_size=2) | _ODD,
    "error": _ODD,
    "usage": st.dictionaries(st.text(max_size=1), _ODD, max_size=1) | _ODD,
    "timings": st.dictionaries(st.text(max_size=1), _ODD, max_size=1) | _ODD,
    "sim": st.fixed_dictionaries({}, optional={"sched_ns": _ODD, "write_ns": _ODD, "tokens": _ODD}) | _ODD})


@settings(max_examples=400, deadline=None)
@given(st.lists(_CHUNK, min_size=1, max_size=4))
def test_fast_path_gives_the_records_of_absorb(chunks: list[dict[str, Any]]) -> None:
    fast = RequestRecord("r", "chat", "m", sent_ns=10)
    client_mod._parse_events(fast, [SSEEvent(100 + i, json.dumps(c)) for i, c in enumerate(chunks)])
    ref = RequestRecord("r", "chat", "m", sent_ns=10)
    for i, c in enumerate(chunks):
        client_mod._absorb(ref, c, 90 + i)
    assert fast == ref


def test_fast_path_sends_the_head_httpx_would_for_every_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast pool's request head is built once per client and URL (bench.client.request._fast_head): every
    request still carries the client's headers (the API key, Content-Type) and its own Content-Length, as the
    httpx path sends them."""
    import asyncio

    from bench.client import RequestSpec, stream_request
    from tests.transport.test_http import Server, read_request

    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-123")
    stream = (b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
              b"data: [DONE]\n\n")
    seen: list[tuple[bytes, dict[str, str], bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while (req := await read_request(reader)) is not None:
            seen.append(req)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                         % len(stream) + stream)
            await writer.drain()

    async def go(fast: bool) -> list[tuple[bytes, dict[str, str], bytes]]:
        seen.clear()
        async with Server(handler) as srv, make_http_client(ClientSettings(fast_io=fast)) as client:
            for n in (1, 40):
                spec = RequestSpec(f"r{n}", "chat", {"messages": [{"role": "user", "content": "x" * n}]})
                rec = await stream_request(client, srv.url + "/v1", spec, model="m")
                assert rec.error is None, rec.error
        return list(seen)

    fast, slow = asyncio.run(go(True)), asyncio.run(go(False))
    assert [r[0] for r in fast] == [r[0] for r in slow] == [b"POST /v1/chat/completions HTTP/1.1"] * 2
    for (_, fh, fb), (_, sh, sb) in zip(fast, slow):
        assert fb == sb and int(fh["content-length"]) == len(fb)
        assert fh["authorization"] == sh["authorization"] == "Bearer sk-canary-123"
        assert fh["content-type"] == sh["content-type"] == "application/json"
        assert fh["host"].startswith("127.0.0.1:") and sh["host"].startswith("127.0.0.1:")


@pytest.mark.parametrize(("status", "cure"), [(502, "no model server answering"), (503, "no model server answering"),
                                              (401, "API key was refused"), (500, "pass --model")])
def test_models_error_names_the_cure_of_its_status(status: int, cure: str) -> None:
    """GET /models failing: a gateway with nothing behind it (502-504) is not cured by --model (a new user was sent
    there by a proxy whose upstream was down), a refused key names the key's variable, anything else --model."""
    import asyncio

    from bench.client import discover_model
    from bench.errors import ServerError
    from tests.transport.test_http import Server, read_request

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await read_request(reader) is not None:
            body = b'{"error": {"message": "upstream down"}}'
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % (status, len(body)) + body)
            await writer.drain()

    async def go() -> str:
        async with Server(handler) as srv, make_http_client(ClientSettings()) as client:
            with pytest.raises(ServerError) as e:
                await discover_model(client, srv.url + "/v1")
            return str(e.value)

    msg = asyncio.run(go())
    assert f"HTTP {status}" in msg and cure in msg, msg
    assert status == 500 or "--model" not in msg
