"""An open-loop schedule opens connections only as its requests need them: none opened ahead, since connections
opened ahead of their requests made a real llama-server (a thread per connection) keep a request waiting 4.9-5.0 s
(benchmarks/results/pool_order-2026-12-05-vm.md). Checked on a worker's share (bench.session.workers.share_records,
the code worker processes and Ray actors run) against ``bench sim`` in its own process."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.client import ClientSettings, RequestSpec, make_http_client
from bench.session.workers import share_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from simproc import SimProcess  # noqa: E402


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(decode_step_ms=2, prefill_tok_s=1e9, max_running=512) as s:
        yield s


def test_a_schedule_opens_connections_only_as_it_needs_them(sim: SimProcess) -> None:
    """30 requests at 100 req/s, each over in a few ms: one after another on one or two connections, none opened
    ahead (before, 25 were opened before the start)."""
    specs = [RequestSpec(f"r{k}", "completions", {"prompt": "hi", "max_tokens": 2}, {}) for k in range(30)]
    offsets = [k * 10_000_000 for k in range(30)]

    async def main() -> tuple[int, list[Any]]:
        client = make_http_client(ClientSettings(), 64)
        start = time.perf_counter_ns() + 300_000_000
        try:
            recs = [rec async for _, rec in share_records(client, sim.base, specs, model="bench-sim", secret=None,
                                                          start_ns=start, offsets=offsets)]
            return client.bench_fast_pool.connects, recs
        finally:
            await client.aclose()

    connects, recs = asyncio.run(main())
    assert all(r.ok for r in recs) and len(recs) == 30
    assert connects <= 3
