"""bench.transport.connector.Opener: a request with no idle connection takes the first of a connection given back
and a new one; new ones open at a bounded pace; a new one nobody waits for is parked; errors, cancellation and
closing. Then FastPool with it against a local server."""

from __future__ import annotations

import asyncio

import pytest

from bench.transport import connector
from bench.transport.connector import Opener
from bench.transport.http import FastPool
from tests.transport.test_http import Server, _get, keepalive_handler, read_request


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Harness:
    """An Opener whose connects wait until the test lets them finish (``finish``), in order."""

    def __init__(self) -> None:
        self.started: list[asyncio.Future[Conn]] = []
        self.parked: list[Conn] = []
        self.released: list[tuple[Conn, bool]] = []
        self.opener: Opener[str, Conn] = Opener(self._connect, self.parked.append,
                                                lambda c, fresh: self.released.append((c, fresh)))

    async def _connect(self, key: str, timeout: float | None) -> Conn:
        fut: asyncio.Future[Conn] = asyncio.get_running_loop().create_future()
        self.started.append(fut)
        return await fut

    def finish(self, i: int, result: Conn | BaseException) -> None:
        if isinstance(result, BaseException):
            self.started[i].set_exception(result)
        else:
            self.started[i].set_result(result)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_connection_given_back_serves_a_waiter_and_the_new_one_is_parked() -> None:
    async def main():
        h = Harness()
        got = asyncio.ensure_future(h.opener.get("k", 1.0))
        await _settle()
        assert len(h.started) == 1 and h.opener.waiting("k") == 1
        back = Conn("back")
        assert h.opener.offer("k", back)
        assert await got == (back, False)
        h.finish(0, Conn("new"))
        await _settle()
        assert [c.name for c in h.parked] == ["new"] and not h.opener.offer("k", Conn("x"))

    asyncio.run(main())


def test_new_connections_open_at_the_pace_and_never_more_than_requests_wait(monkeypatch) -> None:
    """Burst 2 and (almost) no refill: five waiters start two connects; the rest are served by connections given
    back, and no third connect starts."""
    monkeypatch.setattr(connector, "CONNECT_BURST", 2)
    monkeypatch.setattr(connector, "CONNECT_RATE", 1e-9)

    async def main():
        h = Harness()
        gets = [asyncio.ensure_future(h.opener.get("k", 1.0)) for _ in range(5)]
        await _settle()
        assert len(h.started) == 2
        h.finish(0, Conn("a"))
        h.finish(1, Conn("b"))
        await _settle()
        for name in "cde":
            h.opener.offer("k", Conn(name))
        got = await asyncio.gather(*gets)
        assert [(c.name, fresh) for c, fresh in got] == [("a", True), ("b", True), ("c", False), ("d", False),
                                                          ("e", False)]
        assert len(h.started) == 2 and h.opener.handed == 3

    asyncio.run(main())


def test_a_waiter_beyond_the_burst_gets_its_connect_when_the_next_token_is_due(monkeypatch) -> None:
    monkeypatch.setattr(connector, "CONNECT_BURST", 1)
    monkeypatch.setattr(connector, "CONNECT_RATE", 200.0)  # one token every 5 ms

    async def main():
        h = Harness()
        gets = [asyncio.ensure_future(h.opener.get("k", 1.0)) for _ in range(3)]
        await _settle()
        assert len(h.started) == 1
        for _ in range(200):
            if len(h.started) == 3:
                break
            await asyncio.sleep(0.005)
        assert len(h.started) == 3  # each waiter got a connect of its own: a slow server is never short of them
        for i in range(3):
            h.finish(i, Conn(str(i)))
        assert [c.name for c, _ in await asyncio.gather(*gets)] == ["0", "1", "2"]

    asyncio.run(main())


