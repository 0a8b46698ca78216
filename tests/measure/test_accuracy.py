"""Accuracy: bench, driven the way users drive it, against ``bench sim`` with known parameters.

Each test starts the reference engine (``running_sim``) with a :class:`SimConfig`, runs a profile through
``run_profile(base, profile, ClientSettings(), out_dir=tmp_path)`` exactly as ``bench run`` does, and compares the
cell summaries of the results document with the truth functions of :mod:`bench.sim.truth` (docs/sim.md). The
records file written by the run (``records.jsonl``) is read back where the truth depends on per-request facts
(the prompt length the server counted, the sim's own schedule ``sched_ns`` of every event).

Tolerances, and why. The machine is a shared, noisy 2-core box; the sim runs in a thread of the test process
and shares its GIL with the client, so every event can be late by a fraction of a millisecond and, when other
processes hold the cores, by a scheduler slice (several ms). The tolerances below were checked by running this
file repeatedly while two CPU-bound processes competed for the 2 cores (all passed); they are tight enough that a
systematic error of the size named beside each one fails.

* ``RATE_TOL = 3 %`` on medians of decode tok/s (per stream and aggregate): a decode window of 64 tokens at
  10-20 ms per step spans 0.6-1.3 s; 3 % of that is 19-39 ms of stall at the window's ends, far above the
  ~0.1-0.5 ms per-event noise seen here, so a pass is robust and a systematic error above 3 % still fails.
* aggregate decode tok/s: ``RATE_TOL`` plus one decode step of the window (``1 / (L - 1)``, 1.6 % at 64
  tokens): a wave's streams join the batch up to a step apart, so bench's wave window (earliest first token ->
  latest last token) is one step longer than one stream's decode (bench reads ~1.7 % low here, by design of the
  definition); a second check compares bench's figure with the same window taken from the sim's own schedule
  (``sched_ns`` of each event), within ``RATE_TOL`` (timestamp noise at the window's two ends only: one 20 ms
  stall of the box at either end of a 0.64 s window is 3 %; seen: 2.6 %).
* ``ITL_TOL_MS = 1 ms`` on the median ITL (10 % of a 10 ms step): each gap is the step plus the difference of
  two arrival delays (~0.1-0.5 ms each on an idle box, where the median sits within ~0.2 ms of the step); on a
  loaded box stalls make the gaps bimodal (a late read, then two events in one read) and move the median.
* TTFT. Timing noise on a shared box is one-sided: a descheduled process only ever reads *later*. So a
  systematic error shows in the *smallest* value of a cell, noise mostly in the larger ones:

  - a hard lower bound on every request: bench's TTFT can never be below the sim's scheduled prefill + first
    step (the request is sent before the sim's arrival time and read after the scheduled write; 0.05 ms slack
    for ns rounding);
  - bias: the smallest (TTFT - truth) of a cell under ``TTFT_BIAS_MS = 10 ms`` + 1 ms per 1K prompt tokens.
    What sits between the truth and bench's TTFT is HTTP handling, JSON parsing and the sim's tokenizing of the
    prompt before its arrival time (measured: ~1-2 ms for a short prompt, +0.3 ms per 1K tokens), the sim's
    write lateness and the client's read (below); seen up to 8.4 ms at 2K tokens;
  - typical: the median under ``TTFT_TYPICAL_MS = 15 ms`` + 2 ms per 1K tokens (3-5x the idle figures: a
    loaded box), and every request under ``TTFT_MAX_EXCESS_MS = 40 ms`` (a scheduler hiccup);
  - bench's own read: the smallest (bench's first-token time - the sim's ``write_ns`` of that event, one clock)
    under ``READ_BIAS_MS = 5 ms``. On this VM it was 0.1-0.5 ms in some hours and 1.2-4.7 ms in others with
    the box idle (the first token follows an idle wait; waking the reader is slow then); a stamping error of
    bench's own (stamping after parsing, after the stream ends) would be tens to hundreds of ms.
* Counts (reasoning tokens, cached tokens, failed requests) are exact: they come from the server's usage and
  the sim's deterministic rules, so any difference is a bug.

Decode tok/s with several tokens per event counts only the tokens after the first event (the first event's k tokens
arrive at the TTFT); ``(output_tokens - 1)`` would read +5 % high at 4 tokens per event and 64 tokens.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench.client import ClientSettings
from bench.config.profile import parse_profile
from bench.driver import run_profile
from bench.measure.metrics import request_metrics
from bench.records import RequestRecord, read_records
from bench.sim import (
    SimConfig,
    expected_cached_tokens,
    expected_decode_tok_s,
    expected_error_count,
    expected_itl_ms,
    expected_prefill_ms,
    expected_ttft_ms,
    running_sim,
    step_ms,
)
from bench.sim.truth import fails, prefill_rate_tok_s

RATE_TOL = 0.03  # relative, medians of decode tok/s (see module docstring)
ITL_TOL_MS = 1.0  # absolute, median ITL
TTFT_LOWER_SLACK_MS = 0.05  # ns rounding of the schedule
TTFT_BIAS_MS, TTFT_BIAS_MS_PER_1K = 10.0, 1.0  # smallest (bench TTFT - truth) of a cell, + per 1K prompt tokens
TTFT_TYPICAL_MS, TTFT_TYPICAL_MS_PER_1K = 15.0, 2.0  # median (bench TTFT - truth) of a cell
READ_BIAS_MS = 5.0  # smallest (bench's first-token time - the sim's write_ns of it) of a cell
TTFT_MAX_EXCESS_MS = 40.0  # any single request


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def measure(cfg: SimConfig, profile: dict[str, Any], out: Path) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Run ``profile`` against a fresh sim; return the results document and every record of the run.

    The heap pytest has built up (earlier tests' records and results) is frozen out of the garbage collector for
    the run: a full collection over it stalls this process for 40-120 ms on a loaded box, which would delay the
    in-process sim and the client alike. A real ``bench run`` starts with a small heap; the run's own objects are
    still collected as usual.
    """
    prof = parse_profile(profile, "accuracy")
    gc.collect()
    gc.freeze()
    try:
        with running_sim(cfg) as base:
            results = asyncio.run(run_profile(base, prof, ClientSettings(), out_dir=out)).to_dict()
    finally:
        gc.unfreeze()
    return results, read_records(out / "records.jsonl")


