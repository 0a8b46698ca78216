"""Waiting for a schedule's due times: to the microsecond, without keeping a core busy.

Why: asyncio's timers wake through ``epoll_wait``, whose timeout is whole milliseconds rounded up, so a sleep ends
up to ~1 ms late. Bench used to sleep to 1 ms before a due time and spend that last millisecond yielding to the
loop (``await asyncio.sleep(0)`` in a loop): precise, but at 1,000 requests/s or more per process every gap is
that last millisecond, and the sender used a whole core doing nothing (benchmarks/results/openloop-cpu-2026-12-04-vm.md),
a core that the servers and the other senders on the host needed.

Here (Linux, where ``perf_counter_ns`` reads CLOCK_MONOTONIC) each event loop gets one ``timerfd`` armed at the
earliest due time of its waiters (an absolute CLOCK_MONOTONIC time, in ns) and watched by the loop like a socket
(:class:`bench.sim.alarm.Alarm`, the sim's step-loop timer: one implementation, one timer per loop): the loop
sleeps in ``epoll_wait`` until the timer or a read wakes it. The wake costs one loop iteration; the last
:data:`SPIN_NS` before a due time is still spent yielding to the loop, so a due time is kept as precisely as
before. Elsewhere, or when the timer cannot be made, the old way: sleep to :data:`FALLBACK_SPIN_S` before, then
yield.
"""

from __future__ import annotations

import asyncio
import time

from bench.sim.alarm import Alarm, alarm_for

__all__ = ["sleep_until", "SPIN_NS", "FALLBACK_SPIN_S", "Alarm", "alarm_for"]

SPIN_NS = 100_000  # the last stretch before a due time spent yielding to the loop (ns), after the timer's wake
FALLBACK_SPIN_S = 0.001  # without a timer: the stretch spent yielding (asyncio's sleeps end up to 1 ms late)


async def sleep_until(t_ns: int, spin_s: float | None = None) -> int:
    """Wait until ``perf_counter_ns()`` passes ``t_ns``: the loop's :class:`Alarm` to :data:`SPIN_NS` before it
    (without one: ``asyncio.sleep`` to ``spin_s``, default :data:`FALLBACK_SPIN_S`, before it), then yield to the
    event loop until it passes (so reads keep flowing meanwhile). Returns how late it woke (ns, >= 0 up to the
    clock's resolution)."""
    perf = time.perf_counter_ns
    alarm = alarm_for(asyncio.get_running_loop())
    if spin_s is not None:
        spin_ns = round(spin_s * 1e9)
    else:
        spin_ns = SPIN_NS if alarm is not None else round(FALLBACK_SPIN_S * 1e9)
    if t_ns - perf() > spin_ns:
        if alarm is not None:
            await alarm.wait(t_ns - spin_ns)
        else:
            await asyncio.sleep((t_ns - perf() - spin_ns) / 1e9)
    while perf() < t_ns:
        await asyncio.sleep(0)
    return perf() - t_ns
