"""Waiting for a schedule's due times: to the microsecond, without keeping a core busy.

Why: asyncio's timers wake through ``epoll_wait``, whose timeout is whole milliseconds rounded up, so a sleep ends
up to ~1 ms late. Bench used to sleep to 1 ms before a due time and spend that last millisecond yielding to the
loop (``await asyncio.sleep(0)`` in a loop): precise, but at 1,000 requests/s or more per process every gap is
that last millisecond, and the sender used a whole core doing nothing (benchmarks/results/openloop-cpu-2026-12-04-vm.md),
a core that the servers and the other senders on the host needed.

Here (Linux, where ``perf_counter_ns`` reads CLOCK_MONOTONIC) each event loop gets one ``timerfd`` armed at the
earliest due time of its waiters (an absolute CLOCK_MONOTONIC time, in ns) and watched by the loop like a socket:
the loop sleeps in ``epoll_wait`` until the timer or a read wakes it. The wake costs one loop iteration; the last
:data:`SPIN_NS` before a due time is still spent yielding to the loop, so a due time is kept as precisely as
before. Elsewhere, or when the timer cannot be made, the old way: sleep to :data:`FALLBACK_SPIN_S` before, then
yield.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import os
import sys
import time
import weakref
from typing import Any

__all__ = ["sleep_until", "SPIN_NS", "FALLBACK_SPIN_S", "Alarm", "alarm_for"]

SPIN_NS = 100_000  # the last stretch before a due time spent yielding to the loop (ns), after the timer's wake
FALLBACK_SPIN_S = 0.001  # without a timer: the stretch spent yielding (asyncio's sleeps end up to 1 ms late)

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    """glibc's timerfd calls, or None where there are none or ``perf_counter_ns`` is not CLOCK_MONOTONIC."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError, ValueError):
        return None


class Alarm:
    """One event loop's timer: :meth:`wait` returns once ``perf_counter_ns()`` reached a time (never before it),
    woken by a ``timerfd`` that the loop watches. Waits may overlap; a cancelled wait is dropped."""

    __slots__ = ("fd", "libc", "spec", "heap", "armed_ns", "seq")

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: Any) -> None:
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd, self.libc = fd, libc  # no reference to the loop: the timer is closed when the loop goes
        self.spec = _Itimerspec()
        self.heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self.armed_ns = 0  # the time the timer is set for (0: not set)
        self.seq = itertools.count()
        try:
            loop.add_reader(fd, self._fired)
        except (NotImplementedError, RuntimeError):
            os.close(fd)
            raise
        weakref.finalize(loop, _close, fd)

    async def wait(self, t_ns: int) -> None:
        """Return once ``perf_counter_ns() >= t_ns`` (one loop iteration after the timer fired)."""
        if time.perf_counter_ns() >= t_ns:
            return
        fut = asyncio.get_running_loop().create_future()
        self.wake_at(t_ns, fut)
        await fut

    def wake_at(self, t_ns: int, fut: asyncio.Future[None]) -> None:
        """Set ``fut``'s result (None) once ``perf_counter_ns() >= t_ns``; dropped if done before."""
        heapq.heappush(self.heap, (t_ns, next(self.seq), fut))
        if not self.armed_ns or t_ns < self.armed_ns:
            self._arm(t_ns)

    def _arm(self, t_ns: int) -> None:
        v = self.spec.it_value
        v.tv_sec, v.tv_nsec = divmod(max(t_ns, 1), 1_000_000_000)
        if self.libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed_ns = t_ns

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass  # a timer re-armed after it fired: its count was cleared
        now = time.perf_counter_ns()
        heap = self.heap
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        self.armed_ns = 0
        if heap:
            self._arm(heap[0][0])


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


_LIBC: Any = _libc()
_alarms: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Alarm | None] = weakref.WeakKeyDictionary()


def alarm_for(loop: asyncio.AbstractEventLoop) -> Alarm | None:
    """The loop's :class:`Alarm`, made on first use; None where there is no timerfd (the fallback then)."""
    try:
        return _alarms[loop]
    except KeyError:
        pass
    alarm: Alarm | None = None
    if _LIBC is not None:
        try:
            alarm = Alarm(loop, _LIBC)
        except (OSError, NotImplementedError, RuntimeError):
            alarm = None
    _alarms[loop] = alarm
    return alarm


async def sleep_until(t_ns: int, spin_s: float | None = None) -> int:
    """Wait until ``perf_counter_ns()`` passes ``t_ns``: the loop's :class:`Alarm` to :data:`SPIN_NS` before it
    (without one: ``asyncio.sleep`` to ``spin_s``, default :data:`FALLBACK_SPIN_S`, before it), then yield to the
    event loop until it passes (so reads keep flowing meanwhile). Returns how late it woke (ns, >= 0 up to the
    clock's resolution)."""
    perf = time.perf_counter_ns
    alarm = alarm_for(asyncio.get_running_loop())
    spin_ns = SPIN_NS if alarm is not None else round(1e9 * (FALLBACK_SPIN_S if spin_s is None else spin_s))
    if spin_s is not None:
        spin_ns = round(spin_s * 1e9)
    if t_ns - perf() > spin_ns:
        if alarm is not None:
            await alarm.wait(t_ns - spin_ns)
        else:
            await asyncio.sleep((t_ns - perf() - spin_ns) / 1e9)
    while perf() < t_ns:
        await asyncio.sleep(0)
    return perf() - t_ns