def cell(results: dict[str, Any], depth: int, streams: int) -> dict[str, Any]:
    cid = f"d{depth}-s{streams}-prose"
    found = [c for c in results["cells"] if c["id"] == cid]
    assert found, f"no cell {cid} in {[c['id'] for c in results['cells']]}"
    return found[0]


def measured(records: list[RequestRecord], c: dict[str, Any]) -> list[RequestRecord]:
    """The cell's measured records (warm-ups, probes and primes excluded), failures included."""
    return [r for r in records if r.meta.get("cell") == c["id"] and r.meta.get("phase") == "measure"]


def rel_err(got: float, want: float) -> float:
    return abs(got - want) / want


def tok_events(rec: RequestRecord) -> list[Any]:
    return [e for e in rec.events if e.has_text]


def sched_aggregate(recs: list[RequestRecord]) -> list[float]:
    """Per wave: sum(output_tokens - 1) / (latest last-token sched_ns - earliest first-token sched_ns), i.e.
    bench's aggregate definition evaluated on the sim's own schedule instead of arrival times."""
    out = []
    for w in sorted({r.meta["wave"] for r in recs}):
        ok = [r for r in recs if r.meta["wave"] == w and r.ok]
        first = min(tok_events(r)[0].sched_ns for r in ok)
        last = max(tok_events(r)[-1].sched_ns for r in ok)
        out.append(sum(request_metrics(r).output_tokens - 1 for r in ok) / ((last - first) / 1e9))
    return out


