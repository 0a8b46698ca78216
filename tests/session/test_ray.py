"""bench.session.ray_actors: measured waves in Ray actors on a local two-node Ray cluster, every process on 127.0.0.1.

One module-scoped cluster (``ray.cluster_utils.Cluster``: a head and one worker node, both bound to 127.0.0.1,
health checks every 0.5 s so a removed node is noticed in about a second) and ``bench sim`` in a thread of the test
process. What is checked: every listening socket of the Ray processes is on loopback; the actors spread over both
nodes; the wave gives the same figures as local workers (the sim's truth, decode 50 tok/s per stream) with one
clock (every arrival at or after the sim's write, within the offset uncertainty); the run section names the nodes
and offsets (via ``bench run --ray``); a node removed mid-wave loses only its in-flight requests, as failed records.
Open loop (``bench run --rate --ray``): the plan's request count at the planned rate, every record with its
``scheduled_ns``, a small send lag, each actor's loop lag in the cell; a node removed mid-point turns its requests
in flight or not yet sent into failed records with their due times.

The hosts of a one-machine cluster share one clock, so the clock arithmetic (schedule to each actor's clock, stamps
back to the driver's) is also checked without Ray, through stand-in actors whose clock reads 7 s ahead.

Marked ``ray`` (``pytest -m ray``); about 30-60 s on a 2-core CI runner, most of it Ray starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

# Ray rewrites 127.0.0.1 to the host's interface address unless told it runs single-host (read at import)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from bench.cli.app import main  # noqa: E402
from bench.client import ClientSettings, RequestSpec, make_http_client  # noqa: E402
from bench.load.point import LoadSettings, make_plan  # noqa: E402
from bench.measure.metrics import request_metrics  # noqa: E402
from bench.records import read_records  # noqa: E402
from bench.session.loop_lag import LagMonitor  # noqa: E402
from bench.session.ray_actors import RayPool, estimate_offset  # noqa: E402
from bench.session.workers import share_records  # noqa: E402
from bench.sim import SimConfig  # noqa: E402

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


SIM_CONFIG = SimConfig(decode_step_ms=STEP_MS, prefill_tok_s=1e6)  # the shared `sim` fixture


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
    lost_node = [n for n in pool.nodes_report() if n["lost_actors"] == 1]
    assert len(lost_node) == 1 and lost_node[0]["cut"] == 1 and lost_node[0]["kept"] == 1
    assert len(pool.warnings()) == 1 and "1 of its requests" in pool.warnings()[0]


def test_bench_run_with_ray(cluster: Any, sim: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", sim, "--profile", "quick", "--depths", "0", "--streams", "4", "--repeats", "4",
               "--max-tokens", "16", "--ray", cluster.address, "--workers", "2", "--out", str(tmp_path), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    run = res["run"]
    assert run["workers"] == 2 and run["ray"]["address"] == cluster.address
    assert len(run["nodes"]) == 2 and "nodes" not in run["ray"]
    assert all(n["offset_ns"] is not None and n["uncertainty_ns"] >= 0 for n in run["nodes"])
    cell = res["cells"][0]
    assert cell["requests_ok"] == 4
    assert cell["decode_tok_s"]["median"] == pytest.approx(50.0, rel=0.06)
    assert cell["aggregate_decode_tok_s"]["median"] == pytest.approx(200.0, rel=0.1)
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["meta"].get("phase") == "measure"]
    assert len(measured) == 4 and len({r["meta"]["node"] for r in measured}) == 2
    assert statistics.median(r["end_ns"] for r in measured) > 0


# ---- open loop ---------------------------------------------------------------------------------------------------
SHIFT_NS = 7_000_000_000  # the stand-in host's perf_counter reads 7 s ahead of the driver's


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def options(self, **_: Any) -> _Method:
        return self

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


async def _now(x: Any) -> Any:
    return x


class ShiftedActor:
    """A stand-in for bench's actor on a host whose clock reads ``SHIFT_NS`` ahead: the same share
    (:func:`bench.session.workers.share_records`) on this process's loop, every absolute time it is given or sends back on
    the shifted clock. ``die_after``: it is lost after sending that many records."""

    def __init__(self, base: str, die_after: int | None = None) -> None:
        self.base, self.die_after = base, die_after
        self.clock = _Method(lambda: _now(time.perf_counter_ns() + SHIFT_NS))
        self.wave = _Method(self._wave)

    async def _wave(self, specs: list[RequestSpec], start_ns: int, offsets: list[int] | None) -> AsyncIterator[Any]:
        client = make_http_client(ClientSettings(), 8)
        mon = LagMonitor()
        try:
            share = share_records(client, self.base, specs, model=MODEL, secret=None, start_ns=start_ns - SHIFT_NS,
                                  offsets=offsets, monitor=mon)
            async with contextlib.aclosing(share) as recs:
                n = 0
                async for _, rec in recs:
                    rec.sent_ns += SHIFT_NS
                    rec.queued_ns += SHIFT_NS
                    rec.scheduled_ns = None if rec.scheduled_ns is None else rec.scheduled_ns + SHIFT_NS
                    yield _now(rec.to_dict())
                    n += 1
                    if self.die_after is not None and n >= self.die_after:
                        raise RuntimeError("the node died")
            yield _now({"cpu_s": 0.0, "lag_ns": mon.samples_ns})
        finally:
            await client.aclose()


def _shifted_pool(base: str, actors: list[ShiftedActor]) -> RayPool:
    pool = RayPool(base, model=MODEL, settings=ClientSettings(), workers=len(actors))
    pool.actors = list(actors)
    pool.info = [{"node_id": f"node{k}", "host": "h", "ip": "127.0.0.1", "pid": 0, "alive": True}
                 for k in range(len(actors))]
    return pool


OFFSETS = [k * 60_000_000 for k in range(6)]  # a request every 60 ms, dealt 0, 2, 4 / 1, 3, 5


def test_open_loop_on_a_shifted_clock(sim: str) -> None:
    """Each due time goes to its actor on the actor's clock and every stamp comes back on the driver's: the
    schedule is the plan's from the start time on the driver's clock, the sends follow it, and each arrival is at
    or after the sim's write (the sim stamps on the driver's clock)."""
    pool = _shifted_pool(sim, [ShiftedActor(sim), ShiftedActor(sim)])
    before = time.perf_counter_ns()
    recs = asyncio.run(pool.arun(specs(6, "shift", 3), start_delay_s=0.1, offsets=OFFSETS))
    assert all(r.ok for r in recs), [r.error for r in recs]
    t0 = recs[0].scheduled_ns
    assert t0 is not None and before + 100_000_000 <= t0 <= before + 400_000_000  # the driver's clock, not +7 s
    assert [r.scheduled_ns - t0 for r in recs] == OFFSETS  # type: ignore[operator]
    unc = max(x["uncertainty_ns"] for x in pool.info)
    for r in recs:
        assert abs(r.meta["clock_offset_ns"] - SHIFT_NS) <= unc
        assert -unc <= r.sent_ns - r.scheduled_ns < 30_000_000 + unc  # type: ignore[operator]
        for e in r.events:
            if e.write_ns is not None:
                assert r.sent_ns + e.t_ns - e.write_ns >= -unc - 50_000
    assert {r.meta["node"] for r in recs[0::2]} == {"node0"} and {r.meta["node"] for r in recs[1::2]} == {"node1"}
    assert len(pool.last_lag_ns) == 2 and all(pool.last_lag_ns)


def test_open_loop_actor_lost_keeps_every_request(sim: str) -> None:
    """The actor lost after its first record: its other two requests (one in flight or due, one not yet sent)
    come back as failed records with their due times on the driver's clock, none dropped."""
    pool = _shifted_pool(sim, [ShiftedActor(sim), ShiftedActor(sim, die_after=1)])
    recs = asyncio.run(pool.arun(specs(6, "gone", 3), start_delay_s=0.1, offsets=OFFSETS))
    assert [r.request_id for r in recs] == [f"gone-{i:03d}" for i in range(6)]
    lost = [r for r in recs if not r.ok]
    assert [r.meta["stream"] for r in lost] == [3, 5]
    assert all(r.error_kind == "worker_lost" and r.meta["node"] == "node1" and r.sent_ns == 0 for r in lost)
    t0 = recs[0].scheduled_ns
    assert t0 is not None and [r.scheduled_ns - t0 for r in lost] == [OFFSETS[3], OFFSETS[5]]  # type: ignore[operator]
    assert pool.info[1]["alive"] is False and pool.last_lag_ns[1] == [] and pool.last_lag_ns[0]


