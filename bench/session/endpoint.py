"""A prepared endpoint: one server set up for measuring, and the one way bench sends to it.

:meth:`Session.open` learns the model, the server, a tokenizer, the capabilities and the fixed overhead;
:meth:`Session.send` sends one request with the capability fallbacks below; :meth:`Session.realize` gives a planned
request its exact prompt text; :meth:`Session.results` makes the typed results document. The closed-loop cells
(warm-up, waves, the one cell summary) are :mod:`bench.session.sweep`; open-loop points are :mod:`bench.load`.

Capability fallbacks: when the server rejects an optional field (HTTP 400/422), it is dropped for the rest of the
run, the run warns, and the request is sent again: first the length forcing (``min_tokens``/``ignore_eos``), then
``chat_template_kwargs`` if the error names it. A 400 that says the prompt does not fit the context is a failure
of that request, never taken for a rejected field.
"""

from __future__ import annotations

import gc
import os
import platform
import re
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from bench.client import (
    ClientSettings,
    ImageSet,
    RequestSpec,
    StreamTap,
    discover_model,
    image_rejection,
    make_http_client,
    require_ok,
    root_url,
    stream_request,
)
from bench.config.plan import BodyOptions, PlannedRequest, Planner, request_body
from bench.config.profile import Cell, Profile, profile_settings
from bench.config.tools import load_tools, tool_choice_value
from bench.errors import ConfigError, EndpointUnreachable, ServerError, TokenizerError
from bench.measure.metrics import request_metrics
from bench.measure.slo import SLO
from bench.prompts import build_prompt, unique_prefix
from bench.prompts.build import PREFIX_SHARED_TOKENS_MAX
from bench.prompts.content import stream_text
from bench.records import RecordWriter, RequestRecord
from bench.results import CellResult, EndpointInfo, ProfileInfo, Results, RunInfo
from bench.server.gpu import GpuSampler
from bench.server.info import discover_server
from bench.server.metrics import MetricsScraper, detect_metrics
from bench.server.tokenizer import CalibratedTokenizer, HttpTokenizer
from bench.session.hostload import HostLoad
from bench.transport.kernel_stamps import clock_report
from bench.transport.limits import check_connections
from bench.version import __version__
from bench.warns import warning

__all__ = ["Session", "ReaderPool", "Observer", "CellAnnotator", "machine_info", "default_out_dir",
           "check_fits_context"]

# the chars per token a calibration may learn: prose runs 3-6 on BPE vocabularies, CJK and byte-level ones go
# towards 1; a ratio outside comes from a usage.prompt_tokens that does not count the prompt (a fixed number)
CALIBRATION_CPT = (0.5, 16.0)

_CONTEXT_ERROR = re.compile(r"context|too long|maximum.*length|exceed|n_ctx|max_model_len", re.I)


class Observer(Protocol):
    """Progress hooks (a rich display implements them; all optional to act on)."""

    def cell_started(self, cell: Cell, total_requests: int) -> None: ...
    def cell_kept(self, cell: Cell) -> None: ...  # a resumed run's cell kept from the run it continues
    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None: ...
    def request_done(self, cell: Cell, ok: bool) -> None: ...
    def cell_done(self, cell: Cell, summary: CellResult) -> None: ...
    def note(self, text: str) -> None: ...


class ReaderPool(Protocol):
    """Readers of measured waves in other processes or hosts: :class:`bench.session.workers.WorkerPool` (worker
    processes) and :class:`bench.session.ray_actors.RayPool` (Ray actors). Records come back on this process's
    clock."""

    workers: int
    last_lag_ns: list[list[int]]  # per reader: its event loop's lag samples (ns) during the last wave

    def start(self) -> ReaderPool: ...

    async def arun(self, specs: Sequence[RequestSpec], *, start_delay_s: float = ...,
                   offsets: Sequence[int] | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]: ...

    def close(self) -> None: ...


