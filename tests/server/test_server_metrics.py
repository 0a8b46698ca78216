"""Server metrics: /metrics pages -> per-cell deltas, gauges and percentiles (docs/server-metrics.md).

The sim's vLLM-style page is checked exactly against the sim's own counts (its usage objects); SGLang and TGI
pages are fixtures written from their documented series (tests/fixtures/metrics); llama-server runs for real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.server.metrics import (
    Snapshot,
    cross_check_notes,
    cross_checks,
    detect_metrics,
    histogram_bucket,
    histogram_quantile,
    parse_page,
    summarize_snapshots,
)
from bench.sim import SimConfig, running_sim

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def _snaps(name: str) -> list[Snapshot]:
    return [Snapshot(0.0, parse_page((FIX / f"{name}_before.txt").read_text())),
            Snapshot(10.0, parse_page((FIX / f"{name}_after.txt").read_text()))]


def test_sglang_fixture() -> None:
    s = summarize_snapshots("sglang", _snaps("sglang"))
    assert s["backend"] == "sglang" and s["window_s"] == 10.0
    # streaming and non-streaming label sets summed; *_created ignored
    assert (s["prompt_tokens"], s["generation_tokens"], s["requests"]) == (4096, 1024, 8)
    assert (s["prefix_cache_hits"], s["prefix_cache_queries"], s["prefix_cache_hit_rate"]) == (512, 4096, 0.125)
    assert s["kv_cache_usage_pct_max"] == 7.0 and s["requests_running_max"] == 4 and s["requests_waiting_max"] == 1
    assert s["spec_acceptance_rate"] == 0.665 and s["spec_mean_accepted_length"] == 3.0  # SGLang's gauges, mean
    assert s["server_ttft_count"] == 8 and s["server_ttft_ms_mean"] == 65.0
    assert s["server_ttft_ms_p50"] == pytest.approx(70.0)  # rank 4 of 8 inside the (60, 80] ms bucket
    assert s["server_queue_count"] == 8 and s["server_itl_count"] == 1008
    assert s["gauge_series"]["kv_cache_usage_pct"] == [[0.0, 2.0], [10.0, 7.0]]


def test_tgi_fixture() -> None:
    s = summarize_snapshots("tgi", _snaps("tgi"))
    assert (s["prompt_tokens"], s["generation_tokens"], s["requests"]) == (2048, 512, 4)
    assert s["requests_running_max"] == 4 and s["requests_waiting_max"] == 2
    assert "kv_cache_usage_pct_max" not in s and "server_ttft_count" not in s  # TGI does not say
    assert s["server_queue_count"] == 4 and s["server_itl_count"] == 4


VLLM_PAGE = """# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {g0}
vllm:generation_tokens_total{{engine="1",model_name="m"}} {g1}
vllm:generation_tokens_created{{engine="0",model_name="m"}} 1.7e9
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {dt}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {k0}
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} {k1}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {r0}
vllm:num_requests_running{{engine="1",model_name="m"}} {r1}
"""


def _vllm(t: float, **kw: float) -> Snapshot:
    v = {"g0": 0, "g1": 0, "d": 0, "dt": 0, "a": 0, "k0": 0, "k1": 0, "r0": 0, "r1": 0, **kw}
    return Snapshot(t, parse_page(VLLM_PAGE.format(**v)))


def test_engines_summed_resets_and_spec_decode() -> None:
    snaps = [
        _vllm(0, g0=100, g1=50, d=10, dt=30, a=20),
        _vllm(1, g0=160, g1=80, d=30, dt=90, a=50, k0=0.4, k1=0.9, r0=2, r1=3),
        _vllm(2, g0=20, g1=100, d=40, dt=120, a=65, k0=0.5, k1=0.2, r0=1, r1=1),  # engine 0 restarted (160 -> 20)
    ]
    s = summarize_snapshots("vllm", snaps)
    assert s["generation_tokens"] == (60 + 20) + (30 + 20)  # a drop counts what came after the reset
    assert (s["spec_drafts"], s["spec_draft_tokens"], s["spec_accepted_tokens"]) == (30, 90, 45)
    assert s["spec_acceptance_rate"] == 0.5 and s["spec_mean_accepted_length"] == 2.5
    assert s["kv_cache_usage_pct_max"] == 90.0  # the fullest engine
    assert s["requests_running_max"] == 5 and s["requests_running_mean"] == pytest.approx(7 / 3, abs=1e-3)
    assert "prefix_cache_hit_rate" not in s  # not on the page: absent, not zero


def test_table_fields() -> None:
    from bench.server.metrics import table_fields

    assert table_fields({"kv_cache_usage_pct_max": 98.0, "spec_acceptance_rate": 0.71, "backend": "vllm"}) == {
        "KV % max": 98.0, "accept rate": 0.71}
    assert table_fields(None) == {}


def test_histogram_quantile() -> None:
    b = [(0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0)]
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)
    assert histogram_quantile(0.99, b) == 0.2  # in +Inf: the last finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert histogram_bucket(0.5, b) == (0.1, 0.2) and histogram_bucket(0.25, b) == (0.0, 0.1)
    assert histogram_bucket(0.99, b) == (0.2, float("inf")) and histogram_bucket(0.5, []) is None


def _cell(**kw: object) -> dict:
    base: dict = {"id": "decode-s4-d1000", "depth": 1000, "requests_failed": 0,
                  "output_tokens": {"n": 8, "mean": 128.0}, "ttft_ms": {"median": 80.0}}
    base.update(kw)
    return base


def test_cross_checks() -> None:
    healthy = {"generation_tokens": 1024, "prefix_cache_hits": 0, "prefix_cache_hit_rate": 0.0,
               "server_ttft_ms_p50": 70.0}
    assert cross_checks(healthy, _cell(), prefix_cache_expected=False) == []  # a healthy run: no warning
    assert cross_check_notes(healthy, _cell()) == [
        "decode-s4-d1000: TTFT p50 80.0 ms at bench, 70.0 ms at the server: +10.0 ms is network, HTTP and client"]
    # vLLM's TTFT buckets (0.1, 0.25]: both p50s inside the server's p50 bucket, the difference is not measured
    coarse = {"server_ttft_ms_p50": 175.0, "server_ttft_ms_p50_bucket": [100.0, 250.0]}
    assert cross_check_notes(coarse, _cell(ttft_ms={"median": 125.8})) == [
        "decode-s4-d1000: TTFT p50 125.8 ms at bench, 175.0 ms at the server, whose histogram puts it in (100, 250] ms"
        " with bench's: the difference is within the bucket, not measured"]
    assert "+85.0 ms is network" in cross_check_notes(coarse, _cell(ttft_ms={"median": 260.0}))[0]
    w = cross_checks({"generation_tokens": 1100}, _cell(), prefix_cache_expected=False)
    assert len(w) == 1 and "1100" in w[0] and "+7.4 %" in w[0] and "another client" in w[0]
    assert cross_checks({"generation_tokens": 1034}, _cell(), False) == []  # within 1 %
    warm = {"prefix_cache_hits": 3000, "prefix_cache_hit_rate": 0.4}
    w = cross_checks(warm, _cell(), prefix_cache_expected=False)
    assert len(w) == 1 and "40%" in w[0] and "--no-enable-prefix-caching" in w[0]
    assert cross_checks(warm, _cell(), prefix_cache_expected=True) == []
    assert cross_checks(warm, _cell(depth=0), prefix_cache_expected=False) == []  # template header share
    # 60 requests of 32-token prompts, each with a 16-token template header the server may serve from its cache
    # (seen on llama-server: 48 % of prompt tokens): the header explains the hits; more than the header warns
    short = {"prefix_cache_hits": 960, "prefix_cache_queries": 2880, "prefix_cache_hit_rate": 0.3333}
    assert cross_checks(short, _cell(depth=32), prefix_cache_expected=False, expected_hits=60 * 16) == []
    w = cross_checks(dict(short, prefix_cache_hits=1400), _cell(depth=32), False, expected_hits=60 * 16)
    assert len(w) == 1 and "1400 tokens" in w[0]
    assert len(cross_checks(short, _cell(depth=32), prefix_cache_expected=False)) == 1  # no header known: warns


async def _send(client, url: str, n: int, prompt: str, max_tokens: int) -> list:
    specs = [RequestSpec(f"r{i}", "completions", {"prompt": prompt, "max_tokens": max_tokens}) for i in range(n)]
    return list(await asyncio.gather(*(stream_request(client, url, s, model="bench-sim") for s in specs)))


def test_sim_deltas_exact() -> None:
    # 2 of 4 streams wait for 40 steps of 10 ms: a long window for the 20 ms scrapes, even on a loaded machine
    cfg = SimConfig(decode_step_ms=10, prefill_tok_s=200000, prefix_cache=True, prefix_block_tokens=4,
                    max_running=2, kv_cache_tokens=1000)
    prompt = " ".join(f"w{i}" for i in range(40))

    async def go(url: str) -> tuple[dict, list]:
        async with make_http_client(ClientSettings(), 4) as client:
            await _send(client, url, 1, "warm up the counters", 4)  # the baseline is not zero
            scraper = await detect_metrics(client, url, interval_s=0.02)
            assert scraper is not None and scraper.backend == "bench-sim"
            await scraper.begin()
            recs = await _send(client, url, 4, prompt, 40) + await _send(client, url, 2, prompt + " tail", 7)
            return await scraper.end(), recs

    with running_sim(cfg) as url:
        s, recs = asyncio.run(go(url))
    assert all(r.ok for r in recs)
    assert s["prompt_tokens"] == sum(r.usage["prompt_tokens"] for r in recs) == 4 * 40 + 2 * 41
    assert s["generation_tokens"] == sum(r.usage["completion_tokens"] for r in recs) == 4 * 40 + 2 * 7
    assert s["requests"] == 6 and s["server_ttft_count"] == 6 and s["server_queue_count"] == 6
    hits = sum(r.usage["prompt_tokens_details"]["cached_tokens"] for r in recs)
    assert hits > 0 and s["prefix_cache_hits"] == hits and s["prefix_cache_queries"] == s["prompt_tokens"]
    assert s["prefix_cache_hit_rate"] == round(hits / s["prompt_tokens"], 4)
    # max_running 2 of 4 streams: two wait; the KV gauge saw 2 prompts of 40 and their output
    assert s["requests_running_max"] == 2 and s["requests_waiting_max"] == 2
    assert 8.0 <= s["kv_cache_usage_pct_max"] <= 16.0  # 2 x (40 prompt + up to 40 output) of 1000
    assert s["scrapes"] >= 3 and len(s["gauge_series"]["requests_running"]) == s["scrapes"]


def test_no_metrics_page() -> None:
    """A server with no /metrics (here: a case replay server) gives None, not an error."""
    from bench.tools.replay import Case, serve_case

    case = Case("x", "", "chat", 200, {"content-type": "text/event-stream"}, ((0.0, b"data: [DONE]\n\n"),), {})

    async def go(url: str) -> object:
        async with make_http_client(ClientSettings()) as client:
            return await detect_metrics(client, url)

    with serve_case(case) as url:
        assert asyncio.run(go(url)) is None


@pytest.mark.engine
def test_llama_server_metrics(llama_server: str) -> None:
    """The real llama-server (--metrics): token deltas exact against its usage, cached tokens against its
    timings.cache_n (the same prompt twice)."""
    async def go() -> tuple[dict, list]:
        async with make_http_client(ClientSettings(), 2) as client:
            scraper = await detect_metrics(client, llama_server, interval_s=0.05)
            assert scraper is not None and scraper.backend == "llama.cpp"
            await scraper.begin()
            specs = [RequestSpec(f"e{i}", "completions", {"prompt": f"Count to ten, take {i}:", "max_tokens": 24,
                                                         "temperature": 0}) for i in range(2)]
            recs = list(await asyncio.gather(*(stream_request(client, llama_server, s, model="m") for s in specs)))
            again = RequestSpec("e-again", "completions", {"prompt": "Count to ten, take 0:", "max_tokens": 8})
            recs.append(await stream_request(client, llama_server, again, model="m"))
            return await scraper.end(), recs

    s, recs = asyncio.run(go())
    assert all(r.ok for r in recs)
    assert s["generation_tokens"] == sum(r.usage["completion_tokens"] for r in recs)
    assert s["prefix_cache_hits"] == sum(r.timings.get("cache_n", 0) for r in recs) > 0
    assert s["prefix_cache_queries"] == sum(r.usage["prompt_tokens"] for r in recs)  # evaluated + cached
    assert s["requests_running_max"] >= 1 and s["spec_draft_tokens"] == 0
    assert cross_checks(s, {"id": "c", "output_tokens_total": s["generation_tokens"]}, False) == []


def test_slots_and_server_info_stand_in_for_metrics() -> None:
    """Where /metrics is off: llama.cpp's /slots gives the running gauge, SGLang's /get_server_info the accept
    length (and what the server is set to)."""
    import json

    from bench.server.info import sglang_summary, slots_summary
    from bench.server.metrics import page_from

    slots = [{"id": i, "n_ctx": 8192, "is_processing": i < 3, "speculative": True} for i in range(4)]
    assert slots_summary(slots) == {"slots": 4, "slot_ctx": 8192, "slots_processing": 3, "speculative": True}
    idle = page_from("slots", json.dumps([{**s, "is_processing": False} for s in slots]))
    busy = page_from("slots", json.dumps(slots))
    assert idle is not None and busy is not None
    s = summarize_snapshots("llama.cpp", [Snapshot(0, idle), Snapshot(1, busy), Snapshot(2, idle)])
    assert s["requests_running_max"] == 3 and "generation_tokens" not in s
    info = {"disable_radix_cache": False, "speculative_algorithm": "EAGLE", "max_running_requests": 64,
            "enable_metrics": False, "context_length": 32768, "internal_states": [{"avg_spec_accept_length": 2.7}]}
    assert sglang_summary(info) == {"prefix_cache": True, "speculative": "EAGLE", "max_running_requests": 64,
                                    "metrics_enabled": False, "context_length": 32768, "spec_accept_length": 2.7}
    p = page_from("get_server_info", json.dumps(info))
    assert p is not None
    s = summarize_snapshots("sglang", [Snapshot(0, p), Snapshot(1, p)])
    assert s["spec_mean_accepted_length"] == 2.7
    assert slots_summary({"x": 1}) is None and sglang_summary([1]) is None and page_from("slots", "nope") is None


@pytest.mark.engine
def test_llama_server_draft_acceptance() -> None:
    """llama-server with a draft model (SmolLM2 as its own draft): the acceptance counters of /metrics equal the
    per-response timings (draft_n, draft_n_accepted), and the mean accepted length is 1 + accepted / drafts."""
    from bench.server.metrics import spec_from_timings
    from bench.tools.engine import LocalEngine, find_model

    extra = ["-md", str(find_model()), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]

    async def go(url: str) -> tuple[dict, list]:
        async with make_http_client(ClientSettings()) as client:
            scraper = await detect_metrics(client, url)
            assert scraper is not None
            await scraper.begin()
            spec = RequestSpec("d0", "completions", {"prompt": "One, two, three, four,", "max_tokens": 16,
                                                     "ignore_eos": True, "temperature": 0})
            recs = [await stream_request(client, url, spec, model="m")]
            return await scraper.end(), recs

    with LocalEngine(parallel=1, ctx_size=2048, extra_args=extra) as eng:
        s, recs = asyncio.run(go(eng.url))
    st = spec_from_timings(recs)
    assert st is not None and st["draft_tokens"] > 0
    assert (s["spec_draft_tokens"], s["spec_accepted_tokens"]) == (st["draft_tokens"], st["accepted_tokens"])
    assert s["spec_acceptance_rate"] == st["acceptance_rate"]
    assert s["spec_mean_accepted_length"] == round(1 + s["spec_accepted_tokens"] / s["spec_drafts"], 4)


def test_a_crashed_scraper_is_a_warning_not_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interval task dies (a bug in a scrape): the cell's server_metrics says why, and the cell warns."""
    from bench.server import metrics as sm_mod
    from bench.server.metrics import MetricsScraper

    with running_sim(SimConfig(decode_step_ms=2.0)) as base:
        async def go() -> dict:
            client = make_http_client(ClientSettings())
            try:
                sc = MetricsScraper(client, base.removesuffix("/v1") + "/metrics", "bench-sim", interval_s=0.05)
                await sc.begin()

                async def broken(self: MetricsScraper) -> None:
                    raise RuntimeError("parser bug")

                monkeypatch.setattr(sm_mod.MetricsScraper, "scrape", broken)
                await asyncio.sleep(0.2)
                monkeypatch.undo()
                return await sc.end()
            finally:
                await client.aclose()

        out = asyncio.run(go())
    assert out["scraper_error"] == "RuntimeError: parser bug"
    assert out["scrapes"] >= 2  # the first scrape and the one at the end still count

    from bench.config.profile import Profile
    from bench.results import CellResult
    from bench.session.endpoint import Session
    from bench.session.sweep import Sweep

    summary = CellResult(id="c")
    session = object.__new__(Session)
    session.profile = Profile()
    session.template_cached_tokens = 0
    Sweep(session)._server_checks(out, [], summary)
    assert any("the /metrics scraper stopped during the cell (RuntimeError: parser bug)" in w
               for w in summary.warnings)


