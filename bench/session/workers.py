"""Spreading one wave's streams over several worker processes, for event rates one Python process cannot read
on time.

One bench process reads every stream of a wave on one event loop; past some tens of thousands of events per
second (``benchmarks/results/fidelity.md`` has the figure for this machine) it cannot take each read the moment
the data arrives, and the arrival stamps, hence TTFT and ITL, come out late. :class:`WorkerPool` runs N worker
processes, each with its own event loop and its own ``httpx`` client (:func:`bench.client.make_http_client`), and
gives each a share of the wave's requests. The workers call :func:`bench.client.stream_request` exactly as the
single-process runner does, so a record from a worker is the same record, field for field.

Clock: records hold ``time.perf_counter_ns()`` values. On Linux that is ``CLOCK_MONOTONIC``, one clock for the
whole system, so stamps taken in different processes compare directly and the records of all workers merge into
one wave (aggregate decode windows, ITL, everything). On systems where ``perf_counter`` is not system-wide the
pool refuses to start (:func:`shared_clock`).

Start: the parent picks a start time a little ahead (``start_delay_s``) on that shared clock and every worker
sends its requests at that time, so the streams of all workers start together, as the streams of a
single-process wave do. With ``offsets`` (an open-loop schedule, :func:`bench.load.openloop.run_plan_pool`) each
worker sends each request of its share at its own due time on that clock instead. One worker's share is
:func:`share_records`, which :mod:`bench.session.ray_actors`'s actors run too.

Lag: the loops that stamp the reads are the workers'. Each worker samples its own event loop's lag
(:class:`bench.session.loop_lag.LagMonitor`) while it runs its share and sends the samples back with the records
(:attr:`WorkerPool.last_lag_ns`); the cell's lag is the worst worker's (:func:`bench.session.loop_lag.workers_lag`).

Records cross the process boundary as dicts (:meth:`RequestRecord.to_dict` / :meth:`RequestRecord.from_dict`;
event times keep whole-ns precision). They come back in the order of the specs given. Failed requests come back
as records with ``error`` set, like in a single process; a worker that dies is an error (``RuntimeError``), not a
record.

Interrupt: a worker answers a job once, at its end, so an interrupted run (SIGINT, SIGTERM) calls
:meth:`WorkerPool.stop` (from :meth:`WorkerPool.arun`): each worker gets SIGUSR1, sends nothing more, cuts the
requests in flight (records with ``error_kind`` ``cancelled``, as one process cuts them) and answers with the
records it has, which the parent writes before the run stops. Ray actors (:mod:`bench.session.ray_actors`) do not
take this path yet.

While a wave runs a worker keeps Python's garbage collector off (``gc_quiet``, on by default) and collects once
the wave is over: a full collection over a wave's records stalls the process for tens of milliseconds, which
would show as late reads. Memory use grows by one wave's records at most.

Not in the workers: :class:`bench.client.StreamTap` progress counters (live counts stay in each worker) and the
runner's retry without ``min_tokens``/``ignore_eos`` (send specs whose body the server accepts).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.client.endpoint import fill_pool
from bench.client.turns import scheduled_task
from bench.records import CUT_INTERRUPTED, RequestRecord, cut_record
from bench.session.alarm import sleep_until
from bench.session.loop_lag import LagMonitor

__all__ = ["WorkerPool", "run_requests_multiproc", "arun_requests_multiproc", "split_specs", "shared_clock",
           "share_records", "sleep_until"]

DEFAULT_START_DELAY_S = 0.05
STOP_WAIT_S = 10.0  # an interrupted pool waits this long for the workers' records (in flight: cut at once)


def shared_clock() -> bool:
    """True when ``time.perf_counter_ns()`` reads a clock shared by all processes (CLOCK_MONOTONIC on Linux)."""
    try:
        info = time.get_clock_info("perf_counter")
    except ValueError:
        return False
    return sys.platform.startswith("linux") and "CLOCK_MONOTONIC" in info.implementation


def split_specs(specs: Sequence[RequestSpec], workers: int) -> list[list[int]]:
    """Indexes of ``specs`` per worker, round-robin (worker i gets i, i + n, i + 2n, ...); never an empty share
    (fewer shares than workers when there are fewer specs)."""
    n = max(1, min(int(workers), len(specs)))
    return [list(range(i, len(specs), n)) for i in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# one worker's share (worker processes and bench.session.ray_actors's actors)
# ---------------------------------------------------------------------------------------------------------------
async def share_records(client: Any, base: str, specs: Sequence[RequestSpec], *, model: str, secret: str | None,
                        start_ns: int, offsets: Sequence[int] | None = None,
                        monitor: LagMonitor | None = None,
                        stoppers: list[Callable[[], None]] | None = None) -> AsyncIterator[tuple[int, RequestRecord]]:
    """Send one worker's share and yield ``(i, record of specs[i])`` as each request ends.

    A wave (``offsets`` None): every spec goes at ``start_ns``. Open loop: spec i goes at ``start_ns + offsets[i]``
    (sorted), as :mod:`bench.load.openloop` sends (:func:`sleep_until`); its record gets ``scheduled_ns`` (= its
    ``queued_ns``) and ``meta["dispatch_lag_ns"]``. ``monitor`` samples this event loop's lag from ``start_ns`` to
    the last record. Closing the generator early cancels the requests still in flight.

    ``stoppers``: a stop function is appended while the share runs (the interrupt of a run, :meth:`WorkerPool.stop`):
    called, nothing more is sent, the requests in flight end as cut records (``error_kind`` ``cancelled``), which
    are yielded, and the generator ends; a request not yet sent gets no record, as in one process."""
    done: asyncio.Queue[tuple[int, RequestRecord | Exception | None]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int, spec: RequestSpec, sched: int | None) -> None:
        try:
            rec = await stream_request(client, base, spec, model=model, secret=secret, queued_ns=sched)
        except asyncio.CancelledError:
            rec = cut_record(spec.request_id, spec.endpoint, model, sched, dict(spec.meta), CUT_INTERRUPTED)
        except Exception as e:  # noqa: BLE001 - stream_request records failures; anything else goes to the reader
            done.put_nowait((i, e))
            return
        rec.scheduled_ns = sched
        done.put_nowait((i, rec))

    async def dispatch() -> None:
        try:
            await sleep_until(start_ns)
            if monitor is not None:
                monitor.start()
            for i, spec in enumerate(specs):
                sched = None if offsets is None else start_ns + int(offsets[i])
                if sched is not None:
                    spec.meta["dispatch_lag_ns"] = await sleep_until(sched)
                coro = one(i, spec, sched)
                tasks.append(scheduled_task(coro) if sched is not None else asyncio.create_task(coro))
        except Exception as e:  # noqa: BLE001 - never leave the reader waiting
            done.put_nowait((-1, e))

    sender = asyncio.create_task(dispatch())

    def stop() -> None:
        done.put_nowait((-2, None))

    if stoppers is not None:
        stoppers.append(stop)
    try:
        async for item in _read_share(done, len(specs), sender, tasks):
            yield item
    finally:
        if stoppers is not None and stop in stoppers:
            stoppers.remove(stop)
        sender.cancel()
        for t in tasks:
            t.cancel()
        if monitor is not None:
            monitor.stop()


async def _read_share(done: asyncio.Queue[tuple[int, RequestRecord | Exception | None]], n: int,
                      sender: asyncio.Task[None], tasks: list[asyncio.Task[None]]
                      ) -> AsyncIterator[tuple[int, RequestRecord]]:
    """The records of a share as they end: ``n`` of them, or, after a stop, those of the requests in flight."""
    for _ in range(n):
        i, got = await done.get()
        if i == -2:  # stopped: cut what is in flight, yield those records, end
            sender.cancel()
            async for item in _cut_in_flight(tasks, done):
                yield item
            return
        if isinstance(got, Exception):
            raise got
        assert got is not None
        yield i, got


async def _cut_in_flight(tasks: list[asyncio.Task[None]],
                         done: asyncio.Queue[tuple[int, RequestRecord | Exception | None]]
                         ) -> AsyncIterator[tuple[int, RequestRecord]]:
    """Cancel every request still in flight, wait until each has put its record, and yield every record queued."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
    while not done.empty():
        i, got = done.get_nowait()
        if isinstance(got, RequestRecord):
            yield i, got