def breakdown(r: RequestRecord) -> str:
    """Where a request's TTFT went, for failure messages: send -> scheduled first token (sim), sim lateness
    (write - scheduled), write -> client read."""
    tev = tok_events(r)
    if not tev or tev[0].sched_ns is None:
        return "no sim timestamps"
    e = tev[0]
    return (f"send->sched {(e.sched_ns - r.sent_ns) / 1e6:.2f} ms, sim late {(e.write_ns - e.sched_ns) / 1e6:.2f} ms, "
            f"write->read {(r.sent_ns + e.t_ns - e.write_ns) / 1e6:.2f} ms")


def check_ttft_isolated(cfg: SimConfig, recs: list[RequestRecord]) -> float:
    """Each request ran alone in the engine: TTFT truth = prefill(prompt - cached) + t(1). Checks the TTFT bounds
    of the module docstring; returns the median excess (bench - truth) in ms."""
    excess, read, prompt = [], [], []
    for r in recs:
        m = request_metrics(r)
        assert m.ok and m.ttft_ms is not None and m.prompt_tokens is not None
        truth = expected_ttft_ms(cfg, m.prompt_tokens, m.cached_tokens)
        ex = m.ttft_ms - truth
        assert ex >= -TTFT_LOWER_SLACK_MS, f"{r.request_id}: TTFT {m.ttft_ms:.3f} ms below the truth {truth:.3f} ms"
        assert ex <= TTFT_MAX_EXCESS_MS, f"{r.request_id}: TTFT {m.ttft_ms:.3f} ms vs truth {truth:.3f} ms ({breakdown(r)})"
        excess.append(ex)
        read.append(m.ttft_ms - (tok_events(r)[0].write_ns - r.sent_ns) / 1e6)
        prompt.append(m.prompt_tokens)
    k = statistics.median(prompt) / 1000
    details = "; ".join(breakdown(r) for r in recs)
    bias, typical = TTFT_BIAS_MS + TTFT_BIAS_MS_PER_1K * k, TTFT_TYPICAL_MS + TTFT_TYPICAL_MS_PER_1K * k
    assert min(excess) <= bias, f"every TTFT is over {bias:.1f} ms above the truth: {details}"
    assert statistics.median(excess) <= typical, f"median TTFT over {typical:.1f} ms above the truth: {details}"
    assert min(read) <= READ_BIAS_MS, f"bench read every first token over {READ_BIAS_MS} ms after its write: {details}"
    return statistics.median(excess)


# ---------------------------------------------------------------------------------------------------------------
# decode: per stream and aggregate, 1 and 4 streams
# ---------------------------------------------------------------------------------------------------------------
def test_decode_rate_and_itl_constant_step(tmp_path: Path) -> None:
    """t(b) = 10 ms for every batch: 100 tok/s per stream at 1 and 4 streams, 400 tok/s aggregate at 4."""
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=20_000.0)
    results, records = measure(cfg, {
        "max_tokens": 64, "requests": 4, "min_waves": 2, "warmup": 1,
        "sweep": [{"depths": [0], "streams": [1, 4]}],
    }, tmp_path)
    for streams in (1, 4):
        c = cell(results, 0, streams)
        assert c["requests_failed"] == 0 and c["requests_ok"] >= 4
        truth = expected_decode_tok_s(cfg, streams)  # 100 tok/s: the step does not depend on the batch
        assert truth == pytest.approx(100.0)
        assert rel_err(c["decode_tok_s"]["median"], truth) <= RATE_TOL, (streams, c["decode_tok_s"])
        # aggregate: streams x per stream, less one step of join stagger (module docstring)
        agg = c["aggregate_decode_tok_s"]["median"]
        assert rel_err(agg, streams * truth) <= RATE_TOL + 1 / 63, (streams, c["aggregate_decode_tok_s"])
        on_schedule = statistics.median(sched_aggregate(measured(records, c)))
        assert rel_err(agg, on_schedule) <= RATE_TOL, (agg, on_schedule)
        assert abs(c["itl_ms"]["median"] - expected_itl_ms(cfg, streams)) <= ITL_TOL_MS, c["itl_ms"]
        assert c["output_tokens"]["min"] == c["output_tokens"]["max"] == 64
        assert c["tokens_per_event"]["median"] == 1.0
    check_ttft_isolated(cfg, measured(records, cell(results, 0, 1)))


