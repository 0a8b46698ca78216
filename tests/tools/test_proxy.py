"""Tests of the delay proxy (bench.tools.proxy): forwarding, streaming with exact added gaps, and bench through it."""

from __future__ import annotations

import json
import statistics
from time import perf_counter_ns

import httpx
import pytest

from bench.errors import ConfigError
from bench.sim import SimConfig, running_sim
from bench.tools.proxy import ProxyConfig, running_proxy, split_events, upstream_root

MS = 1_000_000


@pytest.fixture(scope="module")
def bench_main():
    """bench.cli.main, with ``bench proxy`` registered as the CLI ships it."""
    from bench.cli.app import cli, main

    assert "proxy" in cli.commands
    return main


def test_split_events_and_upstream_root():
    evs, rest = split_events(b"data: a\n\ndata: b\r\n\r\ndata: c")
    assert evs == [b"data: a\n\n", b"data: b\r\n\r\n"] and rest == b"data: c"
    assert upstream_root("http://h:8080/v1") == upstream_root("http://h:8080/v1/") == "http://h:8080"
    assert upstream_root("https://h/api/v1") == "https://h/api"
    with pytest.raises(ConfigError, match="upstream URL"):
        upstream_root("h:8080")
    with pytest.raises(ConfigError, match="delay-per-event-ms"):
        ProxyConfig("http://h/v1", delay_per_event_ms=-1)


def _token_times(url: str, n: int) -> tuple[int, list[int]]:
    body = {"model": "bench-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": n, "stream": True}
    times: list[int] = []
    with httpx.Client(base_url=url, timeout=10) as c:
        c.get("/models")
        t0 = perf_counter_ns()
        with c.stream("POST", "/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:]).get("sim", {}).get("tokens"):
                    times.append(perf_counter_ns())
    return t0, times


def test_proxy_adds_the_per_event_and_first_byte_delays():
    cfg = SimConfig(decode_step_ms=10, prefill_tok_s=100_000)
    with running_sim(cfg) as sim:
        t0, direct = _token_times(sim, 30)
        with running_proxy(ProxyConfig(sim, delay_per_event_ms=4.0, delay_first_byte_ms=50.0)) as url:
            assert httpx.get(url + "/models", timeout=10).json()["data"][0]["id"] == "bench-sim"  # plain forward
            t1, slow = _token_times(url, 30)
    gap = statistics.median(b - a for a, b in zip(direct, direct[1:])) / MS
    gap_slow = statistics.median(b - a for a, b in zip(slow, slow[1:])) / MS
    assert gap == pytest.approx(10.0, abs=1.5) and gap_slow - gap == pytest.approx(4.0, abs=1.0)
    ttft, ttft_slow = (direct[0] - t0) / MS, (slow[0] - t1) / MS
    # the role chunk is event 0, the first token event 1: + 50 ms + 4 ms
    assert ttft_slow - ttft == pytest.approx(54.0, abs=8.0)
    # the total: 29 more gaps of 4 ms each
    assert ((slow[-1] - slow[0]) - (direct[-1] - direct[0])) / MS == pytest.approx(29 * 4.0, abs=10.0)


def test_proxy_upstream_down_is_a_502_with_an_openai_error():
    with running_proxy(ProxyConfig("http://127.0.0.1:9/v1")) as url:
        r = httpx.post(url + "/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert r.status_code == 502 and "upstream" in r.json()["error"]["message"]


def test_bench_run_through_the_proxy_measures_upstream_plus_delay(tmp_path, bench_main, capsys):
    profile = tmp_path / "p.toml"
    profile.write_text('name = "px"\nmax_tokens = 24\nrequests = 4\nwarmup = 1\noverhead_probes = 1\n'
                       '[[sweep]]\ndepths = [0]\nstreams = [1]\n')
    cfg = SimConfig(decode_step_ms=10, prefill_tok_s=100_000)
    with running_sim(cfg) as sim, running_proxy(ProxyConfig(sim, delay_per_event_ms=2.5)) as url:
        assert bench_main(["run", url, "-p", str(profile), "--out", str(tmp_path / "o"), "--json"]) == 0
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    tok_s = statistics.median(doc["cells"][0]["samples"]["decode_tok_s"])
    assert tok_s == pytest.approx(1000.0 / 12.5, rel=0.05)  # 10 ms steps + 2.5 ms per event: 80 tok/s, not 100
    capsys.readouterr()


def test_proxy_command_bad_input_is_one_line(bench_main, capsys):
    assert bench_main(["proxy", "nonsense"]) == 3
    err = capsys.readouterr().err
    assert "upstream URL" in err and "Traceback" not in err
