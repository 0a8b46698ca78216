"""The closed-loop sweep over one prepared endpoint: per cell, warm-up waves, then measured waves of N concurrent
streams, then the one cell summary (the same step for ``bench run``, the gate's re-measurements and ``bench ab``).

The plan's requests get their prompt text before each wave (:meth:`bench.session.endpoint.Session.realize`), so
building never overlaps timing; a full garbage collection never runs while a wave is in flight. The loops over cells
(``bench run``, ``gate``, ``ab``) and their signal handling live in :mod:`bench.driver`.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.client import RequestSpec, StreamTap, release_idle
from bench.client.endpoint import fill_pool
from bench.config.plan import WARMUP_MAX_TOKENS, PlannedRequest, planned_waves
from bench.config.profile import Cell
from bench.measure.gpu import summarize_gpu, wave_tokens_per_joule
from bench.measure.metrics import RequestMetrics, request_metrics
from bench.measure.queueing import queueing_summary
from bench.measure.slo import point_slo, waves_wall_s
from bench.measure.summary import summarize_cell
from bench.records import RequestRecord
from bench.results import CellResult
from bench.server.gpu import GpuSample
from bench.server.metrics import counters_beside
from bench.session.endpoint import Session
from bench.session.loop_lag import LagMonitor, lag_warning, stamp_context, workers_lag
from bench.stats import bootstrap_ci
from bench.warns import in_cell

__all__ = ["CellRun", "Sweep", "POOL_PHASES"]

POOL_PHASES = ("warmup", "measure")  # the waves a pool reads when there is one (set-up probes and the prime stay here)


def add_lag(acc: list[list[int]], per_worker: Sequence[Sequence[int]] | None) -> None:
    """Add each pool worker's loop-lag samples of one wave (``pool.last_lag_ns``, in pool order) to ``acc``."""
    for k, xs in enumerate(per_worker or []):
        while len(acc) <= k:
            acc.append([])
        acc[k].extend(xs)


@dataclass
class CellRun:
    """What one cell produced: measured records, request ids per wave, bench's CPU use, and the cell summary.

    ``records`` only grow (appended wave by wave, or by :meth:`extend`); :meth:`metrics` computes each record's
    :func:`~bench.measure.metrics.request_metrics` once, for the stop rule and the cell-summary step alike."""

    cell: Cell
    records: list[RequestRecord] = field(default_factory=list)
    waves: list[list[str]] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    lag: dict[str, Any] | None = None
    worker_lag_ns: list[list[int]] = field(default_factory=list)  # per pool worker: its loop-lag samples (ns)
    server_metrics: dict[str, Any] | None = None
    gpu_windows: list[list[GpuSample]] = field(default_factory=list)  # GPU samples per measured window
    wave_spans: list[tuple[float, float]] = field(default_factory=list)  # each wave's start, end (time.monotonic)
    summary: CellResult | None = None
    _metrics: list[RequestMetrics] = field(default_factory=list, init=False, repr=False)

    def metrics(self) -> list[RequestMetrics]:
        """``request_metrics`` of each record, in order (records added since the last call are computed now)."""
        n = len(self._metrics)
        if n and (n > len(self.records) or self._metrics[-1].request_id != self.records[n - 1].request_id):
            self._metrics = []  # the records were replaced, not appended to: compute them all again
        self._metrics += [request_metrics(r) for r in self.records[len(self._metrics):]]
        return self._metrics

    def add_worker_lag(self, per_worker: Sequence[Sequence[int]] | None) -> None:
        """Add each pool worker's loop-lag samples of one wave (``pool.last_lag_ns``, in pool order)."""
        add_lag(self.worker_lag_ns, per_worker)

    def extend(self, more: CellRun) -> None:
        """Add another run of the same cell (re-measured waves, or one side's interleaved wave)."""
        if more.server_metrics is not None:  # the server's counters cover the first part only: marked partial
            first = self.server_metrics is None and not self.records
            self.server_metrics = more.server_metrics if first else {**(self.server_metrics or {}), "partial": True}
        self.gpu_windows.extend(more.gpu_windows)  # energy is taken per window: the gaps between never count
        self.wave_spans.extend(more.wave_spans)
        mine = self.metrics()  # both sides' metrics carried over, none computed again
        self.records.extend(more.records)
        self._metrics = mine + more.metrics()
        self.waves.extend(more.waves)
        self.cpu_s += more.cpu_s
        self.wall_s += more.wall_s
        if more.worker_lag_ns:  # the workers' samples pooled: the worst worker over both parts
            self.add_worker_lag(more.worker_lag_ns)
            self.lag = workers_lag(self.worker_lag_ns)
        elif more.lag is not None:
            old = self.lag or {}
            self.lag = {k: max(v, old.get(k) or 0) if isinstance(v, int | float) else v for k, v in more.lag.items()}


