"""Load from many hosts: bench's measured waves, or an open-loop schedule, read by Ray actors (``bench run URL
--ray ADDRESS --workers N``, with or without ``--rate R`` / ``--trace FILE``).

When one host cannot generate the load (thousands of streams, a cluster of replicas behind a router),
:class:`RayPool` runs N actors spread over the nodes of a Ray cluster (round-robin over the live nodes), each with its own
event loop and bench client (:func:`bench.client.make_http_client` + :func:`bench.client.stream_request`, exactly
as :mod:`bench.session.workers`), and gives each a share of every wave (:func:`bench.session.workers.split_specs`); an actor runs
its share with the worker processes' own code (:func:`bench.session.workers.share_records`). It has the interface of
:class:`bench.session.workers.WorkerPool`: ``start()``, ``await arun(specs, offsets=None) -> list[RequestRecord]``,
``close()``, ``workers``, ``last_cpu_s``, ``last_lag_ns`` (each actor's event-loop lag samples during the last
wave, :class:`bench.session.loop_lag.LagMonitor`: the cell's lag is the worst actor's). Needs ``pip install 'bench[ray]'``
(ray pinned) on the driver and on every node; the driver's copy of the ``bench`` package is shipped to the actors
(``runtime_env`` ``py_modules``), so every node runs the same code. The API key is read from the environment of
each actor (set the variable where ``ray start`` runs); it is never sent through Ray.

Clocks. Each host stamps on its own ``perf_counter_ns`` (CLOCK_MONOTONIC, or kernel stamps converted to it); hosts'
clocks differ by an unknown offset. Before every wave the driver estimates each actor's offset by round trips
through Ray, NTP-style: ``offset = t_actor - (t_send + t_back) / 2`` from the round trip with the smallest RTT of
``OFFSET_ROUNDS``, uncertainty ``RTT / 2`` (the true offset is within it whatever the path asymmetry). Then

* every actor starts its share at one driver-clock instant (converted to its own clock), so the streams of all
  hosts start together; in an open-loop share (``offsets``) request i is due at that instant + ``offsets[i]``, so
  every due time is a driver-clock time converted to the actor's clock;
* each record's absolute times (``queued_ns``, ``sent_ns``, ``scheduled_ns``) are moved onto the driver's clock, so
  the schedule is the driver's and windows over many hosts (aggregate decode) are on one clock, within the
  offsets' uncertainty; event times are relative to
  ``sent_ns`` and every per-request metric (TTFT, ITL, decode rate) is a difference on the host's own clock,
  untouched by the offset. ``meta["node"]`` and ``meta["clock_offset_ns"]`` say where a record came from and by
  how much it was moved.

:meth:`RayPool.nodes_report` names the nodes, their actors and each node's offset with its uncertainty (the run
section of results.json, ``run.nodes``).

Failures. Records stream back as each request finishes (a Ray streaming generator; ``on_record`` gets each as it
comes), so an actor or node lost mid-wave loses only its requests still in flight (in open loop also those not
yet sent): each becomes a cut record (``error_kind = "worker_lost"``, the error names the node; in open loop with
its ``scheduled_ns``), counted as cut, never as a server failure and never silently dropped; the lost actor gets
no later wave (the others take its share; a wave with no actor left is all cut records); :meth:`RayPool.warnings`
names each lost node once.

Joining. A Ray driver joins through a Ray node on its own machine; with a non-loopback ADDRESS bench picks the
local node at the address this machine reaches the head from (:func:`driver_ip`), so the actors on other hosts
reach the driver back (a driver's machine that is not a load host runs ``ray start --num-cpus 0``; nodes without
CPUs get no actor). Before the first wave each actor makes its client, probes the kernel's receive stamps and
opens a connection to the server (``warm``), so the first requests of an open-loop share go on time.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.client import ClientSettings, RequestSpec, make_http_client
from bench.errors import RayClusterError
from bench.records import RequestRecord
from bench.session.loop_lag import LagMonitor
from bench.session.workers import share_records, split_specs
from bench.warns import warning

__all__ = ["RayPool", "estimate_offset", "driver_ip", "OFFSET_ROUNDS"]

OFFSET_ROUNDS = 8
DEFAULT_START_DELAY_S = 0.25  # a wave's start time this far ahead on the driver's clock (covers Ray's dispatch)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class BenchActor:
    """The actor body (wrapped by ``ray.remote`` in :meth:`RayPool.start`): one event loop, one bench client."""

    def __init__(self, base: str, model: str, settings: ClientSettings, concurrency: int) -> None:
        self.base = base
        self.model = model
        self.settings = settings
        self.concurrency = concurrency
        self.client: Any = None

    async def hello(self) -> dict[str, Any]:
        """Where this actor runs."""
        import ray

        ctx = ray.get_runtime_context()
        node_ip: Callable[[], str] = ray.util.get_node_ip_address  # untyped in ray
        return {"node_id": ctx.get_node_id(), "host": socket.gethostname(), "pid": os.getpid(),
                "ip": node_ip(), "bench": str(Path(__file__).resolve().parents[1])}

    async def warm(self) -> bool:
        """Do once, before any wave, what the first request would do late: make the client, probe the kernel's
        receive stamps (and keep them on) and open a TCP connection to the server (its route and ARP entry).
        Returns whether the server's port took the connection."""
        from urllib.parse import urlsplit

        from bench.transport.kernel_stamps import kernel_stamps_supported

        if self.client is None:
            self.client = make_http_client(self.settings, self.concurrency)
        kernel_stamps_supported()
        u = urlsplit(self.base)
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port or (443 if u.scheme == "https"
                                                                                         else 80)), 10)
        except (OSError, TimeoutError):
            return False
        w.close()
        return True

    async def clock(self) -> int:
        """This host's ``perf_counter_ns`` now (for the offset estimate)."""
        return time.perf_counter_ns()

    async def wave(self, specs: list[RequestSpec], start_ns: int, offsets: list[int] | None = None) -> Any:
        """Send ``specs`` at ``start_ns`` (this host's clock), or spec i at ``start_ns + offsets[i]`` (an open-loop
        share: :func:`bench.session.workers.share_records`); yield each record's dict as it finishes, then ``{"cpu_s": ...,
        "lag_ns": [...]}`` (this actor's CPU seconds and its event loop's lag samples meanwhile)."""
        if self.client is None:
            self.client = make_http_client(self.settings, self.concurrency)
        cpu0 = time.process_time()
        mon = LagMonitor()
        gc.disable()
        try:
            async for _, rec in share_records(self.client, self.base, specs, model=self.model,
                                              secret=self.settings.api_key, start_ns=start_ns, offsets=offsets,
                                              monitor=mon):
                yield rec.to_dict()
        finally:
            gc.enable()
        yield {"cpu_s": time.process_time() - cpu0, "lag_ns": mon.samples_ns}
        gc.collect()

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


