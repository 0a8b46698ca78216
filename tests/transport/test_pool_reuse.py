"""bench.transport.http.FastPool: idle connections taken in turn, opened ahead of a schedule (preconnect), and
bench.client.endpoint.warm_pool's count."""

from __future__ import annotations

import asyncio
import time

from bench.client import ClientSettings, make_http_client
from bench.client.endpoint import (
    PRECONNECT_MAX,
    PRECONNECT_WINDOW_S,
    WARM_MARGIN_NS,
    fill_pool,
    preconnect_count,
    warm_pool,
)
from bench.transport.http import FastPool
from tests.transport.test_http import Server, _get, read_request


def _numbering_handler(server_ref: list[Server], order: list[int]):
    """Keeps each connection open and notes, per request, the index of the connection it came on."""

    async def h(reader, writer, i):
        while (req := await read_request(reader)) is not None:
            server_ref[0].requests.append(req)
            order.append(i)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    return h


def test_idle_connections_are_taken_in_turn() -> None:
    """Three connections opened by three concurrent requests; nine requests one after another then use each in
    turn (first in, first out), so none sits idle while requests keep coming. Taking the most recently used one
    first would send all nine on one connection."""
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            pool = FastPool()
            await asyncio.gather(*(_get(pool, srv.url) for _ in range(3)))
            first = list(order)
            order.clear()
            for _ in range(9):
                await _get(pool, srv.url)
            assert pool.connects == 3 and sorted(first) == [0, 1, 2]
            assert order == first * 3  # each connection once per round, in the order they came back
            await pool.aclose()

    asyncio.run(main())


def test_a_steady_load_keeps_its_connections_past_the_expiry() -> None:
    """Requests every 10 ms over 4 pooled connections whose idle expiry is 60 ms, for 0.3 s, then a burst of 4:
    each connection is reused within 40 ms, so none expires and the burst opens nothing (taken most-recent-first,
    three would expire and the burst would open three again: the churn this order removed)."""
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            pool = FastPool(keepalive_expiry=0.06)
            assert await pool.preconnect(srv.url, 4, timeout=5.0) == 4
            for _ in range(30):
                await _get(pool, srv.url)
                await asyncio.sleep(0.01)
            await asyncio.gather(*(_get(pool, srv.url) for _ in range(4)))
            assert pool.connects == 4 and srv.connections == 4
            await pool.aclose()

    asyncio.run(main())


def test_preconnect_opens_and_pools_without_sending() -> None:
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            pool = FastPool()
            assert await pool.preconnect(srv.url, 5, timeout=5.0) == 5
            await asyncio.sleep(0.05)
            assert srv.connections == 5 and srv.requests == [] and pool.idle_count(srv.url) == 5
            await asyncio.gather(*(_get(pool, srv.url) for _ in range(5)))  # all five go on the open ones
            assert pool.connects == 5 and sorted(order) == [0, 1, 2, 3, 4]
            assert await pool.preconnect(srv.url, 3, timeout=0.0) == 0  # no time left: nothing
            await pool.aclose()
            assert await pool.preconnect(srv.url, 3, timeout=5.0) == 0  # a closed pool opens nothing
            assert pool.connects == 5

    asyncio.run(main())


def test_preconnect_count_takes_what_falls_due_first_up_to_the_cap() -> None:
    ms = 1_000_000
    assert preconnect_count([]) == 0
    assert preconnect_count([0, 50 * ms, 100 * ms, 400 * ms]) == 3  # due within the window of the first
    assert preconnect_count([5_000 * ms + k * 100 * ms for k in range(10)]) == 3  # 5.0, 5.1, 5.2 s: from the first
    assert preconnect_count(list(range(0, 1000 * ms, ms))) == PRECONNECT_MAX  # 1,000 req/s: capped
    assert PRECONNECT_WINDOW_S * 1000 >= 3  # the window holds more than one request at 10 req/s and over


def test_warm_pool_tops_up_to_the_count_before_the_start() -> None:
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            client = make_http_client(ClientSettings(), 8)
            offsets = [k * 10_000_000 for k in range(8)]  # 100 req/s: 8 in the window
            start = time.perf_counter_ns() + 500_000_000
            assert await warm_pool(client, srv.url + "/v1", offsets, start) == 8
            assert await warm_pool(client, srv.url + "/v1", offsets, start) == 0  # already there
            assert time.perf_counter_ns() < start - WARM_MARGIN_NS
            late = time.perf_counter_ns() + WARM_MARGIN_NS // 2  # less than the margin left: nothing opens
            assert await warm_pool(client, srv.url + "/v1", offsets + offsets, late) == 0
            assert srv.connections == 8 and srv.requests == []
            await client.aclose()

    asyncio.run(main())


def test_idle_count_drops_the_expired_ones_and_fill_pool_tops_up() -> None:
    """A wave's connections that expired while its records went back are not counted as ready: ``fill_pool`` opens
    the wave's full count again before the next wave starts."""
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            client = make_http_client(ClientSettings(), 8)
            pool = client.bench_fast_pool
            pool.keepalive_expiry = 0.05
            assert await fill_pool(client, srv.url + "/v1", 4, 5.0) == 4
            assert await fill_pool(client, srv.url + "/v1", 4, 5.0) == 0  # all four still fresh
            await asyncio.sleep(0.1)
            assert pool.idle_count(srv.url) == 0  # expired: closed and dropped
            assert await fill_pool(client, srv.url + "/v1", 4, 5.0) == 4
            assert await fill_pool(client, srv.url + "/v1", 6, 0.0) == 0  # no time given: nothing
            assert pool.connects == 8 and srv.requests == []
            await client.aclose()

    asyncio.run(main())
