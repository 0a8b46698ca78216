"""The one driver of every command that measures: ``bench run`` in waves (:func:`run_profile`), ``bench run
--rate/--trace/--sessions`` (:func:`run_load`), ``bench capacity`` (:func:`run_capacity`), ``bench gate``
(:func:`run_gate`, with its re-measurements) and ``bench ab`` (:func:`run_ab`), over one
:class:`bench.session.endpoint.Session` each.

All of them share one incremental writer (:class:`RunOutput`: records as each request finishes, results.json after
each cell, marked incomplete until the end, the other views at the end) and one signal handling
(:func:`stoppable`: SIGINT and SIGTERM both cancel the run; what finished is written, the results are marked
interrupted, and :class:`bench.errors.RunInterrupted` is raised). Nothing here prints: progress goes to the
observer, notes to ``log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import ClientSettings
from bench.config.load import LoadSettings
from bench.config.profile import Profile
from bench.errors import EXIT_CHECK_FAILED, ConfigError, GateCouldNotRun, RunInterrupted
from bench.gate import Rule, Verdict, check_comparable, compare, inconclusive_cells, overall_exit, uncovered_cells
from bench.records import RequestRecord, read_records
from bench.results import CellResult, Results, cell_from_dict, save_results, write_atomic
from bench.session.endpoint import CellAnnotator, Observer, ReaderPool, Session
from bench.session.sweep import CellRun, Sweep

if TYPE_CHECKING:
    from bench.load.capacity import SearchSettings
    from bench.load.capacity_run import Progress

__all__ = ["RunOutput", "GateOutcome", "run_profile", "run_load", "run_capacity", "run_gate", "run_ab", "stoppable",
           "Views"]

Views = Mapping[str, Callable[[Results], str]]
"""Extra files written beside results.json at the end (and on interrupt): ``{file name: results -> text}``."""


@dataclass
class RunOutput:
    """Where a run's files go: ``records.jsonl`` (through the session), ``results.json`` after every cell
    (``run.complete`` false until the end) and ``views`` at the end. ``out_dir=None`` writes nothing."""

    out_dir: Path | None
    views: Views = field(default_factory=dict)

    def progress(self, results: Results) -> None:
        """After a cell: results.json so far (incomplete)."""
        if self.out_dir is not None:
            save_results(results, self.out_dir / "results.json")

    def final(self, results: Results) -> None:
        """At the end or on interrupt: results.json and every view."""
        if self.out_dir is None:
            return
        save_results(results, self.out_dir / "results.json")
        for name, fn in self.views.items():
            write_atomic(self.out_dir / name, fn(results))


@contextlib.asynccontextmanager
async def stoppable() -> AsyncIterator[dict[str, str]]:
    """SIGTERM cancels the current task as Ctrl-C does (asyncio.run turns SIGINT into a cancellation already).

    Yields a dict whose ``"signal"`` names the signal that stopped the run (``SIGINT`` unless SIGTERM came).
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    got = {"signal": "SIGINT"}

    def on_term() -> None:
        got["signal"] = "SIGTERM"
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_term)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        installed = False
    try:
        yield got
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


async def _open(got: dict[str, str], out: RunOutput, on_stop: Callable[[], object], base: str,
                settings: ClientSettings, profile: Profile, **kw: Any) -> Session:
    """:meth:`Session.open`; an interrupt while it runs writes what ``on_stop`` writes (the document of a run that
    measured nothing) and raises :class:`RunInterrupted`."""
    try:
        return await Session.open(base, settings, profile, **kw)
    except (asyncio.CancelledError, KeyboardInterrupt):
        on_stop()
        raise RunInterrupted(out.out_dir, 0, got["signal"]) from None


