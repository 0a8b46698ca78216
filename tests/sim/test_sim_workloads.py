"""bench sim's workload truth: image parts (tokens and encoder time), tool calls, reasoning under both keys."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.sim import SimConfig, running_sim
from bench.sim.text import chat_prompt, image_token_ids
from bench.sim.truth import calls_tool, expected_encode_ms, expected_ttft_ms

IMG = "data:image/png;base64,iVBORw0KGgo="


def _chat(parts: list[dict[str, object]], **kw: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 4, **kw}


def _stream(base: str, body: dict[str, object]) -> list[dict[str, object]]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out = []
    with httpx.stream("POST", base + "/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[6:]))
    return out


def test_image_parts_add_tokens_and_encode_time() -> None:
    cfg = SimConfig(decode_step_ms=5, prefill_tok_s=10_000, image_tokens=300, image_encode_ms=40)
    ids, n = chat_prompt([{"role": "user", "content": [{"type": "text", "text": "a b c"},
                                                        {"type": "image_url", "image_url": {"url": IMG}},
                                                        {"type": "image_url", "image_url": {"url": IMG + "A"}}]}],
                         cfg.image_tokens)
    assert n == 2 and len(ids) == 3 + 600
    assert ids[3:303] == image_token_ids(IMG, 300) and ids[303:] != ids[3:303]
    with running_sim(cfg) as base:
        parts = [{"type": "text", "text": "a b c"}, {"type": "image_url", "image_url": {"url": IMG}},
                 {"type": "image_url", "image_url": {"url": IMG + "B"}}]
        chunks = _stream(base, _chat(parts))
    truth = next(c["sim_request"] for c in chunks if "sim_request" in c)
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage["prompt_tokens"] == 603 and truth["images"] == 2
    assert truth["prefill_end_ns"] - truth["admit_ns"] == round((80 + 603 / 10_000 * 1000) * 1e6)
    assert expected_encode_ms(cfg, 2) == 80.0
    ttft = (truth["first_sched_ns"] - truth["arrival_ns"]) / 1e6
    assert ttft == pytest.approx(expected_ttft_ms(cfg, 603, 0, images=2), abs=1e-6)


def test_images_rejected_like_llama_server_without_projector() -> None:
    with running_sim(SimConfig(decode_step_ms=2, images=False)) as base:
        r = httpx.post(base + "/chat/completions", json=_chat([{"type": "image_url", "image_url": {"url": IMG}}]))
        ok = httpx.post(base + "/chat/completions", json=_chat([{"type": "text", "text": "hi"}]))
    assert r.status_code == 500 and "mmproj" in r.json()["error"]["message"]
    assert ok.status_code == 200


def test_tool_calls_follow_the_seeded_draw() -> None:
    cfg = SimConfig(decode_step_ms=2, tool_call_prob=0.5, reasoning_tokens=1, seed=3)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    with running_sim(cfg) as base:
        runs = [_stream(base, _chat([{"type": "text", "text": "q"}], tools=tools, tool_choice="required"))
                for _ in range(8)]
        none = _stream(base, _chat([{"type": "text", "text": "q"}], tools=tools, tool_choice="none"))
    want = [calls_tool(cfg, n) for n in range(1, 9)]
    assert any(want) and not all(want)
    for chunks, called in zip(runs, want):
        frags = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
                 if c.get("choices") and "tool_calls" in c["choices"][0].get("delta", {})]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1]
        assert bool(frags) == called
        if called:
            assert frags[0]["function"]["name"] == "lookup" and frags[0]["id"]
            assert len(frags) == 3 and finish == "tool_calls"  # 4 tokens: 1 reasoning + 3 argument fragments
    assert not any("tool_calls" in c["choices"][0].get("delta", {}) for c in none if c.get("choices"))


def test_reasoning_under_both_keys_is_the_same_text() -> None:
    with running_sim(SimConfig(decode_step_ms=2, reasoning_tokens=2, reasoning_field="both")) as base:
        chunks = _stream(base, _chat([{"type": "text", "text": "q"}]))
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices") and "reasoning" in c["choices"][0]["delta"]]
    assert len(deltas) == 2 and all(d["reasoning"] == d["reasoning_content"] for d in deltas)
