"""Tests for bench.prompts: content streams, unique prefixes, exact-length building, tokenizers."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from bench.prompts import (
    INSTRUCTIONS,
    KINDS,
    Prompt,
    TextStream,
    build_prompt,
    instruction_for,
    stream_text,
    text_stream,
    tolerance,
    unique_prefix,
)
from bench.prompts import content as content_mod
from bench.server.tokenizer import (
    CalibratedTokenizer,
    HttpTokenizer,
    RegexTokenizer,
    TokenizerError,
    TokenizerUnavailable,
)


def run(coro):
    return asyncio.run(coro)


# ----------------------------------------------------------------------------------- content


def test_kinds_and_instructions():
    assert KINDS == ("prose", "code", "structured", "json")
    for kind in KINDS:
        instr = instruction_for(kind)
        assert instr == INSTRUCTIONS[kind]
        assert 40 < len(instr) < 300
    with pytest.raises(ValueError):
        instruction_for("poetry")
    with pytest.raises(ValueError):
        text_stream("poetry", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_stream_is_deterministic(kind):
    assert stream_text(kind, 7, 6000) == stream_text(kind, 7, 6000)
    s = TextStream(kind, 7)
    short = s.take(100)
    assert len(short) == 100
    assert s.take(5000)[:100] == short
    assert len(s) >= 5000


@pytest.mark.parametrize("kind", KINDS)
def test_different_seeds_differ(kind):
    texts = [stream_text(kind, seed, 3000) for seed in range(8)]
    assert len(set(texts)) == len(texts)
    # Not merely shifted by a few characters: the openings differ too.
    assert len({t[:200] for t in texts}) >= 6


@pytest.mark.parametrize("kind", KINDS)
def test_kinds_produce_nontrivial_text(kind):
    text = stream_text(kind, 3, 20_000)
    assert len(text) == 20_000
    words = re.findall(r"[A-Za-z]{3,}", text)
    assert len(set(words)) > 100
    assert "\ufffd" not in text


def test_kind_specific_content():
    prose = stream_text("prose", 1, 20_000)
    assert prose.count(". ") > 100 and "{" not in prose
    code = stream_text("code", 1, 40_000)
    assert "def " in code and "# file: " in code and code.startswith("# file: ")
    structured = stream_text("structured", 1, 40_000)
    for marker in ("## ", "|", " = ", "Z INFO", ","):
        assert marker in structured
    docs = stream_text("json", 1, 20_000)
    doc, end = json.JSONDecoder().raw_decode(docs)
    assert isinstance(doc, dict) and "type" in doc
    second, _ = json.JSONDecoder().raw_decode(docs[end:].lstrip())
    assert isinstance(second, dict)


def test_prose_cycles_reshuffle():
    paras = content_mod._prose_paragraphs()
    assert len(paras) >= 30
    it = text_stream("prose", 5)
    first = [next(it) for _ in range(len(paras))]
    second = [next(it) for _ in range(len(paras))]
    assert sorted(first) == sorted(second)  # each cycle is a permutation
    assert first != second  # ...in a different order
    assert first[-1] != second[0]


def test_code_stream_reads_only_needed_files():
    content_mod._read_source.cache_clear()
    run(build_prompt("code", 32768, seed=11, prefix="", tokenizer=RegexTokenizer()))
    assert content_mod._read_source.cache_info().misses <= 4
    files = content_mod._code_files()
    assert len(files) >= 10 and all(p.suffix == ".py" for p in files)


# ----------------------------------------------------------------------------- unique prefix


def test_unique_prefix_is_deterministic_and_unique():
    assert unique_prefix("run-a", 17) == unique_prefix("run-a", 17)
    prefixes = [unique_prefix("run-a", i) for i in range(4096)]
    assert len(set(prefixes)) == 4096
    assert len({p[:5] for p in prefixes}) == 4096  # the leading code alone is unique
    for a, b in zip(prefixes, prefixes[1:]):
        assert a[0] != b[0]  # consecutive requests differ at the first character
    assert all(p.endswith("] ") and "-" in p for p in prefixes)
    assert unique_prefix("run-a", 0) != unique_prefix("run-b", 0)
    assert len(unique_prefix("x" * 100, 123456)) < 40
    with pytest.raises(ValueError):
        unique_prefix("run-a", -1)


# ------------------------------------------------------------------------------ build_prompt


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", [0, 100, 1000, 32768])
def test_build_prompt_exact_length_regex(kind, target):
    tok = RegexTokenizer()
    prefix = unique_prefix("run-x", 3)
    p = run(build_prompt(kind, target, seed=3, prefix=prefix, tokenizer=tok))
    assert isinstance(p, Prompt)
    assert p.kind == kind and p.target_tokens == target and p.seed == 3
    assert p.text.startswith(prefix)
    assert p.text.endswith(INSTRUCTIONS[kind])
    assert p.counted_tokens == tok.count_sync(p.text)
    minimal = tok.count_sync(prefix + INSTRUCTIONS[kind])
    if target <= minimal:
        assert p.text == prefix + INSTRUCTIONS[kind]
        assert p.counted_tokens == minimal
    else:
        assert abs(p.counted_tokens - target) <= tolerance(target)
        assert p.tokenizer_calls <= 6
        body = p.text[len(prefix) : -len(INSTRUCTIONS[kind])]
        assert body.endswith("\n\n") and not body[:-2][-1:].isspace()


def test_build_prompt_deterministic_and_seed_dependent():
    tok = RegexTokenizer()
    a = run(build_prompt("prose", 500, seed=1, prefix="p ", tokenizer=tok))
    b = run(build_prompt("prose", 500, seed=1, prefix="p ", tokenizer=tok))
    c = run(build_prompt("prose", 500, seed=2, prefix="p ", tokenizer=tok))
    assert a == b
    assert a.text != c.text


def test_build_prompt_options():
    tok = RegexTokenizer()
    bare = run(build_prompt("json", 300, seed=0, instruction=False, tokenizer=tok))
    assert not bare.text.endswith(INSTRUCTIONS["json"])
    assert abs(bare.counted_tokens - 300) <= tolerance(300)
    custom = run(build_prompt("code", 300, seed=0, instruction="Say hi.", tokenizer=tok))
    assert custom.text.endswith("\n\nSay hi.")
    empty = run(build_prompt("prose", 0, seed=0, instruction=False, tokenizer=tok))
    assert empty.text == "" and empty.counted_tokens == 0
    over = run(build_prompt("prose", 1000, seed=0, tokenizer=tok, overhead_tokens=40))
    assert abs(over.counted_tokens - 960) <= tolerance(960)
    assert over.expected_prompt_tokens == over.counted_tokens + 40
    with pytest.raises(ValueError):
        run(build_prompt("poetry", 10, seed=0, tokenizer=tok))


def test_build_prompt_with_estimator_uses_ratio_once():
    tok = CalibratedTokenizer(4.0)
    p = run(build_prompt("prose", 2000, seed=4, prefix="abc ", tokenizer=tok))
    assert p.tokenizer_calls == 2  # prefix + instruction, then the final text
    assert abs(p.counted_tokens - 2000) <= 20  # whitespace snapping only
    none = run(build_prompt("code", 2000, seed=4, tokenizer=None))
    assert none.counted_tokens is None and none.tokenizer_calls == 0
    assert 2000 * 3 < len(none.text) < 2000 * 4


def test_build_prompt_handles_mismatched_ratio():
    class Dense:
        """A tokenizer with ~1 char per token: far from the default guesses."""

        async def count(self, text):
            return len(text.replace(" ", ""))

    p = run(build_prompt("prose", 5000, seed=0, tokenizer=Dense()))
    assert abs(p.counted_tokens - 5000) <= tolerance(5000)
    assert p.tokenizer_calls <= 6


# -------------------------------------------------------------------------------- tokenizers


def test_regex_tokenizer():
    tok = RegexTokenizer()
    assert tok.count_sync("") == 0
    assert tok.count_sync("Hello, world!") == 4
    assert run(tok.count("def f(x): return x+1")) == 10  # def f ( x ) : return x + 1


def test_calibration_math():
    tok = CalibratedTokenizer.from_probe("a" * 400, 110, overhead_tokens=10)
    assert tok.chars_per_token == pytest.approx(4.0)
    assert tok.count_sync("b" * 41) == 10
    assert tok.count_sync("") == 0 and tok.count_sync("x") == 1
    tok2 = CalibratedTokenizer.calibrate([("x" * 300, 100), ("y" * 900, 200)])
    assert tok2.chars_per_token == pytest.approx(1200 / 300)
    assert run(tok2.count("z" * 80)) == 20
    assert tok.exact is False
    with pytest.raises(ValueError):
        CalibratedTokenizer.calibrate([])
    with pytest.raises(ValueError):
        CalibratedTokenizer.from_probe("abc", 5, overhead_tokens=5)
    with pytest.raises(ValueError):
        CalibratedTokenizer(0)


def _fake_server(form: str, seen: list):
    regex = RegexTokenizer()

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        if request.url.path != "/tokenize":
            return httpx.Response(404)
        body = json.loads(request.content)
        if form == "llama" and "content" in body:
            return httpx.Response(200, json={"tokens": list(range(regex.count_sync(body["content"])))})
        if form == "vllm" and "prompt" in body:
            n = regex.count_sync(body["prompt"])
            return httpx.Response(
                200, json={"tokens": list(range(n)), "count": n, "max_model_len": 4096}
            )
        return httpx.Response(400, json={"error": "bad request"})

    return httpx.MockTransport(handler)


def test_http_tokenizer_llama_form():
    seen: list = []

    async def go():
        async with httpx.AsyncClient(transport=_fake_server("llama", seen)) as client:
            tok = HttpTokenizer(client, "http://srv:8080/v1/", model="m")
            assert tok.url == "http://srv:8080/tokenize"
            assert await tok.available()
            assert tok.form == "llama"
            assert await tok.count("Hello, world!") == 4
            return tok

    tok = run(go())
    assert seen[0] == ("/tokenize", {"content": "Hello, world."})
    assert seen[-1][1] == {"content": "Hello, world!"}
    assert tok.calls == 2


def test_http_tokenizer_vllm_form_and_build():
    seen: list = []

    async def go():
        async with httpx.AsyncClient(transport=_fake_server("vllm", seen)) as client:
            tok = HttpTokenizer(client, "http://srv:8000", model="my-model")
            assert await tok.count("a b c") == 3  # detects on first use
            assert tok.form == "vllm"
            return await build_prompt(
                "structured", 1000, seed=9, prefix=unique_prefix("r", 0), tokenizer=tok
            )

    p = run(go())
    assert seen[0][1] == {"content": "a b c"}  # llama form tried first, rejected
    assert seen[1][1] == {"prompt": "a b c", "model": "my-model"}
    assert abs(p.counted_tokens - 1000) <= tolerance(1000)
    assert p.tokenizer_calls <= 6


def test_http_tokenizer_unavailable():
    def handler(request):
        return httpx.Response(404, text="not found")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            tok = HttpTokenizer(client, "http://srv", model=None)
            assert not await tok.available()
            with pytest.raises(TokenizerUnavailable):
                await tok.count("x")
            assert issubclass(TokenizerUnavailable, TokenizerError)

    run(go())


def test_http_tokenizer_error_after_detection():
    state = {"n": 0}

    def handler(request):
        state["n"] += 1
        if state["n"] == 1:
            return httpx.Response(200, json={"tokens": [1, 2]})
        return httpx.Response(500, text="boom")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            tok = HttpTokenizer(client, "http://srv")
            assert await tok.count("a b") == 2
            with pytest.raises(TokenizerError):
                await tok.count("a b")

    run(go())
