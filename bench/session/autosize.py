"""``bench run --workers auto``: bench measures its own lag and picks how many processes read the streams.

Why: with kernel receive stamps (:mod:`bench.transport.kernel_stamps`) a busy event loop no longer makes the stamps late, but a
process that cannot keep up with the events still distorts the run: when it falls behind one stream by more than
the gap between two of its events, those events are read together (one stamp for both), and when it falls behind
for good the socket buffers fill and the server's writes are slowed by bench (TCP back-pressure). Both show up as
bench's *lag*, measured here two ways:

* **read lag** (kernel stamps): user-space stamp minus kernel stamp of every read (``bench.transport.kernel_stamps.READ_LAG_NS``):
  how long each read waited for Python;
* **event-loop lag** (any stamp source; :class:`LoopLag`): how late a 1 ms ticker task wakes up.

(The warm-up's event-loop lag is sampled every 1 ms here, finer than :class:`bench.session.loop_lag.LagMonitor`'s 10 ms.)

Rule (:func:`choose_workers`): the lag budget is half the median gap between two token events of a stream (so
reads never merge), clipped to 1-20 ms; the lag of one process at N streams grows about linearly with N (each
read waits for the reads ahead of it), so ``workers = ceil(lag_p99 / budget)``, at most the streams and the cores
left beside the main process (three quarters of the cores when the server runs on this host: :func:`reader_limit`).
A saturated process's lag stops growing with the streams (a 16,384-stream warm-up lagged 45 ms and asked for 3
processes; its measured waves then needed 15), so the warm-up's CPU time counts too (:func:`cpu_workers`): its CPU seconds per event times the events per second of the measured waves, over
:data:`CPU_TARGET` (half busy), when that asks for more. The runner measures during each cell's warm-up waves, read by whoever will read
its measured waves (which send the cell's stream count at once like them): the main process while there is no
pool, else the pool, whose worst worker's lag times the workers is what one process would have lagged
(:func:`assess_readers`). It only ever grows the pool, between warm-up and measured waves; the grown pool gets
one warm-up wave of its own, and the readers it replaces close their idle connections first, so a run never holds
two sets of connections (local ports) to the endpoint (:meth:`bench.session.sweep.Sweep._grow_pool`). With a
fixed ``--workers N`` the same measurement gives the warning (:func:`advice`) that names the count to use.

After the measured waves (:func:`recheck`) the lag of the loops that actually read them (with a pool the worst
worker's, from the :class:`bench.session.loop_lag.LagMonitor` each worker runs; :func:`bench.session.loop_lag.workers_lag`) is held against
the same budget: the cell's ``sizing`` says whether its readers kept up and how many the rule asks for from what
they measured, and with ``--workers auto`` the next cell starts from at least that many (:func:`carry`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from bench.records import RequestRecord
from bench.warns import warning

__all__ = ["reader_limit", "usable_cores", "SERVER_SHARE", "LoopLag", "choose_workers", "cpu_workers", "open_loop_workers", "assess", "assess_readers", "advice", "recheck", "carry", "lag_budget_ms",
           "lag_summary", "read_lag_mark", "read_lag_since", "WorkerChoice"]

CPU_TARGET = 0.5  # the busiest a reading process is planned to be (its lag stays low below it: docs/scale.md)
LAG_BUDGET_MIN_MS = 1.0
LAG_BUDGET_MAX_MS = 20.0
TICK_S = 0.001


class LoopLag:
    """A task that sleeps ``TICK_S`` in a loop and records how late it woke (ms). ``async with LoopLag() as lag:``
    ... then ``lag.samples``."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        perf = time.perf_counter
        while True:
            t0 = perf()
            await asyncio.sleep(self.tick_s)
            self.samples.append(max(0.0, (perf() - t0 - self.tick_s) * 1e3))

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


def read_lag_mark() -> int:
    """A mark in this process's read-lag samples (pass it to :func:`read_lag_since`)."""
    from bench.transport.kernel_stamps import READ_LAG_NS

    READ_LAG_NS.clear()
    return 0


def read_lag_since(_mark: int = 0) -> list[float]:
    """Read lags (ms) of the kernel-stamped reads since :func:`read_lag_mark` (empty with user stamps)."""
    from bench.transport.kernel_stamps import READ_LAG_NS

    return [x / 1e6 for x in READ_LAG_NS]