def test_decode_rate_falls_with_batch(tmp_path: Path) -> None:
    """t(b) = 8 + 2 b ms: 100 tok/s alone, 62.5 tok/s per stream at 4 streams (250 aggregate, not 400)."""
    cfg = SimConfig(decode_step_ms=8.0, decode_step_ms_per_seq=2.0, prefill_tok_s=20_000.0)
    results, records = measure(cfg, {
        "max_tokens": 64, "requests": 4, "min_waves": 2, "warmup": 1,
        "sweep": [{"depths": [0], "streams": [1, 4]}],
    }, tmp_path)
    one, four = cell(results, 0, 1), cell(results, 0, 4)
    assert expected_decode_tok_s(cfg, 1) == pytest.approx(100.0)
    assert expected_decode_tok_s(cfg, 4) == pytest.approx(62.5)
    assert rel_err(one["decode_tok_s"]["median"], expected_decode_tok_s(cfg, 1)) <= RATE_TOL, one["decode_tok_s"]
    # per stream at 4: the stream that joins first has one step at b = 1 and the last step of the others is at
    # b = 3; that moves the per-stream rate by < 0.5 %
    assert rel_err(four["decode_tok_s"]["median"], expected_decode_tok_s(cfg, 4)) <= RATE_TOL, four["decode_tok_s"]
    agg = four["aggregate_decode_tok_s"]["median"]
    assert rel_err(agg, 4 * expected_decode_tok_s(cfg, 4)) <= RATE_TOL + 1 / 63, four["aggregate_decode_tok_s"]
    assert rel_err(agg, statistics.median(sched_aggregate(measured(records, four)))) <= RATE_TOL
    assert abs(four["itl_ms"]["median"] - expected_itl_ms(cfg, 4)) <= ITL_TOL_MS, four["itl_ms"]


# ---------------------------------------------------------------------------------------------------------------
# prefill: TTFT at depth, prompt tok/s raw and corrected
# ---------------------------------------------------------------------------------------------------------------
def test_ttft_and_prefill_at_depth(tmp_path: Path) -> None:
    """2K tokens at 10,000 tok/s: TTFT = 204.8 ms + one 10 ms step. Prompt tok/s = uncached / TTFT reads low by
    the step and the HTTP overhead; the overhead-corrected figure must be closer to 10,000 and within 5 %."""
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=10_000.0)
    results, records = measure(cfg, {
        "max_tokens": 16, "requests": 4, "warmup": 1, "overhead_probes": 3,
        "sweep": [{"depths": ["2k"], "streams": [1]}],
    }, tmp_path)
    c = cell(results, 2048, 1)
    recs = measured(records, c)
    assert c["requests_ok"] == len(recs) == 4
    check_ttft_isolated(cfg, recs)
    pt = c["prompt_tokens"]["median"]
    assert abs(pt - 2048) <= 11  # bench's prompt builder: within 0.5 % of the target with the server tokenizer
    truth = prefill_rate_tok_s(cfg, round(pt))  # 10,000 tok/s
    raw, corr = c["prompt_tok_s"]["median"], c["prompt_tok_s_corrected"]["median"]
    # raw = 2048 / (204.8 + 10 + overhead) ms: below the truth by the step and the overhead (~5 %)
    assert raw < truth
    # corrected = 2048 / (TTFT - median TTFT of tiny prompts): the step and the HTTP overhead cancel; what is left
    # is the tiny prompts' own prefill (~0.5 ms), the sim's tokenizing of 2K tokens (~0.6 ms) and noise. 5 % of
    # 205 ms is 10 ms of noise allowed.
    assert abs(corr - truth) < abs(raw - truth), (raw, corr, truth)
    assert rel_err(corr, truth) <= 0.05, (corr, truth)
    assert c["overhead_flag"] is False


