"""Issue 26, item 2: redaction at the border. A hostile server echoes the request's key (mixed case, as real keys
are) in every field bench reads: the model list (id, owner, meta), /props, /version, /slots, /get_model_info,
/get_server_info, /metrics (HELP text and labels), /tokenize, response headers, the streamed text, reasoning,
model, usage and timings, and error bodies; verbatim, lower-cased, upper-cased, split by a newline and JSON
\\u-escaped. `bench run` (with --report), `bench check` (table and --json), `bench record`, `bench probe` (table,
--json, -v) and `bench report` run against it; no file under --out and nothing on the terminal holds the key in
any of those forms."""

from __future__ import annotations

import re
import secrets
import string
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from aiohttp import web

from bench.cli.app import main
from bench.client.border import admit_body, admit_headers
from bench.redaction import add_secret
from tests.client.test_hardening import serving_in_thread

KEY = "sk-Proj-" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(30)) + "aZ"
ESC = "@@escaped-key@@"  # stands for the key written as JSON \u escapes (replaced in the JSON text)
STATE = web.AppKey("state", dict)


def forms(k: str) -> list[str]:
    """The key as the server writes it: verbatim, lower-cased, upper-cased, split by a newline, \\u-escaped."""
    return [k, k.lower(), k.upper(), k[:11] + "\n" + k[11:], ESC]


def normal(text: str) -> str:
    """``text`` with every way of hiding the key undone: JSON \\u escapes, backslashes, %XX, whitespace, table
    borders (box-drawing characters), letter case."""
    text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    text = unquote(text.replace("\\n", "").replace("\\t", "").replace("\\", ""))
    return re.sub(r"[\s\u2500-\u257f]", "", text).lower()


def assert_clean(text: str, where: str) -> None:
    t, k = normal(text), KEY.lower()
    half = len(k) // 2
    assert k not in t and k[:half + 1] not in t and k[half:] not in t, where


def _seen(request: web.Request, route: str) -> list[str]:
    auth = request.headers.get("Authorization", "")
    assert auth == f"Bearer {KEY}", route  # the key was sent: the test is not vacuous
    request.app[STATE].setdefault(route, 0)
    request.app[STATE][route] += 1
    return forms(KEY)


def _json(obj: Any, **kw: Any) -> web.Response:
    import json

    esc = "".join(f"\\u{ord(c):04x}" for c in KEY)
    return web.Response(text=json.dumps(obj).replace(ESC, esc), content_type="application/json",
                        headers={"X-Echo": KEY}, **kw)


async def _models(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "models")
    return _json({"object": "list", "data": [{"id": f[0], "object": "model", "owned_by": f[1], "root": f[4],
                                              "parent": f[2], "max_model_len": 4096,
                                              "meta": {"n_ctx": 4096, "n_params": 1000, "name": f[3]}}]})


async def _props(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "props")
    return _json({"default_generation_settings": {"n_ctx": 4096, "model": f[4]}, "total_slots": 2,
                  "build_info": f[2], "model_path": f[1], "chat_template": f[3]})


async def _version(request: web.Request) -> web.StreamResponse:
    return _json({"version": _seen(request, "version")[1]})


async def _model_info(request: web.Request) -> web.StreamResponse:
    return _json({"model_path": _seen(request, "get_model_info")[0]})


async def _slots(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "slots")
    return _json([{"id": 0, "n_ctx": 2048, "is_processing": False, "model": f[0], "speculative": False}])


async def _server_info(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "get_server_info")
    return _json({"disable_radix_cache": False, "speculative_algorithm": f[1], "context_length": 4096,
                  "max_running_requests": 4, "internal_states": [{"avg_spec_accept_length": 1.5, "note": f[4]}]})


async def _metrics(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "metrics")
    n = request.app[STATE]["metrics"]
    page = (f"# HELP vllm:num_requests_running Requests running for {f[0]}\n# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{f[1]}"}} 1.0\n'
            f'vllm:num_requests_waiting{{model_name="{f[2]}"}} 0.0\n'
            f"# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="{f[0]}"}} {5 * n}.0\n'
            f"# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{f[0]}",owner="{f[1]}"}} {4 * n}.0\n')
    return web.Response(text=page, content_type="text/plain", headers={"X-Echo": KEY})


async def _tokenize(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "tokenize")
    data = await request.json()
    return _json({"tokens": list(range(max(1, len(str(data.get("content", "")).split())))), "note": f[4]})


def _sse(obj: Any) -> bytes:
    import json

    esc = "".join(f"\\u{ord(c):04x}" for c in KEY)
    return f"data: {json.dumps(obj).replace(ESC, esc)}\n\n".encode()