def lag_summary(samples: Sequence[float]) -> dict[str, Any]:
    """``{"n", "p50_ms", "p99_ms", "max_ms"}`` of lag samples in ms (None values when there are none)."""
    if not samples:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    x = sorted(samples)
    n = len(x)
    return {"n": n, "p50_ms": round(x[n // 2], 3), "p99_ms": round(x[min(n - 1, math.ceil(0.99 * n) - 1)], 3),
            "max_ms": round(x[-1], 3)}


def _median_gap_ns(records: Sequence[RequestRecord]) -> int | None:
    """The median gap between consecutive token events of a stream, over the records (None without any)."""
    gaps = sorted(b - a for r in records for ts in [[e.t_ns for e in r.events if e.has_text]]
                  for a, b in zip(ts, ts[1:]) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def lag_budget_ms(records: Sequence[RequestRecord]) -> float:
    """Half the median gap between consecutive token events of a stream, clipped to 1-20 ms (20 ms when the
    records have no such gap)."""
    gap = _median_gap_ns(records)
    if gap is None:
        return LAG_BUDGET_MAX_MS
    return min(LAG_BUDGET_MAX_MS, max(LAG_BUDGET_MIN_MS, gap / 2e6))


class WorkerChoice(dict[str, Any]):
    """What :func:`choose_workers` decided and from what (JSON-able): ``workers``, ``lag_p99_ms``,
    ``budget_ms``, ``lag_source`` (``"read"`` or ``"loop"``), ``capped`` (the cores or streams limited it)."""


SERVER_SHARE = 0.25
"""The share of the cores bench leaves to a server on the same host (:func:`bench.session.hostload.server_here`):
its reading or sending processes take at most the rest. On 16 cores beside 3 blast servers, 15 processes sending
20,000 req/s lagged p99 2.35 ms and 12 held 0.22 ms (benchmarks/results/schedule_accuracy-2026-12-05-h100.md);
with 12 chosen, 4 of 13 later runs held p99 < 1 ms (schedule_accuracy-2026-12-05b-h100.md)."""


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity: ``taskset`` or a container's cpuset), else the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def reader_limit(streams: int, cores: int | None = None, here: bool = False) -> int:
    """The most reading (or sending) processes a cell gets: one per stream, and the cores (default
    :func:`usable_cores`) beside the main process; with the server on this host (``here``), 1 - :data:`SERVER_SHARE`
    of the cores (12 of 16, 1 of 2)."""
    cores = cores or usable_cores()
    top = int(cores * (1 - SERVER_SHARE)) if here else (cores - 1 if cores > 2 else cores)
    return max(1, min(streams, top))


def choose_workers(lag_p99_ms: float | None, budget_ms: float, streams: int, cores: int | None = None,
                   lag_source: str = "read", here: bool = False) -> WorkerChoice:
    """The worker count for a cell from the lag of ONE reading process (module docstring's rule); ``here``: the
    server runs on this host (:func:`reader_limit`)."""
    limit = reader_limit(streams, cores, here)
    want = 1
    if lag_p99_ms is not None and budget_ms > 0 and lag_p99_ms > budget_ms:
        want = math.ceil(lag_p99_ms / budget_ms)
    n = min(want, limit)
    return WorkerChoice(workers=n, lag_p99_ms=lag_p99_ms, budget_ms=round(budget_ms, 3), lag_source=lag_source,
                        capped=want > n, **({"server_here": True} if here else {}))


OPEN_REQUEST_CPU_S = 0.40e-3
"""Client CPU per short open-loop request (send, read, record): one process sending 2,000 req/s for 3 s on the H200
host used 0.40 ms per request, set-up included (benchmarks/results/schedule_accuracy-2026-12-05-h200.md)."""
OPEN_EVENT_CPU_S = 3.0e-6
"""Client CPU per token event: 335,676 events per CPU-second (benchmarks/results/hotpath-blast-2026-12-05-h200.md)."""


def open_loop_workers(times_s: Sequence[float], output_tokens: Sequence[int],
                      cores: int | None = None, here: bool = False) -> WorkerChoice:
    """``--workers auto`` for an open-loop schedule (sent at its due times, so its CPU need is known before it
    runs): the client CPU its requests and token events take per second (:data:`OPEN_REQUEST_CPU_S`,
    :data:`OPEN_EVENT_CPU_S`) over :data:`CPU_TARGET`, at most the cores beside the main process (a 20,000 req/s
    schedule of one-token answers asks for 17, and gets 15 on 16 cores, 12 with the server on the same host
    (``here``: :func:`reader_limit`); 12 held send-lag p99 0.22 ms there)."""
    n = len(times_s)
    span = max(times_s, default=0.0) or 1.0
    rate, events = n / span, sum(output_tokens) / span
    cpu = rate * OPEN_REQUEST_CPU_S + events * OPEN_EVENT_CPU_S
    want = max(1, math.ceil(cpu / CPU_TARGET))
    limit = reader_limit(n, cores, here)
    return WorkerChoice(workers=min(want, limit), rate_rps=round(rate, 3), events_per_s=round(events, 1),
                        cpu_cores=round(cpu, 3), capped=want > limit, **({"server_here": True} if here else {}))


def cpu_workers(records: Sequence[RequestRecord], cpu_s: float | None, streams: int) -> int | None:
    """The reading processes the measured waves need by CPU: the warm-up's CPU seconds per token event (every
    cost of the wave counted against its events, so an over-estimate) times the events per second the measured
    waves bring (``streams`` / the median gap between two events of a stream), over :data:`CPU_TARGET`. None
    without CPU time or events."""
    events = sum(1 for r in records for e in r.events if e.has_text)
    gap = _median_gap_ns(records)
    if not cpu_s or cpu_s <= 0 or not events or gap is None:
        return None
    events_per_s = streams / (gap / 1e9)
    return max(1, math.ceil(events_per_s * cpu_s / events / CPU_TARGET))


def assess(records: Sequence[RequestRecord], read_lag_ms: Sequence[float], loop_lag_ms: Sequence[float],
           streams: int, cores: int | None = None, cpu_s: float | None = None, here: bool = False) -> WorkerChoice:
    """:func:`choose_workers` from one wave read by one process: its records (for the event gap), the read lags
    of its kernel-stamped reads and the event-loop lags measured meanwhile (used when there are no read lags);
    raised to :func:`cpu_workers` when the process's CPU time over the wave (``cpu_s``) says more are needed (a
    saturated process's lag stops growing with the streams, its CPU need does not)."""
    src, samples = ("read", read_lag_ms) if read_lag_ms else ("loop", loop_lag_ms)
    summ = lag_summary(samples)
    choice = choose_workers(summ["p99_ms"], lag_budget_ms(records), streams, cores, src, here)
    choice["lag"] = summ
    by_cpu = cpu_workers(records, cpu_s, streams)
    if by_cpu is not None:
        top = reader_limit(streams, cores, here)
        choice["cpu_workers"] = by_cpu
        if min(by_cpu, top) > choice["workers"]:
            choice["workers"], choice["capped"] = min(by_cpu, top), by_cpu > top
    return choice


def assess_readers(records: Sequence[RequestRecord], lag: dict[str, Any] | None, readers: int, streams: int,
                   cores: int | None = None, here: bool = False) -> WorkerChoice:
    """:func:`choose_workers` from one wave read by a pool of ``readers`` processes: ``lag`` is the worst reader's
    event-loop lag (:func:`bench.session.loop_lag.workers_lag`) and one process would have lagged ``readers`` times
    as much (the module's linear rule, as :func:`recheck`); never fewer than ``readers`` (a pool only grows).
    ``readers`` in the choice says who read the wave."""
    got = lag or {}
    summ = {"n": got.get("samples", 0), **{k: got.get(k) for k in ("p50_ms", "p99_ms", "max_ms")}}
    p99 = summ["p99_ms"]
    choice = choose_workers(None if p99 is None else p99 * readers, lag_budget_ms(records), streams, cores, "loop",
                            here)
    choice["workers"], choice["lag_p99_ms"] = max(choice["workers"], readers), p99
    choice["readers"], choice["lag"] = readers, summ
    return choice


def advice(cell_id: str, choice: WorkerChoice, workers: int) -> str | None:
    """The warning when a cell needs more readers than it has (``--workers`` fixed), else None."""
    if choice["workers"] <= workers:
        return None
    readers = int(choice.get("readers", 1))
    who = "1 reading process" if readers == 1 else f"each of {readers} reading processes"
    return warning("reads-lagged", lag=choice["lag_p99_ms"], who=who, budget=choice["budget_ms"],
                   n=choice["workers"])


def recheck(choice: WorkerChoice, lag: dict[str, Any], workers: int, streams: int,
            cores: int | None = None, here: bool = False) -> WorkerChoice:
    """After a cell's measured waves, add ``choice["measured"]``: ``workers`` (the readers), ``lag_p99_ms`` (the
    p99 event-loop lag of the loops that read them, ``lag``: the worst worker's with a pool), ``kept_up`` (within
    ``budget_ms``) and ``workers_needed``: the module's linear rule from those readers (one process would have
    lagged ``workers x p99``; :func:`choose_workers`, so capped alike), never fewer than ``workers``."""
    p99, budget = lag.get("p99_ms"), choice["budget_ms"]
    kept, need = True, workers
    if p99 is not None and p99 > budget:
        kept, need = False, max(workers, choose_workers(workers * p99, budget, streams, cores, here=here)["workers"])
    choice["measured"] = {"workers": workers, "lag_p99_ms": p99, "kept_up": kept, "workers_needed": need}
    return choice


def carry(choice: WorkerChoice, earlier: Iterable[WorkerChoice], streams: int) -> WorkerChoice:
    """``--workers auto``: raise a cell's choice to what the measured waves of earlier cells needed
    (:func:`recheck`), at most one reader per stream; ``carried`` says it was raised."""
    need = max((c.get("measured", {}).get("workers_needed", 1) for c in earlier), default=1)
    if min(need, streams) > choice["workers"]:
        choice["workers"], choice["carried"] = min(need, streams), True
    return choice