async def estimate_offset(clock_call: Any, rounds: int = OFFSET_ROUNDS) -> tuple[int, int]:
    """``(offset_ns, uncertainty_ns)`` of a remote clock: ``clock_call()`` is awaited and returns the remote
    ``perf_counter_ns``; the round trip with the smallest RTT counts (offset = remote - midpoint, RTT / 2)."""
    best_rtt, best_off = -1, 0
    perf = time.perf_counter_ns
    for _ in range(max(1, rounds)):
        t0 = perf()
        tr = await clock_call()
        t1 = perf()
        rtt = t1 - t0
        if best_rtt < 0 or rtt < best_rtt:
            best_rtt, best_off = rtt, int(tr) - (t0 + t1) // 2
    return best_off, (best_rtt + 1) // 2


def _lost_record(spec: RequestSpec, model: str, node: str, why: str, scheduled_ns: int | None = None) -> RequestRecord:
    """The failed record of a request lost with its actor (``scheduled_ns``: its due time on the driver's clock, in
    an open-loop share; it was in flight or not yet sent)."""
    rec = RequestRecord(spec.request_id, spec.endpoint, model, queued_ns=scheduled_ns or 0,
                        meta={**spec.meta, "node": node}, scheduled_ns=scheduled_ns)
    rec.error = (f"cut: bench's Ray actor on node {node} was lost mid-run; the request was in flight or not yet "
                 f"sent ({why})")
    rec.error_kind = "worker_lost"
    return rec


