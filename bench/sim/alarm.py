"""A timer to the microsecond without keeping a core busy (Linux ``timerfd``): the sim's step loop, and bench's
senders through :func:`bench.session.alarm.sleep_until` (one timer per event loop for both).

asyncio's timers wake through ``epoll_wait``, whose timeout is whole milliseconds rounded up; so the step loop used
to yield with ``sleep(0)`` for the last 1.5 ms before each deadline: with 1 ms steps it never slept, and each sim
process kept a core busy (benchmarks/results/openloop-cpu-2026-12-04-vm.md), a core the clients on the same host
needed. Here each event loop gets one ``timerfd`` armed at the earliest wake time of its waiters (absolute
CLOCK_MONOTONIC, the clock of ``perf_counter_ns`` on Linux) and watched by the loop like a socket, so the loop
sleeps in ``epoll_wait`` until the timer or a request wakes it. None where there is no timerfd: the step loop then
waits as before. It lives here because the sim imports nothing else of bench.
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

__all__ = ["Alarm", "alarm_for"]

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
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
    """One event loop's timer: :meth:`wake_at` sets a future's result once ``perf_counter_ns()`` reached a time
    (never before it); a future done meanwhile (woken otherwise, cancelled) is dropped. :meth:`wait` awaits such a
    time. Waits may overlap."""

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
            pass  # re-armed after it fired: the count was cleared
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
    """The loop's :class:`Alarm`, made on first use; None where there is no timerfd."""
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