CellAnnotator = Callable[["Session", CellResult], None]
"""Adds to a fresh cell summary what the core does not compute (the roofline...): called by the cell-summary step."""


def check_fits_context(profile: Profile, context: int | None, need: tuple[str, int] | None = None, *,
                       where: str = "the server's context of {n} tokens",
                       cure: str = "start the server with a larger context") -> None:
    """Refuse, before sending anything, a profile whose prompt + output cannot fit the server's context. ``need``:
    what an open-loop run sends instead of the profile's cells (a label and its largest prompt + output tokens).
    ``where`` (``{n}``: the context) and ``cure`` word the line for a context the user cannot raise (the embedded
    endpoint's model: :func:`bench.cli.common.engine_size`).

    Raises:
        ConfigError: naming the cell's depth (or the schedule's largest request), the context and the fix.
    """
    if not context:
        return
    where = where.format(n=context)
    if need is not None:
        if need[1] > context:
            raise ConfigError(f"{need[0]}: its largest request, {need[1]} prompt + output tokens, does not fit "
                              f"{where} (use smaller --input-tokens/--max-tokens, or {cure})")
        return
    for c in profile.cells():
        total = c.depth + c.max_tokens
        if total > context:
            fix = (f"use --depths below {context - c.max_tokens}" if c.max_tokens < context
                   else f"use --max-tokens below {context - c.depth}" if c.depth < context
                   else "use smaller --depths and --max-tokens")
            raise ConfigError(f"cell {c.id}: a {c.depth}-token prompt + {c.max_tokens} output tokens = {total} "
                              f"tokens do not fit {where} ({fix}, or {cure})")


