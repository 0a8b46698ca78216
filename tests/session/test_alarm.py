"""bench.session.alarm: due times kept on a timerfd, never early, without a busy core."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.session.alarm import alarm_for, sleep_until
from bench.sim import alarm as alarm_mod  # the timer bench.session.alarm uses

linux = pytest.mark.skipif(alarm_mod._LIBC is None, reason="no timerfd here")


def test_sleep_until_is_never_early_and_returns_its_lateness() -> None:
    async def main() -> list[tuple[int, int, int]]:
        out = []
        t0 = time.perf_counter_ns()
        for k in range(1, 40):
            due = t0 + k * 700_000  # 0.7 ms apart, inside and beyond the spin stretch
            lag = await sleep_until(due)
            out.append((due, time.perf_counter_ns(), lag))
        return out

    for due, woke, lag in asyncio.run(main()):
        assert woke >= due and lag >= 0
        assert woke - due >= lag  # the lag was read before `woke`


@linux
def test_overlapping_and_cancelled_waits_each_wake_at_their_time() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = alarm_for(loop)
        assert a is not None and alarm_for(loop) is a
        t0 = time.perf_counter_ns()
        woke: dict[str, int] = {}

        async def one(name: str, due: int) -> None:
            await a.wait(due)
            woke[name] = time.perf_counter_ns()

        late = asyncio.create_task(one("late", t0 + 30_000_000))
        gone = asyncio.create_task(one("gone", t0 + 5_000_000))
        early = asyncio.create_task(one("early", t0 + 10_000_000))  # earlier than the timer's: re-arms it
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(late, early)
        assert gone.cancelled() and "gone" not in woke
        assert t0 + 10_000_000 <= woke["early"] < woke["late"]
        assert woke["late"] >= t0 + 30_000_000
        assert not a.heap and not a.armed_ns
        await a.wait(t0)  # a time already passed: at once

    asyncio.run(main())


@linux
def test_a_dispatch_at_1000_per_s_leaves_the_core_mostly_idle() -> None:
    """The point of the timer: 1,000 due times a second used to keep a core busy (yielding for the last ms
    before each); now the process sleeps between them. Lenient bound: a shared CI machine."""

    async def main() -> None:
        t0 = time.perf_counter_ns() + 5_000_000
        for k in range(500):
            await sleep_until(t0 + k * 1_000_000)

    c0, w0 = time.process_time(), time.perf_counter()
    asyncio.run(main())
    assert (time.process_time() - c0) / (time.perf_counter() - w0) < 0.6


def test_without_a_timer_it_sleeps_and_yields(monkeypatch) -> None:
    monkeypatch.setattr(alarm_mod, "_LIBC", None)
    monkeypatch.setattr(alarm_mod, "_alarms", type(alarm_mod._alarms)())

    async def main() -> tuple[int, int, object]:
        due = time.perf_counter_ns() + 3_000_000
        lag = await sleep_until(due)
        return due, lag, alarm_for(asyncio.get_running_loop())

    due, lag, got = asyncio.run(main())
    assert lag >= 0 and got is None


@linux
def test_the_timer_is_closed_with_its_loop() -> None:
    import gc
    import os

    loop = asyncio.new_event_loop()
    a = alarm_for(loop)
    assert a is not None
    fd = a.fd
    os.fstat(fd)
    loop.close()
    del a, loop
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)