def test_prefill_at_1m_tokens_with_upload_split_out(tmp_path: Path) -> None:
    """A 1M-token prompt (5 MB body) at 200k tok/s: 5.24 s of modelled prefill. Sending, parsing and tokenizing the
    body is outside the engine (about a second here); the sim stamps when the body was in (its role chunk), so
    ``upload_ms`` splits it out and TTFT - upload matches the engine's truth within 1 %, as at 4K."""
    cfg = SimConfig(decode_step_ms=5.0, prefill_tok_s=200_000.0, max_model_len=1_100_000)
    results, records = measure(cfg, {
        "max_tokens": 4, "requests": 1, "warmup": 0, "overhead_probes": 1,
        "sweep": [{"depths": ["1m"], "streams": [1]}],
    }, tmp_path)
    c = cell(results, 1 << 20, 1)
    [r] = measured(records, c)
    m = request_metrics(r)
    assert m.ok and m.prompt_tokens is not None and m.ttft_ms is not None and m.upload_ms is not None
    assert abs(m.prompt_tokens - (1 << 20)) <= 0.005 * (1 << 20)
    truth = expected_ttft_ms(cfg, m.prompt_tokens, m.cached_tokens)  # prefill + one step, from arrival
    assert m.upload_ms > 0
    assert rel_err(m.ttft_ms - m.upload_ms, truth) <= 0.01, (m.ttft_ms, m.upload_ms, truth)


def test_ttft_with_prefill_halving(tmp_path: Path) -> None:
    """rate(d) = R / (1 + d/H) with R = 10,000 and H = 4,096: 8,000 tok/s at 1K (128 ms), 6,667 tok/s at 2K
    (307 ms). The corrected prompt tok/s follows the falling rate within 5 % (what is left after the overhead
    correction is the sim's parse/tokenize time that grows with the prompt, ~1-2 % here, and noise)."""
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=10_000.0, prefill_halving_tokens=4096.0)
    results, records = measure(cfg, {
        "max_tokens": 16, "requests": 2, "warmup": 0, "overhead_probes": 3,
        "sweep": [{"depths": ["1k", "2k"], "streams": [1]}],
    }, tmp_path)
    for depth in (1024, 2048):
        c = cell(results, depth, 1)
        check_ttft_isolated(cfg, measured(records, c))
        pt = round(c["prompt_tokens"]["median"])
        truth = prefill_rate_tok_s(cfg, pt)
        assert rel_err(c["prompt_tok_s_corrected"]["median"], truth) <= 0.05, (depth, c["prompt_tok_s_corrected"], truth)
    assert cell(results, 2048, 1)["prompt_tok_s_corrected"]["median"] < cell(results, 1024, 1)["prompt_tok_s_corrected"]["median"]


# ---------------------------------------------------------------------------------------------------------------
# several tokens per event
# ---------------------------------------------------------------------------------------------------------------
def test_itl_with_several_tokens_per_event(tmp_path: Path) -> None:
    """4 tokens per 20 ms event: per-token ITL = 5 ms, 4 tokens/event, 16 events for 64 tokens."""
    cfg = SimConfig(decode_step_ms=20.0, prefill_tok_s=20_000.0, tokens_per_event=4)
    results, records = measure(cfg, {
        "max_tokens": 64, "requests": 3, "warmup": 1,
        "sweep": [{"depths": [0], "streams": [1]}],
    }, tmp_path)
    c = cell(results, 0, 1)
    assert abs(c["itl_ms"]["median"] - step_ms(cfg, 1) / 4) <= ITL_TOL_MS / 4 + 0.1, c["itl_ms"]
    assert c["tokens_per_event"]["median"] == 4.0
    for r in measured(records, c):
        m = request_metrics(r)
        assert m.chunks == 16 and m.output_tokens == 64 and m.itl_count == 60  # 15 gaps x 4 tokens
    check_ttft_isolated(cfg, measured(records, c))


