"""An open-loop schedule opens its first connections before its start (bench.client.endpoint.warm_pool), in one
process (bench.load.openloop.run_plan) and in a worker's share (bench.session.workers.share_records), against
``bench sim`` in its own process."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bench.load.openloop as openloop
from bench.client import ClientSettings, RequestSpec, make_http_client
from bench.client.endpoint import preconnect_count
from bench.config.profile import Profile
from bench.driver import run_load
from bench.load.point import LoadSettings
from bench.session.workers import share_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from simproc import SimProcess  # noqa: E402


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(decode_step_ms=2, prefill_tok_s=1e9, max_running=512) as s:
        yield s


def test_one_process_opens_its_first_connections_before_the_start(sim: SimProcess, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real = openloop.warm_pool

    async def spy(client: Any, base: str, offsets: list[int], start_ns: int) -> int:
        opened = await real(client, base, offsets, start_ns)
        calls.append({"opened": opened, "want": preconnect_count(offsets), "left_ns": start_ns - time.perf_counter_ns(),
                      "idle": client.bench_fast_pool.idle_count(base)})
        return opened

    monkeypatch.setattr(openloop, "warm_pool", spy)
    ls = LoadSettings(rate=100.0, duration_s=0.6, arrival="constant", input_tokens="16", warmup_s=0.0)
    res = asyncio.run(run_load(sim.base, Profile(name="t", max_tokens=2, warmup=0, overhead_probes=1),
                               ClientSettings(), ls, out_dir=tmp_path)).to_dict()
    assert res["cells"][0]["counts"]["failed"] == 0
    [call] = calls
    assert call["want"] == 25  # 100 req/s: those due in the first 0.25 s
    assert call["idle"] >= 25 and call["opened"] >= 25 - 2  # the probes' connections may already be idle
    assert call["left_ns"] > 0  # done before the first request was due


def test_a_workers_share_opens_its_first_connections_before_the_start(sim: SimProcess) -> None:
    specs = [RequestSpec(f"r{k}", "completions", {"prompt": "hi", "max_tokens": 2}, {}) for k in range(30)]
    offsets = [k * 10_000_000 for k in range(30)]  # 100 req/s for 0.3 s

    async def main() -> tuple[int, int, list[Any]]:
        client = make_http_client(ClientSettings(), 64)
        start = time.perf_counter_ns() + 300_000_000
        try:
            recs = [rec async for _, rec in share_records(client, sim.base, specs, model="bench-sim", secret=None,
                                                          start_ns=start, offsets=offsets)]
            first_sent = min(r.sent_ns for r in recs)
            return client.bench_fast_pool.connects, first_sent - start, recs
        finally:
            await client.aclose()

    connects, first_late_ns, recs = asyncio.run(main())
    assert all(r.ok for r in recs) and len(recs) == 30
    assert connects >= preconnect_count(offsets) == 25  # one request at a time would open one or two
    assert 0 <= first_late_ns < 50_000_000