async def _share(client: Any, base: str, specs: list[RequestSpec], model: str, secret: str | None, start_ns: int,
                 offsets: list[int] | None, monitor: LagMonitor,
                 stoppers: list[Callable[[], None]] | None = None) -> list[RequestRecord | None]:
    """:func:`share_records` collected in the order of ``specs`` (None: not sent before a stop)."""
    out: list[RequestRecord | None] = [None] * len(specs)
    async for i, rec in share_records(client, base, specs, model=model, secret=secret, start_ns=start_ns,
                                      offsets=offsets, monitor=monitor, stoppers=stoppers):
        out[i] = rec
    return out


# ---------------------------------------------------------------------------------------------------------------
# the worker process
# ---------------------------------------------------------------------------------------------------------------
def _next_job(conn: Any, prepare: Callable[[list[RequestSpec], list[int] | None], object] | None = None
              ) -> tuple[int, list[RequestSpec], int, list[int] | None] | None:
    """The next job from the pipe with its start time (which follows the share when the pool sends it apart: the
    worker calls ``prepare(specs, offsets)`` and then says ``("got", job_id)``), or None: told to stop, or the pipe
    closed."""
    try:
        msg = conn.recv()
        if msg is None:
            return None
        job_id, specs, start_ns, offsets = msg
        if start_ns is None:
            if prepare is not None:
                prepare(specs, offsets)
            conn.send(("got", job_id))
            start_ns = conn.recv()[2]
    except (EOFError, OSError):
        return None
    return job_id, specs, start_ns, offsets


