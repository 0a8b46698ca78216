"""bench.session.workers: a wave spread over worker processes gives the same records as one process would.

Against ``bench sim`` in a thread of the test process (the workers reach it over loopback). Worker processes are
started with 'spawn', which costs ~0.5-1 s each on this box; the pool tests reuse one pool (module fixture).

Timing tolerances, and why: the streams of all workers start at one shared-clock start time, so their first
tokens land in the same one or two decode steps (20 ms): first-token arrival times of a wave must lie within
2 steps + 30 ms of each other (worker start skew ~1 ms idle, more on a loaded 2-core box). Records' times must
be consistent with the sim's own timestamps on the shared clock: every arrival at or after the sim's write of
that event (hard bound), and the median lag under 10 ms (typically < 1 ms; the box is shared).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.config.profile import Profile, Sweep
from bench.driver import run_profile
from bench.measure.metrics import request_metrics
from bench.records import RequestRecord
from bench.session.workers import WorkerPool, arun_requests_multiproc, run_requests_multiproc, shared_clock, split_specs
from bench.sim import SimConfig, running_sim

MODEL = "bench-sim"
STEP_MS = 20.0
TOKENS = 12


def specs(n: int, tag: str, max_tokens: int = TOKENS) -> list[RequestSpec]:
    return [RequestSpec(f"{tag}-{i:03d}", "chat",
                        {"messages": [{"role": "user", "content": f"workers test {tag} {i}"}],
                         "max_tokens": max_tokens}, {"stream": i, "tag": tag})
            for i in range(n)]


async def one_process(base: str, sp: list[RequestSpec]) -> list[RequestRecord]:
    client = make_http_client(ClientSettings(), len(sp))
    try:
        return list(await asyncio.gather(*(stream_request(client, base, s, model=MODEL) for s in sp)))
    finally:
        await client.aclose()


def shape(r: RequestRecord) -> dict:
    """What must not depend on the process that made the request: everything but times and the sim's request
    numbering (text, ids and per-event sim fields carry the request number)."""
    d = r.to_dict()
    d.pop("queued_ns"), d.pop("sent_ns"), d.pop("end_ns")
    for k in [k for k in d if k.startswith("ttft_") and k.endswith("_ms")]:  # times (ttft_content_ms...): present
        d[k] = d[k] is not None
    d["events"] = [(bool(e[1]), bool(e[2]), e[6]) for e in d["events"]]
    d.pop("usage")
    return d


SIM_CONFIG = SimConfig(decode_step_ms=STEP_MS, prefill_tok_s=1e6, error_rate=0.25)  # the shared `sim` fixture


@pytest.fixture(scope="module")
def pool(sim: str) -> Iterator[WorkerPool]:
    with WorkerPool(sim, model=MODEL, settings=ClientSettings(), workers=2, concurrency=16) as p:
        yield p


def test_split_specs() -> None:
    sp = specs(5, "s")
    assert split_specs(sp, 2) == [[0, 2, 4], [1, 3]]
    assert split_specs(sp, 8) == [[0], [1], [2], [3], [4]]  # never an empty share
    assert split_specs(sp, 1) == [[0, 1, 2, 3, 4]]
    assert shared_clock()  # Linux: perf_counter is CLOCK_MONOTONIC


def test_records_like_single_process(sim: str, pool: WorkerPool) -> None:
    """8 streams over 2 workers: every stream present, in spec order, each record shaped like a single-process
    one; failures (error_rate 0.25 -> exactly 2 of every 8 consecutive requests) kept as error records."""
    sp = specs(8, "multi")
    recs = pool.run(sp)
    assert [r.request_id for r in recs] == [s.request_id for s in sp]
    assert [r.meta for r in recs] == [s.meta for s in sp]
    assert all(isinstance(r, RequestRecord) for r in recs)
    failed = [r for r in recs if not r.ok]
    assert len(failed) == 2 and all(r.error_kind == "http_5xx" and r.status == 503 for r in failed)
    ok = [r for r in recs if r.ok]
    single = asyncio.run(one_process(sim, specs(8, "single")))
    single_ok = [r for r in single if r.ok]
    assert len([r for r in single if not r.ok]) == 2
    # same shape field for field (times and the sim's per-request numbering aside)
    ref = shape(single_ok[0])
    for r in ok:
        s = shape(r)
        s["request_id"], s["meta"] = ref["request_id"], ref["meta"]
        assert s == ref
        m = request_metrics(r)
        assert m.output_tokens == TOKENS and m.chunks == TOKENS and m.ttft_ms is not None
        assert m.decode_tok_s is not None
    # CPU use reported per worker for the wave
    assert len(pool.last_cpu_s) == 2 and all(c > 0 for c in pool.last_cpu_s)


def test_one_clock_and_one_start(sim: str, pool: WorkerPool) -> None:
    """Records of different workers share the clock: each arrival is at or after the sim's write of that event,
    and the streams of both workers start together."""
    recs = [r for r in pool.run(specs(8, "clock")) if r.ok]
    lags, firsts = [], []
    for r in recs:
        tev = [e for e in r.events if e.has_text]
        firsts.append(r.sent_ns + tev[0].t_ns)
        for e in tev:
            lag = r.sent_ns + e.t_ns - e.write_ns
            assert lag >= 0, f"{r.request_id}: read {lag} ns before the sim wrote it: clocks differ"
            lags.append(lag / 1e6)
    assert statistics.median(lags) < 10.0
    spread_ms = (max(firsts) - min(firsts)) / 1e6
    assert spread_ms <= 2 * STEP_MS + 30.0, spread_ms


def test_open_loop_share_and_lag_come_back(pool: WorkerPool) -> None:
    """An open-loop job: each request sent at start + its offset by the worker it is dealt to (``scheduled_ns``,
    ``meta.dispatch_lag_ns``), and each worker's loop-lag samples come back with the records."""
    offsets = [0, 40_000_000, 80_000_000, 120_000_000, 160_000_000, 200_000_000]
    recs = pool.run(specs(6, "open", 4), offsets=offsets)
    t0 = recs[0].scheduled_ns
    assert t0 is not None
    assert [r.scheduled_ns - t0 for r in recs] == offsets  # type: ignore[operator]
    for r in recs:
        assert r.queued_ns == r.scheduled_ns and 0 <= r.sent_ns - r.scheduled_ns < 30e6  # type: ignore[operator]
        assert 0 <= r.meta["dispatch_lag_ns"] < 30e6
    assert len(pool.last_lag_ns) == 2
    # each worker ran for ~0.28 s (its share: 3 sends 80 ms apart, 4 tokens at 20 ms): a sample every 10 ms
    assert all(len(x) >= 10 and min(x) >= 0 for x in pool.last_lag_ns), [len(x) for x in pool.last_lag_ns]