class RayPool:
    """N bench actors on a Ray cluster, kept between waves (module docstring).

    Args:
        base: normalized base URL (reachable from every node).
        model: model name sent with every request.
        settings: client settings (the API key variable is read on each node).
        workers: actors (>= 1), placed round-robin over the live nodes (``workers = k x nodes`` gives k per node).
        address: the Ray cluster (``ray start`` prints it, e.g. ``10.0.0.1:6379``); ``None``: ``RAY_ADDRESS`` or
            a local Ray.
        concurrency: the most streams one wave may have (sizes each actor's connection pool).
        ship_code: send the driver's ``bench`` package to the actors (``runtime_env`` ``py_modules``).
    """

    def __init__(self, base: str, *, model: str, settings: ClientSettings, workers: int, address: str | None = None,
                 concurrency: int = 1024, ship_code: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.base, self.model, self.settings = base, model, settings
        self.workers = workers
        self.address = address
        self.concurrency = max(1, concurrency)
        self.ship_code = ship_code
        self.last_cpu_s: list[float] = []
        self.last_lag_ns: list[list[int]] = []  # per actor: its loop's lag samples during the last wave
        self.actors: list[Any] = []
        self.info: list[dict[str, Any]] = []  # per actor: hello() + offset_ns, uncertainty_ns, alive
        self._inited = False

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> RayPool:
        """Connect to the cluster, start the actors and wait until each answers. Raises
        :class:`~bench.errors.RayClusterError` when ray is not installed, the cluster cannot be joined or the
        actors do not start."""
        if self.actors:
            return self
        ray = _import_ray(self.address)
        if not ray.is_initialized():
            self._join(ray)
        per = -(-self.concurrency // self.workers) + 4
        cls = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=max(64, per * 2))(BenchActor)
        nodes = _alive_nodes(ray)
        self.actors = [cls.options(scheduling_strategy=_on_node(ray, nodes, k)).remote(
            self.base, self.model, self.settings, per) for k in range(self.workers)]
        try:
            self.info = [dict(x, alive=True) for x in ray.get([a.hello.remote() for a in self.actors], timeout=120)]
            for x, reached in zip(self.info, ray.get([a.warm.remote() for a in self.actors], timeout=60)):
                x["reached_server"] = bool(reached)
        except Exception as e:  # noqa: BLE001
            self.close()
            raise RayClusterError(f"bench's Ray actors did not start: {e}") from None
        return self

    def _join(self, ray: Any) -> None:
        """``ray.init`` on this machine's Ray node: the one at the address this machine reaches the head from
        (:func:`driver_ip`), so that the actors on other hosts reach the driver back at an address of its own."""
        env = {"py_modules": [str(Path(__file__).resolve().parents[1])]} if self.ship_code else {}
        extra: dict[str, Any] = {} if self.address else {"include_dashboard": False}  # only for a Ray started here
        ip = driver_ip(self.address)
        if ip is not None:
            extra["_node_ip_address"] = ip
        _cluster_errors_to_stderr()
        try:
            ray.init(address=self.address, runtime_env=env, log_to_driver=False, **extra)
        except Exception as e:  # noqa: BLE001 - ray raises many kinds (ConnectionError, RuntimeError...)
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            if ip is not None and "No node info found" in msg:
                msg = (f"no Ray node of the cluster runs on this machine at {ip} (the address it reaches the head "
                       f"from); a Ray driver joins through a node of its own machine: run bench on a node of the "
                       f"cluster, or start one here first: ray start --address {self.address} --num-cpus 0 "
                       f"--node-ip-address {ip}")
            raise RayClusterError(f"cannot join the Ray cluster at {self.address or 'RAY_ADDRESS'}: {msg}") from None
        self._inited = True

    def close(self) -> None:
        """Stop the actors (and leave the cluster when this pool joined it). Idempotent."""
        if not self.actors and not self._inited:
            return
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors = []
        if self._inited:
            ray.shutdown()
            self._inited = False

    def __enter__(self) -> RayPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clocks ------------------------------------------------------------------------------------------------
    async def measure_offsets(self) -> None:
        """Estimate every live actor's clock offset to the driver (concurrently)."""
        live = [i for i, x in enumerate(self.info) if x["alive"]]

        async def one(i: int) -> None:
            async def call() -> int:
                return int(await self.actors[i].clock.remote())

            try:
                off, unc = await estimate_offset(call)
            except Exception:  # noqa: BLE001 - the actor is gone: the wave will find out and count it
                return
            self.info[i]["offset_ns"], self.info[i]["uncertainty_ns"] = off, unc

        await asyncio.gather(*(one(i) for i in live))

    def nodes_report(self) -> list[dict[str, Any]]:
        """Per node: id, host, ip, actors (total and lost), the offset with the smallest uncertainty (ns) and,
        for a node lost mid-run, ``cut`` (its requests in flight or not yet sent) and ``kept`` (its finished
        requests of the wave it was lost in)."""
        nodes: dict[str, dict[str, Any]] = {}
        for x in self.info:
            n = nodes.setdefault(x["node_id"], {"node_id": x["node_id"], "host": x["host"], "ip": x["ip"],
                                                "actors": 0, "lost_actors": 0, "offset_ns": None,
                                                "uncertainty_ns": None, "cut": 0, "kept": 0})
            n["actors"] += 1
            n["lost_actors"] += 0 if x["alive"] else 1
            n["cut"] += int(x.get("cut", 0))
            n["kept"] += int(x.get("kept", 0))
            unc = x.get("uncertainty_ns")
            if unc is not None and (n["uncertainty_ns"] is None or unc < n["uncertainty_ns"]):
                n["offset_ns"], n["uncertainty_ns"] = x["offset_ns"], unc
        return list(nodes.values())

    def warnings(self) -> list[str]:
        """One line per node lost mid-run: what was kept, what was cut, and what to do."""
        out = []
        for n in self.nodes_report():
            if n["lost_actors"]:
                left = sum(1 for x in self.info if x["alive"])
                out.append(warning("node-lost", node=n["node_id"][:12], ip=n["ip"], cut=n["cut"], kept=n["kept"],
                                   left=left))
        return out

    # -- waves -------------------------------------------------------------------------------------------------
    async def arun(self, specs: Sequence[RequestSpec], *, start_delay_s: float = DEFAULT_START_DELAY_S,
                   offsets: Sequence[int] | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
        """One wave over the live actors, all starting at one driver-clock time ``start_delay_s`` from now.
        Returns the records in the order of ``specs``, on the driver's clock; lost requests are failed records.

        ``offsets`` (ns, sorted, one per spec) makes it an open-loop schedule, as :meth:`WorkerPool.run
        <bench.session.workers.WorkerPool.run>`: spec i is due at the start + ``offsets[i]`` on the driver's clock; the
        actor it is dealt to sends it at that instant on its own clock, and its record's ``scheduled_ns`` is the
        driver-clock due time. ``on_record`` is called with each record as it comes back (a lost request's
        record when its actor is found lost), so a results folder has them before the wave ends."""
        specs = list(specs)
        if not specs:
            return []
        if not self.actors:
            raise RuntimeError("RayPool.arun before start()")
        await self.measure_offsets()
        live = [i for i, x in enumerate(self.info) if x["alive"]]
        start = time.perf_counter_ns() + int(start_delay_s * 1e9)
        offs = None if offsets is None else [int(x) for x in offsets]
        if not live:
            lost = [_lost_record(s, self.model, "?", "no live actor left", _due(start, offs, j))
                    for j, s in enumerate(specs)]
            if on_record is not None:
                for r in lost:
                    on_record(r)
            return lost
        shares = split_specs(specs, len(live))
        out: list[RequestRecord | None] = [None] * len(specs)
        done = await asyncio.gather(*(self._share(live[k], specs, idx, start, offs, out, on_record)
                                      for k, idx in enumerate(shares)))
        self.last_cpu_s = [float(d["cpu_s"]) for d in done if d is not None]
        self.last_lag_ns = [[] for _ in self.actors]
        for k, d in zip(live, done):
            self.last_lag_ns[k] = list(d["lag_ns"]) if d is not None else []
        return out  # type: ignore[return-value]

    async def _share(self, i: int, specs: list[RequestSpec], idx: list[int], start: int, offsets: list[int] | None,
                     out: list[RequestRecord | None],
                     on_record: Callable[[RequestRecord], None] | None = None) -> dict[str, Any] | None:
        """Run actor i's share (``specs[j]`` for j in ``idx``; in open loop due at ``start + offsets[j]``) and fill
        ``out`` at ``idx``; returns the actor's closing ``{"cpu_s", "lag_ns"}`` (None when it was lost)."""
        info = self.info[i]
        off = int(info.get("offset_ns") or 0)
        pos = {specs[j].request_id: j for j in idx}
        mine = None if offsets is None else [offsets[j] for j in idx]
        tail: dict[str, Any] | None = None
        try:
            gen = self.actors[i].wave.options(num_returns="streaming").remote([specs[j] for j in idx], start + off,
                                                                               mine)
            async for ref in gen:
                d = await ref
                if "request_id" not in d:
                    tail = d
                    continue
                rec = _to_driver_clock(RequestRecord.from_dict(d), off, info["node_id"])
                out[pos.pop(rec.request_id)] = rec
                if on_record is not None:
                    on_record(rec)
        except Exception as e:  # noqa: BLE001 - RayActorError, ActorDiedError, node failures...
            info["alive"] = False
            why = (str(e).strip() or type(e).__name__).splitlines()[0][:200]
            for j in pos.values():
                out[j] = lost = _lost_record(specs[j], self.model, info["node_id"], why, _due(start, offsets, j))
                if on_record is not None:
                    on_record(lost)
            info["cut"] = info.get("cut", 0) + len(pos)
            info["kept"] = info.get("kept", 0) + len(idx) - len(pos)
            return None
        return tail


def _due(start: int, offsets: list[int] | None, j: int) -> int | None:
    """Spec j's due time on the driver's clock in an open-loop run (None in a wave)."""
    return None if offsets is None else start + offsets[j]


def _to_driver_clock(rec: RequestRecord, off: int, node: str) -> RequestRecord:
    """Move a record's absolute times (``queued_ns``, ``sent_ns``, ``scheduled_ns``) from its actor's clock onto
    the driver's (``off`` = actor clock - driver clock) and say where it came from."""
    rec.sent_ns -= off
    rec.queued_ns -= off
    if rec.scheduled_ns is not None:
        rec.scheduled_ns -= off
    rec.meta["node"] = node
    rec.meta["clock_offset_ns"] = off
    return rec


def _cluster_errors_to_stderr() -> None:
    """Ray's driver prints the cluster's error messages (``(raylet) The node ... has been marked dead``) on
    stdout, which ``--json`` keeps for the results document alone: they go to stderr instead (bench reports a
    lost node in its own warning). Done once per process, before ``ray.init`` starts the thread that prints."""
    try:
        import ray._private.worker as rw
    except ImportError:  # another ray layout: its messages stay where ray puts them
        return
    orig = getattr(rw, "print_to_stdstream", None)
    if orig is None or getattr(orig, "bench_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        orig({**data, "is_err": True}, ignore_prefix)

    to_stderr.bench_stderr = True  # type: ignore[attr-defined]
    rw.print_to_stdstream = to_stderr


def _alive_nodes(ray: Any) -> list[str]:
    """Ids of the cluster's live nodes that offer CPUs, in a stable order (a node started with ``--num-cpus 0``
    hosts a driver, not load: it gets no actor unless no node offers CPUs)."""
    live = [n for n in ray.nodes() if n.get("Alive")]
    working = [n for n in live if float((n.get("Resources") or {}).get("CPU", 0)) > 0] or live
    return sorted(n["NodeID"] for n in working)


def driver_ip(address: str | None) -> str | None:
    """The address this machine reaches the Ray head ``address`` (``host:port``) from: the source address of a
    UDP socket connected there (nothing is sent). None for no address or a loopback one (a one-machine cluster,
    where Ray's own choice holds) or when it cannot be told."""
    if not address or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or host in _LOOPBACK or not port.isdigit():
        return None
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port)))
            ip = str(s.getsockname()[0])
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "::1" else ip


def _on_node(ray: Any, nodes: list[str], k: int) -> Any:
    """Actor k's placement: round-robin over the live nodes (pinned, so N actors on M nodes split evenly);
    Ray's SPREAD when the node list is unknown."""
    if not nodes:
        return "SPREAD"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=nodes[k % len(nodes)], soft=False)


def _import_ray(address: str | None) -> Any:
    """``import ray``; a loopback ``address`` keeps Ray's driver on loopback too (Ray would otherwise rewrite
    ``127.0.0.1`` to the host's interface address, which may not even be reachable)."""
    host = (address or "").rsplit(":", 1)[0].strip("[]")
    if host in _LOOPBACK:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise RayClusterError("--ray needs ray: pip install 'bench[ray]'") from None
    return ray
