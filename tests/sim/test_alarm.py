"""bench.sim.alarm: the step loop's timer (a timerfd the event loop watches)."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.sim import alarm as alarm_mod
from bench.sim.alarm import alarm_for

pytestmark = pytest.mark.skipif(alarm_mod._LIBC is None, reason="no timerfd here")


def test_futures_are_woken_at_their_times_in_order_and_done_ones_dropped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = alarm_for(loop)
        assert a is not None and alarm_for(loop) is a
        t0 = time.perf_counter_ns()
        futs = {name: loop.create_future() for name in ("b", "a", "gone")}
        a.wake_at(t0 + 20_000_000, futs["b"])
        a.wake_at(t0 + 8_000_000, futs["a"])
        a.wake_at(t0 + 4_000_000, futs["gone"])
        futs["gone"].set_result(None)  # woken otherwise (a request arrived): the timer passes it by
        await futs["a"]
        t_a = time.perf_counter_ns()
        assert not futs["b"].done()
        await futs["b"]
        t_b = time.perf_counter_ns()
        assert t0 + 8_000_000 <= t_a < t_b and t_b >= t0 + 20_000_000
        assert not a.heap and not a.armed_ns

    asyncio.run(main())


def test_an_idle_step_loop_of_1_ms_steps_leaves_the_core_mostly_idle() -> None:
    """Waiting 1 ms steps used to mean yielding to the loop all the time (a busy core); lenient bound: a shared
    CI machine."""
    from bench.sim.config import SimConfig
    from bench.sim.engine import Engine

    async def main() -> None:
        eng = Engine(SimConfig())
        t0 = time.perf_counter_ns()
        for k in range(1, 301):
            await eng._wait_until(t0 + k * 1_000_000, interruptible=False)
            assert time.perf_counter_ns() >= t0 + k * 1_000_000

    c0, w0 = time.process_time(), time.perf_counter()
    asyncio.run(main())
    assert (time.process_time() - c0) / (time.perf_counter() - w0) < 0.6
