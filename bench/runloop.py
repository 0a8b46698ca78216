"""The run loops: ``bench run`` (:func:`run_profile`), ``bench gate`` (:func:`run_gate`, with its re-measurements)
and ``bench ab`` (:func:`run_ab`), over one :class:`bench.runner.Session` each.

All three share one incremental writer (:class:`RunOutput`: records as each request finishes, results.json after
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
from typing import Any

from .client import ClientSettings
from .errors import EXIT_CHECK_FAILED, ConfigError, GateCouldNotRun, RunInterrupted
from .gate import Rule, Verdict, check_comparable, compare, inconclusive_cells, overall_exit, uncovered_cells
from .profile import Profile
from .results import CellResult, Results, save_results, write_atomic
from .runner import CellAnnotator, CellRun, Observer, Session

__all__ = ["RunOutput", "GateOutcome", "run_profile", "run_gate", "run_ab", "stoppable", "Views"]

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


async def _interrupted(session: Session, cells: list[CellResult], out: RunOutput, got: dict[str, str]) -> None:
    out.final(session.results(cells, interrupted=True))
    n = session.writer.count if session.writer else 0
    raise RunInterrupted(out.out_dir, n, got["signal"]) from None


async def run_profile(base: str, profile: Profile, settings: ClientSettings, *, out_dir: Path | None,
                      model: str | None = None, observer: Observer | None = None, workers: int | str = 1,
                      views: Views | None = None, pool: Any = None,
                      annotators: list[CellAnnotator] | None = None, resume: Results | None = None,
                      ray_address: str | None = None, gpu: Any = None) -> Results:
    """Run every cell of ``profile`` against ``base``; returns the results document.

    ``workers``: processes that read the measured waves (1: this process; see :mod:`bench.workers`); ``pool``: an
    already made pool with the same interface (Ray actors). ``resume``: an interrupted run of the same profile,
    endpoint and model whose finished cells are kept (the unfinished one is measured again). At the end the
    overhead probes run again and ``run.drift`` says how far the server moved. Raises :class:`RunInterrupted` on
    SIGINT/SIGTERM, after writing what finished. ``gpu``: a GPU sampler (:mod:`bench.server.gpu`) around each
    cell's measured waves.
    """
    out = RunOutput(out_dir, views or {})
    async with stoppable() as got:
        session = await Session.open(base, settings, profile, model=model, out_dir=out_dir, observer=observer,
                                     workers=workers, pool=pool, annotators=annotators, ray_address=ray_address,
                                     gpu=gpu)
        cells: list[CellResult] = []
        try:
            done = _resumable(resume, session)
            for cell in profile.cells():
                if cell.id in done:
                    cells.append(done[cell.id])
                    continue
                run = await session.run_cell(cell)
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
        st.runs[cell.id] = await session.run_cell(cell)
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
            run.extend(await st.session.run_cell(cells[cid], waves=k, first_wave=len(run.waves)))
            st.session.summarize(run)
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
                for w in range(sa.planned_waves(cell)):
                    for sess, acc in ((sa, ra), (sb, rb)):
                        acc.extend(await sess.run_cell(cell, waves=1, warmup=(w == 0), first_wave=w))
                ca.append(sa.summarize(ra))
                cb.append(sb.summarize(rb))
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
