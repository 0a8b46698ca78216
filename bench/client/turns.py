"""Turns: bursts of per-request work spread over event-loop iterations, so the loop keeps reading its sockets.

Why: asyncio runs every ready callback of an iteration before it polls its sockets again. When hundreds of
requests are sent at once (a wave of N streams), or end at once (a batching engine finishes them in the same
decode step), every one of their tasks is ready in the same iteration, and the iteration lasts as long as all of
their work together: ~100 µs of Python each to build and send a request, tens of µs to finish one. At 2,048 streams
that is 100-300 ms in which no socket is read. A kernel receive stamp (bench.transport.kernel_stamps) does not move with that
delay, but when a stream is not read within one gap between its events, the kernel hands two events over in one
read with the later one's stamp, and the earlier event's stamp is late by a whole gap
(``benchmarks/results/fidelity-*.md``: errors that are whole multiples of the 50 ms step, at the start and the end
of the wave).

:func:`take_turn` is awaited before each such piece of work (bench.client.request: before a request is sent, and after a
response's last event, before its connection is handed back and its record finished). The first callers of an
iteration go at once, for :data:`SLICE_S` of work; later ones wait in order, and each following iteration lets a
batch of them go: the batch doubles while the last batch's work took less than a slice, and halves (never below
one) when it took longer, whatever the reads in the same iteration took. Between two batches the loop polls its sockets. A lone request never waits.

A request sent on a schedule (open loop: :func:`scheduled_task`) does not wait for a turn before its send: its
time is the schedule's, and a turn's wait would be added to its send lag whenever the loop is busy with reads
(measured at 2,000 req/s: the batch halves to one send per loop iteration and the sends fall behind). Its end
still takes a turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["SLICE_S", "Turns", "take_turn", "scheduled_task"]

T = TypeVar("T")
_SCHEDULED: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_scheduled_send", default=False)

SLICE_S = 0.001  # work let through per loop iteration before the loop polls its sockets again (s)
MAX_BATCH = 1024


class Turns:
    """The turns of one event loop (:func:`take_turn` keeps one per loop).

    Args:
        loop: the event loop.
        slice_s: work per iteration (:data:`SLICE_S`).
        clock: seconds (for tests; default ``time.perf_counter``).
    """

    __slots__ = ("loop", "slice_s", "clock", "queue", "started", "armed", "batch", "run_start", "waited")

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_s: float = SLICE_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.loop = loop
        self.slice_s = slice_s
        self.clock = clock
        self.queue: deque[asyncio.Future[None]] = deque()
        self.started: float | None = None  # when the first turn of this iteration went (None: none yet)
        self.armed = False  # a tick is scheduled for the next iteration
        self.batch = 1
        self.run_start: float | None = None  # when the first of the last woken batch resumed
        self.waited = 0  # turns that had to wait (for tests and diagnostics)

    async def turn(self) -> None:
        """Return when this caller may do its piece of work (at once while the iteration's slice lasts)."""
        if not self.queue:
            now = self.clock()
            if self.started is None:
                self.started = now
                self._arm()
                return
            if now - self.started < self.slice_s:
                return
        fut = self.loop.create_future()
        self.queue.append(fut)
        self.waited += 1
        self._arm()
        await fut
        if self.run_start is None:
            self.run_start = self.clock()

    def _arm(self) -> None:
        if not self.armed:
            self.armed = True
            self.loop.call_soon(self._tick)

    def _tick(self) -> None:
        """One iteration later (the loop polled in between): a new slice, and the next batch of waiters."""
        now = self.clock()
        # the woken batch ran just before this tick (both were scheduled in the same iteration, the batch first);
        # the reads that follow in the iteration are not its work
        took = now - self.run_start if self.run_start is not None else 0.0
        self.run_start = None
        self.armed = False
        self.started = None
        q = self.queue
        if not q:
            self.batch = 1
            return
        self.batch = min(self.batch * 2, MAX_BATCH) if took < self.slice_s else max(1, self.batch // 2)
        woken = 0
        while q and woken < self.batch:
            fut = q.popleft()
            if not fut.done():  # a cancelled waiter is skipped
                fut.set_result(None)
                woken += 1
        self.started = now  # the woken run in the next iteration, in this slice
        self._arm()


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns] = weakref.WeakKeyDictionary()


def scheduled_task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task for a request due now on a schedule: its send goes at once (no turn), its end takes one."""
    ctx = contextvars.copy_context()
    ctx.run(_SCHEDULED.set, True)
    return asyncio.get_running_loop().create_task(coro, context=ctx)


async def take_turn(send: bool = False) -> None:
    """Wait for this caller's turn on the running loop (:class:`Turns`); ``send``: before a request's send, which
    a request of a schedule (:func:`scheduled_task`) makes at once."""
    if send and _SCHEDULED.get():
        return
    loop = asyncio.get_running_loop()
    t = _turns.get(loop)
    if t is None:
        t = _turns[loop] = Turns(loop)
    await t.turn()