class Sweep:
    """The cells of one prepared endpoint (:class:`Session`), measured in waves. :meth:`run_cell` -> a
    :class:`CellRun` with its summary; :meth:`summarize` is the one cell-summary step."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lag: LagMonitor | None = None  # the measured waves' lag monitor, paused while a wave is prepared

    # ---- cells --------------------------------------------------------------------------------------------------
    async def _wave(self, cell: Cell, reqs: list[PlannedRequest]) -> list[RequestRecord]:
        in_workers = self.session.pool is not None and bool(reqs) and reqs[0].phase in POOL_PHASES
        if self._lag is not None:
            self._lag.pause()  # building prompts and encoding images blocks the loop while nothing is read
        try:
            texts = [await self.session.realize(r) for r in reqs]
            images = [self.session.image_urls(r.request_id, r.images, r.image_wh) for r in reqs]  # before the wave
            if not in_workers:  # one connection per stream, open before the wave (workers open their own)
                await fill_pool(self.session.client, self.session.base, len(reqs),
                                self.session.settings.connect_timeout_s)
        finally:
            if self._lag is not None:
                self._lag.resume()
        measured = bool(reqs) and reqs[0].phase == "measure"
        if in_workers:
            return await self._wave_in_workers(cell, reqs, texts, images, measured)
        taps = [StreamTap() for _ in reqs]
        if self.session.observer is not None and measured:
            self.session.observer.wave_started(cell, taps)

        async def one(i: int) -> RequestRecord:
            r = reqs[i]
            rec = await self.session.send(texts[i], r.max_tokens, r.phase, r.meta, tap=taps[i], request_id=r.request_id,
                                          images=images[i], thinking=r.thinking)
            self.session.write(rec)
            if self.session.observer is not None and measured:
                self.session.observer.request_done(cell, rec.ok)
            return rec

        # a full garbage collection stops every stream's reads for tens of ms (measured: 33-40 ms at 256 streams):
        # none runs while a wave is in flight; the collector catches up between waves, outside any timing
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            return list(await asyncio.gather(*(one(i) for i in range(len(reqs)))))
        finally:
            if gc_was_on:
                gc.enable()
                gc.collect()

    async def _wave_in_workers(self, cell: Cell, reqs: list[PlannedRequest], texts: list[str],
                               images: list[list[str]], measured: bool) -> list[RequestRecord]:
        """One wave spread over the worker processes (records on one clock; no live counters)."""
        body = self.session.body
        specs = [RequestSpec(r.request_id, self.session.profile.endpoint,
                             body(t, r.max_tokens, im, thinking=r.thinking), r.meta)
                 for r, t, im in zip(reqs, texts, images)]
        pool = self.session.pool
        assert pool is not None, "a wave in workers needs the session's pool"
        recs = await pool.arun(specs)
        for rec in recs:
            if rec.images:
                self.session.refuse_rejected_images(rec)
            self.session.write(rec)
            if self.session.observer is not None and measured:
                self.session.observer.request_done(cell, rec.ok)
        return recs

    async def _warmup_and_size(self, cell: Cell) -> None:
        """The warm-up waves, read by whoever reads the measured waves (this process, or the pool: so they warm the
        connections the measured waves use), measuring bench's lag meanwhile; then grow the worker pool
        (``--workers auto``) or warn (fixed count) when the readers cannot keep up (:mod:`bench.session.autosize`)."""
        from bench.session import autosize as autosize

        recs: list[RequestRecord] = []
        pool_lag: list[list[int]] = []
        autosize.read_lag_mark()
        cpu0 = time.process_time()
        async with autosize.LoopLag() as loop_lag:
            for w in range(self.session.profile.warmup):
                recs += await self._wave(cell, self.session.planner.wave(cell, "warmup", w, depth=0,
                                                                 max_tokens=WARMUP_MAX_TOKENS))
                if self.session.pool is not None:
                    add_lag(pool_lag, getattr(self.session.pool, "last_lag_ns", None))
        if self.session.pool is None:
            choice = autosize.assess(recs, autosize.read_lag_since(), loop_lag.samples, cell.streams,
                                     cpu_s=time.process_time() - cpu0, here=self.session.server_here)
        else:
            choice = autosize.assess_readers(recs, workers_lag(pool_lag), self.session.workers, cell.streams,
                                             here=self.session.server_here)
        if self.session.workers_auto:
            autosize.carry(choice, self.session.sizing.values(), cell.streams)
        self.session.sizing[cell.id] = choice
        # a fixed count: the warm-up's advice waits for the measured waves (one lag warning per cell, _lag_note)
        if self.session.workers_auto and choice["workers"] > self.session.workers:
            await self._grow_pool(cell, choice["workers"])

    async def _grow_pool(self, cell: Cell, workers: int) -> None:
        """Read the cell's next waves with ``workers`` worker processes: the old readers' idle connections are
        closed first (this process's with a reset, :func:`bench.client.release_idle`; an old pool's workers close
        theirs so as they stop), so the run never holds two sets of connections to the endpoint (each takes a local
        port: a 16,384-stream run held 32,768 against a 28,232-port range, and 4,538 requests of each wave failed);
        then one warm-up wave through the new pool opens and warms its connections."""
        from bench.session.workers import WorkerPool

        release_idle(self.session.client)
        if self.session.pool is not None:
            self.session.pool.close()
            self.session.pool = None
        conc = max((c.streams for c in self.session.profile.cells()), default=1)
        pool = WorkerPool(self.session.base, model=self.session.model, settings=self.session.settings,
                          workers=workers, concurrency=conc)
        await asyncio.get_running_loop().run_in_executor(None, pool.start)
        self.session.pool = pool
        n = self.session.profile.warmup  # numbered after the cell's warm-up waves
        await self._wave(cell, self.session.planner.wave(cell, "warmup", n, depth=0, max_tokens=WARMUP_MAX_TOKENS))

    def planned_waves(self, cell: Cell) -> int:
        """Waves a cell runs at least: enough for ``requests`` and ``min_waves``."""
        return planned_waves(self.session.profile, cell)

    async def _warm(self, cell: Cell) -> None:
        if self.session.profile.warmup:
            await self._warmup_and_size(cell)
        if self.session.profile.prefix_cache:  # prime the cache: one request with the shared prompt, not measured
            await self._wave(cell, self.session.planner.wave(cell, "prime", 0, n=1, max_tokens=WARMUP_MAX_TOKENS))

    async def run_cell(self, cell: Cell, waves: int | None = None, *, warmup: bool = True,
                       first_wave: int = 0) -> CellRun:
        """Warm-up waves, then measured waves of ``cell.streams`` concurrent requests; returns them summarized.

        Args:
            waves: run exactly this many measured waves; default: :meth:`planned_waves`, extended up to
                ``max_waves`` while ``target_ci`` is not met.
            warmup: run the profile's warm-up waves first.
            first_wave: number of the first measured wave (for re-measured or interleaved waves).
        """
        run = CellRun(cell)
        fixed = waves is not None
        want = waves if waves is not None else self.planned_waves(cell)
        if self.session.observer is not None:
            self.session.observer.cell_started(cell, want * cell.streams)
        if warmup:
            await self._warm(cell)
        mon = LagMonitor()
        if self.session.scraper is not None:
            await self.session.scraper.begin()
        gpu = self.session.gpu
        if gpu is not None:  # its readings (and an exporter's page) are taken in a thread, not in this loop
            await asyncio.to_thread(gpu.begin)
        mon.start()
        self._lag = mon
        try:
            await self._measured_waves(run, want, fixed, first_wave)
        finally:
            self._lag = None
            own = mon.stop()  # with a pool this loop only waits: the workers' loops stamp the reads
            run.lag = workers_lag(run.worker_lag_ns) or own
            if gpu is not None:
                run.gpu_windows.append(await asyncio.to_thread(gpu.end))
            if self.session.scraper is not None:
                run.server_metrics = await self.session.scraper.end()
        if cell.id in self.session.sizing and run.lag:
            from bench.session import autosize as autosize

            autosize.recheck(self.session.sizing[cell.id], run.lag, self.session.workers, cell.streams,
                             here=self.session.server_here)
        self.summarize(run)
        return run

    def _lag_note(self, run: CellRun) -> str | None:
        """The cell's one lag warning, from one closed set (:func:`bench.session.loop_lag.lag_warning`): the
        measured waves' event-loop lag when it was over what the stamps can take, else the readers the warm-up
        probe asked for when the measured waves did not keep up either (:func:`bench.session.autosize.advice`);
        never both, and none when the measured waves kept up."""
        from bench.session import autosize as autosize

        cell = run.cell
        stamps = stamp_context(run.records, run.summary.itl_ms if run.summary else None)
        note = lag_warning(run.lag, workers=self.session.workers, streams=cell.streams, **stamps) if run.lag else None
        if note and (self.session.pool is None or "workers" in (run.lag or {})):  # a pool's lag: its workers' loops
            return note
        choice = self.session.sizing.get(cell.id)
        if choice is None or self.session.workers_auto or (choice.get("measured") or {}).get("kept_up", False):
            return None
        return autosize.advice(cell.id, choice, self.session.workers)

    async def _measured_waves(self, run: CellRun, want: int, fixed: bool, first_wave: int) -> None:
        cell, p, w = run.cell, self.session.profile, 0
        while True:
            reqs = self.session.planner.wave(cell, "measure", first_wave + w)
            c0, t0, m0 = time.process_time(), time.perf_counter(), time.monotonic()
            recs = await self._wave(cell, reqs)
            run.wave_spans.append((m0, time.monotonic()))
            if self.session.pool is not None:
                run.add_worker_lag(getattr(self.session.pool, "last_lag_ns", None))
            run.cpu_s += time.process_time() - c0
            run.wall_s += time.perf_counter() - t0
            run.records.extend(recs)
            run.waves.append([r.request_id for r in recs])
            w += 1
            if w >= want:
                if fixed or w >= p.max_waves or not p.target_ci or self._ci_met(run):
                    break
                if self.session.observer is not None:
                    self.session.observer.cell_started(cell, (w + 1) * cell.streams)

    def summarize(self, run: CellRun) -> CellResult:
        """The one cell-summary step (used for every cell of run, gate, its re-measurements, and ab)."""
        cell, p = run.cell, self.session.profile
        cpu = 100.0 * run.cpu_s / run.wall_s if run.wall_s > 0 else None
        expected = None if p.prefix_cache else self.session.shared_prefix_tokens
        ms = run.metrics()  # each record's metrics, computed once for everything below
        run.summary = summarize_cell(cell, run.records, run.waves, self.session.overhead_ms,
                                     depth_target_tokens=cell.depth or None, expected_cached_tokens=expected,
                                     client_cpu_pct=cpu, target_ci=p.target_ci, max_waves=p.max_waves, metrics=ms)
        q = queueing_summary({"id": cell.id, "streams": cell.streams}, ms, run.waves, self.session.server)
        run.summary.queueing = q
        run.summary.warnings += q.get("warnings") or []
        run.summary.client_lag = run.lag
        lag_note = self._lag_note(run)
        if lag_note:
            run.summary.warnings.append(in_cell(cell.id, lag_note))
        if run.server_metrics:
            self._server_checks(run.server_metrics, ms, run.summary)
        if self.session.slo is not None:
            self._score_slo(run, ms, run.summary)
        if run.gpu_windows and self.session.gpu is not None:
            run.summary.gpu = self._gpu_summary(run, ms, run.summary)
        for annotate in self.session.annotators:
            annotate(self.session, run.summary)
        if self.session.observer is not None:
            self.session.observer.cell_done(cell, run.summary)
        return run.summary

    def _server_checks(self, server_metrics: dict[str, Any], ms: list[RequestMetrics], summary: CellResult) -> None:
        """The server's own counters beside bench's (``ms``: the cell's request metrics): stored, cross-checked
        (warnings), TTFT compared (notes)."""
        view = {**summary.to_dict(), "output_tokens_total": sum(m.output_tokens for m in ms if m.ok)}
        summary.server_metrics, warns = counters_beside(server_metrics, view,
                                                        prefix_cache_expected=self.session.profile.prefix_cache,
                                                        expected_hits=self.session.shared_prefix_tokens * len(ms))
        summary.warnings += warns

    def _gpu_summary(self, run: CellRun, ms: list[RequestMetrics], summary: CellResult) -> dict[str, Any] | None:
        """The cell's ``gpu`` section: its windows' samples over the successful requests' output tokens (and, at
        depth > 0, their uncached prompt tokens); per-wave tokens per joule go in ``summary.samples`` (what a gate
        rule on ``tokens_per_joule`` reads). docs/gpu-telemetry.md."""
        gpu = self.session.gpu
        assert gpu is not None
        ok = [m for m in ms if m.ok]
        prompt = sum(max(0, (m.prompt_tokens or 0) - m.cached_tokens) for m in ok) if run.cell.depth else None
        g = summarize_gpu(run.gpu_windows, output_tokens=sum(m.output_tokens for m in ok), prompt_tokens=prompt,
                          source=gpu.source, interval_s=gpu.interval_s, info=gpu.info)
        if g is None or (gpu.auto and all(x.get("util_pct_mean") == 0 for x in g["gpus"])):
            return None  # auto, and no GPU worked: the local endpoint does not run on them (sim, CPU build)
        tokens = {m.request_id: m.output_tokens for m in ok}
        waves = [(t0, t1, sum(tokens.get(r, 0) for r in ids)) for (t0, t1), ids in zip(run.wave_spans, run.waves)]
        per_wave = wave_tokens_per_joule(g, run.gpu_windows, waves)
        if per_wave is not None:
            summary.samples["tokens_per_joule"] = per_wave
        return g

    def _score_slo(self, run: CellRun, ms: list[RequestMetrics], summary: CellResult) -> None:
        """``goodput``, ``slo`` and ``slo_met`` of a concurrency cell: the open-loop figures
        (:func:`bench.measure.slo.point_slo`) over every measured request, the window being the measured waves' wall
        time (:func:`bench.measure.slo.waves_wall_s`; docs/load.md)."""
        assert self.session.slo is not None
        s = point_slo(run.records, self.session.slo, waves_wall_s(run.records, run.waves), ms)
        summary.goodput, summary.slo = s["goodput"], s["slo"]
        summary.slo_met = bool(run.records) and all(v["held"] for v in s["slo"].values())

    def _ci_met(self, run: CellRun) -> bool:
        vals = [m.decode_tok_s for m in run.metrics() if m.ok and m.decode_tok_s]
        if len(vals) < 3:
            return False
        lo, hi = bootstrap_ci(vals)
        med = sorted(vals)[len(vals) // 2]
        return (hi - lo) / 2 <= self.session.profile.target_ci * med