def _not_started(base: str, profile: Profile, model: str | None, load: dict[str, Any] | None = None) -> Results:
    """The results document of a run interrupted before its first request: no cells, ``run.interrupted``."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    from bench.results import EndpointInfo, ProfileInfo, RunInfo
    from bench.version import __version__

    now = datetime.now(UTC).isoformat(timespec="seconds")
    settings = {k: v for k, v in asdict(profile).items() if k != "source"}
    return Results(profile=ProfileInfo(profile.name, profile.source, settings),
                   endpoint=EndpointInfo(base, model or "", profile.endpoint),
                   run=RunInfo(id="", started=now, interrupted=True), bench_version=__version__, created=now,
                   warnings=["interrupted before the first measured request (while the endpoint was being set up)"],
                   load=load)


async def _interrupted(session: Session, cells: list[CellResult], out: RunOutput, got: dict[str, str]) -> None:
    out.final(session.results(cells, interrupted=True))
    n = session.writer.count if session.writer else 0
    raise RunInterrupted(out.out_dir, n, got["signal"]) from None


async def run_profile(base: str, profile: Profile, settings: ClientSettings, *, out_dir: Path | None,
                      model: str | None = None, observer: Observer | None = None, workers: int | str = 1,
                      views: Views | None = None, pool: ReaderPool | None = None,
                      annotators: list[CellAnnotator] | None = None, resume: Results | None = None,
                      ray_address: str | None = None, gpu: Any = None) -> Results:
    """Run every cell of ``profile`` against ``base``; returns the results document.

    ``workers``: processes that read the measured waves (1: this process; see :mod:`bench.session.workers`); ``pool``: an
    already made pool with the same interface (Ray actors). ``resume``: an interrupted run of the same profile,
    endpoint and model whose finished cells are kept (the unfinished one is measured again). At the end the
    overhead probes run again and ``run.drift`` says how far the server moved. Raises :class:`RunInterrupted` on
    SIGINT/SIGTERM, after writing what finished. ``gpu``: a GPU sampler (:mod:`bench.server.gpu`) around each
    cell's measured waves.
    """
    out = RunOutput(out_dir, views or {})
    async with stoppable() as got:
        session = await _open(got, out, lambda: out.final(_not_started(base, profile, model)), base, settings,
                              profile, model=model, out_dir=out_dir, observer=observer, workers=workers, pool=pool,
                              annotators=annotators, ray_address=ray_address, gpu=gpu)
        cells: list[CellResult] = []
        try:
            done = _resumable(resume, session)
            for cell in profile.cells():
                if cell.id in done:
                    cells.append(done[cell.id])
                    continue
                run = await Sweep(session).run_cell(cell)
                assert run.summary is not None
                cells.append(run.summary)
                out.progress(session.results(cells))
            await session.measure_drift()
            results = session.results(cells, complete=True)
            out.final(results)
            return results
        except (asyncio.CancelledError, KeyboardInterrupt):
            await _interrupted(session, cells, out, got)
            raise  # unreachable: _interrupted raises
        finally:
            await session.close()


async def run_load(base: str, profile: Profile, settings: ClientSettings, ls: LoadSettings, *,
                   out_dir: Path | None, model: str | None = None, observer: Observer | None = None,
                   workers: int = 1, ray_address: str | None = None, views: Views | None = None) -> Results:
    """``bench run`` in an open-loop mode (``ls.mode``: rate, trace or sessions): one point; returns the results
    document (records.jsonl as requests end; results.json and ``views`` at the end, or on interrupt with the
    requests that ended so far). ``workers > 1`` sends the schedule from that many processes, ``ray_address`` from
    ``workers`` Ray actors on that cluster (``run.ray`` names the nodes and their clock offsets). ``views``: the files
    beside results.json (default: results.csv and results.md).

    Raises:
        ConfigError: a bad setting, or ``ray_address`` in sessions mode (the conversations run in this process).
        RunInterrupted: SIGINT or SIGTERM, after writing what finished (``run.interrupted`` true).
    """
    from bench.load.point import interrupted_point, load_dict, make_plan, measure_load

    ls.check()
    if ray_address is not None and ls.mode == "sessions":
        raise ConfigError("--ray is not available with --sessions: the conversations run in this process")
    planned = len(make_plan(ls, profile.max_tokens)) if ls.mode != "sessions" else ls.users * ls.turns
    from bench.report.export import VIEWS

    out = RunOutput(out_dir, VIEWS if views is None else views)
    async with stoppable() as got:
        session = await _open(got, out, lambda: out.final(_not_started(base, profile, model, load_dict(ls))), base,
                              settings, profile, model=model, out_dir=out_dir, observer=observer, workers=workers,
                              ray_address=ray_address)
        try:
            summary = await measure_load(session, ls)
            results = session.results([cell_from_dict(summary, f"point {summary.get('id')}")], complete=True)
            results.load = load_dict(ls)
            out.final(results)
            return results
        except (asyncio.CancelledError, KeyboardInterrupt):
            summary = interrupted_point(ls, planned, _measured_records(session, out_dir), ls.slo_spec)
            results = session.results([cell_from_dict(summary, f"point {summary.get('id')}")], interrupted=True)
            results.load = load_dict(ls)
            out.final(results)
            raise RunInterrupted(out_dir, session.writer.count if session.writer else 0, got["signal"]) from None
        finally:
            await session.close()


def _measured_records(session: Session, out_dir: Path | None) -> list[RequestRecord]:
    """The measured requests this session wrote so far (read back from its records.jsonl)."""
    if out_dir is None or session.writer is None:
        return []
    return [r for r in read_records(session.writer.path) if r.meta.get("phase") == "measure"]


async def run_capacity(base: str, profile: Profile, settings: ClientSettings, ls: LoadSettings,
                       ss: SearchSettings, *, out_dir: Path, model: str | None = None,
                       progress: Progress | None = None) -> dict[str, Any]:
    """``bench capacity``: the search (:mod:`bench.load.capacity`) over one session; returns capacity.json's
    document (written to ``out_dir`` with every point's folder).

    Raises:
        RunInterrupted: SIGINT or SIGTERM, after writing capacity.json with ``"interrupted": true`` and the
            points finished so far.
    """
    from bench.load.capacity_run import not_searched, search_capacity

    async with stoppable() as got:
        session = await _open(got, RunOutput(out_dir), lambda: not_searched(ls, ss, out_dir), base, settings,
                              profile, model=model, out_dir=out_dir)
        try:
            return await search_capacity(session, ls, ss, out_dir=out_dir, progress=progress)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise RunInterrupted(out_dir, 0, got["signal"]) from None
        finally:
            await session.close()


def _resumable(resume: Results | None, session: Session) -> dict[str, CellResult]:
    """The finished cells of the run to continue, after checking it is the same profile, endpoint and model."""
    if resume is None:
        return {}
    for what, was, now in (("profile", resume.profile.name, session.profile.name),
                           ("endpoint", resume.endpoint.url, session.base),
                           ("model", resume.endpoint.model, session.model)):
        if was != now:
            raise ConfigError(f"--resume: the run to continue used {what} {was!r}, this one {now!r} (same profile, "
                              "endpoint and model needed; --overwrite starts afresh)")
    session.note(f"resumed run {resume.run.id}: {len(resume.cells)} finished cell(s) kept, the rest measured now")
    return {c.id: c for c in resume.cells}


@dataclass
class GateOutcome:
    """What :func:`run_gate` produced.

    Attributes:
        results: the candidate results document (re-measured cells merged in).
        verdicts: the final verdicts.
        code: :func:`bench.gate.overall_exit` of them (0/1/2).
        extra_waves: re-measure waves spent (<= the budget).
        remeasured: ``{cell id: extra waves}``.
        differences: comparability differences accepted with ``force``.
    """

    results: Results
    verdicts: list[Verdict]
    code: int
    extra_waves: int = 0
    remeasured: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


@dataclass
class _GateState:
    session: Session
    baseline: Results
    rules: Sequence[Rule]
    level: float
    seed: int
    runs: dict[str, CellRun] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)

    def cells(self) -> list[CellResult]:
        return [r.summary for r in self.runs.values() if r.summary is not None]

    def results(self, complete: bool = False) -> Results:
        res = self.session.results(self.cells(), complete=complete)
        if self.extra:
            res.run.gate_extra_waves = dict(self.extra)
        return res

    def verdicts(self) -> list[Verdict]:
        return compare(self.baseline, self.results(), self.rules, level=self.level, seed=self.seed)


async def run_gate(base: str, profile: Profile, settings: ClientSettings, baseline: Results, rules: Sequence[Rule],
                   *, model: str | None = None, out_dir: Path | None = None, force: bool = False,
                   budget_waves: int | None = None, observer: Observer | None = None,
                   log: Callable[[str], None] | None = None, level: float = 0.95, seed: int = 0,
                   views: Views | None = None, gpu: Any = None) -> GateOutcome:
    """Run ``profile`` against ``base``, compare with ``baseline`` under ``rules``, re-measure inconclusive cells.

    Re-measuring: while some cell has an inconclusive verdict, no verdict is a regression (which already decides
    the exit code) and budget is left (``budget_waves``, default ``profile.gate_budget_waves``), each such cell gets
    ``min(its current waves, budget left / cells)`` (at least 1) more measured waves (after its warm-up), merged
    with its earlier ones through the same cell-summary step, and every verdict is recomputed. ``gpu``: a GPU
    sampler (:mod:`bench.server.gpu`) around each cell's measured waves.

    Raises:
        ConfigError: the runs are not comparable (profile, model, backend; unless ``force``).
        GateCouldNotRun: every request of some cell failed.
        RunInterrupted: SIGINT/SIGTERM (what finished is written).
    """
    if baseline.profile.name != profile.name and not force:
        raise ConfigError(f"runs are not comparable: the baseline was made with profile {baseline.profile.name!r}, "
                          f"this run uses {profile.name!r} (--force compares anyway)")
    out = RunOutput(out_dir, views or {})
    async with stoppable() as got:
        session = await Session.open(base, settings, profile, model=model, out_dir=out_dir, observer=observer,
                                     gpu=gpu)
        st = _GateState(session, baseline, rules, level, seed)
        try:
            return await _gate(st, out, force, budget_waves, log or (lambda s: None))
        except (asyncio.CancelledError, KeyboardInterrupt):
            await _interrupted(session, st.cells(), out, got)
            raise
        finally:
            await session.close()


async def _gate(st: _GateState, out: RunOutput, force: bool, budget_waves: int | None,
                say: Callable[[str], None]) -> GateOutcome:
    session, profile = st.session, st.session.profile
    # fail fast, before measuring anything, when the model or the backend differ
    probe = session.results([])
    check_comparable(st.baseline, probe, force, ignore_interrupted=True)
    for cell in profile.cells():
        st.runs[cell.id] = await Sweep(session).run_cell(cell)
        out.progress(st.results())
    failed = [c.id for c in st.cells() if c.requests_ok == 0 and c.requests_failed > 0]
    if failed:
        out.final(st.results(complete=True))
        raise GateCouldNotRun(f"every request failed in cell(s) {', '.join(failed)}; see "
                              f"{out.out_dir or 'the results'} (nothing to compare)")
    diffs = check_comparable(st.baseline, st.results(complete=True), force)
    for cid in uncovered_cells(st.baseline, st.results()):
        say(f"warning: cell {cid} is not in the baseline; no rule can check it")
    spent = await _remeasure(st, profile.gate_budget_waves if budget_waves is None else budget_waves, say)
    await session.measure_drift()
    results = st.results(complete=True)
    verdicts = compare(st.baseline, results, st.rules, level=st.level, seed=st.seed)
    out.final(results)
    return GateOutcome(results, verdicts, overall_exit(verdicts), spent, dict(st.extra), diffs)


async def _remeasure(st: _GateState, budget: int, say: Callable[[str], None]) -> int:
    """Extra waves for inconclusive cells within ``budget``; returns the waves spent."""
    spent = 0
    cells = {c.id: c for c in st.session.profile.cells()}
    verdicts = st.verdicts()
    while spent < budget:
        todo = [cid for cid in inconclusive_cells(verdicts) if cid in cells]
        if not todo or overall_exit(verdicts) == EXIT_CHECK_FAILED:
            break  # nothing to settle, or a regression already decides the exit code
        share = max(1, (budget - spent) // len(todo))
        for cid in todo:
            if spent >= budget:
                break
            run = st.runs[cid]
            k = min(share, len(run.waves) or 1, budget - spent)
            say(f"re-measuring {cid}: {k} more wave(s) (inconclusive; budget {budget - spent} of {budget} left)")
            run.extend(await Sweep(st.session).run_cell(cells[cid], waves=k, first_wave=len(run.waves)))
            Sweep(st.session).summarize(run)
            spent += k
            st.extra[cid] = st.extra.get(cid, 0) + k
        verdicts = st.verdicts()
    return spent


async def run_ab(base_a: str, base_b: str, profile: Profile, settings: ClientSettings, *, model_a: str | None = None,
                 model_b: str | None = None, observer: Observer | None = None, out_a: Path | None = None,
                 out_b: Path | None = None, views: Views | None = None) -> tuple[Results, Results]:
    """Measure two endpoints with interleaved waves: per cell, waves go A, B, A, B, ... (each side warms up before
    its first wave of a cell), so slow drift of the machine or the network falls on both alike.

    Each side runs the cell's planned waves (``target_ci`` is not used) and is summarized by the same step as
    ``bench run``. Writes each side's folder (``out_a``/``out_b``) incrementally. Returns ``(a, b)``.
    """
    oa, ob = RunOutput(out_a, views or {}), RunOutput(out_b, views or {})
    async with stoppable() as got:
        sa = await Session.open(base_a, settings, profile, model=model_a, observer=observer, out_dir=out_a)
        try:
            sb = await Session.open(base_b, settings, profile, model=model_b, observer=observer, out_dir=out_b)
        except BaseException:
            await sa.close()
            raise
        ca: list[CellResult] = []
        cb: list[CellResult] = []
        try:
            for cell in profile.cells():
                ra, rb = CellRun(cell), CellRun(cell)
                for w in range(Sweep(sa).planned_waves(cell)):
                    for sess, acc in ((sa, ra), (sb, rb)):
                        acc.extend(await Sweep(sess).run_cell(cell, waves=1, warmup=(w == 0), first_wave=w))
                ca.append(Sweep(sa).summarize(ra))
                cb.append(Sweep(sb).summarize(rb))
                oa.progress(sa.results(ca))
                ob.progress(sb.results(cb))
            await sa.measure_drift()
            await sb.measure_drift()
            a, b = sa.results(ca, complete=True), sb.results(cb, complete=True)
            oa.final(a)
            ob.final(b)
            return a, b
        except (asyncio.CancelledError, KeyboardInterrupt):
            ob.final(sb.results(cb, interrupted=True))
            await _interrupted(sa, ca, oa, got)
            raise
        finally:
            await sa.close()
            await sb.close()