def test_bench_run_rate_with_ray(cluster: Any, sim: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench run --rate 20 --duration 3 --ray ADDRESS --workers 2``: the schedule split over the two nodes'
    actors, the plan's 60 requests at the planned rate, the send lag small, the actors' loop lag in the cell."""
    rc = main(["run", sim, "--rate", "20", "--duration", "3", "--arrival", "constant", "--input-tokens", "16",
               "--max-tokens", "8", "--ray", cluster.address, "--workers", "2", "--out", str(tmp_path), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    run = res["run"]
    assert run["workers"] == 2 and run["ray"]["address"] == cluster.address and len(run["nodes"]) == 2
    assert all(n["offset_ns"] is not None and n["uncertainty_ns"] >= 0 for n in run["nodes"])
    cell = res["cells"][0]
    plan = make_plan(LoadSettings(rate=20.0, duration_s=3.0, arrival="constant", input_tokens="16"), 8)
    assert cell["counts"] == {"planned": len(plan), "finished": len(plan), "failed": 0, "cut": 0} and len(plan) == 60
    sc = cell["schedule"]
    assert sc["achieved_rps"] == pytest.approx(sc["planned_rps"], rel=0.02), sc
    assert sc["send_lag_ms"]["p50"] < 5.0 and sc["send_lag_ms"]["p99"] < 50.0, sc
    recs = [r for r in read_records(tmp_path / "records.jsonl") if r.meta.get("phase") == "measure"]
    assert len(recs) == 60 and all(r.scheduled_ns is not None for r in recs)
    assert len({r.meta["node"] for r in recs}) == 2
    t0 = min(r.scheduled_ns for r in recs)  # type: ignore[type-var]
    got = sorted((r.scheduled_ns - t0) / 1e9 for r in recs)  # type: ignore[operator]
    assert got == pytest.approx([p.at_s for p in plan], abs=1e-6)
    assert len(cell["client_lag"]["workers"]) == 2 and all(w["samples"] > 0 for w in cell["client_lag"]["workers"])


def test_node_lost_mid_point_keeps_every_request(cluster: Any, sim: str) -> None:
    """An open-loop share on the worker node: its first request done, its second in flight, its third not yet
    due when the node goes; the last two become worker_lost records with their due times; the other node's
    share is untouched."""
    pool = RayPool(sim, model=MODEL, settings=ClientSettings(), workers=2, address=cluster.address,
                   concurrency=8)
    worker_id = cluster.bench_worker.node_id
    offsets = [0, 0, 300_000_000, 300_000_000, 2_000_000_000, 2_000_000_000]

    async def point_then_kill() -> list[Any]:
        task = asyncio.ensure_future(pool.arun(specs(6, "ptlost", [2, 2, 60, 60, 2, 2]), offsets=offsets))
        await asyncio.sleep(0.8)
        await asyncio.get_running_loop().run_in_executor(None, cluster.remove_node, cluster.bench_worker)
        return await asyncio.wait_for(task, 60)

    try:
        pool.start()
        assert any(x["node_id"] == worker_id for x in pool.info), pool.info
        recs = asyncio.run(point_then_kill())
    finally:
        pool.close()
        cluster.bench_worker = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    assert len(recs) == 6 and all(r.scheduled_ns is not None for r in recs)
    t0 = min(r.scheduled_ns for r in recs)
    assert [r.scheduled_ns - t0 for r in recs] == offsets
    lost = [r for r in recs if not r.ok]
    assert len(lost) == 2 and all(r.error_kind == "worker_lost" and r.meta["node"] == worker_id for r in lost)
    assert sorted(r.meta["stream"] % 2 for r in lost) == [lost[0].meta["stream"] % 2] * 2  # one actor's share
    assert sorted(r.meta["stream"] // 2 for r in lost) == [1, 2]  # the one in flight and the one not yet due
    assert sum(r.ok for r in recs) == 4


def test_sessions_refuse_ray() -> None:
    """Conversations run in the driver: --ray with --sessions is refused before anything is sent."""
    from bench.config.profile import Profile
    from bench.driver import run_load
    from bench.errors import ConfigError

    with pytest.raises(ConfigError, match="--ray"):
        asyncio.run(run_load("http://127.0.0.1:9/v1", Profile(), ClientSettings(), LoadSettings(mode="sessions"),
                             out_dir=None, ray_address="127.0.0.1:1"))
