"""Event-loop lag: how late the loop runs what is due, which is how late fastio's read stamps can be.

A stream's read is stamped when the event loop gets to it (``data_received``); anything that holds the loop (JSON
parsing, record writing, a burst of other streams' reads) delays every stamp due meanwhile. :class:`LagMonitor`
measures that delay directly: a task that asks to wake every ``interval_s`` (10 ms) and records, each time, how much
later than asked it actually woke (scheduled vs actual wake-up). The figures say how late a stamp taken at a random
moment of the run could have been, independently of CPU use::

    mon = LagMonitor()
    mon.start()                       # inside the running loop
    ... measure ...
    lag = mon.stop()                  # {"p50_ms", "p99_ms", "max_ms", "samples"}
    text = lag_warning(lag, workers=1, streams=512)   # a warning naming --workers N, or None

The baseline on an idle loop is the timer granularity (well under 1 ms on Linux).

With ``--workers N`` or ``--ray`` the loops that stamp are the workers' (:mod:`bench.session.workers`,
:mod:`bench.session.ray_actors`): each runs its own monitor during its share and sends the samples back, and the figure (and
the warning) is the worst worker's (:func:`workers_lag`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from bench.warns import warning

__all__ = ["LagMonitor", "lag_warning", "lag_stats", "stamp_context", "workers_lag", "LAG_WARN_MS"]

LAG_WARN_MS = 5.0  # p99 lag above this: stamps are late enough to show in ITL percentiles


class LagMonitor:
    """Samples the running event loop's lag every ``interval_s`` seconds (default 10 ms) until :meth:`stop`.

    Args:
        interval_s: the sampling period; each sample costs one timer wake-up (~10 µs of loop time).
        max_samples: samples kept (the oldest are dropped beyond it; 100,000 = 16 minutes at 10 ms).
    """

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.samples_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None
        self._paused = 0  # pause() calls not yet resumed
        self._epoch = 0  # resume() calls so far: a sample whose span met a pause is dropped

    def pause(self) -> None:
        """Take no samples until :meth:`resume` (work that blocks the loop while nothing is read: building the
        next wave's requests, encoding its images). Nests."""
        self._paused += 1

    def resume(self) -> None:
        """End one :meth:`pause`; the sample whose span met it is dropped."""
        self._paused = max(0, self._paused - 1)
        self._epoch += 1

    def start(self) -> None:
        """Start sampling on the running loop (call from a coroutine). A second call is a no-op."""
        if self._task is None or self._task.done():
            self.samples_ns = []
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        perf = time.perf_counter_ns
        step = int(self.interval_s * 1e9)
        samples = self.samples_ns
        while True:
            due, epoch = perf() + step, self._epoch
            await asyncio.sleep(self.interval_s)
            if self._paused or epoch != self._epoch:
                continue
            samples.append(max(0, perf() - due))
            if len(samples) > self.max_samples:
                del samples[: len(samples) - self.max_samples]

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the lag in ms: ``p50_ms``, ``p99_ms``, ``max_ms`` (None without samples) and
        ``samples`` (their number)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return lag_stats(self.samples_ns)


def lag_stats(samples_ns: list[int]) -> dict[str, Any]:
    """``{"p50_ms", "p99_ms", "max_ms", "samples"}`` of lag samples in ns (percentiles interpolate linearly)."""
    if not samples_ns:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "samples": 0}
    s = sorted(samples_ns)
    return {"p50_ms": round(_pct(s, 50) / 1e6, 3), "p99_ms": round(_pct(s, 99) / 1e6, 3),
            "max_ms": round(s[-1] / 1e6, 3), "samples": len(s)}


def workers_lag(samples_ns: Sequence[Sequence[int]]) -> dict[str, Any] | None:
    """The lag of a cell or point read by worker processes or Ray actors: :func:`lag_stats` of the worst worker
    (highest p99), plus ``worker`` (its index) and ``workers`` (every worker's stats, in pool order); None when no
    worker sent samples."""
    if not any(samples_ns):
        return None
    each = [lag_stats(list(x)) for x in samples_ns]
    worst = max((k for k, x in enumerate(each) if x["samples"]), key=lambda k: each[k]["p99_ms"])
    return {**each[worst], "worker": worst, "workers": each}


def _pct(s: list[int], q: float) -> float:
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lag_warning(lag: dict[str, Any], *, workers: int = 1, streams: int = 1,
                threshold_ms: float = LAG_WARN_MS, kernel: bool = False, gap_ms: float | None = None) -> str | None:
    """A warning when the p99 lag is over what the stamps can take, naming the fix; None otherwise (a healthy run
    draws no warning).

    User-space stamps are late by the lag itself: over ``threshold_ms`` it shows in ITL percentiles. Kernel stamps
    (``kernel``: every read of the cell was kernel-stamped) are not moved by the loop at all; they go wrong only
    when a stream is not read within the gap between two of its events (``gap_ms``: the cell's median ITL), so that
    one read returns both with the later one's stamp: the limit is then half that gap (``threshold_ms`` when the
    gap is unknown). The fix named is ``--workers N``, N = workers x p99 / limit, at most one per stream and one per
    CPU core; with one stream (or fewer) per reading process more of them cannot help, and the warning says so.
    """
    p99 = lag.get("p99_ms")
    limit = max(threshold_ms, 0.5 * gap_ms) if kernel and gap_ms else threshold_ms
    if p99 is None or p99 <= limit:
        return None
    what = ("reads come later than half the gap between two events (the kernel then merges them into one stamp)"
            if kernel else "the client is too busy to stamp reads on time")
    head = {"p99": p99, "max": lag.get("max_ms") or p99, "what": what}
    if streams <= workers:
        return warning("client-lag-busy-host", streams=streams, workers=workers, **head)
    cap = max(workers + 1, min(streams, os.cpu_count() or 1))
    n = min(max(workers + 1, math.ceil(workers * p99 / limit)), cap)
    return warning("client-lag", n=n, **head)


def stamp_context(records: Sequence[Any], itl_ms: dict[str, Any] | None) -> dict[str, Any]:
    """``kernel`` (every record kernel-stamped) and ``gap_ms`` (the median of the cell's ``itl_ms`` summary, as the
    cell summary computed it) of a cell: what :func:`lag_warning` needs to judge its lag."""
    kernel = bool(records) and all(getattr(r, "stamp_source", "user") == "kernel" for r in records)
    return {"kernel": kernel, "gap_ms": (itl_ms or {}).get("median")}