def test_open_loop_points_carry_the_servers_counters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``bench run --rate`` cell and each ``bench capacity`` point.json hold ``server_metrics`` over the whole
    point (warm-up and cool-down requests too): the sim's counters equal the usage of every record of the point."""
    import json

    from bench.cli.app import main
    from bench.records import read_records

    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6)) as url:
        assert main(["run", url, "--rate", "20", "--requests", "12", "--arrival", "constant", "--input-tokens", "16",
                     "--max-tokens", "5", "--out", str(tmp_path / "run"), "--json"]) == 0, capsys.readouterr().err
        [c] = json.loads(capsys.readouterr().out)["cells"]
        rc = main(["capacity", url, "--by", "concurrency", "--slo", "ttft_p90=2s", "--input-tokens", "16",
                   "--max-tokens", "4", "--start", "1", "--max-load", "2", "--trials", "1", "--max-points", "2",
                   "--out", str(tmp_path / "cap"), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    recs = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.meta.get("phase") == "measure"]
    sm = c["server_metrics"]
    assert len(recs) == 12 and all(r.ok for r in recs) and c["window"]["requests"] < 12  # the window is a part
    assert sm["backend"] == "bench-sim" and sm["requests"] == 12 and sm["server_ttft_count"] == 12
    assert sm["generation_tokens"] == sum(r.usage["completion_tokens"] for r in recs) == 60
    assert sm["prompt_tokens"] == sum(r.usage["prompt_tokens"] for r in recs)
    assert not [w for w in c["warnings"] if "token" in w]
    for p in json.loads(out)["points"]:
        point = json.loads((Path(p["dir"]) / "point.json").read_text())
        done = [r for r in read_records(Path(p["dir"]) / "records.jsonl") if r.ok]
        assert point["server_metrics"]["generation_tokens"] == sum(r.usage["completion_tokens"] for r in done) > 0


def test_quantiles_of_a_coarse_first_bucket_are_bounded_by_the_mean() -> None:
    """vLLM's queue-time buckets start at 300 ms: 430 requests that queued 15 us on average all fall in (0, 0.3] s,
    where interpolation alone says p50 = 150 ms. A duration's q quantile is at most mean / (1 - q) (Markov)."""
    def page(n: float, total_s: float) -> str:
        return ("# TYPE vllm:request_queue_time_seconds histogram\n"
                + "".join(f'vllm:request_queue_time_seconds_bucket{{le="{le}"}} {n}\n' for le in ("0.3", "0.5", "+Inf"))
                + f"vllm:request_queue_time_seconds_count {n}\nvllm:request_queue_time_seconds_sum {total_s}\n")

    s = summarize_snapshots("vllm", [Snapshot(0.0, parse_page(page(8, 0.0003548))),
                                     Snapshot(1.0, parse_page(page(438, 0.0069315)))])
    assert s["server_queue_count"] == 430 and s["server_queue_ms_mean"] == pytest.approx(0.0153, abs=1e-3)
    assert s["server_queue_ms_p50"] == pytest.approx(2 * 0.0153, abs=2e-3) and s["server_queue_ms_p99"] < 2.0
    assert s["server_queue_ms_p50_bucket"] == [0.0, 300.0]


def test_token_surplus_that_failed_requests_can_explain_is_not_a_warning() -> None:
    """A request bench cut was written by the server (its tokens counted there) but keeps no tokens at bench: a
    surplus within failed x max_tokens is theirs (their own warnings tell), a larger one is somebody else's."""
    from bench.server.metrics import cross_checks

    cell = {"id": "rate-5", "output_tokens_total": 1200, "requests_failed": 8, "max_tokens": 100}
    assert cross_checks({"generation_tokens": 1675}, cell, prefix_cache_expected=False) == []
    assert cross_checks({"generation_tokens": 2001}, cell, prefix_cache_expected=False)  # > 8 x 100 more
    no_fail = {**cell, "requests_failed": 0}
    assert cross_checks({"generation_tokens": 1675}, no_fail, prefix_cache_expected=False)
    assert cross_checks({"generation_tokens": 1000}, cell, prefix_cache_expected=False)  # fewer: not theirs


def test_an_open_loop_point_with_cut_requests_does_not_warn_of_a_token_mismatch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Requests still in flight at --drain are cut: the cut is warned of, the server's count of their tokens is not
    a second, misleading warning (it said "run against a server no one else uses")."""
    import json

    from bench.cli.app import main

    with running_sim(SimConfig(decode_step_ms=20.0, prefill_tok_s=1e6)) as url:
        rc = main(["run", url, "--rate", "5", "--requests", "20", "--arrival", "constant", "--input-tokens", "16",
                   "--max-tokens", "100", "--drain", "0.5", "--out", str(tmp_path / "run"), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    [c] = json.loads(out)["cells"]
    assert c["counts"]["cut"] > 0 and c["server_metrics"]["generation_tokens"] > c["counts"]["finished"] * 100
    assert any("were cut" in w for w in c["warnings"])
    assert not [w for w in c["warnings"] if "tokens bench does not count" in w or "generated" in w], c["warnings"]
