"""Tests of bench.sim, the reference engine (talks to it with plain httpx, not the rest of bench).

Timing tolerances, and why:
* the *schedule* (``sim.sched_ns``, ``sim_request``) is exact: asserted to within 1 us (ns rounding);
* server lateness ``write_ns - sched_ns``: median below 1 ms and every event below 10 ms (typically
  ~0.01-0.05 ms; the tail budget covers preemption on a loaded 2-core CI box);
* times seen by this client (receive - send) are asserted within 10 ms of the truth for TTFT and within
  3 ms for the median inter-event gap (loopback + httpx parsing + scheduler noise).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from time import perf_counter_ns

import httpx
import pytest

from bench.sim import (
    SimConfig,
    count_tokens,
    expected_cached_tokens,
    expected_decode_tok_s,
    expected_e2e_ms,
    expected_error_count,
    expected_events,
    expected_itl_ms,
    expected_prefill_ms,
    expected_ttft_ms,
    load_config,
    output_length,
    running_sim,
    step_ms,
    tokenize,
)
from bench.sim.__main__ import main as sim_main

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000  # ns per ms
EXACT_NS = 1_000  # schedule equality tolerance (rounding to ns of float ms values)
LATE_NS = 10 * MS  # max allowed write_ns - sched_ns


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def stream(client: httpx.Client, path: str, body: dict) -> tuple[int, list[tuple[int, object]]]:
    """POST a streaming request; returns (send time, [(receive time, parsed chunk or "[DONE]")])."""
    out: list[tuple[int, object]] = []
    t_send = perf_counter_ns()
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            now = perf_counter_ns()
            assert line.startswith("data: "), line
            data = line[6:]
            out.append((now, "[DONE]" if data == "[DONE]" else json.loads(data)))
    return t_send, out


def token_chunks(chunks: list[tuple[int, object]]) -> list[tuple[int, dict]]:
    return [(t, c) for t, c in chunks if isinstance(c, dict) and "sim" in c and c["sim"].get("tokens")]


def final_chunk(chunks: list[tuple[int, object]]) -> dict:
    fin = [c for _, c in chunks if isinstance(c, dict) and c.get("choices") and c["choices"][0].get("finish_reason")]
    assert len(fin) == 1
    return fin[0]


def usage_chunk(chunks: list[tuple[int, object]]) -> dict:
    us = [c for _, c in chunks if isinstance(c, dict) and c.get("choices") == [] and "usage" in c]
    assert len(us) == 1
    return us[0]["usage"]


def chat_body(prompt: str, max_tokens: int, **extra) -> dict:
    body = {"model": "bench-sim", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update(extra)
    return body


# ------------------------------------------------------------------------------------------------
# pure parts
# ------------------------------------------------------------------------------------------------
def test_truth_formulas() -> None:
    cfg = SimConfig(prefill_tok_s=1000, decode_step_ms=10, decode_step_ms_per_seq=2, tokens_per_event=4)
    assert step_ms(cfg, 1) == 12 and step_ms(cfg, 8) == 26
    assert expected_itl_ms(cfg, 3) == 16
    assert expected_decode_tok_s(cfg, 1) == pytest.approx(4 * 1000 / 12)
    assert expected_prefill_ms(cfg, 500) == pytest.approx(500)
    halving = cfg.replace(prefill_halving_tokens=1000)
    # rate at d = 1000 is halved; only the 200 uncached tokens cost time
    assert expected_prefill_ms(halving, 200, prompt_tokens=1000) == pytest.approx(400)
    assert expected_ttft_ms(cfg, 100) == pytest.approx(100 + 12)
    assert expected_events(cfg, 10) == 3
    assert expected_e2e_ms(cfg, 100, 10) == pytest.approx(100 + 3 * 12)
    pc = SimConfig(prefix_cache=True)
    assert expected_cached_tokens(pc, 40) == 32
    assert expected_cached_tokens(pc, 32) == 16  # never the whole prompt
    assert expected_cached_tokens(pc, 100, matched_tokens=20) == 16
    assert expected_cached_tokens(SimConfig(), 40) == 0
    assert expected_error_count(SimConfig(error_rate=0.25), 10) == 2
    assert expected_error_count(SimConfig(), 10) == 0
    assert output_length(SimConfig(), 1, 7) == (7, "length")
    eos = SimConfig(eos_prob=0.2, seed=3)
    assert output_length(eos, 5, 1000) == output_length(eos, 5, 1000)  # deterministic
    assert output_length(eos, 5, 1000)[1] == "stop"


def test_tokenizer() -> None:
    assert tokenize("") == [] and tokenize("   ") == []
    assert len(tokenize("hello world  foo\n bar ")) == 4
    assert tokenize("a b") == tokenize(" a\n\tb")  # ids depend on the word only
    assert count_tokens(" the of and") == 3


def test_config_file(tmp_path: Path) -> None:
    assert load_config(str(ROOT / "profiles" / "sim-default.toml")) == SimConfig()
    for prof in sorted((ROOT / "profiles").glob("sim-*.toml")):
        load_config(str(prof))  # every shipped profile is valid
    p = tmp_path / "c.toml"
    p.write_text('decode_step_ms = 5\ntokens_per_event = [1, 2]\nerror_kind = 429\n')
    cfg = load_config(str(p))
    assert cfg.decode_step_ms == 5 and cfg.tokens_per_event == (1, 2) and cfg.error_kind == "429"
    p.write_text("decode_step_ms = 5\nbogus_field = 1\n")
    with pytest.raises(ValueError, match="bogus_field"):
        load_config(str(p))
    with pytest.raises(ValueError, match="max_running"):
        SimConfig(max_running=0)
    assert sim_main(["--config", str(p)]) == 3  # bad input, as every bench command (docs/sim.md)


# ------------------------------------------------------------------------------------------------
# HTTP surface
# ------------------------------------------------------------------------------------------------
def test_models_health_tokenize_metrics() -> None:
    with running_sim(SimConfig(model="m1", decode_step_ms=1)) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        root = url[: -len("/v1")]
        with httpx.Client(base_url=root, timeout=10) as c:
            assert c.get("/health").json() == {"status": "ok"}
            models = c.get("/v1/models").json()
            assert models["object"] == "list" and len(models["data"]) == 1
            assert models["data"][0]["id"] == "m1" and models["data"][0]["owned_by"] == "bench-sim"
            tok = c.post("/tokenize", json={"content": "one two  three"}).json()
            assert tok["count"] == 3 and tok["tokens"] == tokenize("one two three")
            assert c.post("/tokenize", json={"prompt": "x y"}).json()["count"] == 2
            assert c.post("/tokenize", json={}).status_code == 400
            # bad generation requests
            assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
            assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 0}).status_code == 400
            assert c.post("/v1/completions", content=b"{nope").status_code == 400
            r = c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3})
            assert r.status_code == 200
            text = c.get("/metrics").text
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                         "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                         "vllm:request_success_total"):
                assert name in text
            assert 'vllm:prompt_tokens_total{model_name="m1"} 3.0' in text
            assert 'vllm:generation_tokens_total{model_name="m1"} 3.0' in text
            assert 'vllm:request_success_total{model_name="m1",finished_reason="length"} 1.0' in text
            assert 'vllm:time_to_first_token_seconds_count{model_name="m1"} 1.0' in text


def test_stream_chat_timing() -> None:
    # prompt 50 tokens at 10000 tok/s -> 5 ms prefill; t(1) = 20 ms
    cfg = SimConfig(prefill_tok_s=10000, decode_step_ms=20)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        c.get("/models")  # warm the connection
        t_send, chunks = stream(c, "/chat/completions", chat_body(words(50), 20))
    objs = [o for _, o in chunks]
    # role chunk, 20 token chunks, finish chunk, usage chunk, [DONE]
    assert len(objs) == 24 and objs[-1] == "[DONE]"
    role = objs[0]
    assert role["object"] == "chat.completion.chunk"
    assert set(role) == {"id", "object", "created", "model", "choices", "sim"}
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    # the role chunk says when the body was in, parsed and tokenized (before the engine saw it), and carries no token
    assert role["sim"]["tokens"] == 0 and role["sim"]["sched_ns"] <= role["sim"]["write_ns"]
    assert t_send < role["sim"]["sched_ns"]
    toks = token_chunks(chunks)
    assert len(toks) == 20
    assert all(o["choices"][0]["delta"]["content"].startswith(" ") and o["sim"]["tokens"] == 1 for _, o in toks)
    text = "".join(o["choices"][0]["delta"]["content"] for _, o in toks)
    assert count_tokens(text) == 20
    fin = final_chunk(chunks)
    assert fin["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
    assert usage_chunk(chunks) == {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                                   "prompt_tokens_details": {"cached_tokens": 0},
                                   "completion_tokens_details": {"reasoning_tokens": 0}}
    truth = fin["sim_request"]
    # the exact schedule
    sched = [o["sim"]["sched_ns"] for _, o in toks]
    write = [o["sim"]["write_ns"] for _, o in toks]
    assert truth["admit_ns"] == truth["arrival_ns"]
    assert abs(truth["prefill_end_ns"] - truth["arrival_ns"] - expected_prefill_ms(cfg, 50) * MS) <= EXACT_NS
    assert abs(sched[0] - truth["arrival_ns"] - expected_ttft_ms(cfg, 50) * MS) <= EXACT_NS
    assert all(abs(b - a - expected_itl_ms(cfg, 1) * MS) <= EXACT_NS for a, b in zip(sched, sched[1:]))
    assert abs(sched[-1] - truth["arrival_ns"] - expected_e2e_ms(cfg, 50, 20) * MS) <= EXACT_NS
    assert truth["first_sched_ns"] == sched[0] and truth["last_sched_ns"] == sched[-1] and truth["events"] == 20
    # monotonic, near arrival, and actually sent on time
    assert t_send <= truth["arrival_ns"] < sched[0]
    assert truth["arrival_ns"] - t_send < 10 * MS
    assert all(a < b for a, b in zip(write, write[1:]))
    assert all(0 <= w - s < LATE_NS for s, w in zip(sched, write))
    assert statistics.median(w - s for s, w in zip(sched, write)) < 1 * MS
    assert all(t >= o["sim"]["write_ns"] for t, o in toks)
    # what a client sees
    ttft_client = toks[0][0] - t_send
    assert abs(ttft_client - 25 * MS) < 10 * MS, ttft_client / MS
    gaps = [b[0] - a[0] for a, b in zip(toks, toks[1:])]
    assert abs(statistics.median(gaps) - 20 * MS) < 3 * MS, statistics.median(gaps) / MS


def test_nonstream_and_completions() -> None:
    cfg = SimConfig(decode_step_ms=2, reasoning_tokens=2)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/chat/completions", json={"messages": [{"role": "system", "content": "be brief"},
                                                           {"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
                                              "max_completion_tokens": 5})
        body = r.json()
        assert body["object"] == "chat.completion"
        msg = body["choices"][0]["message"]
        assert count_tokens(msg["reasoning_content"]) == 2 and count_tokens(msg["content"]) == 3
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 5
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
        # completions: no reasoning phase; token-id prompts count one token per id
        r = c.post("/completions", json={"prompt": [5, 6, 7], "max_tokens": 4})
        body = r.json()
        assert body["object"] == "text_completion" and count_tokens(body["choices"][0]["text"]) == 4
        assert body["usage"]["prompt_tokens"] == 3
        _, chunks = stream(c, "/completions", {"prompt": "a b", "max_tokens": 3, "stream": True,
                                               "stream_options": {"include_usage": True}})
        toks = token_chunks(chunks)
        assert len(toks) == 3 and all(o["object"] == "text_completion" for _, o in toks)
        assert all(o["choices"][0]["text"].startswith(" ") for _, o in toks)
        assert final_chunk(chunks)["choices"][0]["finish_reason"] == "length"
        assert usage_chunk(chunks)["completion_tokens"] == 3
        # no include_usage -> no usage chunk
        _, chunks = stream(c, "/completions", {"prompt": "a b", "max_tokens": 2, "stream": True})
        assert not any(isinstance(o, dict) and "usage" in o for _, o in chunks) and chunks[-1][1] == "[DONE]"


def test_reasoning_phase() -> None:
    cfg = SimConfig(decode_step_ms=2, reasoning_tokens=5)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, chunks = stream(c, "/chat/completions", chat_body("think", 8))
    deltas = [o["choices"][0]["delta"] for _, o in token_chunks(chunks)]
    assert [("reasoning_content" in d, "content" in d) for d in deltas] == [(True, False)] * 5 + [(False, True)] * 3
    u = usage_chunk(chunks)
    assert u["completion_tokens"] == 8 and u["completion_tokens_details"]["reasoning_tokens"] == 5


def test_tokens_per_event() -> None:
    cfg = SimConfig(decode_step_ms=5, tokens_per_event=4, reasoning_tokens=2)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, chunks = stream(c, "/chat/completions", chat_body("x", 10))
        toks = token_chunks(chunks)
        assert [o["sim"]["tokens"] for _, o in toks] == [4, 4, 2]
        d0 = toks[0][1]["choices"][0]["delta"]  # the reasoning boundary falls inside the first event
        assert count_tokens(d0["reasoning_content"]) == 2 and count_tokens(d0["content"]) == 2
        for _, o in toks[1:]:
            assert count_tokens(o["choices"][0]["delta"]["content"]) == o["sim"]["tokens"]
        sched = [o["sim"]["sched_ns"] for _, o in toks]
        assert all(abs(b - a - 5 * MS) <= EXACT_NS for a, b in zip(sched, sched[1:]))
        assert usage_chunk(chunks)["completion_tokens"] == 10
    cfg = SimConfig(decode_step_ms=1, tokens_per_event=[1, 2, 3], seed=7)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, chunks = stream(c, "/chat/completions", chat_body("x", 40))
        ks = [o["sim"]["tokens"] for _, o in token_chunks(chunks)]
        assert sum(ks) == 40 and set(ks[:-1]) <= {1, 2, 3} and len(set(ks)) > 1


def _concurrent(url: str, bodies: list[dict], stagger_s: float = 0.0) -> list[tuple[int, list]]:
    """Stream ``bodies`` from parallel threads; request i starts ``i * stagger_s`` after a common start.
    Clients are created and connected beforehand (creating one costs tens of ms)."""
    clients = [httpx.Client(base_url=url, timeout=10) for _ in bodies]
    for c in clients:
        c.get("/models")
    barrier = threading.Barrier(len(bodies))

    def run(i: int) -> tuple[int, list]:
        barrier.wait()
        if stagger_s:
            time.sleep(stagger_s * i)
        return stream(clients[i], "/chat/completions", bodies[i])

    try:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as ex:
            return list(ex.map(run, range(len(bodies))))
    finally:
        for c in clients:
            c.close()


def test_queue_max_running_1() -> None:
    cfg = SimConfig(max_running=1, decode_step_ms=10, prefill_tok_s=1000)  # 10-token prompt: 10 ms prefill
    with running_sim(cfg) as url:
        res = _concurrent(url, [chat_body(words(10), 5), chat_body(words(10), 5)], stagger_s=0.005)
    truths = sorted((final_chunk(ch)["sim_request"] for _, ch in res), key=lambda t: t["request_no"])
    first, second = truths
    assert first["admit_ns"] == first["arrival_ns"]
    assert second["arrival_ns"] < first["last_sched_ns"]  # it arrived while the first was running ...
    assert second["admit_ns"] == first["last_sched_ns"]  # ... and waited for its slot
    assert abs(second["prefill_end_ns"] - second["admit_ns"] - 10 * MS) <= EXACT_NS
    assert abs(second["first_sched_ns"] - second["admit_ns"] - expected_ttft_ms(cfg, 10) * MS) <= EXACT_NS


def test_batch_step_time() -> None:
    # t(b) = 20 + 10 b ms; the second request arrives during the first's first step and joins at its end
    cfg = SimConfig(decode_step_ms=20, decode_step_ms_per_seq=10, prefill_tok_s=1e6)
    with running_sim(cfg) as url:
        res = _concurrent(url, [chat_body("a", 6), chat_body("b", 6)], stagger_s=0.003)
    by_no = {final_chunk(ch)["sim_request"]["request_no"]: ch for _, ch in res}
    s1 = [o["sim"]["sched_ns"] for _, o in token_chunks(by_no[1])]
    s2 = [o["sim"]["sched_ns"] for _, o in token_chunks(by_no[2])]
    t1, t2 = step_ms(cfg, 1) * MS, step_ms(cfg, 2) * MS
    t_arr2 = final_chunk(by_no[2])["sim_request"]["arrival_ns"]
    assert t_arr2 < s1[0], "second request was too late to test batching"
    assert s2[0] == s1[1]  # joined the step after the first's first step
    assert all(abs(b - a - t2) <= EXACT_NS for a, b in zip(s1, s1[1:]))
    assert all(abs(b - a - t2) <= EXACT_NS for a, b in zip(s2[:-1], s2[1:-1]))
    assert abs(s2[-1] - s2[-2] - t1) <= EXACT_NS  # alone again for its last step


def test_prefill_overlaps_decode_and_joins_at_step_boundary() -> None:
    # A: 100-token prompt (100 ms prefill); B: 1 token (1 ms), arrives ~10 ms later and decodes while A
    # prefills; A joins the decode loop at the first step boundary at or after its prefill end.
    cfg = SimConfig(prefill_tok_s=1000, decode_step_ms=10)
    with running_sim(cfg) as url:
        res = _concurrent(url, [chat_body(words(100), 2), chat_body("b", 20)], stagger_s=0.01)
    a, b = (final_chunk(ch)["sim_request"] for _, ch in res)  # identified by prompt, not arrival order
    assert a["prompt_tokens"] == 100 and b["prompt_tokens"] == 1 and b["arrival_ns"] < a["prefill_end_ns"]
    t1 = 10 * MS
    assert abs(a["prefill_end_ns"] - a["arrival_ns"] - 100 * MS) <= EXACT_NS
    b_start = b["prefill_end_ns"]  # B found the loop idle: its first step starts at its prefill end
    assert abs(b["first_sched_ns"] - b["arrival_ns"] - (1 * MS + t1)) <= EXACT_NS
    k = -(-(a["prefill_end_ns"] - b_start) // t1)  # steps of B until the boundary at/after A's prefill end
    boundary = b_start + k * t1
    assert abs(a["first_sched_ns"] - (boundary + t1)) <= EXACT_NS * (k + 1)


def test_prefix_cache() -> None:
    cfg = SimConfig(prefix_cache=True, prefill_tok_s=1000, decode_step_ms=1)
    prompt = words(40)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, a = stream(c, "/chat/completions", chat_body(prompt, 2))
        _, b = stream(c, "/chat/completions", chat_body(prompt, 2))
        _, other = stream(c, "/chat/completions", chat_body(words(20) + " different tail here", 2))
    assert usage_chunk(a)["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage_chunk(b)["prompt_tokens_details"]["cached_tokens"] == 32 == expected_cached_tokens(cfg, 40)
    assert usage_chunk(other)["prompt_tokens_details"]["cached_tokens"] == 16  # first block shared
    ta, tb = final_chunk(a)["sim_request"], final_chunk(b)["sim_request"]
    assert abs(ta["prefill_end_ns"] - ta["admit_ns"] - 40 * MS) <= EXACT_NS
    assert abs(tb["prefill_end_ns"] - tb["admit_ns"] - expected_prefill_ms(cfg, 8, 40) * MS) <= EXACT_NS


@pytest.mark.parametrize("kind", ["429", "503"])
def test_http_errors_exact(kind: str) -> None:
    cfg = SimConfig(error_rate=0.25, error_kind=kind, decode_step_ms=1)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        codes = [c.post("/completions", json={"prompt": "p", "max_tokens": 1}).status_code for _ in range(10)]
        metrics = c.get(url[:-3] + "/metrics").text
    assert codes.count(int(kind)) == expected_error_count(cfg, 10) == 2
    assert [i + 1 for i, s in enumerate(codes) if s != 200] == [4, 8]
    assert f'kind="{kind}"}} 2.0' in metrics


def test_stream_error() -> None:
    cfg = SimConfig(error_rate=0.5, error_kind="stream", error_after_tokens=3, decode_step_ms=1)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, ok = stream(c, "/chat/completions", chat_body("x", 6))  # request 1: fine
        _, bad = stream(c, "/chat/completions", chat_body("x", 6))  # request 2: fails
        r = c.post("/completions", json={"prompt": "x", "max_tokens": 6})  # request 3: fine
        r4 = c.post("/completions", json={"prompt": "x", "max_tokens": 6})  # request 4: fails
    assert len(token_chunks(ok)) == 6
    assert len(token_chunks(bad)) == 3
    assert bad[-1][1] == "[DONE]" and bad[-2][1]["error"]["code"] == 500
    assert "message" in bad[-2][1]["error"]
    assert r.status_code == 200 and r4.status_code == 500


def test_eos_prob() -> None:
    cfg = SimConfig(eos_prob=0.3, decode_step_ms=1, seed=11)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        for no in (1, 2, 3):
            _, chunks = stream(c, "/chat/completions", chat_body("x", 50))
            n, reason = output_length(cfg, no, 50)
            assert usage_chunk(chunks)["completion_tokens"] == n
            assert final_chunk(chunks)["choices"][0]["finish_reason"] == reason


def test_cli_port_0() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "bench.sim", "--port", "0", "--decode-step-ms", "1",
                          "--model", "cli-model"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/v1"), line
        url = line.split()[-1]
        r = httpx.post(url + "/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.json()["model"] == "cli-model"
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0


# ------------------------------------------------------------------------------------------------
# seeded noise: --step-jitter-pct, --drift-pct
# ------------------------------------------------------------------------------------------------
def test_noise_off_is_exact_and_drift_factor_is_seeded() -> None:
    from bench.sim.truth import drift_factor, jitter_factor

    cfg = SimConfig(decode_step_ms=10, prefill_tok_s=1000)
    assert drift_factor(cfg) == 1.0 and step_ms(cfg, 1) == 10 and expected_prefill_ms(cfg, 500) == 500
    d = cfg.replace(drift_pct=2.0, seed=5)
    f = drift_factor(d)
    assert f == drift_factor(cfg.replace(drift_pct=2.0, seed=5)) != drift_factor(cfg.replace(drift_pct=2.0, seed=6))
    assert step_ms(d, 1) == pytest.approx(10 * f) and expected_prefill_ms(d, 500) == pytest.approx(500 * f)
    # the spread of ln F over instances is drift_pct / 100
    logs = [math.log(drift_factor(cfg.replace(drift_pct=2.0, seed=s))) for s in range(2000)]
    assert abs(statistics.mean(logs)) < 0.002 and statistics.stdev(logs) == pytest.approx(0.02, rel=0.06)
    j = cfg.replace(step_jitter_pct=10)
    assert jitter_factor(j, 0.0) == pytest.approx(math.exp(-0.005))
    zs = [random.Random(s).gauss(0, 1) for s in range(4000)]
    assert statistics.mean(jitter_factor(j, z) for z in zs) == pytest.approx(1.0, abs=0.006)
    with pytest.raises(ValueError, match="step_jitter_pct"):
        SimConfig(step_jitter_pct=-1)
    with pytest.raises(ValueError, match="drift_pct"):
        SimConfig(drift_pct=80)


def _gaps_ms(cfg: SimConfig, n_tokens: int) -> list[float]:
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, chunks = stream(c, "/chat/completions", chat_body("x", n_tokens))
    sched = [o["sim"]["sched_ns"] for _, o in token_chunks(chunks)]
    return [(b - a) / MS for a, b in zip(sched, sched[1:])]


def test_step_jitter_and_drift_on_the_schedule() -> None:
    from bench.sim.truth import drift_factor, jitter_factor

    base = SimConfig(decode_step_ms=2, seed=9)
    assert all(abs(g - 2.0) <= EXACT_NS / MS for g in _gaps_ms(base, 12))  # both 0: exactly t(1)
    drifted = base.replace(drift_pct=5.0)
    f = drift_factor(drifted)
    assert f != 1.0 and all(abs(g - 2.0 * f) <= EXACT_NS / MS for g in _gaps_ms(drifted, 12))
    jit = base.replace(step_jitter_pct=20.0)
    gaps = _gaps_ms(jit, 40)
    rng = random.Random("jitter/9")  # the engine's stream: one draw per step, the first step included
    want = [2.0 * jitter_factor(jit, rng.gauss(0.0, 1.0)) for _ in range(40)]
    assert gaps == pytest.approx(want[1:], abs=EXACT_NS / MS)
    assert statistics.stdev(gaps) > 0.2  # 20 % jitter of 2 ms steps


def test_cli_noise_flags() -> None:
    from bench.sim.__main__ import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(["--step-jitter-pct", "3", "--drift-pct", "1.5"]))
    assert cfg.step_jitter_pct == 3.0 and cfg.drift_pct == 1.5


def _raw_exchange(sock, path: str, body: bytes) -> bytes:
    """One request on a raw socket; every byte of the response up to its chunked terminator, as the reads came:
    a list of the reads joined by b"|"."""
    sock.sendall(b"POST /v1%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (path.encode(), len(body), body))
    reads: list[bytes] = []
    sock.settimeout(10)
    while not b"".join(reads).endswith(b"0\r\n\r\n"):
        try:
            got = sock.recv(65536)
        except TimeoutError:
            break
        if not got:
            break
        reads.append(got)
    return b"|".join(reads)


@pytest.mark.parametrize("error_rate", [0.0, 1.0])
def test_the_last_event_carries_the_chunked_terminator_and_the_connection_is_kept(error_rate: float) -> None:
    """[DONE] and the chunked body's terminator go out in one write (one read here, as a client's [DONE] and the
    end of the body come together), exactly one terminator, and the next request on the same connection is
    answered (also after a stream that fails: error_rate 1)."""
    import socket as _socket

    cfg = SimConfig(decode_step_ms=1, error_rate=error_rate, error_kind="stream", error_after_tokens=1)
    with running_sim(cfg) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with _socket.create_connection(("127.0.0.1", port)) as sock:
            for path, body in [("/completions", {"prompt": "x", "max_tokens": 3, "stream": True}),
                               ("/chat/completions", {**chat_body("x", 2), "stream": True}),
                               ("/completions", {"prompt": "y", "max_tokens": 1, "stream": True})]:
                raw = _raw_exchange(sock, path, json.dumps(body).encode())
                last = raw.rsplit(b"|", 1)[-1]
                assert last.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), raw[-200:]
                assert raw.replace(b"|", b"").count(b"\r\n0\r\n\r\n") == 1


def test_late_write_reports_name_the_events_by_their_stamp(capsys: pytest.CaptureFixture[str]) -> None:
    """``late_write_ms``: an event whose write returned that long after its ``write_ns`` stamp is reported on
    stderr as ``late-write WRITE_NS GAP_NS`` (benchmarks/scale_streams.py sets those events apart: the sim's own
    stall). With a threshold of one nanosecond every token event is late, and each line names one event's stamp."""
    cfg = SimConfig(decode_step_ms=1, late_write_ms=1e-6)
    with running_sim(cfg) as url, httpx.Client(base_url=url, timeout=10) as c:
        _, chunks = stream(c, "/chat/completions", chat_body(words(5), 6))
    lines = [ln.split() for ln in capsys.readouterr().err.splitlines() if ln.startswith("late-write ")]
    stamps = [o["sim"]["write_ns"] for _, o in token_chunks(chunks)]
    assert len(stamps) == 6 and sorted(int(w) for _, w, _ in lines) == stamps
    assert all(int(gap) > 0 for _, _, gap in lines)
    with running_sim(SimConfig(decode_step_ms=1)) as url, httpx.Client(base_url=url, timeout=10) as c:
        stream(c, "/chat/completions", chat_body(words(5), 6))
    assert "late-write" not in capsys.readouterr().err  # 0: off


def test_every_shipped_profile_fits_the_sims_default_context() -> None:
    """`bench run SIM -p NAME` works for every shipped profile (spark-recipe asks for 131,072 + 256 tokens)."""
    from bench.config.profile import PROFILES_DIR, load_profile

    names = sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if not p.stem.startswith("sim-"))  # sim-*: sim configs
    assert {"quick", "prefill", "spark-recipe"} <= set(names)
    need = {n: max(c.depth + c.max_tokens for c in load_profile(n).cells()) for n in names}
    assert all(v <= SimConfig().max_model_len for v in need.values()), need
