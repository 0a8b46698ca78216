"""`bench check` (conformance report) against the sim in several configurations, a replayed case and the real
llama-server; `bench record` -> `bench replay` reproduces the recorded metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli.app import main
from bench.sim import SimConfig, running_sim
from bench.tools.replay import Case, serve_case

KEYS = {"usage", "tokens_per_event", "min_tokens_honoured", "prefix_cache", "metrics", "tokenize",
        "context_tokens", "keeps_open_after_done"}


def _check(url: str, capsys: pytest.CaptureFixture[str]) -> dict:
    rc = main(["check", url, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert KEYS <= set(rep)
    return rep


def test_check_sim_default(capsys) -> None:
    with running_sim(SimConfig(decode_step_ms=2, max_model_len=32768)) as url:
        rep = _check(url, capsys)
    assert rep["usage"] == "final" and rep["tokens_per_event"] == 1.0
    assert rep["min_tokens_honoured"] is True and rep["prefix_cache"] is False
    assert rep["metrics"] is True and rep["metrics_backend"] == "bench-sim" and "kv_cache_usage_pct" in rep["metrics_keys"]
    assert rep["tokenize"] is True and rep["context_tokens"] == 32768
    assert rep["keeps_open_after_done"] is False and rep["keepalive_comments"] is False
    assert rep["role_first_chunk"] is True and rep["reasoning_fields"] == [] and rep["tool_calls"] == "none"


@pytest.mark.parametrize("mode", ["never", "every_chunk"])
def test_check_sim_usage_modes(capsys, mode: str) -> None:
    with running_sim(SimConfig(decode_step_ms=2, usage_mode=mode)) as url:
        rep = _check(url, capsys)
    assert rep["usage"] == mode


def test_check_sim_drafts_cache_eos_reasoning(capsys) -> None:
    cfg = SimConfig(decode_step_ms=2, tokens_per_event=(2, 4), prefix_cache=True, eos_prob=0.2, reasoning_tokens=2)
    with running_sim(cfg) as url:
        rep = _check(url, capsys)
    assert rep["tokens_per_event"] > 1.5  # several tokens per event, as with speculative decoding
    assert rep["prefix_cache"] is True and rep["cached_tokens_second"] > 150
    assert rep["min_tokens_honoured"] is False and rep["stops_early_without_min_tokens"] is True
    assert rep["reasoning_fields"] == ["reasoning_content"]


def test_check_terminal_table_fits_80_columns(capsys) -> None:
    with running_sim(SimConfig(decode_step_ms=2)) as url:
        assert main(["check", url]) == 0
    out = capsys.readouterr().out
    assert "keeps_open_after_done" in out and max(len(line) for line in out.splitlines()) <= 80


def test_check_open_after_done_and_comments(capsys) -> None:
    """A server that sends [DONE], then a keep-alive comment 400 ms later before ending the response."""
    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"},
                                                                         "finish_reason": None}]}
    evs = ((1.0, f"data: {json.dumps(chunk)}\n\n".encode()), (5.0, b"data: [DONE]\n\n"),
           (400.0, b": keep-alive\n\n"))
    case = Case("open", "", "chat", 200, {"content-type": "text/event-stream"}, evs, {})
    with serve_case(case) as url:
        rep = _check(url, capsys)
    assert rep["keeps_open_after_done"] is True and rep["done_to_end_ms"] > 300
    assert rep["keepalive_comments"] is True and rep["usage"] == "never" and rep["metrics"] is False
    assert rep["role_first_chunk"] is False and rep["tokenize"] is False and rep["context_tokens"] is None


def test_record_then_replay(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("BENCH_TEST_KEY", "sk-secret-0123456789")
    out = tmp_path / "rec.json"
    with running_sim(SimConfig(decode_step_ms=20, tokens_per_event=(1, 2))) as url:
        rc = main(["record", url, "--out", str(out), "--max-tokens", "12", "--api-key-env", "BENCH_TEST_KEY"])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    text = out.read_text()
    assert "sk-secret" not in text
    case = json.loads(text)
    assert case["request"]["headers"]["Authorization"] == "Bearer ***"
    assert case["request"]["body"]["max_tokens"] == 12 and case["endpoint"] == "chat"
    exp = case["expect"]
    assert exp["ok"] is True and exp["output_tokens"] == 12 and exp["ttft_ms"][0] < exp["ttft_ms"][1]
    rc = main(["replay", str(out), "--json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0, got
    assert got["output_tokens"] == 12 and got["chunks"] == exp["chunks"] and got["itl_count"] == exp["itl_count"]



@pytest.mark.engine
def test_check_llama_server(llama_server: str, capsys) -> None:
    rep = _check(llama_server, capsys)
    assert rep["backend"] == "llama.cpp" and rep["metrics"] is True and rep["metrics_backend"] == "llama.cpp"
    assert rep["usage"] in ("final", "every_chunk") and rep["tokenize"] is True
    assert rep["context_tokens"] and rep["context_tokens"] > 0 and rep["tokens_per_event"] == pytest.approx(1.0)
    assert rep["keeps_open_after_done"] is False and rep["prefix_cache"] is True


@pytest.mark.parametrize("hits", [0, 200])
def test_check_vllms_tokenize_form_and_a_cache_only_its_metrics_show(hits: int, capsys, monkeypatch) -> None:
    """vLLM's ways, on a replayed case: ``/tokenize`` takes only its own form (``prompt`` + ``model``: 400 for
    llama.cpp's ``content``), and usage carries no cached tokens (vLLM without --enable-prompt-tokens-details)
    while its /metrics page counts prefix-cache hits: ``hits`` per chat request after the first."""
    from aiohttp import web

    import bench.tools.replay as replay

    chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"},
                                                                         "finish_reason": None}]}
    usage = {"id": "x", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 300, "completion_tokens": 1, "total_tokens": 301}}
    evs = ((1.0, f"data: {json.dumps(chunk)}\n\n".encode()), (2.0, f"data: {json.dumps(usage)}\n\n".encode()),
           (3.0, b"data: [DONE]\n\n"))
    case = Case("vllm-like", "", "chat", 200, {"content-type": "text/event-stream"}, evs, {})
    chats = [0]
    make = replay._make_app

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        if "prompt" not in body:
            return web.json_response({"error": {"message": "body.prompt: Field required"}}, status=400)
        return web.json_response({"count": 7, "tokens": list(range(7)), "max_model_len": 8192})

    async def metrics(request: web.Request) -> web.Response:
        n = hits * max(0, chats[0] - 1)
        return web.Response(text=f'# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{{engine="0"}} '
                                 f'{n}.0\n', content_type="text/plain")

    @web.middleware
    async def count(request: web.Request, handler):
        chats[0] += request.path == "/v1/chat/completions"
        return await handler(request)

    def app(c: Case, late_ms: list[float] | None = None) -> web.Application:
        a = make(c, late_ms)
        a.middlewares.append(count)
        a.router.add_post("/tokenize", tokenize)
        a.router.add_get("/metrics", metrics)
        return a

    monkeypatch.setattr(replay, "_make_app", app)
    with serve_case(case) as url:
        rep = _check(url, capsys)
    assert rep["tokenize"] is True and rep["chat_template_tokens"] == 300 - 7
    assert rep["metrics_backend"] == "vllm" and rep["cached_tokens_second"] == 0
    assert rep["prefix_cache"] is (hits > 0) and rep["prefix_cache_seen_in"] == ("metrics" if hits else None)


@pytest.mark.parametrize("as_json", [False, True])
def test_check_of_a_server_refusing_every_request_exits_5_with_the_cure(as_json: bool, capsys) -> None:
    """A server answering HTTP 401 to every generation request: no confident table of 'usage never', 'prefix_cache
    no', 'tool_calls rejected', but one line naming the error and the key's cure, and exit 5 (as `bench probe`)."""
    body = json.dumps({"error": {"message": "invalid key"}}).encode()
    case = Case("401", "", "chat", 401, {"content-type": "application/json"}, ((0.0, body),), {})
    with serve_case(case) as url:
        rc = main(["check", url, *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert rc == 5, err
    assert "every request of the check failed (HTTP 401: invalid key)" in err and "--api-key-env" in err
    assert len(err.strip().splitlines()) == 1
    if as_json:
        rep = json.loads(out)
        assert rep["ok"] is False and rep["status"] == 401 and rep["requests_ok"] == 0
    else:
        assert out == "" and "usage" not in err


def test_check_counts_its_successes(capsys) -> None:
    with running_sim(SimConfig(decode_step_ms=2)) as url:
        rep = _check(url, capsys)
    assert rep["requests_ok"] >= 6 and rep["ok"] is True and rep["status"] == 200


def test_check_rows_say_what_the_finding_means() -> None:
    """'tool_calls none' read like no support, and 'chat_template_tokens 0' was said to be 'expected as cached'."""
    from bench.tools.check import report_rows

    def row(rep: dict, key: str) -> tuple[str, str]:
        return next((found, does) for k, found, does in report_rows(rep) if k == key)

    assert row({"tool_calls": "none"}, "tool_calls") == ("not called", "tools accepted, none called "
                                                         "(--tool-choice required forces one)")
    assert row({"tool_calls": "rejected"}, "tool_calls")[1] == "the server refused a request with tools"
    assert row({"tool_calls": "streamed"}, "tool_calls")[1] == "tool-call arguments count as output"
    assert row({"chat_template_tokens": 0}, "chat_template_tokens")[1] == "no template tokens around the prompt"
    assert row({"chat_template_tokens": 12}, "chat_template_tokens")[1] == "the shared header is expected as cached"
    assert row({"chat_template_tokens": None}, "chat_template_tokens") == ("?", "unknown: no /tokenize to "
                                                                             "compare with")
