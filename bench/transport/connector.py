"""How a request that finds no idle connection gets one (:class:`Opener`, used by
:class:`bench.transport.http.FastPool`).

It waits for the first of two things: a connection another request gives back (handed over directly, oldest
waiter first), or a new connection. New connections open at a bounded pace per server: ``CONNECT_BURST`` at once,
then ``CONNECT_RATE`` per second, and never more at a time than requests wait for one.

Why: every request that found no idle connection used to open its own. After a hiccup of the event loop (tens
of ms: a page fault, the scheduler, a burst of records) every request falling due at once did that; a connect
costs 0.15-0.27 ms of the loop's CPU on a 2-core VM, so the requests due meanwhile were late as well and opened
more. At 20,000 req/s from 12 workers each worker opened 105-312 connections in 100-200 ms and stalled 39-65 ms
(benchmarks/results/schedule_accuracy-2026-12-05c-h100.md), while a connection came back every millisecond or so.
Handing those over serves the burst without opening what only that moment needed.

What it never does: cap the number of connections (a request that still waits when a token is free gets its own
new one, so a slow server gets one connection per request in flight, as before), or put a request on a
connection a server may not be serving: a new connection that no request waits for any more (a returned one
served it first) is parked by the caller where it is taken last (:meth:`FastPool._park`), because a server with a
thread per connection (llama.cpp's llama-server) leaves connections beyond its threads unserved until one is idle
for its keep-alive timeout (benchmarks/results/pool_order-2026-12-05-vm.md: 5 s).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

from bench.errors import FastIOError

__all__ = ["Opener", "open_many", "CONNECT_BURST", "CONNECT_RATE"]

CONNECT_BURST = 16  # new connections a server gets at once before the pace applies
CONNECT_RATE = 2000.0  # then per second and server (per process: each worker has its own pool)


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)
K = TypeVar("K", bound=Hashable)


class Opener(Generic[K, C]):
    """Waiters per server key, new connections paced by a token bucket per key.

    Args:
        connect: opens one connection to a key's server (raises on failure).
        park: takes a new connection that no waiter wants any more (the pool keeps it idle, taken last).
        release: takes back a connection handed to a waiter that was cancelled meanwhile (``fresh``: it is new).
    """

    def __init__(self, connect: Callable[[K, float | None], Awaitable[C]], park: Callable[[C], None],
                 release: Callable[[C, bool], None]) -> None:
        self._connect = connect
        self._park = park
        self._release = release
        self._waiters: dict[K, deque[asyncio.Future[tuple[C, bool]]]] = {}
        self._opening: dict[K, int] = {}
        self._tokens: dict[K, tuple[float, float]] = {}  # key: (tokens, when counted)
        self._timers: dict[K, tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle]] = {}
        self._closed = False
        self.handed = 0  # returned connections handed straight to a waiter (for tests and diagnostics)

    async def get(self, key: K, timeout: float | None) -> tuple[C, bool]:
        """A connection for one request: (connection, fresh). ``fresh``: newly opened (else one another request gave
        back). Raises what the connect raised when the connect that served this wait failed."""
        fut: asyncio.Future[tuple[C, bool]] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, deque()).append(fut)
        self._pump(key, timeout)
        try:
            return await fut
        except asyncio.CancelledError:
            self._drop(key, fut)
            raise

    def offer(self, key: K, conn: C) -> bool:
        """Hand a connection another request gave back to the oldest waiter; False when none waits."""
        fut = self._oldest(key)
        if fut is None:
            return False
        fut.set_result((conn, False))
        self.handed += 1
        return True

    def waiting(self, key: K) -> int:
        """Requests waiting for a connection to ``key``'s server (a wait cancelled a moment ago counts until its task
        runs again and leaves the queue: at most one connect too many, which is parked). O(1): :meth:`_pump` asks
        once per connect it starts, with thousands waiting when a slow server's run ramps up."""
        return len(self._waiters.get(key, ()))

    def close(self, error: BaseException) -> None:
        """Fail every waiter with ``error``; connects still under way close their connection when they finish."""
        self._closed = True
        for _, t in self._timers.values():
            t.cancel()
        self._timers.clear()
        for waiters in self._waiters.values():
            for f in waiters:
                if not f.done():
                    f.set_exception(error)
        self._waiters.clear()

    # --- internals ----------------------------------------------------------------------------------------------
    def _oldest(self, key: K) -> asyncio.Future[tuple[C, bool]] | None:
        waiters = self._waiters.get(key)
        while waiters:
            f = waiters.popleft()
            if not f.done():
                return f
        return None

    def _drop(self, key: K, fut: asyncio.Future[tuple[C, bool]]) -> None:
        """A cancelled wait: leave the queue; a connection already handed to it goes back."""
        waiters = self._waiters.get(key)
        if waiters is not None and fut in waiters:
            waiters.remove(fut)
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            conn, fresh = fut.result()
            self._release(conn, fresh)

    def _take_token(self, key: K) -> float:
        """Take a token if there is one: 0.0; else the seconds until the next one (nothing taken)."""
        now = time.monotonic()
        tokens, at = self._tokens.get(key, (float(CONNECT_BURST), now))
        tokens = min(float(CONNECT_BURST), tokens + (now - at) * CONNECT_RATE)
        if tokens >= 1.0:
            self._tokens[key] = (tokens - 1.0, now)
            return 0.0
        self._tokens[key] = (tokens, now)
        return (1.0 - tokens) / CONNECT_RATE

    def _pump(self, key: K, timeout: float | None) -> None:
        """Start connects while fewer are under way than requests wait, as far as the tokens allow; else come back
        when the next token is due."""
        if self._closed:
            return
        while self._opening.get(key, 0) < self.waiting(key):
            wait = self._take_token(key)
            if wait:
                loop = asyncio.get_running_loop()
                timer = self._timers.get(key)
                if timer is None or timer[0] is not loop:  # one of a loop that ended would never fire
                    self._timers[key] = (loop, loop.call_later(wait, self._due, key, timeout))
                return
            self._opening[key] = self._opening.get(key, 0) + 1
            task = asyncio.ensure_future(self._connect(key, timeout))
            task.add_done_callback(functools.partial(self._opened, key, timeout))

    def _due(self, key: K, timeout: float | None) -> None:
        self._timers.pop(key, None)
        self._pump(key, timeout)

    def _opened(self, key: K, timeout: float | None, task: asyncio.Future[C]) -> None:
        """A connect finished: its connection (or its error) goes to the oldest waiter; a connection no one waits
        for any more is parked (closed when the opener is closed)."""
        self._opening[key] -= 1
        if task.cancelled():
            return
        exc = task.exception()
        fut = self._oldest(key)
        if exc is not None:
            if fut is not None:
                fut.set_exception(exc)
        elif self._closed:
            task.result().close()
        elif fut is not None:
            fut.set_result((task.result(), True))
        else:
            self._park(task.result())
        self._pump(key, timeout)


async def open_many(connect: Callable[[], Awaitable[C]], n: int, parallel: int, timeout: float) -> list[C]:
    """Up to ``n`` connections from ``connect``, ``parallel`` at a time, within ``timeout`` seconds: those open by
    then (a failed connect stops its lane; the others go on)."""
    conns: list[C] = []
    left = [n]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            try:
                conns.append(await connect())
            except (FastIOError, OSError):
                return

    tasks = [asyncio.ensure_future(lane()) for _ in range(min(n, parallel))]
    _, late = await asyncio.wait(tasks, timeout=timeout)
    for t in late:
        t.cancel()
    if late:
        await asyncio.wait(late)
    return conns
