"""A measuring session against one endpoint: set-up, then warm-up and waves of concurrent streams per cell.

Flow: :meth:`Session.open` (model, server info, tokenizer, capabilities, fixed overhead) -> :meth:`Session.run_cell`
for each cell (the plan's requests get their prompt text before each wave, so building never overlaps timing) ->
:meth:`Session.summarize` (the one cell-summary step) -> :meth:`Session.results` (the typed results document).
The loops over cells (``bench run``, ``gate``, ``ab``) and their signal handling live in :mod:`bench.driver`.

Capability fallbacks: when the server rejects an optional field (HTTP 400/422), it is dropped for the rest of the
run, the run warns, and the request is sent again: first the length forcing (``min_tokens``/``ignore_eos``), then
``chat_template_kwargs`` if the error names it. A 400 that says the prompt does not fit the context is a failure
of that request, never taken for a rejected field.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import re
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench.client import (
    ClientSettings,
    RequestSpec,
    StreamTap,
    discover_model,
    make_http_client,
    root_url,
    stream_request,
)
from bench.config.plan import WARMUP_MAX_TOKENS, BodyOptions, PlannedRequest, Planner, planned_waves, request_body
from bench.config.profile import Cell, Profile
from bench.errors import ConfigError, EndpointUnreachable, ServerError, TokenizerError
from bench.measure.metrics import RequestMetrics, request_metrics
from bench.measure.queueing import queueing_summary
from bench.measure.slo import SLO, parse_slo, point_slo, waves_wall_s
from bench.measure.summary import summarize_cell
from bench.prompts import build_prompt, unique_prefix
from bench.prompts.build import PREFIX_SHARED_TOKENS_MAX
from bench.prompts.content import stream_text
from bench.records import RecordWriter, RequestRecord
from bench.results import CellResult, EndpointInfo, ProfileInfo, Results, RunInfo
from bench.server.info import discover_server
from bench.server.metrics import MetricsScraper, cross_check_notes, cross_checks, detect_metrics
from bench.server.tokenizer import CalibratedTokenizer, HttpTokenizer
from bench.session.loop_lag import LagMonitor, lag_warning, stamp_context, workers_lag
from bench.stats import bootstrap_ci
from bench.transport.kernel_stamps import clock_report
from bench.version import __version__

__all__ = ["Session", "CellRun", "Observer", "CellAnnotator", "machine_info", "default_out_dir",
           "check_fits_context"]

_CONTEXT_ERROR = re.compile(r"context|too long|maximum.*length|exceed|n_ctx|max_model_len", re.I)


class Observer(Protocol):
    """Progress hooks (a rich display implements them; all optional to act on)."""

    def cell_started(self, cell: Cell, total_requests: int) -> None: ...
    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None: ...
    def request_done(self, cell: Cell, ok: bool) -> None: ...
    def cell_done(self, cell: Cell, summary: CellResult) -> None: ...
    def note(self, text: str) -> None: ...


CellAnnotator = Callable[["Session", CellResult], None]
"""Adds to a fresh cell summary what the core does not compute (the roofline...): called by the cell-summary step."""


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
        for k, xs in enumerate(per_worker or []):
            while len(self.worker_lag_ns) <= k:
                self.worker_lag_ns.append([])
            self.worker_lag_ns[k].extend(xs)

    def extend(self, more: CellRun) -> None:
        """Add another run of the same cell (re-measured waves, or one side's interleaved wave)."""
        if more.server_metrics is not None:  # the server's counters cover the first part only: marked partial
            first = self.server_metrics is None and not self.records
            self.server_metrics = more.server_metrics if first else {**(self.server_metrics or {}), "partial": True}
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


def check_fits_context(profile: Profile, context: int | None) -> None:
    """Refuse, before sending anything, a profile whose prompt + output cannot fit the server's context.

    Raises:
        ConfigError: naming the cell's depth, the context and the fix.
    """
    if not context:
        return
    for c in profile.cells():
        need = c.depth + c.max_tokens
        if need > context:
            raise ConfigError(f"cell {c.id}: a {c.depth}-token prompt + {c.max_tokens} output tokens = {need} "
                              f"tokens do not fit the server's context of {context} tokens (use --depths below "
                              f"{context - c.max_tokens}, or start the server with a larger context)")


class Session:
    """One endpoint prepared for measuring. Create with :meth:`open`; close with :meth:`close`."""

    def __init__(self, base: str, settings: ClientSettings, profile: Profile, client: httpx.AsyncClient) -> None:
        self.base = base
        self.settings = settings
        self.profile = profile
        self.client = client
        self.model = ""
        self.server: dict[str, Any] = {}
        self.tokenizer: Any = None
        self.tokenizer_kind = ""
        self.template_overhead_tokens = 0
        self.template_cached_tokens = 0
        self.overhead_ms: float | None = None
        self.body_opts = BodyOptions(profile.endpoint, profile.temperature, profile.thinking, profile.force_length)
        self.run_id = uuid.uuid4().hex[:8]
        self.planner = Planner(self.run_id, profile)
        self.writer: RecordWriter | None = None
        self.observer: Observer | None = None
        self.warnings: list[str] = []
        self.pool: Any = None  # a worker pool (bench.session.workers) when measured waves are spread over processes
        self.workers_auto = False  # --workers auto: bench.session.autosize grows the pool from its measured lag
        self.sizing: dict[str, Any] = {}  # cell id -> bench.session.autosize's choice
        self.annotators: list[CellAnnotator] = []
        self.drift: dict[str, Any] | None = None
        self.scraper: MetricsScraper | None = None  # the server's /metrics (bench.server.metrics), when it has one
        self.extras: dict[str, Any] = {}  # top-level additions of annotators (roofline_spec)
        self.slo: SLO | None = parse_slo(profile.slo, "[load] slo") if profile.slo else None
        self.started = datetime.now(UTC)

    @property
    def workers(self) -> int:
        """Processes (or actors) reading the measured waves."""
        return int(getattr(self.pool, "workers", 1)) if self.pool is not None else 1

    @property
    def force_length(self) -> bool:
        """Whether requests still carry ``min_tokens``/``ignore_eos`` (False once the server rejected them)."""
        return self.body_opts.force_length

    # ---- set-up -------------------------------------------------------------------------------------------------
    @classmethod
    async def open(cls, base: str, settings: ClientSettings, profile: Profile, *, model: str | None = None,
                   out_dir: Path | None = None, observer: Observer | None = None, workers: int | str = 1,
                   pool: Any = None, annotators: list[CellAnnotator] | None = None,
                   ray_address: str | None = None) -> Session:
        """Connect, learn the server, pick a tokenizer, check forced lengths, measure the fixed overhead.

        ``workers > 1`` runs each measured wave's streams in that many worker processes (:mod:`bench.session.workers`);
        ``workers="auto"``: the count is chosen per cell from bench's own lag during the warm-up
        (:mod:`bench.session.autosize`); ``ray_address``: the measured waves run in ``workers`` Ray actors on that cluster
        (:mod:`bench.session.ray_actors`); ``pool`` is any object with the same ``start``/``arun``/``close``. Set-up, probes
        and warm-ups stay in this process.

        Raises:
            EndpointUnreachable: the URL does not answer.
            ServerError: the server answers but the probe requests fail.
            ConfigError: a cell cannot fit the server's context.
        """
        conc = max((c.streams for c in profile.cells()), default=1)
        s = cls(base, settings, profile, make_http_client(settings, conc))
        s.observer = observer
        s.annotators = list(annotators or [])
        try:
            s.model = model or await discover_model(s.client, base, settings.api_key)
            s.server = await discover_server(s.client, base)
            check_fits_context(profile, s.server.get("context_size"))
            if out_dir is not None:
                s.writer = RecordWriter(Path(out_dir) / "records.jsonl")
            await s._setup_tokenizer()
            await s._measure_overhead()
            s.workers_auto = workers == "auto"
            s.pool = pool if pool is not None else s._worker_pool(workers, conc, ray_address)
            s.scraper = await detect_metrics(s.client, s.base)
            gc.collect()
            gc.freeze()  # what exists now (modules, the session) is never scanned again by the collector
        except BaseException:
            await s.close()
            raise
        return s

    def _worker_pool(self, workers: int | str, conc: int, ray_address: str | None) -> Any:
        if ray_address is not None:
            from bench.session.ray_actors import RayPool

            n = workers if isinstance(workers, int) else 1
            return RayPool(self.base, model=self.model, settings=self.settings, workers=n, address=ray_address,
                           concurrency=conc).start()
        if not isinstance(workers, int) or workers <= 1:
            return None
        from bench.session.workers import WorkerPool

        return WorkerPool(self.base, model=self.model, settings=self.settings, workers=workers,
                          concurrency=conc).start()

    async def close(self) -> None:
        """Close the HTTP client, the worker processes and the records file."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.scraper is not None:
            await self.scraper.stop()
        await self.client.aclose()
        if self.writer is not None:
            self.writer.close()

    def note(self, text: str) -> None:
        """A run-level warning: kept for results.json and shown by the observer."""
        self.warnings.append(text)
        if self.observer is not None:
            self.observer.note(text)

    def write(self, rec: RequestRecord) -> None:
        """Append a finished record to records.jsonl (when the session has a results folder)."""
        if self.writer is not None:
            self.writer.write(rec)


    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        """The JSON body for a prompt with the capabilities the server accepted so far."""
        return request_body(self.body_opts, text, max_tokens)

    # ---- sending ------------------------------------------------------------------------------------------------
    async def send(self, text: str, max_tokens: int, tag: str, meta: dict[str, Any],
                   tap: StreamTap | None = None, request_id: str | None = None) -> RequestRecord:
        """One request, with the capability fallbacks of the module docstring (rejected attempts are written)."""
        rid = request_id or self.planner.next_id(tag)[0]
        spec = RequestSpec(rid, self.profile.endpoint, self.body(text, max_tokens), meta)
        rec = await stream_request(self.client, self.base, spec, model=self.model, secret=self.settings.api_key,
                                   tap=tap)
        for attempt in (1, 2):
            if rec.status not in (400, 422) or not self._drop_rejected_field(spec, rec):
                break
            self.write(rec)  # the rejected attempt stays on disk, as a failure
            spec = RequestSpec(f"{rid}-retry{attempt}", self.profile.endpoint, self.body(text, max_tokens), meta)
            rec = await stream_request(self.client, self.base, spec, model=self.model,
                                       secret=self.settings.api_key, tap=tap)
        return rec

    def _drop_rejected_field(self, spec: RequestSpec, rec: RequestRecord) -> bool:
        """Drop the optional field a 400/422 rejected; False when the error is not about one (e.g. context)."""
        err = rec.error or ""
        if _CONTEXT_ERROR.search(err) and "min_tokens" not in err and "ignore_eos" not in err:
            return False
        if self.body_opts.force_length:
            self.body_opts = replace(self.body_opts, force_length=False)
            self.note(f"server rejected min_tokens/ignore_eos ({err}); retrying without them: output lengths are "
                      "what the model produced, reported per cell")
            return True
        if "chat_template_kwargs" in spec.body and "chat_template_kwargs" in err:
            self.body_opts = replace(self.body_opts, template_kwargs=False)
            self.note(f"server rejected chat_template_kwargs ({err}); thinking cannot be disabled on it")
            return True
        return False

    async def _setup_tokenizer(self) -> None:
        http = HttpTokenizer(self.client, root_url(self.base), self.model)
        if await http.available():
            self.tokenizer, self.tokenizer_kind = http, "server"
            return
        await self._calibrate()

    async def _calibrate(self) -> None:
        """No /tokenize (or it broke): calibrate chars per token from two probes of different lengths."""
        short = unique_prefix(self.run_id, 999_999) + "Say OK."
        long_ = short + " " + stream_text("prose", 7, 4000)
        pts = []
        for text in (short, long_):
            rec = await self.send(text, 1, "calibration", {"phase": "calibration"})
            self.write(rec)
            m = request_metrics(rec)
            if m.prompt_tokens is None:  # a probe that failed after usage arrived still tells the prompt size
                self.note(f"cannot calibrate prompt length (no usage.prompt_tokens): {rec.error or 'no usage'}")
                self.tokenizer, self.tokenizer_kind = CalibratedTokenizer(4.0), "default-ratio"
                return
            pts.append(m.prompt_tokens)
        cpt = (len(long_) - len(short)) / max(1, pts[1] - pts[0])
        self.tokenizer = CalibratedTokenizer(cpt)
        self.template_overhead_tokens = max(0, pts[0] - round(len(short) / cpt))
        self.tokenizer_kind = "calibrated"
        self.note(f"prompt lengths calibrated at {cpt:.2f} chars/token from two probes (an estimate; the server "
                  "has no working /tokenize)")

    async def _measure_overhead(self, seed_base: int = 1_000_000, learn: bool = True) -> float | None:
        """Tiny prompts: the fixed TTFT overhead (their median TTFT, returned and, with ``learn``, kept), and with
        ``learn`` the template's overhead and cached header tokens. Probes of a later call (``seed_base``) get their
        own unique prefixes, so no probe is served from the cache of an earlier one.

        A probe whose single token decodes to no text (``no_tokens``: it happens with special tokens) is skipped and
        replaced, up to ``overhead_probes + 3`` extra tries; any other failure stops the run.
        """
        n = self.profile.overhead_probes
        ttfts: list[float] = []
        done, tries, header_known = 0, 0, not learn
        while done < n + 1:  # the first is a warm-up (connection, server caches)
            text = unique_prefix(self.run_id, seed_base + tries) + "Say OK."
            tries += 1
            rec = await self.send(text, 1, "overhead", {"phase": "overhead"})
            self.write(rec)
            m = request_metrics(rec)
            if not rec.ok:
                if rec.error_kind == "connect":
                    raise EndpointUnreachable(rec.error or "cannot connect")
                if rec.error_kind == "no_tokens" and tries <= 2 * n + 4:
                    continue
                raise ServerError(f"probe request failed: {rec.error}")
            if not header_known and self.tokenizer_kind == "server" and m.prompt_tokens is not None:
                self.template_overhead_tokens = max(0, m.prompt_tokens - await self._count(text))
                header_known = True
            if done > 0:
                if learn:  # a prompt unique from its first character still shares the chat template's header
                    self.template_cached_tokens = max(self.template_cached_tokens, m.cached_tokens)
                if m.ttft_ms is not None:
                    ttfts.append(m.ttft_ms)
            done += 1
        median = sorted(ttfts)[len(ttfts) // 2] if ttfts else None
        if learn:
            self.overhead_ms = median
        return median

    async def measure_drift(self) -> None:
        """Run the overhead probes again at the end: how far the server's fixed overhead moved during the run
        (a stored baseline from a drifting server is worth less; docs/gate.md)."""
        start = self.overhead_ms
        if start is None or self.profile.overhead_probes < 1:
            return
        try:
            end = await self._measure_overhead(seed_base=2_000_000, learn=False)
        except (ServerError, EndpointUnreachable) as e:
            self.note(f"the closing overhead probes failed ({e}); drift not measured")
            return
        if end is not None:
            self.drift = {"overhead_ms_start": round(start, 3), "overhead_ms_end": round(end, 3),
                          "overhead_change_pct": round((end - start) / start * 100, 1) if start else None}

    async def _count(self, text: str) -> int:
        try:
            return int(await self.tokenizer.count(text))
        except TokenizerError as e:
            await self._tokenizer_failed(e)
            return int(await self.tokenizer.count(text))

    async def _tokenizer_failed(self, e: TokenizerError) -> None:
        """/tokenize broke mid-run: estimate from its successful counts so far, else calibrate with two probes."""
        fb = self.tokenizer.fallback() if isinstance(self.tokenizer, HttpTokenizer) else None
        if fb is not None:
            self.tokenizer, self.tokenizer_kind = fb, "calibrated"
            self.note(f"/tokenize failed mid-run ({e}); prompt lengths are now estimated at {fb.chars_per_token:.2f} "
                      "chars/token from its earlier counts")
            return
        self.note(f"/tokenize failed ({e}); calibrating prompt lengths from two probes")
        await self._calibrate()

    # ---- cells --------------------------------------------------------------------------------------------------
    async def realize(self, req: PlannedRequest) -> str:
        """The exact prompt text of a planned request (the server's tokenizer, or the calibration, sizes it).

        A /tokenize that fails mid-run switches the run to a calibrated count (with a warning) instead of stopping.
        """
        for _ in range(2):
            try:
                pr = await build_prompt(req.kind, req.target_tokens, seed=req.seed, prefix=req.prefix,
                                        tokenizer=self.tokenizer, overhead_tokens=self.template_overhead_tokens)
                req.meta["counted_tokens"] = pr.expected_prompt_tokens
                return pr.text
            except TokenizerError as e:
                if self.tokenizer_kind != "server":
                    raise ServerError(f"building a {req.target_tokens}-token prompt: {e}") from None
                await self._tokenizer_failed(e)
        raise ServerError(f"building a {req.target_tokens}-token prompt failed twice")

    async def _wave(self, cell: Cell, reqs: list[PlannedRequest]) -> list[RequestRecord]:
        texts = [await self.realize(r) for r in reqs]
        measured = bool(reqs) and reqs[0].phase == "measure"
        if self.pool is not None and measured:
            return await self._wave_in_workers(cell, reqs, texts)
        taps = [StreamTap() for _ in reqs]
        if self.observer is not None and measured:
            self.observer.wave_started(cell, taps)

        async def one(i: int) -> RequestRecord:
            r = reqs[i]
            rec = await self.send(texts[i], r.max_tokens, r.phase, r.meta, tap=taps[i], request_id=r.request_id)
            self.write(rec)
            if self.observer is not None and measured:
                self.observer.request_done(cell, rec.ok)
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

    async def _wave_in_workers(self, cell: Cell, reqs: list[PlannedRequest], texts: list[str]) -> list[RequestRecord]:
        """One measured wave spread over the worker processes (records on one clock; no live counters)."""
        specs = [RequestSpec(r.request_id, self.profile.endpoint, self.body(t, r.max_tokens), r.meta)
                 for r, t in zip(reqs, texts)]
        recs: list[RequestRecord] = await self.pool.arun(specs)
        for rec in recs:
            self.write(rec)
            if self.observer is not None:
                self.observer.request_done(cell, rec.ok)
        return recs

    async def _warmup_and_size(self, cell: Cell) -> None:
        """The warm-up waves (read by this process), measuring bench's lag meanwhile; then grow the worker pool
        (``--workers auto``) or warn (fixed count) when one process cannot keep up (:mod:`bench.session.autosize`)."""
        from bench.session import autosize as autosize

        recs: list[RequestRecord] = []
        autosize.read_lag_mark()
        async with autosize.LoopLag() as loop_lag:
            for w in range(self.profile.warmup):
                recs += await self._wave(cell, self.planner.wave(cell, "warmup", w, depth=0,
                                                                 max_tokens=WARMUP_MAX_TOKENS))
        choice = autosize.assess(recs, autosize.read_lag_since(), loop_lag.samples, cell.streams)
        if self.workers_auto:
            autosize.carry(choice, self.sizing.values(), cell.streams)
        self.sizing[cell.id] = choice
        have = self.workers
        if not self.workers_auto:
            msg = autosize.advice(cell.id, choice, have)
            if msg:
                self.note(msg)
        elif choice["workers"] > have:
            from bench.session.workers import WorkerPool

            conc = max((c.streams for c in self.profile.cells()), default=1)
            pool = WorkerPool(self.base, model=self.model, settings=self.settings, workers=choice["workers"],
                              concurrency=conc)
            await asyncio.get_running_loop().run_in_executor(None, pool.start)
            if self.pool is not None:
                self.pool.close()
            self.pool = pool

    def planned_waves(self, cell: Cell) -> int:
        """Waves a cell runs at least: enough for ``requests`` and ``min_waves``."""
        return planned_waves(self.profile, cell)

    async def _warm(self, cell: Cell) -> None:
        if self.profile.warmup:
            await self._warmup_and_size(cell)
        if self.profile.prefix_cache:  # prime the cache: one request with the shared prompt, not measured
            await self._wave(cell, self.planner.wave(cell, "prime", 0, n=1, max_tokens=WARMUP_MAX_TOKENS))

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
        if self.observer is not None:
            self.observer.cell_started(cell, want * cell.streams)
        if warmup:
            await self._warm(cell)
        mon = LagMonitor()
        if self.scraper is not None:
            await self.scraper.begin()
        mon.start()
        try:
            await self._measured_waves(run, want, fixed, first_wave)
        finally:
            own = mon.stop()  # with a pool this loop only waits: the workers' loops stamp the reads
            run.lag = workers_lag(run.worker_lag_ns) or own
            if self.scraper is not None:
                run.server_metrics = await self.scraper.end()
        if cell.id in self.sizing and run.lag:
            from bench.session import autosize as autosize

            autosize.recheck(self.sizing[cell.id], run.lag, self.workers, cell.streams)
        self.summarize(run)
        return run

    async def _measured_waves(self, run: CellRun, want: int, fixed: bool, first_wave: int) -> None:
        cell, p, w = run.cell, self.profile, 0
        while True:
            reqs = self.planner.wave(cell, "measure", first_wave + w)
            c0, t0 = time.process_time(), time.perf_counter()
            recs = await self._wave(cell, reqs)
            if self.pool is not None:
                run.add_worker_lag(getattr(self.pool, "last_lag_ns", None))
            run.cpu_s += time.process_time() - c0
            run.wall_s += time.perf_counter() - t0
            run.records.extend(recs)
            run.waves.append([r.request_id for r in recs])
            w += 1
            if w >= want:
                if fixed or w >= p.max_waves or not p.target_ci or self._ci_met(run):
                    break
                if self.observer is not None:
                    self.observer.cell_started(cell, (w + 1) * cell.streams)

    def summarize(self, run: CellRun) -> CellResult:
        """The one cell-summary step (used for every cell of run, gate, its re-measurements, and ab)."""
        cell, p = run.cell, self.profile
        cpu = 100.0 * run.cpu_s / run.wall_s if run.wall_s > 0 else None
        expected = None if p.prefix_cache else self.template_cached_tokens + PREFIX_SHARED_TOKENS_MAX
        ms = run.metrics()  # each record's metrics, computed once for everything below
        run.summary = summarize_cell(cell, run.records, run.waves, self.overhead_ms,
                                     depth_target_tokens=cell.depth or None, expected_cached_tokens=expected,
                                     client_cpu_pct=cpu, target_ci=p.target_ci, max_waves=p.max_waves, metrics=ms)
        q = queueing_summary({"id": cell.id, "streams": cell.streams}, ms, run.waves, self.server)
        run.summary.queueing = q
        run.summary.warnings += q.get("warnings") or []
        run.summary.client_lag = run.lag
        stamps = stamp_context(run.records, run.summary.itl_ms)
        lag_note = lag_warning(run.lag, workers=self.workers, streams=cell.streams, **stamps) if run.lag else None
        if lag_note and (self.pool is None or "workers" in (run.lag or {})):  # a pool's lag: its workers' loops
            run.summary.warnings.append(f"{cell.id}: {lag_note}")
        if run.server_metrics:
            self._server_checks(run.server_metrics, ms, run.summary)
        if self.slo is not None:
            self._score_slo(run, ms, run.summary)
        for annotate in self.annotators:
            annotate(self, run.summary)
        if self.observer is not None:
            self.observer.cell_done(cell, run.summary)
        return run.summary

    def _server_checks(self, server_metrics: dict[str, Any], ms: list[RequestMetrics], summary: CellResult) -> None:
        """The server's own counters beside bench's (``ms``: the cell's request metrics): stored, cross-checked
        (warnings), TTFT compared (notes)."""
        sm = dict(server_metrics)
        if sm.get("scraper_error"):
            summary.warnings.append(f"{summary.id}: the /metrics scraper stopped during the cell "
                                    f"({sm['scraper_error']}): its series cover the scrapes before that and the "
                                    "one at the cell's end")
        ok = [m for m in ms if m.ok]
        view = {**summary.to_dict(), "output_tokens_total": sum(m.output_tokens for m in ok)}
        if not sm.get("partial"):  # counters of some waves only (ab, re-measured gate cells): nothing to compare
            summary.warnings += cross_checks(sm, view, prefix_cache_expected=self.profile.prefix_cache)
        notes = cross_check_notes(sm, view)
        if notes:
            sm["notes"] = notes
        summary.server_metrics = sm

    def _score_slo(self, run: CellRun, ms: list[RequestMetrics], summary: CellResult) -> None:
        """``goodput``, ``slo`` and ``slo_met`` of a concurrency cell: the open-loop figures
        (:func:`bench.measure.slo.point_slo`) over every measured request, the window being the measured waves' wall
        time (:func:`bench.measure.slo.waves_wall_s`; docs/load.md)."""
        assert self.slo is not None
        s = point_slo(run.records, self.slo, waves_wall_s(run.records, run.waves), ms)
        summary.goodput, summary.slo = s["goodput"], s["slo"]
        summary.slo_met = bool(run.records) and all(v["held"] for v in s["slo"].values())

    def _ci_met(self, run: CellRun) -> bool:
        vals = [m.decode_tok_s for m in run.metrics() if m.ok and m.decode_tok_s]
        if len(vals) < 3:
            return False
        lo, hi = bootstrap_ci(vals)
        med = sorted(vals)[len(vals) // 2]
        return (hi - lo) / 2 <= self.profile.target_ci * med

    # ---- results ------------------------------------------------------------------------------------------------
    def results(self, cells: list[CellResult], *, complete: bool = False, interrupted: bool = False) -> Results:
        """The typed results document of the cells so far (``complete`` once every cell is in)."""
        p = self.profile
        settings = {k: v for k, v in asdict(p).items() if k not in ("source",)}
        warnings = list(self.warnings) + [w for c in cells for w in c.warnings]
        now = datetime.now(UTC)
        run = RunInfo(
            id=self.run_id, started=self.started.isoformat(timespec="seconds"),
            duration_s=round((now - self.started).total_seconds(), 2), complete=complete, interrupted=interrupted,
            overhead_ms=self.overhead_ms, tokenizer=self.tokenizer_kind,
            template_overhead_tokens=self.template_overhead_tokens,
            template_cached_tokens=self.template_cached_tokens, forced_length=self.force_length,
            workers=self.workers, workers_auto=self.workers_auto, sizing=self.sizing or None,
            stamp_clock=clock_report(), ray=_ray_section(self.pool), drift=self.drift,
        )
        return Results(
            profile=ProfileInfo(p.name, p.source, settings),
            endpoint=EndpointInfo(self.base, self.model, p.endpoint),
            run=run, cells=list(cells), server=self.server, machine=machine_info(), warnings=warnings,
            bench_version=__version__, created=now.isoformat(timespec="seconds"),
            roofline_spec=self.extras.get("roofline_spec"),
        )


def _ray_section(pool: Any) -> dict[str, Any] | None:
    """``{"address", "nodes"}`` when the waves ran on Ray (bench.session.ray_actors), else None."""
    report = getattr(pool, "nodes_report", None)
    if report is None:
        return None
    return {"address": pool.address, "nodes": report()}


def machine_info() -> dict[str, Any]:
    """Where bench ran: host, OS, CPU count, Python."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def default_out_dir(profile: Profile) -> Path:
    """``bench-results/<UTC time>-<profile>``."""
    return Path("bench-results") / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{profile.name}"
