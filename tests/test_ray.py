"""bench.raypool: measured waves in Ray actors on a local two-node Ray cluster, every process on 127.0.0.1.

One module-scoped cluster (``ray.cluster_utils.Cluster``: a head and one worker node, both bound to 127.0.0.1,
health checks every 0.5 s so a removed node is noticed in about a second) and ``bench sim`` in a thread of the test
process. What is checked: every listening socket of the Ray processes is on loopback; the actors spread over both
nodes; the wave gives the same figures as local workers (the sim's truth, decode 50 tok/s per stream) with one
clock (every arrival at or after the sim's write, within the offset uncertainty); the run section names the nodes
and offsets (via ``bench run --ray``); a node removed mid-wave loses only its in-flight requests, as failed records.

Marked ``ray`` (``pytest -m ray``); about 30-60 s on a 2-core CI runner, most of it Ray starting.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from collections.abc import Iterator
from typing import Any

import pytest

# Ray rewrites 127.0.0.1 to the host's interface address unless told it runs single-host (read at import)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from bench.cli import main  # noqa: E402
from bench.client import ClientSettings, RequestSpec  # noqa: E402
from bench.metrics import request_metrics  # noqa: E402
from bench.raypool import RayPool, estimate_offset  # noqa: E402
from bench.sim import SimConfig, running_sim  # noqa: E402

pytestmark = pytest.mark.ray
MODEL = "bench-sim"
STEP_MS = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    fast_health = {"health_check_period_ms": 500, "health_check_failure_threshold": 2,
                   "health_check_initial_delay_ms": 0}
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "_system_config": fast_health})
    worker = c.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    c.bench_worker = worker  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with running_sim(SimConfig(decode_step_ms=STEP_MS, prefill_tok_s=1e6)) as base:
        yield base


def specs(n: int, tag: str, tokens: int | list[int] = 12) -> list[RequestSpec]:
    toks = tokens if isinstance(tokens, list) else [tokens] * n
    return [RequestSpec(f"{tag}-{i:03d}", "chat", {"messages": [{"role": "user", "content": f"ray {tag} {i}"}],
                                                   "max_tokens": toks[i]}, {"stream": i}) for i in range(n)]


def _loopback(ip: str) -> bool:
    import ipaddress

    a = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return a.is_loopback


def _ray_listeners() -> list[tuple[str, int, str]]:
    """Listening sockets of this machine's Ray processes (gcs_server, raylet, ray:: workers...)."""
    import psutil  # ray ships it

    out = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status != psutil.CONN_LISTEN or not conn.pid:
            continue
        try:
            name = " ".join(psutil.Process(conn.pid).cmdline()[:2])
        except psutil.Error:
            continue
        if "ray" in name or "gcs_server" in name or "raylet" in name:
            out.append((conn.laddr.ip, conn.laddr.port, name[:80]))
    return out


def test_offset_estimate_takes_the_fastest_round_trip() -> None:
    calls = iter([(5_000, 900), (1_000, 100), (3_000, 500)])  # (delay ns, remote answer - midpoint)
    import time

    async def call() -> int:
        _delay, skew = next(calls)
        return time.perf_counter_ns() + 1_000_000 + skew  # remote clock 1 ms ahead

    off, unc = asyncio.run(estimate_offset(call, rounds=3))
    assert abs(off - 1_000_000) < max(unc, 200_000) and unc > 0


def test_wave_on_two_nodes_like_local_workers(cluster: Any, sim: str) -> None:
    pool = RayPool(sim, model=MODEL, settings=ClientSettings(), workers=2, address=cluster.address,
                   concurrency=8)
    try:
        pool.start()
        listeners = _ray_listeners()
        assert listeners and all(_loopback(ip) for ip, _, _ in listeners), listeners
        assert len({x["node_id"] for x in pool.info}) == 2  # round-robin: one actor per node
        recs = asyncio.run(pool.arun(specs(6, "two")))
    finally:
        pool.close()
    assert [r.request_id for r in recs] == [f"two-{i:03d}" for i in range(6)]
    assert all(r.ok for r in recs), [r.error for r in recs]
    nodes = pool.nodes_report()
    assert len(nodes) == 2 and all(n["uncertainty_ns"] is not None and n["ip"] == "127.0.0.1" for n in nodes)
    for r in recs:
        unc = next(n["uncertainty_ns"] for n in nodes if n["node_id"] == r.meta["node"])
        m = request_metrics(r)
        assert m.decode_tok_s == pytest.approx(1000.0 / STEP_MS, rel=0.08)  # the sim's truth, on its own clock
        for e in r.events:
            if e.write_ns is not None:  # one host: the driver's clock is the sim's; offset error within RTT/2
                assert r.sent_ns + e.t_ns - e.write_ns >= -unc - 50_000
    firsts = [r.sent_ns + next(e.t_ns for e in r.events if e.has_text) for r in recs]
    assert (max(firsts) - min(firsts)) / 1e6 < 3 * STEP_MS + 50  # all hosts start together
    assert len(pool.last_cpu_s) == 2


def test_node_lost_mid_wave_fails_only_in_flight(cluster: Any, sim: str) -> None:
    pool = RayPool(sim, model=MODEL, settings=ClientSettings(), workers=2, address=cluster.address,
                   concurrency=8)
    worker_id = cluster.bench_worker.node_id

    async def wave_then_kill() -> list[Any]:
        task = asyncio.ensure_future(pool.arun(specs(4, "lost", [2, 2, 60, 60])))  # short ones end at ~60 ms
        await asyncio.sleep(0.8)
        await asyncio.get_running_loop().run_in_executor(None, cluster.remove_node, cluster.bench_worker)
        return await asyncio.wait_for(task, 60)

    try:
        pool.start()
        on_worker = [i for i, x in enumerate(pool.info) if x["node_id"] == worker_id]
        assert on_worker, pool.info
        recs = asyncio.run(wave_then_kill())
        after = asyncio.run(pool.arun(specs(2, "after", 4)))  # the survivor takes the whole next wave
    finally:
        pool.close()
        cluster.bench_worker = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    lost = [r for r in recs if not r.ok]
    assert lost and all(r.error_kind == "worker_lost" and r.meta["node"] == worker_id for r in lost)
    # the worker node's short request had finished before the loss: it is kept, only the long one is lost
    assert sorted(r.meta["stream"] for r in lost) in ([2], [3])
    assert sum(r.ok for r in recs) == 3
    assert all(r.ok for r in after) and {r.meta["node"] for r in after} != {worker_id}
    assert any(n["lost_actors"] == 1 for n in pool.nodes_report())


def test_bench_run_with_ray(cluster: Any, sim: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", sim, "--profile", "quick", "--depths", "0", "--streams", "4", "--repeats", "4",
               "--max-tokens", "16", "--ray", cluster.address, "--workers", "2", "--out", str(tmp_path), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    run = res["run"]
    assert run["workers"] == 2 and run["ray"]["address"] == cluster.address
    assert len(run["ray"]["nodes"]) == 2
    assert all(n["offset_ns"] is not None and n["uncertainty_ns"] >= 0 for n in run["ray"]["nodes"])
    cell = res["cells"][0]
    assert cell["requests_ok"] == 4
    assert cell["decode_tok_s"]["median"] == pytest.approx(50.0, rel=0.06)
    assert cell["aggregate_decode_tok_s"]["median"] == pytest.approx(200.0, rel=0.1)
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["meta"].get("phase") == "measure"]
    assert len(measured) == 4 and len({r["meta"]["node"] for r in measured}) == 2
    assert statistics.median(r["end_ns"] for r in measured) > 0
