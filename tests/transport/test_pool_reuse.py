"""bench.transport.http.FastPool: the most recently used idle connection first, connections opened ahead of a wave
(preconnect, bench.client.endpoint.fill_pool)."""

from __future__ import annotations

import asyncio

from bench.client import ClientSettings, make_http_client
from bench.client.endpoint import fill_pool
from bench.transport.http import FastPool
from tests.transport.test_http import Server, _get, read_request, settled_connects


def _numbering_handler(server_ref: list[Server], order: list[int]):
    """Keeps each connection open and notes, per request, the index of the connection it came on."""

    async def h(reader, writer, i):
        while (req := await read_request(reader)) is not None:
            server_ref[0].requests.append(req)
            order.append(i)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    return h


def test_the_most_recently_used_idle_connection_goes_first() -> None:
    """Three connections opened by three concurrent requests; nine requests one after another then all go on the
    one that came back last, a connection the server is serving (a server with a thread per connection, as
    llama-server, may not serve the others: benchmarks/results/pool_order-2026-12-05-vm.md)."""
    ref: list[Server] = []
    order: list[int] = []

    async def main():
        async with Server(_numbering_handler(ref, order)) as srv:
            ref.append(srv)
            pool = FastPool()
            await asyncio.gather(*(_get(pool, srv.url) for _ in range(3)))
            last = order[-1]
            order.clear()
            for _ in range(9):
                await _get(pool, srv.url)
            assert await settled_connects(pool, 3) == 3 and order == [last] * 9
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