def check_connection_limits(base: str, streams: int) -> None:
    """Refuse, before sending anything, a run whose streams this machine cannot hold open at once: more than its
    local port range (to one ``host:port``) or its open-files limit (raised first where the hard limit allows;
    :func:`bench.transport.limits.check_connections`).

    Raises:
        ConfigError: one line naming the limit and the fix (``sysctl``, ``ulimit -n``, fewer ``--streams``).
    """
    parts = urlsplit(base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    msg = check_connections(streams, f"{parts.hostname}:{port}")
    if msg:
        raise ConfigError(msg)


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
        tools = load_tools(profile.tools)
        self.body_opts = BodyOptions(profile.endpoint, profile.temperature, profile.thinking, profile.force_length,
                                     tools=tools, tool_choice=tool_choice_value(profile.tool_choice, tools))
        self._image_sets: dict[tuple[int, int, int], ImageSet] = {}
        self.run_id = uuid.uuid4().hex[:8]
        self.planner = Planner(self.run_id, profile)
        self.writer: RecordWriter | None = None
        self.observer: Observer | None = None
        self.warnings: list[str] = []
        self.pool: ReaderPool | None = None  # when measured waves are read by other processes or Ray actors
        self.workers_auto = False  # --workers auto: bench.session.autosize grows the pool from its measured lag
        self.sizing: dict[str, Any] = {}  # cell id -> bench.session.autosize's choice
        self.annotators: list[CellAnnotator] = []
        self.drift: dict[str, Any] | None = None
        self.hostload: HostLoad | None = None  # other work on this host during the run (machine.other_load)
        self.scraper: MetricsScraper | None = None  # the server's /metrics (bench.server.metrics), when it has one
        self.gpu: GpuSampler | None = None  # GPU telemetry around each measured window (bench.server.gpu)
        self.extras: dict[str, Any] = {}  # top-level additions of annotators (roofline_spec)
        self.slo: SLO | None = profile.slo_spec
        self.started = datetime.now(UTC)

    @property
    def workers(self) -> int:
        """Processes (or actors) reading the measured waves."""
        return int(getattr(self.pool, "workers", 1)) if self.pool is not None else 1

    @property
    def shared_prefix_tokens(self) -> int:
        """Prompt tokens per request a prefix cache may serve in a run meant to defeat it: the chat template's
        shared header (seen in the overhead probes) and the few tokens unique prompts may still share."""
        return self.template_cached_tokens + PREFIX_SHARED_TOKENS_MAX

    @property
    def force_length(self) -> bool:
        """Whether requests still carry ``min_tokens``/``ignore_eos`` (False once the server rejected them)."""
        return self.body_opts.force_length

    @property
    def server_here(self) -> bool:
        """The endpoint runs on this host (as :meth:`open`'s host-load count found it,
        bench.session.hostload.server_here): ``--workers auto`` leaves it a share of the cores."""
        return self.hostload is not None and self.hostload.local

    # ---- set-up -------------------------------------------------------------------------------------------------
    @classmethod
    async def open(cls, base: str, settings: ClientSettings, profile: Profile, *, model: str | None = None,
                   out_dir: Path | None = None, observer: Observer | None = None, workers: int | str = 1,
                   pool: ReaderPool | None = None, annotators: list[CellAnnotator] | None = None,
                   ray_address: str | None = None, gpu: GpuSampler | None = None,
                   need: tuple[str, int] | None = None) -> Session:
        """Connect, learn the server, pick a tokenizer, check forced lengths, measure the fixed overhead.

        ``workers > 1`` runs each measured wave's streams in that many worker processes (:mod:`bench.session.workers`);
        ``workers="auto"``: the count is chosen per cell from bench's own lag during the warm-up
        (:mod:`bench.session.autosize`); ``ray_address``: the measured waves run in ``workers`` Ray actors on that cluster
        (:mod:`bench.session.ray_actors`); ``pool`` is any object with the same ``start``/``arun``/``close``. Set-up and
        probes stay in this process; a pool reads the warm-up waves too (:data:`bench.session.sweep.POOL_PHASES`). ``gpu``: a GPU sampler run around each cell's measured waves (the
        session closes it). ``need``: an open loop's largest request (:func:`check_fits_context`), checked against
        the server's context instead of the profile's cells, which it does not run.

        Raises:
            EndpointUnreachable: the URL does not answer.
            ServerError: the server answers but the probe requests fail.
            ConfigError: a cell cannot fit the server's context, or this machine cannot hold its streams'
                connections (:func:`check_connection_limits`).
        """
        conc = max((c.streams for c in profile.cells()), default=1)
        check_connection_limits(base, conc)
        s = cls(base, settings, profile, make_http_client(settings, conc))
        s.observer = observer
        s.gpu = gpu
        s.annotators = list(annotators or [])
        try:
            s.model = model or await discover_model(s.client, base, settings.api_key)
            s.server = await discover_server(s.client, base)
            check_fits_context(profile, s.server.get("context_size"), need)
            if out_dir is not None:
                s.writer = RecordWriter(Path(out_dir) / "records.jsonl")
            await s._setup_tokenizer()
            await s._measure_overhead()
            s.workers_auto = workers == "auto"
            s.pool = pool if pool is not None else s._worker_pool(workers, conc, ray_address)
            s.scraper = await detect_metrics(s.client, s.base)
            s.hostload = HostLoad.start(base)
            gc.collect()
            gc.freeze()  # what exists now (modules, the session) is never scanned again by the collector
        except BaseException:
            await s.close()
            raise
        return s

    def _worker_pool(self, workers: int | str, conc: int, ray_address: str | None) -> ReaderPool | None:
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
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
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


    def body(self, text: str, max_tokens: int, images: Sequence[str] = (),
             history: Sequence[dict[str, Any]] = (), thinking: bool | None = None) -> dict[str, Any]:
        """The JSON body for a prompt (with its images and earlier turns; ``thinking``: the cell's switch, None
        for the profile's) with the capabilities the server accepted so far."""
        opts = self.body_opts if thinking is None else replace(self.body_opts, thinking=thinking)
        return request_body(opts, text, max_tokens, image_urls=images, history=history)

    def image_urls(self, request_id: str, count: int | None = None, wh: tuple[int, int] | None = None) -> list[str]:
        """The images of one request as data URLs, unique to it (seeded by the run and ``request_id``): ``count``
        of ``wh`` pixels, by default the profile's ``images`` and ``image_size``. Not timed: build them before
        sending."""
        p = self.profile
        n = p.images if count is None else count
        if n <= 0:
            return []
        w, h = wh if wh is not None else (int(x) for x in p.image_size.split("x"))
        key = (n, w, h)
        if key not in self._image_sets:
            self._image_sets[key] = ImageSet(n, w, h, p.image_format, p.image_source)
        return self._image_sets[key].urls(f"{self.run_id}/{request_id}")

    # ---- sending ------------------------------------------------------------------------------------------------
    async def send(self, text: str, max_tokens: int, tag: str, meta: dict[str, Any],
                   tap: StreamTap | None = None, request_id: str | None = None, *, images: Sequence[str] = (),
                   history: Sequence[dict[str, Any]] = (), thinking: bool | None = None,
                   refuse_images: bool = True) -> RequestRecord:
        """One request, with the capability fallbacks of the module docstring (rejected attempts are written).

        Raises:
            ServerError: the server refused the request's images (one line naming ``--images``); with
                ``refuse_images=False`` the failed record is returned instead (open loop: checked after the point).
        """
        rid = request_id or self.planner.next_id(tag)[0]
        spec = RequestSpec(rid, self.profile.endpoint, self.body(text, max_tokens, images, history, thinking), meta)
        rec = await stream_request(self.client, self.base, spec, model=self.model, secret=self.settings.api_key,
                                   tap=tap)
        for attempt in (1, 2):
            if rec.status not in (400, 422) or not self._drop_rejected_field(spec, rec):
                break
            self.write(rec)  # the rejected attempt stays on disk, as a failure
            spec = RequestSpec(f"{rid}-retry{attempt}", self.profile.endpoint,
                               self.body(text, max_tokens, images, history, thinking), meta)
            rec = await stream_request(self.client, self.base, spec, model=self.model,
                                       secret=self.settings.api_key, tap=tap)
        if images and refuse_images:
            self.refuse_rejected_images(rec)
        return rec

    def refuse_rejected_images(self, rec: RequestRecord) -> None:
        """Stop the run when the server answered a request with images by an HTTP error about images.

        Raises:
            ServerError: ``the server does not accept image input (...): run without --images, ...``.
        """
        line = image_rejection(rec)
        if line is None:
            return
        self.write(rec)
        raise ServerError(line)

    def _drop_rejected_field(self, spec: RequestSpec, rec: RequestRecord) -> bool:
        """Drop the optional field a 400/422 rejected; False when the error is not about one (e.g. context)."""
        err = rec.error or ""
        if _CONTEXT_ERROR.search(err) and "min_tokens" not in err and "ignore_eos" not in err:
            return False
        if self.body_opts.force_length:
            self.body_opts = replace(self.body_opts, force_length=False)
            self.note(warning("fields-rejected", error=err))
            return True
        if "chat_template_kwargs" in spec.body and "chat_template_kwargs" in err:
            self.body_opts = replace(self.body_opts, template_kwargs=False)
            self.note(warning("thinking-fixed", error=err))
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
                self.note(warning("no-calibration", error=rec.error or "no usage"))
                self.tokenizer, self.tokenizer_kind = CalibratedTokenizer(4.0), "default-ratio"
                return
            pts.append(m.prompt_tokens)
        chars = len(long_) - len(short)
        cpt = chars / (pts[1] - pts[0]) if pts[1] > pts[0] else float("inf")
        if not CALIBRATION_CPT[0] <= cpt <= CALIBRATION_CPT[1]:  # a fixed or made-up count: no ratio to learn
            shown = "no ratio" if cpt == float("inf") else f"{cpt:.1f} chars/token"
            self.note(warning("calibration-implausible", short=pts[0], long=pts[1], chars=chars, cpt=shown))
            self.tokenizer, self.tokenizer_kind = CalibratedTokenizer(4.0), "default-ratio"
            return
        self.tokenizer = CalibratedTokenizer(cpt)
        self.template_overhead_tokens = max(0, pts[0] - round(len(short) / cpt))
        self.tokenizer_kind = "calibrated"
        self.note(warning("prompt-sizes-estimated", cpt=cpt))

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
                if rec.error_kind == "no_tokens" and tries <= 2 * n + 4:
                    continue
                require_ok(rec, self.base, "probe request")
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
        except (ServerError, EndpointUnreachable, ConfigError) as e:  # ConfigError: no local port left (client_limit)
            self.note(warning("closing-probes-failed", error=e))
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
            self.note(warning("tokenize-failed", when=" mid-run", error=e,
                              how=f"estimated at {fb.chars_per_token:.2f} chars/token from its earlier counts"))
            return
        self.note(warning("tokenize-failed", when="", error=e, how="calibrated from two probes"))
        await self._calibrate()

    # ---- prompts ------------------------------------------------------------------------------------------------
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

    # ---- results ------------------------------------------------------------------------------------------------
    def _machine(self) -> dict[str, Any]:
        """:func:`machine_info`, with ``other_load``: the cores other work kept busy on this host meanwhile."""
        info = machine_info()
        load = self.hostload.figures() if self.hostload is not None else None
        return {**info, "other_load": load} if load is not None else info

    def results(self, cells: list[CellResult], *, complete: bool = False, interrupted: bool = False) -> Results:
        """The typed results document of the cells so far (``complete`` once every cell is in)."""
        p = self.profile
        settings = profile_settings(p)
        warnings = list(self.warnings) + _pool_warnings(self.pool) + [w for c in cells for w in c.warnings]
        now = datetime.now(UTC)
        run = RunInfo(
            id=self.run_id, started=self.started.isoformat(timespec="seconds"),
            duration_s=round((now - self.started).total_seconds(), 2), complete=complete, interrupted=interrupted,
            overhead_ms=self.overhead_ms, tokenizer=self.tokenizer_kind,
            template_overhead_tokens=self.template_overhead_tokens,
            template_cached_tokens=self.template_cached_tokens, forced_length=self.force_length,
            workers=self.workers, workers_auto=self.workers_auto, sizing=self.sizing or None,
            stamp_clock=clock_report(), ray=_ray_section(self.pool), nodes=_nodes(self.pool), drift=self.drift,
        )
        return Results(
            profile=ProfileInfo(p.name, p.source, settings),
            endpoint=EndpointInfo(self.base, self.model, p.endpoint),
            run=run, cells=list(cells), server=self.server, machine=self._machine(), warnings=warnings,
            bench_version=__version__, created=now.isoformat(timespec="seconds"),
            roofline_spec=self.extras.get("roofline_spec"),
        )


def _ray_section(pool: ReaderPool | None) -> dict[str, Any] | None:
    """``{"address"}`` when the waves ran on Ray (bench.session.ray_actors), else None."""
    if getattr(pool, "nodes_report", None) is None:
        return None
    return {"address": getattr(pool, "address", None)}


def _nodes(pool: ReaderPool | None) -> list[dict[str, Any]] | None:
    """The Ray nodes that sent the load, each with its clock offset and uncertainty (``run.nodes``), else None."""
    report = getattr(pool, "nodes_report", None)
    return None if report is None else list(report())


def _pool_warnings(pool: ReaderPool | None) -> list[str]:
    """The pool's own warnings (a Ray node lost mid-run: one line each)."""
    warn = getattr(pool, "warnings", None)
    return list(warn()) if callable(warn) else []


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