def test_a_failed_connect_fails_the_oldest_waiter() -> None:
    async def main():
        h = Harness()
        first = asyncio.ensure_future(h.opener.get("k", 1.0))
        second = asyncio.ensure_future(h.opener.get("k", 1.0))
        await _settle()
        h.finish(1, ConnectionRefusedError("refused"))
        with pytest.raises(ConnectionRefusedError):
            await first
        h.finish(0, Conn("a"))
        assert (await second)[0].name == "a"

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_gives_back_what_it_was_handed() -> None:
    async def main():
        h = Harness()
        gone = asyncio.ensure_future(h.opener.get("k", 1.0))
        await _settle()
        gone.cancel()
        await _settle()
        assert h.opener.waiting("k") == 0
        h.finish(0, Conn("new"))
        await _settle()
        assert [c.name for c in h.parked] == ["new"]  # no one waits: parked, not lost
        late = asyncio.ensure_future(h.opener.get("k", 1.0))
        await _settle()
        h.opener.offer("k", Conn("back"))
        late.cancel()  # handed a connection, cancelled before it ran
        await _settle()
        assert [(c.name, fresh) for c, fresh in h.released] == [("back", False)]

    asyncio.run(main())


def test_closing_fails_the_waiters_and_closes_what_opens_after() -> None:
    async def main():
        h = Harness()
        got = asyncio.ensure_future(h.opener.get("k", 1.0))
        await _settle()
        h.opener.close(RuntimeError("closed"))
        with pytest.raises(RuntimeError):
            await got
        late = Conn("late")
        h.finish(0, late)
        await _settle()
        assert late.closed and h.parked == []

    asyncio.run(main())


def test_a_burst_on_a_fast_server_is_served_by_the_connections_given_back(monkeypatch) -> None:
    """Twenty requests at once with one new connection allowed: all answered, on that one connection."""
    monkeypatch.setattr(connector, "CONNECT_BURST", 1)
    monkeypatch.setattr(connector, "CONNECT_RATE", 1e-9)
    ref: list[Server] = []

    async def main():
        async with Server(keepalive_handler(ref)) as srv:
            ref.append(srv)
            pool = FastPool()
            got = await asyncio.gather(*(_get(pool, srv.url) for _ in range(20)))
            assert [s for s, _, b in got] == [200] * 20 and pool.connects == 1 and srv.connections == 1
            assert pool._opener.handed == 19
            await pool.aclose()

    asyncio.run(main())


def test_a_slow_server_gets_a_connection_per_request_in_flight() -> None:
    """Forty requests that the server answers only once all forty arrived (more than the burst of 16): each gets
    its own connection, none waits for another's response."""
    n = 40
    ref: list[Server] = []
    arrived: list[int] = []
    everyone = asyncio.Event

    async def main():
        all_in = everyone()

        async def h(reader, writer, i):
            while (req := await read_request(reader)) is not None:
                ref[0].requests.append(req)
                arrived.append(i)
                if len(arrived) == n:
                    all_in.set()
                await all_in.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()

        async with Server(h) as srv:
            ref.append(srv)
            pool = FastPool()
            got = await asyncio.wait_for(asyncio.gather(*(_get(pool, srv.url) for _ in range(n))), 20)
            assert [s for s, _, _ in got] == [200] * n and pool.connects == n and sorted(arrived) == list(range(n))
            await pool.aclose()

    asyncio.run(main())


def test_a_pace_timer_of_an_ended_event_loop_does_not_hold_up_the_next_one(monkeypatch) -> None:
    """A pool used by two ``asyncio.run`` calls: the first ends while a waiter waits for the next token (its timer
    never fires); in the second a waiter still gets its connect when the token is due."""
    monkeypatch.setattr(connector, "CONNECT_BURST", 1)
    monkeypatch.setattr(connector, "CONNECT_RATE", 20.0)  # one token every 50 ms
    h = Harness()

    async def first():
        gets = [asyncio.ensure_future(h.opener.get("k", 1.0)) for _ in range(2)]
        await _settle()
        assert len(h.started) == 1
        for g in gets:
            g.cancel()
        await asyncio.gather(*gets, return_exceptions=True)

    async def second():
        got = asyncio.ensure_future(h.opener.get("k", 1.0))
        for _ in range(400):
            if len(h.started) == 2:
                break
            await asyncio.sleep(0.005)
        assert len(h.started) == 2
        h.finish(1, Conn("b"))
        assert (await got)[0].name == "b"

    asyncio.run(first())
    asyncio.run(second())