def test_the_start_time_follows_every_share(pool: WorkerPool) -> None:
    """Shares that take long to pickle, send and unpickle (each spec's meta holds 300,000 small dicts, 50-60 ms each
    way on this box, as long as a 60,000-request schedule's share takes) still start on time: the start is fixed once every
    worker has its share, so the first request of each worker is not late (issue 26: it was fixed before sending,
    and the last workers of a 20,000 req/s schedule started up to 113 ms late)."""
    sp = specs(2, "big", 2)
    for s in sp:
        s.meta["pad"] = [{"i": i} for i in range(300_000)]
    recs = pool.run(sp, offsets=[0, 0])
    assert len(recs) == 2  # (ok or not: the shared sim fails a quarter of its requests on purpose)
    assert all(0 <= r.meta["dispatch_lag_ns"] < 30e6 for r in recs), [r.meta["dispatch_lag_ns"] for r in recs]


def test_a_worker_prepares_its_share_before_it_answers_got() -> None:
    """The start time is fixed once every worker answered ``got``; a worker opens its share's connections
    (``prepare``) before answering, so that opening them is never inside the measured time."""
    import multiprocessing as mp

    from bench.session.workers import _next_job

    parent, child = mp.Pipe()
    seen: list[str] = []
    out: list[object] = []

    def prepare(sp: list[RequestSpec], offsets: list[int] | None) -> None:
        seen.append(f"prepare {len(sp)} {offsets}")
        time.sleep(0.1)
        seen.append("prepared")

    t = threading.Thread(target=lambda: out.append(_next_job(child, prepare)))
    t.start()
    parent.send((7, specs(3, "p", 2), None, None))
    assert parent.recv() == ("got", 7)
    seen.append("got")
    parent.send(("start", 7, 12345))
    t.join(5)
    assert seen == ["prepare 3 None", "prepared", "got"]
    job = out[0]
    assert isinstance(job, tuple) and job[0] == 7 and job[2] == 12345 and len(job[1]) == 3


def test_pool_reused_across_waves(pool: WorkerPool) -> None:
    a = pool.run(specs(4, "w1", 2))
    b = pool.run(specs(3, "w2", 2))  # an uneven split: 2 + 1
    assert [r.request_id for r in a] == [f"w1-{i:03d}" for i in range(4)]
    assert [r.request_id for r in b] == [f"w2-{i:03d}" for i in range(3)]
    assert pool.run([]) == []


def test_async_wrapper(pool: WorkerPool) -> None:
    async def go() -> list[RequestRecord]:
        ticks = 0

        async def ticker() -> None:  # the caller's loop stays free while the workers stream
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        try:
            return await pool.arun(specs(4, "async", 8))
        finally:
            t.cancel()
            assert ticks >= 5

    recs = asyncio.run(go())
    assert len(recs) == 4 and [r.meta["stream"] for r in recs] == [0, 1, 2, 3]