async def _chat(request: web.Request) -> web.StreamResponse:
    f = _seen(request, "chat")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Echo": KEY})
    await resp.prepare(request)
    pieces = [KEY[i:i + 3] for i in range(0, len(KEY), 3)]
    head = {"id": f[0], "model": f[1], "system_fingerprint": f[2], "object": "chat.completion.chunk"}
    await resp.write(_sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                       "reasoning_content": f"think {f[4]}"}}]}))
    for p in pieces:
        await resp.write(_sse({**head, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}))
    await resp.write(_sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    await resp.write(_sse({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces),
                                                           "note": f[3]},
                           "timings": {"prompt_n": 5, "predicted_n": len(pieces), "note": f[4]}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _completions(request: web.Request) -> web.StreamResponse:
    """An error body in every form: the completions endpoint refuses the key."""
    f = _seen(request, "completions")
    return _json({"error": {"message": f"Incorrect API key provided: {f[4]} ({f[1]}, {f[3]})", "code": 401}},
                 status=401)


class Canary:
    """The canary server on loopback, in the current event loop; ``state`` counts the calls per route."""

    def __init__(self, state: dict[str, int]) -> None:
        self.state = state
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Canary:
        app = web.Application()
        app[STATE] = self.state
        for path, h in (("/v1/models", _models), ("/props", _props), ("/version", _version),
                        ("/get_model_info", _model_info), ("/slots", _slots), ("/get_server_info", _server_info),
                        ("/metrics", _metrics)):
            app.router.add_get(path, h)
        app.router.add_post("/tokenize", _tokenize)
        app.router.add_post("/v1/chat/completions", _chat)
        app.router.add_post("/v1/completions", _completions)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


RUN = ["--streams", "1", "--depths", "0", "--repeats", "1", "--max-tokens", "4", "--prompt", "prose"]


def _commands(base: str, out: Path) -> list[tuple[list[str], int]]:
    """(arguments, expected exit code) of every command the test runs against the canary server."""
    key = ["--api-key-env", "BENCH_BORDER_KEY"]
    return [
        (["run", base, *key, *RUN, "--out", str(out / "run"), "--report"], 0),
        (["run", base, *key, *RUN, "--out", str(out / "run-json"), "--json"], 0),
        (["run", base, *key, *RUN, "--endpoint", "completions", "--out", str(out / "run-errors")], None),
        (["check", base, *key], 0),
        (["check", base, *key, "--json"], 0),
        (["record", base, *key, "--out", str(out / "case.json")], 0),
        (["probe", base, *key], 0),
        (["probe", base, *key, "--json"], 0),
        (["-v", "probe", base, *key], 0),
        (["probe", base, *key, "--endpoint", "completions"], 5),
        (["report", str(out / "run" / "results.json"), "-o", str(out / "report.html")], 0),
    ]


@pytest.mark.parametrize("width", [60, 100])
def test_canary_key_never_leaves_the_border(monkeypatch, tmp_path, capsys, caplog, width) -> None:
    from bench.report import console

    monkeypatch.setenv("BENCH_BORDER_KEY", KEY)
    monkeypatch.setattr(console.stdout, "width", width)  # narrow tables fold long values over lines
    monkeypatch.setattr(console.stderr, "width", width)
    caplog.set_level("DEBUG", logger="bench")  # what -v logs (the root logger stays at WARNING)
    state: dict[str, int] = {}
    out = tmp_path / "out"
    outputs: list[tuple[str, str]] = []
    with serving_in_thread(lambda: Canary(state)) as url:
        for args, want in _commands(url + "/v1", out):
            rc = main(args)
            o, e = capsys.readouterr()
            outputs += [(f"{args[:2]} stdout", o), (f"{args[:2]} stderr", e)]
            if want is not None:
                assert rc == want, (args, o, e)
    assert {"models", "props", "version", "get_model_info", "slots", "get_server_info", "metrics", "tokenize",
            "chat", "completions"} <= set(state), state  # every field was offered to bench
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"records.jsonl", "results.json", "results.csv", "results.md", "report.html", "case.json"} <= {
        p.name for p in files}
    for p in files:
        outputs.append((str(p.relative_to(out)), p.read_text(encoding="utf-8", errors="replace")))
    outputs.append(("log", caplog.text))
    for where, text in outputs:
        assert_clean(text, where)
    results = (out / "run" / "results.json").read_text()
    assert "***" in results  # the server's words reached the results, redacted


def test_normal_undoes_every_form() -> None:
    """The test's own check can fail: each form the server writes is found by it."""
    esc = "".join(f"\\u{ord(c):04x}" for c in KEY)
    for f in forms(KEY)[:4] + [esc, "│ " + KEY[:10] + " │\n│ " + KEY[10:] + " │"]:
        with pytest.raises(AssertionError):
            assert_clean(f"x {f} y", f)


def test_border_redacts_bodies_and_headers_only_with_a_key() -> None:
    import httpx

    body = b'{"owned_by": "' + "".join(f"\\u{ord(c):04x}" for c in KEY.lower()).encode() + b'"}'
    add_secret(KEY)
    assert admit_body(body) == b'{"owned_by": "***"}'
    assert admit_body(b'{"ok": 1}') == b'{"ok": 1}'
    h = admit_headers(httpx.Headers({"X-Echo": KEY.upper(), "Content-Type": "text/plain"}))
    assert h["x-echo"] == "***" and h["content-type"] == "text/plain"


@pytest.mark.parametrize("form", ["verbatim", "lower", "upper", "u-escaped", "u-escaped-twice", "lower-u-escaped",
                                  "slash-escaped", "percent", "split", "cut-lower"])
@pytest.mark.parametrize("backslash_elsewhere", [False, True], ids=["plain-text", "text-with-escapes"])
def test_every_form_of_the_key_is_redacted(form, backslash_elsewhere) -> None:
    """Each form, in a text that takes the fast path (no backslash, no %) and one that takes the full pattern."""
    from bench.redaction import redact

    add_secret(KEY)
    k = KEY
    text = {"verbatim": k, "lower": k.lower(), "upper": k.upper(),
            "u-escaped": "".join(f"\\u{ord(c):04x}" for c in k),
            "u-escaped-twice": "".join(f"\\\\u{ord(c):04x}" for c in k),
            "lower-u-escaped": "".join(f"\\u{ord(c):04X}" for c in k.lower()),
            "slash-escaped": "".join("\\" + c for c in k), "percent": "".join(f"%{ord(c):02X}" for c in k),
            "split": k[:5] + "\n  " + k[5:20] + "\\n" + k[20:], "cut-lower": k.lower()[:12]}[form]
    pre = 'a "quoted\\" \\t ' if backslash_elsewhere else "a "
    out = redact(pre + text)
    assert out == pre + "***", (form, out)