def test_decode_rate_with_several_tokens_per_event(tmp_path: Path) -> None:
    """4 tokens per 20 ms event: 200 tok/s per stream."""
    cfg = SimConfig(decode_step_ms=20.0, prefill_tok_s=20_000.0, tokens_per_event=4)
    results, _ = measure(cfg, {
        "max_tokens": 64, "requests": 2, "warmup": 0,
        "sweep": [{"depths": [0], "streams": [1]}],
    }, tmp_path)
    c = cell(results, 0, 1)
    assert expected_decode_tok_s(cfg, 1) == pytest.approx(200.0)
    assert rel_err(c["decode_tok_s"]["median"], 200.0) <= RATE_TOL, c["decode_tok_s"]


# ---------------------------------------------------------------------------------------------------------------
# reasoning phase
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3])
def test_reasoning_phase(tmp_path: Path, k: int) -> None:
    """8 reasoning tokens first: TTFT is the first reasoning event, TTFC the first event with content, which is
    event ceil((8 + 1) / k): TTFC - TTFT = (ceil(9 / k) - 1) steps (8 steps at k = 1; 2 at k = 3, where the third
    event straddles the boundary). reasoning_tokens is exact (usage)."""
    R = 8
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=20_000.0, reasoning_tokens=R, tokens_per_event=k)
    results, records = measure(cfg, {
        "max_tokens": 32, "requests": 4, "warmup": 1, "thinking": True,
        "sweep": [{"depths": [0], "streams": [1]}],
    }, tmp_path)
    c = cell(results, 0, 1)
    assert c["reasoning_tokens"] == R * c["requests_ok"]
    gap_truth = (math.ceil((R + 1) / k) - 1) * step_ms(cfg, 1)
    gaps = []
    for r in measured(records, c):
        m = request_metrics(r)
        assert m.reasoning_tokens == R and not m.reasoning_tokens_estimated
        assert m.ttfc_ms is not None and m.ttfc_ms > m.ttft_ms
        gaps.append(m.ttfc_ms - m.ttft_ms)
    # the gap is between two events of one stream: the noise of two arrival delays, not summed over the steps;
    # 5 ms covers a late read on a loaded box (6 % of the 80 ms gap at k = 1). Seen: the first event, written
    # after an idle prefill wait, read ~4 ms late on every request while other processes held both cores
    assert abs(statistics.median(gaps) - gap_truth) <= 5.0, (gaps, gap_truth)
    # the summary's medians: TTFC median - TTFT median carries the TTFT noise of two different requests
    assert abs(c["ttfc_ms"]["median"] - c["ttft_ms"]["median"] - gap_truth) <= TTFT_TYPICAL_MS
    check_ttft_isolated(cfg, measured(records, c))


