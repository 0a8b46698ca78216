"""Metric definitions on hand-built records (pure; no server)."""

from __future__ import annotations

import pytest

from bench.measure.metrics import request_metrics
from bench.measure.tokens import estimate_tokens, event_token_counts
from bench.records import Event, RecordWriter, RequestRecord, read_records

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


def test_a_record_names_its_node_at_the_top() -> None:
    """Issue 30's interface: every measured record of a --ray run has `node` (the Ray node id, also meta.node);
    read back, it comes from meta again."""
    r = rec([(10, " a")])
    assert r.to_dict()["node"] is None
    r.meta["node"] = "abc123"
    d = r.to_dict()
    assert d["node"] == "abc123" and RequestRecord.from_dict(d).meta["node"] == "abc123"


def test_record_to_dict_is_asdicts_with_compact_events() -> None:
    """RequestRecord.to_dict builds its dict field by field (asdict made a dict of every event only to drop it):
    the same keys in the same order, the same values, deep copies of the containers."""
    import collections
    import dataclasses

    from bench.records import _DERIVED

    @dataclasses.dataclass
    class Tag:
        name: str
        at: tuple[int, int]

    r = rec([(10, " a"), (20, " b")], usage={"completion_tokens": 2, "details": {"x": [1, (2, 3)]}})
    r.meta = {"phase": "p", "k": 3, "t": (1, [2]), "tag": Tag("x", (1, 2)), "dd": collections.OrderedDict(a=[1])}
    r.tool_calls, r.scheduled_ns, r.timings = [{"id": "c", "name": "f", "arguments": "{}"}], 5, {"n": 1.5}
    r.redact()  # what to_dict does first: with a secret registered by an earlier test, meta's OrderedDict is a dict
    ref = dataclasses.asdict(r)
    ref["events"] = [[round(e.t_ns / 1e6, 6), e.content, e.reasoning, e.tool, e.sched_ns, e.write_ns, e.tokens]
                     for e in r.events]
    ref["ok"] = r.ok
    ref["node"] = None  # no Ray node
    for k in _DERIVED:
        v = getattr(r, k)
        ref[k] = None if v is None else round(v, 6)
    got = r.to_dict()
    assert got == ref and list(got) == list(ref) and repr(got) == repr(ref)
    assert got["meta"] is not r.meta and got["meta"]["t"][1] is not r.meta["t"][1]
    assert got["usage"]["details"]["x"] is not r.usage["details"]["x"]  # type: ignore[index]


def _cell_records() -> list[RequestRecord]:
    """Two waves of two requests (distinct ids and send times; the second wave slower), one of them failed."""
    out = []
    for w in range(2):
        for s in range(2):
            step = 10 + 5 * w + s
            r = rec([(50 + step * i, " w") for i in range(8)], usage={"prompt_tokens": 20, "completion_tokens": 8},
                    end_ms=50 + step * 8)
            r.request_id, r.sent_ns = f"w{w}s{s}", (1 + w) * 1000 * MS + s
            r.meta = {"cell": "d0-s2-prose", "phase": "measure", "wave": w}
            out.append(r)
    out[3].error, out[3].error_kind = "HTTP 500", "http_5xx"
    return out


def test_cell_summary_computes_each_records_metrics_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop rule, the cell summary, its noise and queueing, and the server cross-check share one computation of
    each record's metrics, and give what the metrics computed afresh give."""
    import asyncio

    import httpx

    import bench.measure.metrics
    import bench.measure.slo
    import bench.measure.summary
    import bench.session.endpoint
    import bench.session.sweep
    from bench.client import ClientSettings
    from bench.config.profile import Cell, Profile
    from bench.measure.noise import wave_medians
    from bench.measure.queueing import queueing_summary
    from bench.measure.summary import summarize_cell
    from bench.session.endpoint import Session
    from bench.session.sweep import CellRun, Sweep

    recs = _cell_records()
    fresh = [request_metrics(r) for r in recs]
    calls: list[str] = []

    def counted(r: RequestRecord):
        calls.append(r.request_id)
        return request_metrics(r)

    for mod in (bench.measure.metrics, bench.session.endpoint, bench.session.sweep, bench.measure.summary, bench.measure.slo):
        monkeypatch.setattr(mod, "request_metrics", counted)
    cell = Cell("main", 0, 2, "prose", 8, 4)
    session = Session("http://127.0.0.1:9/v1", ClientSettings(), Profile(target_ci=0.05), httpx.AsyncClient())
    sweep = Sweep(session)
    try:
        run = CellRun(cell)
        run.records, run.waves = recs[:2], [["w0s0", "w0s1"]]
        sweep._ci_met(run)
        run.records.extend(recs[2:])
        run.waves.append(["w1s0", "w1s1"])
        sweep._ci_met(run)
        tokens = sum(m.output_tokens for m in fresh if m.ok)
        run.server_metrics = {"generation_tokens": 2 * tokens}  # twice what bench counted: a cross-check warning
        summary = sweep.summarize(run)
    finally:
        asyncio.run(session.client.aclose())
    assert sorted(calls) == sorted(r.request_id for r in recs)  # each record once
    assert [m.to_dict(with_itl=True) for m in run.metrics()] == [m.to_dict(with_itl=True) for m in fresh]
    monkeypatch.undo()
    alone = summarize_cell(cell, recs, run.waves, None, expected_cached_tokens=None, target_ci=0.05)
    for key in ("decode_tok_s", "aggregate_decode_tok_s", "ttft_ms", "itl_ms", "noise", "samples", "errors"):
        assert getattr(summary, key) == getattr(alone, key), key
    assert summary.noise is not None and summary.noise["wave_medians"] == [round(x, 3) for x in wave_medians(
        fresh, run.waves)] and len(summary.noise["wave_medians"]) == 2
    assert summary.queueing == queueing_summary({"id": cell.id, "streams": 2}, fresh, run.waves, {})
    assert any(f"the server generated {2 * tokens} tokens, bench counted {tokens}" in w for w in summary.warnings)


def test_cell_run_extend_carries_the_metrics_over() -> None:
    from bench.config.profile import Cell
    from bench.session.sweep import CellRun

    recs = _cell_records()
    cell = Cell("main", 0, 2, "prose", 8, 4)
    a, b = CellRun(cell, records=recs[:2], waves=[["w0s0", "w0s1"]]), CellRun(cell, records=recs[2:])
    b.waves = [["w1s0", "w1s1"]]
    a.metrics()
    a.extend(b)
    assert [m.request_id for m in a.metrics()] == [r.request_id for r in recs]
    a.records = list(reversed(recs))  # replaced, not appended to: computed again, in the new order
    assert [m.request_id for m in a.metrics()] == [r.request_id for r in reversed(recs)]
