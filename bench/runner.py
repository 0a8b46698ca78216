"""Running a profile: prepare the endpoint, then warm-up and waves of concurrent streams per cell.

Flow: :meth:`Session.open` (model, server info, tokenizer, capabilities, fixed overhead) ->
:meth:`Session.run_cell` for each cell (prompts built before each wave, so building never overlaps timing) ->
:func:`run_profile` (records written as each request finishes; results.json rewritten after each cell).

Rules kept here:
- every request's prompt starts with a unique prefix (``prompts.unique_prefix``), warm-ups and probes included,
  so no request shares a cached prefix with another (unless ``prefix_cache`` is asked for on purpose);
- output length is forced with ``min_tokens``/``ignore_eos`` beside ``max_tokens``; if the server rejects those
  fields (HTTP 400/422), the request is retried once without them, thinking stays disabled, and the run warns;
- thinking is off for chat unless asked (``chat_template_kwargs: {enable_thinking: false}``); temperature 0.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import platform
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from . import __version__
from .client import ClientSettings, RequestSpec, StreamTap, discover_model, make_http_client, root_url, stream_request
from .errors import EndpointUnreachable, ServerError
from .metrics import request_metrics
from .profile import Cell, Profile
from .prompts import CalibratedTokenizer, HttpTokenizer, TokenizerError, build_prompt, unique_prefix
from .prompts.content import stream_text
from .records import RecordWriter, RequestRecord
from .server_info import discover_server
from .stats import bootstrap_ci
from .summary import summarize_cell

__all__ = ["Session", "CellRun", "Observer", "run_profile", "RunInterrupted", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
WARMUP_MAX_TOKENS = 8
CLIENT_CPU_WARN_PCT = 70.0


class Observer(Protocol):
    """Progress hooks (a rich display implements them; all optional to act on)."""

    def cell_started(self, cell: Cell, total_requests: int) -> None: ...
    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None: ...
    def request_done(self, cell: Cell, ok: bool) -> None: ...
    def cell_done(self, cell: Cell, summary: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...


class RunInterrupted(Exception):
    """The run was stopped (Ctrl-C); ``out_dir`` holds every finished record."""

    def __init__(self, out_dir: Path | None, records: int) -> None:
        super().__init__(f"interrupted; {records} finished records kept in {out_dir}")
        self.out_dir = out_dir
        self.records = records


@dataclass
class CellRun:
    """What one cell produced: measured records, request ids per wave, and the cell summary."""

    cell: Cell
    records: list[RequestRecord] = field(default_factory=list)
    waves: list[list[str]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


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
        self.force_length = profile.force_length
        self.template_kwargs = True  # send chat_template_kwargs (thinking off) until the server rejects them
        self.run_id = uuid.uuid4().hex[:8]
        self.writer: RecordWriter | None = None
        self.observer: Observer | None = None
        self.warnings: list[str] = []
        self.pool: Any = None  # bench.workers.WorkerPool when measured waves are spread over processes
        self.started = datetime.now(UTC)
        self._n = 0

    # ---- setup ------------------------------------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        base: str,
        settings: ClientSettings,
        profile: Profile,
        *,
        model: str | None = None,
        out_dir: Path | None = None,
        observer: Observer | None = None,
        workers: int = 1,
    ) -> Session:
        """Connect, learn the server, pick a tokenizer, check forced lengths, measure the fixed overhead.

        ``workers > 1`` runs each measured wave's streams in that many worker processes (:mod:`bench.workers`);
        set-up, probes and warm-ups stay in this process.

        Raises:
            EndpointUnreachable: the URL does not answer.
            ServerError: the server answers but the probe requests fail.
        """
        conc = max((c.streams for c in profile.cells()), default=1)
        s = cls(base, settings, profile, make_http_client(settings, conc))
        s.observer = observer
        try:
            s.model = model or await discover_model(s.client, base, settings.api_key)
            s.server = await discover_server(s.client, base)
            if out_dir is not None:
                s.writer = RecordWriter(Path(out_dir) / "records.jsonl")
            await s._setup_tokenizer()
            await s._measure_overhead()
            if workers > 1:
                from .workers import WorkerPool

                s.pool = WorkerPool(base, model=s.model, settings=settings, workers=workers, concurrency=conc).start()
            gc.collect()
            gc.freeze()  # what exists now (modules, the session) is never scanned again by the collector
        except BaseException:
            await s.close()
            raise
        return s

    async def close(self) -> None:
        """Close the HTTP client, the worker processes and the records file."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        await self.client.aclose()
        if self.writer is not None:
            self.writer.close()

    def _note(self, text: str) -> None:
        self.warnings.append(text)
        if self.observer is not None:
            self.observer.note(text)

    def _next_id(self, tag: str) -> tuple[str, int]:
        i = self._n
        self._n += 1
        return f"{self.run_id}-{tag}-{i:05d}", i

    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        """The JSON body for a prompt (endpoint, max_tokens, temperature, forcing, thinking)."""
        p = self.profile
        if p.endpoint == "chat":
            b: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
            if not p.thinking and self.template_kwargs:
                b["chat_template_kwargs"] = {"enable_thinking": False}
        else:
            b = {"prompt": text}
        b["max_tokens"] = max_tokens
        b["temperature"] = p.temperature
        if self.force_length:
            b["min_tokens"] = max_tokens
            b["ignore_eos"] = True
        return b

    async def send(self, text: str, max_tokens: int, tag: str, meta: dict[str, Any],
                   tap: StreamTap | None = None) -> RequestRecord:
        """One request. When the server rejects an optional field (HTTP 400/422), it is dropped for the rest of the
        run, the run warns, and the request is sent again: first the length forcing (``min_tokens``/``ignore_eos``,
        which servers reject naming it in many ways, or not at all), then ``chat_template_kwargs`` if the error
        names it (strict servers such as OpenAI's own API; thinking then cannot be switched off)."""
        rid, _ = self._next_id(tag)
        spec = RequestSpec(rid, self.profile.endpoint, self.body(text, max_tokens), meta)
        rec = await stream_request(self.client, self.base, spec, model=self.model, secret=self.settings.api_key,
                                   tap=tap)
        for attempt in (1, 2):
            if rec.status not in (400, 422):
                break
            if self.force_length:
                self.force_length = False
                self._note(f"server rejected min_tokens/ignore_eos ({rec.error}); retrying without them: output "
                           "lengths are what the model produced, reported per cell")
            elif "chat_template_kwargs" in spec.body and "chat_template_kwargs" in (rec.error or ""):
                self.template_kwargs = False
                self._note(f"server rejected chat_template_kwargs ({rec.error}); thinking cannot be disabled on it")
            else:
                break
            self._write(rec)  # the rejected attempt stays on disk, as a failure
            spec = RequestSpec(f"{rid}-retry{attempt}", self.profile.endpoint, self.body(text, max_tokens), meta)
            rec = await stream_request(self.client, self.base, spec, model=self.model,
                                       secret=self.settings.api_key, tap=tap)
        return rec

    async def _setup_tokenizer(self) -> None:
        http = HttpTokenizer(self.client, root_url(self.base), self.model)
        if await http.available():
            self.tokenizer, self.tokenizer_kind = http, "server"
            return
        # no /tokenize: calibrate chars per token from two probes of different lengths
        short = unique_prefix(self.run_id, 999_999) + "Say OK."
        long_ = short + " " + stream_text("prose", 7, 4000)
        pts = []
        for text in (short, long_):
            rec = await self.send(text, 1, "calib", {"phase": "calibration"})
            self._write(rec)
            m = request_metrics(rec)
            if m.prompt_tokens is None:  # a probe that failed after usage arrived still tells the prompt size
                self._note(f"cannot calibrate prompt length (no usage.prompt_tokens): {rec.error or 'no usage'}")
                self.tokenizer, self.tokenizer_kind = CalibratedTokenizer(4.0), "default-ratio"
                return
            pts.append(m.prompt_tokens)
        cpt = (len(long_) - len(short)) / max(1, pts[1] - pts[0])
        self.tokenizer = CalibratedTokenizer(cpt)
        self.template_overhead_tokens = max(0, pts[0] - round(len(short) / cpt))
        self.tokenizer_kind = "calibrated"
        self._note(f"server has no /tokenize: prompt lengths calibrated at {cpt:.2f} chars/token (an estimate)")

    async def _measure_overhead(self) -> None:
        """Tiny prompts: template overhead tokens (with a server tokenizer) and the fixed TTFT overhead.

        A probe whose single token decodes to no text (``no_tokens``: it happens with special tokens) is skipped and
        replaced, up to ``overhead_probes + 3`` extra tries; any other failure stops the run.
        """
        n = self.profile.overhead_probes
        ttfts: list[float] = []
        done, tries, header_known = 0, 0, False
        while done < n + 1:  # the first is a warm-up (connection, server caches)
            text = unique_prefix(self.run_id, 1_000_000 + tries) + "Say OK."
            tries += 1
            rec = await self.send(text, 1, "overhead", {"phase": "overhead"})
            self._write(rec)
            m = request_metrics(rec)
            if not rec.ok:
                if rec.error_kind == "connect":
                    raise EndpointUnreachable(rec.error or "cannot connect")
                if rec.error_kind == "no_tokens" and tries <= 2 * n + 4:
                    continue
                raise ServerError(f"probe request failed: {rec.error}")
            if not header_known and self.tokenizer_kind == "server" and m.prompt_tokens is not None:
                self.template_overhead_tokens = max(0, m.prompt_tokens - await self.tokenizer.count(text))
                header_known = True
            if done > 0:
                # a prompt unique from its first character still shares the chat template's fixed header
                self.template_cached_tokens = max(self.template_cached_tokens, m.cached_tokens)
                if m.ttft_ms is not None:
                    ttfts.append(m.ttft_ms)
            done += 1
        if ttfts:
            ttfts.sort()
            self.overhead_ms = ttfts[len(ttfts) // 2]

    def _write(self, rec: RequestRecord) -> None:
        if self.writer is not None:
            self.writer.write(rec)

    def write(self, rec: RequestRecord) -> None:
        """Append a record to records.jsonl (public alias of ``_write``)."""
        self._write(rec)

    # ---- cells --------------------------------------------------------------------------------------------------
    async def _prompts(self, cell: Cell, n: int, depth: int, tag: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for k in range(n):
            _, idx = self._next_id("p")
            if self.profile.prefix_cache:
                prefix, seed = "", k
            else:
                prefix, seed = unique_prefix(self.run_id, idx), idx
            try:
                pr = await build_prompt(cell.prompt, depth, seed=seed, prefix=prefix, tokenizer=self.tokenizer,
                                        overhead_tokens=self.template_overhead_tokens)
            except TokenizerError as e:
                raise ServerError(f"building a {depth}-token prompt: {e}") from None
            meta = {"cell": cell.id, "stream": k, "phase": tag, "target_tokens": depth,
                    "counted_tokens": pr.expected_prompt_tokens}
            out.append((pr.text, meta))
        return out

    async def _wave(self, cell: Cell, prompts: list[tuple[str, dict[str, Any]]], max_tokens: int,
                    tag: str, wave_no: int) -> list[RequestRecord]:
        if self.pool is not None and tag == "measure":
            return await self._wave_in_workers(cell, prompts, max_tokens, tag, wave_no)
        taps = [StreamTap() for _ in prompts]
        if self.observer is not None and tag == "measure":
            self.observer.wave_started(cell, taps)

        async def one(i: int) -> RequestRecord:
            text, meta = prompts[i]
            rec = await self.send(text, max_tokens, tag, {**meta, "wave": wave_no}, tap=taps[i])
            self._write(rec)
            if self.observer is not None and tag == "measure":
                self.observer.request_done(cell, rec.ok)
            return rec

        # a full garbage collection stops every stream's reads for tens of ms (measured: 33-40 ms at 256 streams):
        # none runs while a wave is in flight; the collector catches up between waves, outside any timing
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
        finally:
            if gc_was_on:
                gc.enable()
                gc.collect()

    async def _wave_in_workers(self, cell: Cell, prompts: list[tuple[str, dict[str, Any]]], max_tokens: int,
                               tag: str, wave_no: int) -> list[RequestRecord]:
        """One measured wave spread over the worker processes (records on one clock; no live counters)."""
        specs = []
        for text, meta in prompts:
            rid, _ = self._next_id(tag)
            specs.append(RequestSpec(rid, self.profile.endpoint, self.body(text, max_tokens), {**meta, "wave": wave_no}))
        recs = await self.pool.arun(specs)
        for rec in recs:
            self._write(rec)
            if self.observer is not None:
                self.observer.request_done(cell, rec.ok)
        return recs

    def planned_waves(self, cell: Cell) -> int:
        """Waves a cell runs at least: enough for ``requests`` and ``min_waves``."""
        return max(self.profile.min_waves, math.ceil(cell.requests / cell.streams))

    async def run_cell(self, cell: Cell, waves: int | None = None, *, warmup: bool = True) -> CellRun:
        """Warm-up waves, then measured waves of ``cell.streams`` concurrent requests.

        Args:
            waves: run exactly this many measured waves; default: :meth:`planned_waves`, extended up to
                ``max_waves`` while ``target_ci`` is not met.
            warmup: run the profile's warm-up waves first.
        """
        p = self.profile
        run = CellRun(cell)
        fixed = waves is not None
        want = waves if fixed else self.planned_waves(cell)
        if self.observer is not None:
            self.observer.cell_started(cell, want * cell.streams)
        if warmup:
            for w in range(p.warmup):
                prompts = await self._prompts(cell, cell.streams, 0, "warmup")
                await self._wave(cell, prompts, WARMUP_MAX_TOKENS, "warmup", w)
        if p.prefix_cache:
            # prime the cache: one request with the shared prompt, not measured
            prompts = await self._prompts(cell, 1, cell.depth, "prime")
            await self._wave(cell, prompts, WARMUP_MAX_TOKENS, "prime", 0)
        w = 0
        cpu_s = wall_s = 0.0
        while True:
            prompts = await self._prompts(cell, cell.streams, cell.depth, "measure")
            c0, t0 = time.process_time(), time.perf_counter()
            recs = await self._wave(cell, prompts, cell.max_tokens, "measure", w)
            cpu_s += time.process_time() - c0
            wall_s += time.perf_counter() - t0
            run.records.extend(recs)
            run.waves.append([r.request_id for r in recs])
            w += 1
            if w >= want:
                if fixed or w >= p.max_waves or not p.target_ci or self._ci_met(run):
                    break
                if self.observer is not None:
                    self.observer.cell_started(cell, (w + 1) * cell.streams)
        run.summary = summarize_cell(cell, run.records, run.waves, self.overhead_ms,
                                     depth_target_tokens=cell.depth or None,
                                     expected_cached_tokens=None if p.prefix_cache else self.template_cached_tokens)
        # bench is one thread: near 100 % of a core while measuring, the client may be the bottleneck
        cpu_pct = 100.0 * cpu_s / wall_s if wall_s > 0 else None
        run.summary["client_cpu_pct"] = None if cpu_pct is None else round(cpu_pct, 1)
        if cpu_pct is not None and cpu_pct > CLIENT_CPU_WARN_PCT:
            run.summary["warnings"].append(
                f"{cell.id}: bench's client used {cpu_pct:.0f} % of a CPU core while measuring; its timestamps may "
                "lag (see benchmarks/fidelity.py)")
        if all(not r.ok for r in run.records):
            kinds = sorted({r.error_kind or "?" for r in run.records})
            run.summary["warnings"].append(f"{cell.id}: every request failed ({', '.join(kinds)})")
        if self.observer is not None:
            self.observer.cell_done(cell, run.summary)
        return run

    def _ci_met(self, run: CellRun) -> bool:
        vals = [m.decode_tok_s for m in map(request_metrics, run.records) if m.ok and m.decode_tok_s]
        if len(vals) < 3:
            return False
        lo, hi = bootstrap_ci(vals)
        med = sorted(vals)[len(vals) // 2]
        return (hi - lo) / 2 <= self.profile.target_ci * med

    # ---- results -------------------------------------------------------------------------------------------------
    def results(self, cells: list[dict[str, Any]], *, interrupted: bool = False) -> dict[str, Any]:
        """The results document (schema: docs/results.md)."""
        p = self.profile
        settings = {k: v for k, v in asdict(p).items() if k not in ("source",)}
        warnings = list(self.warnings) + [w for c in cells for w in c.get("warnings", [])]
        return {
            "schema": SCHEMA_VERSION,
            "bench_version": __version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "profile": {"name": p.name, "source": p.source, "settings": settings},
            "endpoint": {"url": self.base, "model": self.model, "kind": p.endpoint},
            "server": self.server,
            "machine": machine_info(),
            "run": {
                "id": self.run_id,
                "started": self.started.isoformat(timespec="seconds"),
                "duration_s": round((datetime.now(UTC) - self.started).total_seconds(), 2),
                "interrupted": interrupted,
                "overhead_ms": self.overhead_ms,
                "tokenizer": self.tokenizer_kind,
                "template_overhead_tokens": self.template_overhead_tokens,
                "template_cached_tokens": self.template_cached_tokens,
                "forced_length": self.force_length,
                "workers": self.pool.workers if self.pool is not None else 1,
            },
            "cells": cells,
            "warnings": warnings,
        }


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


async def run_profile(
    base: str,
    profile: Profile,
    settings: ClientSettings,
    *,
    out_dir: Path | None,
    model: str | None = None,
    observer: Observer | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """Run every cell of ``profile`` against ``base``; returns the results document.

    ``workers``: processes that read the measured waves (1: this process; see :mod:`bench.workers`).

    Writes ``out_dir/records.jsonl`` (each request as it finishes) and rewrites ``out_dir/results.json`` after each
    cell, so nothing finished is lost. Raises :class:`RunInterrupted` on cancellation (Ctrl-C), after writing.
    """
    from .report.export import write_results

    session = await Session.open(base, settings, profile, model=model, out_dir=out_dir, observer=observer,
                                 workers=workers)
    cells: list[dict[str, Any]] = []
    try:
        for cell in profile.cells():
            run = await session.run_cell(cell)
            cells.append(run.summary)
            if out_dir is not None:
                write_results(session.results(cells), out_dir, formats=("json",))
        results = session.results(cells)
        if out_dir is not None:
            write_results(results, out_dir)
        return results
    except (asyncio.CancelledError, KeyboardInterrupt):
        if out_dir is not None:
            write_results(session.results(cells, interrupted=True), out_dir)
        n = session.writer.count if session.writer else 0
        raise RunInterrupted(out_dir, n) from None
    finally:
        await session.close()