# ---------------------------------------------------------------------------------------------------------------
# queueing beyond max_running
# ---------------------------------------------------------------------------------------------------------------
def test_queueing_beyond_max_running(tmp_path: Path) -> None:
    """max_running = 2, 4 streams of 16 tokens at 20 ms per step. The first two are admitted at once (first tokens
    after 1 and 2 steps); the other two wait for a slot: one is admitted when the first finishes (after 16 steps)
    and decodes from the next boundary (first token after 18 steps), the last when the second finishes (after 19
    steps). bench's TTFT must include the wait. Per-stream decode is unaffected (t(b) does not depend on b)."""
    L, t = 16, 20.0
    cfg = SimConfig(decode_step_ms=t, prefill_tok_s=20_000.0, max_running=2)
    results, records = measure(cfg, {
        "max_tokens": L, "requests": 8, "warmup": 1,
        "sweep": [{"depths": [0], "streams": [4]}],
    }, tmp_path)
    c = cell(results, 0, 4)
    recs = measured(records, c)
    assert c["requests_ok"] == 8 and c["waves"] == 2
    for wave in (0, 1):
        wrecs = [r for r in recs if r.meta["wave"] == wave]
        ttfts = sorted(request_metrics(r).ttft_ms for r in wrecs)
        # nominal TTFTs of the 4 streams, in steps: 1, 2, L + 2, L + 3 (+ ~1.4 ms prefill). Allowed above them:
        # one step (a stream whose send or prefill end is late by a few ms joins the next step boundary) plus
        # 10 ms of HTTP handling and read on a loaded box. Below: the queued two cannot see a token before a slot
        # frees, L steps after the first stream's start (a hard bound; the spread of sends is below one step).
        nominal = [1 * t, 2 * t, (L + 2) * t, (L + 3) * t]
        for got, want in zip(ttfts, nominal):
            assert got <= want + t + 10.0, (ttfts, nominal)
        assert ttfts[1] < L * t / 2 <= L * t <= ttfts[2], ttfts  # two served at once, two waited a whole decode
        # the client queued nothing: the whole wait is the server's
        assert all(r.queue_ms < 5.0 for r in wrecs)
        # bench's TTFT vs the sim's own schedule of the first token (same clock): loopback, the sim's lateness
        # and the client's read apart (< 1 ms idle; 15 ms covers a loaded box)
        for r in wrecs:
            sched_ttft = (tok_events(r)[0].sched_ns - r.sent_ns) / 1e6
            assert 0.0 <= request_metrics(r).ttft_ms - sched_ttft <= 15.0
    assert c["ttft_ms"]["max"] >= L * t  # the summary shows the queue wait
    assert rel_err(c["decode_tok_s"]["median"], expected_decode_tok_s(cfg, 2)) <= RATE_TOL


# ---------------------------------------------------------------------------------------------------------------
# prefix cache
# ---------------------------------------------------------------------------------------------------------------
def test_prefix_cache_on_and_off(tmp_path: Path) -> None:
    """Sim with a prefix cache (16-token blocks). bench's prefix-cache mode (``prefix_cache = true``) repeats one
    primed 2K prompt: cached = floor((d - 1) / 16) * 16 per request, exactly, and TTFT is the prefill of the rest.
    bench's default mode starts every prompt with a unique prefix: cached = 0, exactly."""
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=20_000.0, prefix_cache=True, prefix_block_tokens=16)
    prof = {"max_tokens": 16, "requests": 3, "warmup": 1, "sweep": [{"depths": ["2k"], "streams": [1]}]}
    on, rec_on = measure(cfg, {**prof, "prefix_cache": True}, tmp_path / "on")
    off, rec_off = measure(cfg, prof, tmp_path / "off")

    c = cell(on, 2048, 1)
    recs = measured(rec_on, c)
    want = 0
    for r in recs:
        m = request_metrics(r)
        assert m.cached_tokens == expected_cached_tokens(cfg, m.prompt_tokens), (m.prompt_tokens, m.cached_tokens)
        want += m.cached_tokens
    assert c["cached_tokens"] == want > 0
    check_ttft_isolated(cfg, recs)  # truth = prefill of the uncached tail at the rate of the whole prompt + step
    # 10.8 ms of truth here vs 112 ms uncached; 50 ms leaves room for a loaded box (seen: 22 ms) and still
    # tells a cache hit from a miss
    assert c["ttft_ms"]["median"] < 50.0
    assert not any("cached" in w for w in c["warnings"])

    c = cell(off, 2048, 1)
    assert c["cached_tokens"] == 0
    assert all(request_metrics(r).cached_tokens == 0 for r in measured(rec_off, c))
    check_ttft_isolated(cfg, measured(rec_off, c))
    assert c["ttft_ms"]["median"] >= expected_prefill_ms(cfg, 2048 - 11)