def test_one_shot_functions(sim: str) -> None:
    """run_requests_multiproc / arun_requests_multiproc start and stop their own workers."""
    recs = run_requests_multiproc(sim, specs(3, "oneshot", 4), model=MODEL, settings=ClientSettings(), workers=2)
    assert [r.request_id for r in recs] == [f"oneshot-{i:03d}" for i in range(3)]
    recs = asyncio.run(arun_requests_multiproc(sim, specs(2, "aoneshot", 4), model=MODEL,
                                               settings=ClientSettings(), workers=3))
    assert [r.request_id for r in recs] == ["aoneshot-000", "aoneshot-001"]
    assert run_requests_multiproc(sim, [], model=MODEL, settings=ClientSettings(), workers=2) == []


def test_unreachable_endpoint_gives_error_records() -> None:
    """A refused connection is a record with error_kind 'connect', as in one process; the pool survives."""
    with WorkerPool("http://127.0.0.1:9/v1", model=MODEL, settings=dataclasses.replace(
            ClientSettings(), connect_timeout_s=2.0), workers=1, concurrency=2) as p:
        recs = p.run(specs(2, "down", 2))
        assert [r.error_kind for r in recs] == ["connect", "connect"]
        assert all(not r.ok and r.events == [] for r in recs)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        WorkerPool("http://x/v1", model=MODEL, settings=ClientSettings(), workers=0)
    with pytest.raises(ValueError):
        WorkerPool("http://x/v1", model=MODEL, settings=ClientSettings(), workers=1, start_method="fork")
    with pytest.raises(RuntimeError):
        WorkerPool("http://x/v1", model=MODEL, settings=ClientSettings(), workers=1).run(specs(1, "x"))


# ---- the lag of worker loops in a cell ---------------------------------------------------------------------------
LAG_PROFILE = Profile(name="lag", max_tokens=24, requests=8, warmup=0, overhead_probes=1,
                      sweeps=(Sweep(depths=(0,), streams=(4,)),))


@pytest.fixture(scope="module")
def clean_sim() -> Iterator[str]:
    with running_sim(SimConfig(decode_step_ms=STEP_MS, prefill_tok_s=1e6)) as base:
        yield base


class _CellDone:
    """An observer that only sets ``done`` when the cell is summarized (before the session closes the pool)."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def cell_started(self, *_: object) -> None: ...
    def cell_kept(self, *_: object) -> None: ...
    def wave_started(self, *_: object) -> None: ...
    def request_done(self, *_: object) -> None: ...
    def note(self, *_: object) -> None: ...

    def cell_done(self, *_: object) -> None:
        self.done.set()


def _cell_through(base: str, pool: WorkerPool, obs: _CellDone | None = None) -> dict:
    res = asyncio.run(run_profile(base, LAG_PROFILE, ClientSettings(), out_dir=None, pool=pool,
                                  observer=obs or _CellDone()))
    assert res.run.workers == 2
    (cell,) = res.cells
    assert cell.requests_ok == 8
    return cell.to_dict()


def test_cell_reports_the_workers_lag(clean_sim: str) -> None:
    """--workers 2: the cell's client_lag is the lag the workers' own loops measured (each has samples over the
    measured waves), the figure being the worst worker's."""
    with WorkerPool(clean_sim, model=MODEL, settings=ClientSettings(), workers=2, concurrency=4) as p:
        cell = _cell_through(clean_sim, p)
    lag = cell["client_lag"]
    assert len(lag["workers"]) == 2
    assert all(w["samples"] >= 40 for w in lag["workers"]), lag  # 2 waves of ~0.5 s, a sample every 10 ms
    worst = max(range(2), key=lambda k: lag["workers"][k]["p99_ms"])
    assert lag["worker"] == worst and lag["p99_ms"] == lag["workers"][worst]["p99_ms"]
    assert lag["samples"] == lag["workers"][worst]["samples"]


def test_a_stalled_worker_draws_the_lag_warning(clean_sim: str) -> None:
    """One worker stopped for 30 ms out of every 60 ms (SIGSTOP/SIGCONT from here: its loop wakes up to 30 ms
    late, as a busy loop would): the cell's lag is that worker's, and the warning names a larger --workers."""
    with WorkerPool(clean_sim, model=MODEL, settings=ClientSettings(), workers=2, concurrency=4) as p:
        pid = p._procs[1].pid
        obs = _CellDone()  # stalling stops once the cell is summarized, before the pool is closed

        def stall() -> None:
            try:
                while not obs.done.is_set():
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(0.03)
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(0.03)
            finally:
                os.kill(pid, signal.SIGCONT)

        t = threading.Thread(target=stall, daemon=True)
        t.start()
        try:
            cell = _cell_through(clean_sim, p, obs)
        finally:
            obs.done.set()
            t.join()
    lag = cell["client_lag"]
    assert lag["worker"] == 1 and lag["p99_ms"] > 15.0, lag
    assert lag["workers"][0]["p99_ms"] < lag["p99_ms"]
    notes = [w for w in cell["warnings"] if "event-loop lag" in w]
    assert len(notes) == 1, cell["warnings"]
    m = re.search(r"use --workers (\d+)", notes[0])
    assert m and int(m.group(1)) > 2, notes
