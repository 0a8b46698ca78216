"""Metric definitions on hand-built records (pure; no server)."""

from __future__ import annotations

import pytest

from bench.metrics import request_metrics
from bench.records import Event, RecordWriter, RequestRecord, read_records
from bench.tokens import estimate_tokens, event_token_counts

MS = 1_000_000


def rec(events, usage=None, timings=None, end_ms=None, **kw) -> RequestRecord:
    r = RequestRecord("r", "chat", "m", queued_ns=1, sent_ns=1, done=True, finish_reason="stop", usage=usage,
                      timings=timings, **kw)
    r.events = [Event(int(t * MS), content=c) for t, c in events]
    r.end_ns = int((end_ms or events[-1][0] + 1) * MS)
    return r


def test_decode_itl_tpot_definitions() -> None:
    # first token at 100 ms, then 9 more every 20 ms -> decode (10-1)/0.18 s = 50 tok/s
    r = rec([(100 + 20 * i, " w") for i in range(10)], usage={"prompt_tokens": 50, "completion_tokens": 10},
            end_ms=290)
    m = request_metrics(r)
    assert m.ttft_ms == pytest.approx(100)
    assert m.decode_tok_s == pytest.approx(50)
    assert m.itl_count == 9 and m.itl_ms_p50 == pytest.approx(20)
    assert m.tpot_ms == pytest.approx((290 - 100) / 9)
    assert m.prefill_tok_s == pytest.approx(50 / 0.1) and m.prefill_source == "ttft"


def test_itl_divides_gaps_by_tokens_per_event() -> None:
    r = rec([(100 + 12 * i, " a b c d") for i in range(10)], usage={"completion_tokens": 40})
    m = request_metrics(r)
    assert m.itl_count == 36 and m.itl_ms_p50 == pytest.approx(3)
    assert m.tokens_per_event == 4


def test_cached_tokens_are_not_prefilled() -> None:
    r = rec([(50, " a"), (60, " b")], usage={"prompt_tokens": 1000, "completion_tokens": 2,
                                             "prompt_tokens_details": {"cached_tokens": 900}})
    m = request_metrics(r)
    assert m.cached_tokens == 900
    assert m.prefill_tok_s == pytest.approx(100 / 0.05)


def test_server_timings_win_for_prefill() -> None:
    r = rec([(50, " a"), (60, " b")], usage={"prompt_tokens": 1000, "completion_tokens": 2},
            timings={"prompt_n": 1000, "prompt_ms": 40.0, "cache_n": 0})
    assert request_metrics(r).prefill_tok_s == pytest.approx(25000) and request_metrics(r).prefill_source == "server"


def test_reasoning_counted_once() -> None:
    r = rec([(10, " x"), (20, " y")], usage={"completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 1}})
    m = request_metrics(r)
    assert m.output_tokens == 2 and m.reasoning_tokens == 1


def test_estimates_when_no_usage() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens(" the") == 1 and estimate_tokens(" the of and") == 3
    evs = [Event(1, content=" a b"), Event(2, content=" c")]
    assert event_token_counts(evs, None) == [2.0, 1.0]
    assert event_token_counts(evs, 6) == [4.0, 2.0]
    m = request_metrics(rec([(10, " a b"), (20, " c")]))
    assert m.output_tokens == 3 and m.output_tokens_estimated


def test_records_round_trip_and_truncated_line(tmp_path) -> None:
    r = rec([(10, " a"), (20, " b")], usage={"completion_tokens": 2})
    p = tmp_path / "r.jsonl"
    with RecordWriter(p) as w:
        w.write(r)
        w.write(r)
    with open(p, "a") as fh:
        fh.write('{"request_id": "half')  # a run killed mid-write
    back = read_records(p)
    assert len(back) == 2
    assert request_metrics(back[0]).to_dict() == request_metrics(r).to_dict()