def test_prefix_cache_every_stream_shares_the_primed_prompt(tmp_path: Path) -> None:
    """prefix_cache = true at 4 streams: every request of the cell sends the one prompt the priming request
    warmed, so each is served from the cache (cached = floor((d - 1) / 16) * 16, exactly) and its TTFT is the
    prefill of the uncached tail. Streams used to get prompts of their own (seed = stream): streams 1-3 read
    cached 0 and a cold prefill (232 ms against 23 ms cached), a mix of cold and warm."""
    cfg = SimConfig(decode_step_ms=5.0, prefill_tok_s=5_000.0, prefix_cache=True, prefix_block_tokens=16)
    prof = {"max_tokens": 8, "requests": 8, "warmup": 1, "prefix_cache": True,
            "sweep": [{"depths": ["1k"], "streams": [4]}]}
    res, recs = measure(cfg, prof, tmp_path)
    c = cell(res, 1024, 4)
    ms = [request_metrics(r) for r in measured(recs, c)]
    assert len(ms) == 8 and all(m.ok for m in ms)
    assert len({m.prompt_tokens for m in ms}) == 1, [m.prompt_tokens for m in ms]  # one prompt for every stream
    for m in ms:
        assert m.prompt_tokens is not None and m.cached_tokens == expected_cached_tokens(cfg, m.prompt_tokens) > 0
    cold = expected_prefill_ms(cfg, 1000)  # ~200 ms; cached: under 16 tokens of prefill and a step or few
    assert max(m.ttft_ms or 0.0 for m in ms) < cold / 2, [m.ttft_ms for m in ms]


# ---------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,bench_kind", [("503", "http_5xx"), ("stream", "stream_error")])
def test_error_rate_exact(tmp_path: Path, kind: str, bench_kind: str) -> None:
    """error_rate 0.25: generation request n fails iff n % 4 == 0. Before the measured requests the run sends
    3 (one warm-up probe + 2 overhead probes; no warm-up wave), so the 8 measured ones are n = 4..11, of which
    exactly 2 fail whatever order the 4 concurrent streams arrive in. Failures stay out of latency statistics."""
    cfg = SimConfig(decode_step_ms=10.0, prefill_tok_s=20_000.0, error_rate=0.25, error_kind=kind,
                    error_after_tokens=4)
    results, records = measure(cfg, {
        "max_tokens": 32, "requests": 8, "warmup": 0, "overhead_probes": 2,
        "sweep": [{"depths": [0], "streams": [4]}],
    }, tmp_path)
    first = min(r.sent_ns for r in records if r.meta.get("phase") == "measure")
    before = [r for r in records if r.meta.get("phase") != "measure" and r.sent_ns < first]  # not the drift probes
    assert len(before) == 3 and all(r.ok for r in before)
    n_fail = expected_error_count(cfg, 3 + 8) - expected_error_count(cfg, 3)
    assert n_fail == sum(fails(cfg, n) for n in range(4, 12)) == 2
    c = cell(results, 0, 4)
    assert c["requests_failed"] == n_fail
    assert c["requests_ok"] == 8 - n_fail
    assert c["errors"] == {bench_kind: n_fail}
    # failures kept out of latency and rate statistics
    for key in ("ttft_ms", "decode_tok_s", "e2e_ms", "tpot_ms"):
        assert c[key]["n"] == c["requests_ok"], (key, c[key])
    assert c["output_tokens"]["min"] == 32  # the stream-error ones (4 tokens) are not in there
    assert c["itl_ms"]["n"] == c["requests_ok"] * 31
    assert rel_err(c["decode_tok_s"]["median"], expected_decode_tok_s(cfg, 4)) <= RATE_TOL
    assert any("failed" in w for w in c["warnings"])