def _preparer(loop: asyncio.AbstractEventLoop, client: Any, base: str,
              timeout_s: float) -> Callable[[list[RequestSpec], list[int] | None], None]:
    """What a worker does with a share before the start time is set: a wave's connections, one per stream, open
    (the last wave's may have expired while its records went back: 4,096 streams from 2 workers opened every one
    again at each wave's start, benchmarks/results/scale_streams-preconnect-2026-12-05-vm.md). Not for an
    open-loop share: it opens connections as it needs them (:mod:`bench.transport.connector`)."""

    def prepare(specs: list[RequestSpec], offsets: list[int] | None) -> None:
        if offsets is None:
            loop.run_until_complete(fill_pool(client, base, len(specs), timeout_s))

    return prepare


def _worker_main(conn: Any, base: str, model: str, settings: ClientSettings, concurrency: int,
                 gc_quiet: bool) -> None:
    """Entry point of a worker: serve wave jobs from ``conn`` until told to stop (``None``) or the pipe closes.

    Protocol: the worker sends ``("ready", pid)``; each job ``(job_id, [RequestSpec], start_ns, offsets)`` (offsets:
    None for a wave, else each spec's send time in ns after ``start_ns``; ``start_ns`` None: the worker answers
    ``("got", job_id)`` and the start time follows as ``("start", job_id, start_ns)``) is answered by ``("done", job_id, [record
    dict], cpu_s, lag_ns)`` (``lag_ns``: this loop's lag samples during the job, :class:`bench.session.loop_lag.LagMonitor`) or
    ``("error", job_id, text)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the pool stops
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def make() -> Any:
        return make_http_client(settings, concurrency)

    client = loop.run_until_complete(make())
    secret = settings.api_key
    stoppers: list[Callable[[], None]] = []  # SIGUSR1 (WorkerPool.stop): the running share stops, keeping its records
    if hasattr(signal, "SIGUSR1"):
        loop.add_signal_handler(signal.SIGUSR1, lambda: [f() for f in list(stoppers)])
    try:
        conn.send(("ready", os.getpid()))
        prepare = _preparer(loop, client, base, settings.connect_timeout_s)
        while (msg := _next_job(conn, prepare)) is not None:
            job_id, specs, start_ns, offsets = msg
            cpu0 = time.process_time()
            mon = LagMonitor()
            try:
                if gc_quiet:
                    gc.disable()
                recs = loop.run_until_complete(_share(client, base, specs, model, secret, start_ns, offsets, mon,
                                                      stoppers))
                cpu = time.process_time() - cpu0
                out = [None if r is None else r.to_dict() for r in recs]
                del recs
            except Exception as e:  # noqa: BLE001 - reported to the parent, which raises
                conn.send(("error", job_id, f"{type(e).__name__}: {e}"))
                continue
            finally:
                if gc_quiet:
                    gc.enable()
            conn.send(("done", job_id, out, cpu, mon.samples_ns))
            del out
            if gc_quiet:
                gc.collect()
    finally:
        try:
            loop.run_until_complete(client.aclose())
        finally:
            loop.close()
            conn.close()


def _send(conn: Any, proc: Any, msg: Any) -> None:
    try:
        conn.send(msg)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"bench worker {proc.pid} is gone: {e}") from None


# ---------------------------------------------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------------------------------------------
class WorkerPool:
    """N worker processes, each with one event loop and one HTTP client, kept alive between waves (so their
    connections are reused like the single-process runner's).

    Usage::

        with WorkerPool(base, model=model, settings=settings, workers=2, concurrency=1024) as pool:
            records = pool.run(specs)            # one wave; blocking
            records = await pool.arun(specs)     # the same from async code (the loop stays free)
            pool.last_cpu_s                       # CPU seconds each worker spent on the last wave
            pool.last_lag_ns                      # each worker's event-loop lag samples (ns) during it

    Args:
        base: normalized base URL.
        model: model name sent with every request.
        settings: client settings (the API key is read from the environment in each worker).
        workers: processes (>= 1).
        concurrency: the most streams one wave may have (sizes each worker's connection pool); default 1024.
        start_method: ``"spawn"`` (default) or ``"forkserver"``; ``"fork"`` is refused (a forked copy of a
            process with a running event loop or threads is unsafe).
        gc_quiet: keep the garbage collector off in a worker while its wave runs (module docstring).

    Raises:
        RuntimeError: the clock is not shared between processes, or a worker failed to start.
    """

    def __init__(self, base: str, *, model: str, settings: ClientSettings, workers: int,
                 concurrency: int = 1024, start_method: str = "spawn", gc_quiet: bool = True) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        self.base = base
        self.model = model
        self.settings = settings
        self.workers = workers
        self.concurrency = max(1, concurrency)
        self.start_method = start_method
        self.gc_quiet = gc_quiet
        self.last_cpu_s: list[float] = []
        self.last_lag_ns: list[list[int]] = []
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._jobs = 0
        self._stopped = False  # stop() was called: a wave may come back short
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> WorkerPool:
        """Start the workers and wait until each is ready (its imports and HTTP client done)."""
        if self._procs:
            return self
        if not shared_clock():
            raise RuntimeError("worker processes need a system-wide perf_counter clock (Linux CLOCK_MONOTONIC); "
                               f"this system has {time.get_clock_info('perf_counter').implementation}")
        ctx: Any = mp.get_context(self.start_method)  # typeshed's BaseContext lacks Process
        per_worker = -(-self.concurrency // self.workers) + 4
        try:
            for _ in range(self.workers):
                parent, child = ctx.Pipe(duplex=True)
                p = ctx.Process(target=_worker_main, name="bench-worker", daemon=True,
                                args=(child, self.base, self.model, self.settings, per_worker, self.gc_quiet))
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            for p, c in zip(self._procs, self._conns):
                if not c.poll(60):
                    raise RuntimeError(f"bench worker {p.pid} did not start within 60 s")
                msg = c.recv()
                if not (isinstance(msg, tuple) and msg[0] == "ready"):
                    raise RuntimeError(f"bench worker {p.pid} sent {msg!r} instead of ready")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the workers (idempotent): ask each to finish, then terminate any that does not within 5 s."""
        for c in self._conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(1.0)
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self._procs, self._conns = [], []

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- waves -------------------------------------------------------------------------------------------------
    def run(self, specs: Sequence[RequestSpec], *, start_delay_s: float = DEFAULT_START_DELAY_S,
            offsets: Sequence[int] | None = None) -> list[RequestRecord]:
        """Run one wave: every spec as one concurrent streaming request, spread round-robin over the workers, all
        sent at one start time, ``start_delay_s`` after the last worker got its share. Returns the records in the order of ``specs``.

        ``offsets`` (ns, sorted, one per spec) makes it an open-loop schedule instead: spec i is sent at the start
        time + ``offsets[i]`` by the worker it is dealt to (records carry ``scheduled_ns``).

        Raises:
            RuntimeError: the pool is not started, or a worker died or failed.
        """
        specs = list(specs)
        if not specs:
            return []
        if not self._procs:
            raise RuntimeError("WorkerPool.run before start()")
        with self._lock:
            self._jobs += 1
            job = self._jobs
            used = list(zip(self._conns, self._procs, split_specs(specs, self.workers)))
            self._deal(job, specs, used, offsets, start_delay_s)
            out: list[RequestRecord | None] = [None] * len(specs)
            cpu: list[float] = []
            lags: list[list[int]] = [[] for _ in range(self.workers)]
            problems: list[str] = []
            for w, (c, p, idx) in enumerate(used):  # every worker's answer is read before raising: none left in a pipe
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    problems.append(f"bench worker {p.pid} died during a wave (exit code {p.exitcode})")
                    continue
                if msg[0] != "done" or msg[1] != job:
                    problems.append(f"bench worker {p.pid} failed: {msg[2] if msg[0] == 'error' else msg!r}")
                    continue
                for i, d in zip(idx, msg[2]):
                    if d is not None:  # None: not sent before a stop
                        out[i] = RequestRecord.from_dict(d)
                cpu.append(msg[3])
                lags[w] = msg[4]
            self.last_cpu_s, self.last_lag_ns = cpu, lags
            if problems:
                raise RuntimeError("; ".join(problems))
        assert self._stopped or all(r is not None for r in out)
        return [r for r in out if r is not None]

    @staticmethod
    def _deal(job: int, specs: list[RequestSpec], used: list[tuple[Any, Any, list[int]]],
              offsets: Sequence[int] | None, start_delay_s: float) -> None:
        """Send every worker its share and, once each has it unpacked, the start time, ``start_delay_s`` from then:
        the shares of a large schedule take a while to pickle, send and unpickle (60,000 short requests: about
        0.4 s of CPU), and a start time fixed before sending them made the last workers start late (issue 26)."""
        for c, p, idx in used:
            _send(c, p, (job, [specs[i] for i in idx], None,
                         None if offsets is None else [int(offsets[i]) for i in idx]))
        for c, p, _ in used:
            try:
                got = c.recv()
            except (EOFError, OSError):
                raise RuntimeError(f"bench worker {p.pid} died before the start (exit code {p.exitcode})") from None
            if got != ("got", job):
                raise RuntimeError(f"bench worker {p.pid} failed: {got[2] if got[0] == 'error' else got!r}")
        start_ns = time.perf_counter_ns() + int(start_delay_s * 1e9)
        for c, p, _ in used:
            _send(c, p, ("start", job, start_ns))

    def stop(self) -> None:
        """Interrupt the running wave or schedule (SIGUSR1 to each worker): nothing more is sent, the requests in
        flight end as cut records, and :meth:`run` returns what the workers have (fewer records than specs)."""
        self._stopped = True
        for p in self._procs:
            if p.pid is not None and p.is_alive() and hasattr(signal, "SIGUSR1"):
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except OSError:
                    pass

    async def arun(self, specs: Sequence[RequestSpec], *, start_delay_s: float = DEFAULT_START_DELAY_S,
                   offsets: Sequence[int] | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
        """:meth:`run` from async code: the waiting happens in a thread, so the caller's event loop stays free.
        ``on_record`` is called with each record (here once the wave is over, in order)."""
        fut = asyncio.get_running_loop().run_in_executor(
            None, lambda: self.run(specs, start_delay_s=start_delay_s, offsets=offsets))
        try:
            recs = await asyncio.shield(fut)
        except asyncio.CancelledError:  # the run is interrupted: keep what the workers finished, then go on stopping
            self.stop()
            try:
                recs = await asyncio.wait_for(asyncio.shield(fut), STOP_WAIT_S)
            except Exception:  # noqa: BLE001 - a worker that does not answer: its records are lost, the stop is not
                raise asyncio.CancelledError from None
            for r in recs:
                if on_record is not None:
                    on_record(r)
            raise
        if on_record is not None:
            for r in recs:
                on_record(r)
        return recs


def run_requests_multiproc(base: str, specs: list[RequestSpec], *, model: str, settings: ClientSettings,
                           workers: int) -> list[RequestRecord]:
    """One wave of ``specs`` spread over ``workers`` fresh worker processes (started and stopped here; keep a
    :class:`WorkerPool` open instead to run several waves). Returns the records in the order of ``specs``."""
    if not specs:
        return []
    n = max(1, min(workers, len(specs)))
    with WorkerPool(base, model=model, settings=settings, workers=n, concurrency=len(specs)) as pool:
        return pool.run(specs)


async def arun_requests_multiproc(base: str, specs: list[RequestSpec], *, model: str, settings: ClientSettings,
                                  workers: int) -> list[RequestRecord]:
    """:func:`run_requests_multiproc` from async code (runs in a thread; the caller's loop stays free)."""
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: run_requests_multiproc(base, specs, model=model, settings=settings, workers=workers))
