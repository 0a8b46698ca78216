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
import math
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.client import ClientSettings
from bench.config.load import LoadSettings
from bench.config.profile import Profile, profile_settings, settings_diff
from bench.errors import EXIT_CHECK_FAILED, BenchError, ConfigError, GateCouldNotRun, RunInterrupted
from bench.gate import (
    Rule,
    Verdict,
    check_comparable,
    inconclusive_cells,
    overall_exit,
    uncovered_cells,
)
from bench.records import RequestRecord, read_records
from bench.results import CellResult, Results, cell_from_dict, save_results, write_atomic
from bench.sequential import (
    MAX_GROWTH,
    Look,
    gate_schedules,
    look_schedule,
    plan_gate,
    plan_lines,
    sequential_compare,
)
from bench.session.endpoint import CellAnnotator, Observer, ReaderPool, Session
from bench.session.sweep import CellRun, Sweep
from bench.warns import warning

if TYPE_CHECKING:
    from bench.load.capacity import SearchSettings
    from bench.load.capacity_run import Progress

__all__ = ["RunOutput", "GateOutcome", "run_profile", "run_load", "run_capacity", "run_gate", "run_ab", "stoppable",
           "Views", "gate_schedules", "ABRounds", "plan_lines"]

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
    from datetime import UTC, datetime

    from bench.results import EndpointInfo, ProfileInfo, RunInfo
    from bench.version import __version__

    now = datetime.now(UTC).isoformat(timespec="seconds")
    settings = profile_settings(profile)
    return Results(profile=ProfileInfo(profile.name, profile.source, settings),
                   endpoint=EndpointInfo(base, model or "", profile.endpoint),
                   run=RunInfo(id="", started=now, interrupted=True), bench_version=__version__, created=now,
                   warnings=[warning("interrupted-setup")],
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
    _check_resume(resume, profile, base)  # before the probes: a refused --resume leaves the folder as it was
    async with stoppable() as got:
        session = await _open(got, out, lambda: out.final(_not_started(base, profile, model)), base, settings,
                              profile, model=model, out_dir=out_dir, observer=observer, workers=workers, pool=pool,
                              annotators=annotators, ray_address=ray_address, gpu=gpu)
        cells: list[CellResult] = []
        sweep = Sweep(session)
        try:
            done = _resumable(resume, session)
            for cell in profile.cells():
                if cell.id in done:
                    cells.append(done[cell.id])
                    if observer is not None:  # its number is its place in the profile
                        observer.cell_kept(cell)
                    continue
                run = await sweep.run_cell(cell)
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
        except BenchError:
            if cells:  # a run stopped by an error keeps what finished, with its views (marked incomplete)
                out.final(session.results(cells))
            raise
        finally:
            await session.close()


async def run_load(base: str, profile: Profile, settings: ClientSettings, ls: LoadSettings, *,
                   out_dir: Path | None, model: str | None = None, observer: Observer | None = None,
                   workers: int | str = 1, ray_address: str | None = None, views: Views | None = None) -> Results:
    """``bench run`` in an open-loop mode (``ls.mode``: rate, trace or sessions): one point; returns the results
    document (records.jsonl as requests end; results.json and ``views`` at the end, or on interrupt with the
    requests that ended so far). ``workers > 1`` sends the schedule from that many processes (``"auto"``: as many
    as its CPU need asks, :func:`bench.session.autosize.open_loop_workers`), ``ray_address`` from
    ``workers`` Ray actors on that cluster (``run.nodes`` names the nodes and their clock offsets). ``views``: the files
    beside results.json (default: results.csv and results.md).

    Raises:
        ConfigError: a bad setting, or ``ray_address`` in sessions mode (the conversations run in this process).
        RunInterrupted: SIGINT or SIGTERM, after writing what finished (``run.interrupted`` true).
    """
    from bench.load.point import interrupted_point, load_dict, make_plan, measure_load, plan_depth

    ls.check()
    if ray_address is not None and ls.mode == "sessions":
        raise ConfigError("--ray is not available with --sessions: the conversations run in this process")
    plan = make_plan(ls, profile.max_tokens) if ls.mode != "sessions" else None  # made once, sent as made
    planned = len(plan) if plan is not None else ls.users * ls.turns
    need = (f"the {ls.mode} schedule", max(p.input_tokens + p.output_tokens for p in plan)) if plan else None
    auto = workers == "auto"
    sizing = _open_loop_sizing(plan, ls, workers, ray_address, base)
    if sizing is not None:
        workers = int(sizing["workers"])
    from bench.report.export import VIEWS

    out = RunOutput(out_dir, VIEWS if views is None else views)
    async with stoppable() as got:
        session = await _open(got, out, lambda: out.final(_not_started(base, profile, model, load_dict(ls))), base,
                              settings, profile, model=model, out_dir=out_dir, observer=observer, workers=workers,
                              ray_address=ray_address, need=need)
        if sizing is not None:
            session.workers_auto, session.sizing = auto, {"open-loop": sizing}
        try:
            summary = await measure_load(session, ls, plan)
            results = session.results([cell_from_dict(summary, f"point {summary.get('id')}")], complete=True)
            results.load = load_dict(ls)
            out.final(results)
            return results
        except (asyncio.CancelledError, KeyboardInterrupt):
            summary = interrupted_point(ls, planned, _measured_records(session, out_dir), ls.slo_spec,
                                        depth=plan_depth(plan) if plan is not None else 0)
            results = session.results([cell_from_dict(summary, f"point {summary.get('id')}")], interrupted=True)
            results.load = load_dict(ls)
            out.final(results)
            raise RunInterrupted(out_dir, session.writer.count if session.writer else 0, got["signal"]) from None
        finally:
            await session.close()


def _open_loop_sizing(plan: list[Any] | None, ls: LoadSettings, workers: int | str,
                      ray_address: str | None, base: str = "") -> dict[str, Any] | None:
    """The open loop's processes when bench chooses them: ``--workers auto`` from the plan's CPU need (leaving a
    server on this host, ``base``, its share of the cores); one, with a
    note, for sessions (they run in this process) or a --max-concurrency cap (one process counts what is in
    flight); None: ``workers`` as given. ConfigError, before anything is sent, for a cap with N > 1 or --ray."""
    from bench.session.autosize import WorkerChoice, open_loop_workers
    from bench.session.hostload import server_here

    if not plan:
        return WorkerChoice(workers=1, note="sessions run in this process") if workers != 1 else None
    capped = ls.max_concurrency is not None and not all(p.at_s == 0 for p in plan)
    if capped and (ray_address is not None or (workers != "auto" and int(workers) > 1)):
        raise ConfigError("--max-concurrency is not available with --workers > 1 or --ray in open-loop runs "
                          "(one process counts what is in flight): leave --workers out, or the cap")
    if workers != "auto":
        return None
    if capped:
        return WorkerChoice(workers=1, note="--max-concurrency: one process sends the schedule")
    return open_loop_workers([p.at_s for p in plan], [p.output_tokens for p in plan], here=server_here(base))


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


def _check_resume(resume: Results | None, profile: Profile, base: str) -> None:
    """Refuse to continue a run of another profile, endpoint or settings (``--resume``)."""
    if resume is None:
        return
    _same_as_resumed("profile", resume.profile.name, profile.name)
    _same_as_resumed("endpoint", resume.endpoint.url, base)
    changed = settings_diff(resume.profile.settings, profile_settings(profile))
    if changed:
        raise ConfigError(f"--resume: the run to continue was measured with other settings ({changed}): its cells "
                          "and these would not compare; resume with the same flags, or --overwrite starts afresh")


def _same_as_resumed(what: str, was: str, now: str) -> None:
    if was != now:
        raise ConfigError(f"--resume: the run to continue used {what} {was!r}, this one {now!r} (same profile, "
                          "endpoint and model needed; --overwrite starts afresh)")


def _resumable(resume: Results | None, session: Session) -> dict[str, CellResult]:
    """The finished cells of the run to continue, after checking it is the same model (:func:`_check_resume` checked
    the rest before the session opened)."""
    if resume is None:
        return {}
    _same_as_resumed("model", resume.endpoint.model, session.model)
    total = len(session.profile.cells())
    if resume.cells:
        session.note(warning("resumed", run=resume.run.id, kept=len(resume.cells), total=total,
                             left=total - len(resume.cells)))
    else:
        session.note(warning("resumed-nothing-kept", run=resume.run.id, total=total))
    return {c.id: c for c in resume.cells}


@dataclass
class GateOutcome:
    """What :func:`run_gate` produced.

    Attributes:
        results: the candidate results document (every round's waves merged in).
        verdicts: the final verdicts (each made at its cell's last sequential look).
        code: :func:`bench.gate.overall_exit` of them (0/1/2).
        extra_waves: waves measured beyond the profile's planned ones, in all.
        remeasured: ``{cell id: extra waves}``.
        differences: comparability differences accepted with ``force``.
        plan: :func:`bench.sequential.plan_gate` of the baseline for the look schedules (before measuring).
        schedules: ``{cell id: candidate waves at each planned look}``.
        looks: ``{cell id: candidate waves at each look taken}``.
        wave_s: ``{cell id: seconds per measured wave}`` (from the first wave), ``warm_s``: of a round's warm-up.
        budget_ran_out: True when some undecided cell could not take its next look within the budget.
    """

    results: Results
    verdicts: list[Verdict]
    code: int
    extra_waves: int = 0
    remeasured: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    schedules: dict[str, list[int]] = field(default_factory=dict)
    looks: dict[str, list[int]] = field(default_factory=dict)
    wave_s: dict[str, float] = field(default_factory=dict)
    warm_s: dict[str, float] = field(default_factory=dict)
    budget_ran_out: bool = False


@dataclass
class _GateState:
    session: Session
    baseline: Results
    rules: Sequence[Rule]
    seed: int
    deadline: float | None = None
    spread_pct: float = 0.0
    runs: dict[str, CellRun] = field(default_factory=dict)
    extra: dict[str, int] = field(default_factory=dict)
    wave_s: dict[str, float] = field(default_factory=dict)
    warm_s: dict[str, float] = field(default_factory=dict)
    schedules: dict[str, list[int]] = field(default_factory=dict)
    looks: dict[str, list[int]] = field(default_factory=dict)
    planned: dict[str, float | None] = field(default_factory=dict)
    sweep: Sweep = field(init=False)

    def __post_init__(self) -> None:
        self.sweep = Sweep(self.session)

    def cells(self) -> list[CellResult]:
        return [r.summary for r in self.runs.values() if r.summary is not None]

    def results(self, complete: bool = False) -> Results:
        res = self.session.results(self.cells(), complete=complete)
        if self.extra:
            res.run.gate_extra_waves = dict(self.extra)
        return res

    def baseline_waves(self, cid: str) -> int:
        cell = next((c for c in self.baseline.cells if c.id == cid), None)
        return cell.waves if cell is not None and cell.waves > 0 else self.schedules[cid][0]

    def verdicts(self) -> list[Verdict]:
        looks = {cid: Look(tuple(ws), self.schedules[cid][-1], self.baseline_waves(cid), spread_pct=self.spread_pct)
                 for cid, ws in self.looks.items() if ws}
        return sequential_compare(self.baseline, self.results(), self.rules, looks, planned=self.planned,
                                  seed=self.seed)

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()


async def run_gate(base: str, profile: Profile, settings: ClientSettings, baseline: Results, rules: Sequence[Rule],
                   *, model: str | None = None, out_dir: Path | None = None, force: bool = False,
                   budget_waves: int | None = None, max_waves: int | None = None, deadline: float | None = None,
                   observer: Observer | None = None, log: Callable[[str], None] | None = None, seed: int = 0,
                   views: Views | None = None, instance_spread_pct: float = 0.0, gpu: Any = None) -> GateOutcome:
    """Run ``profile`` against ``base`` and decide every rule against ``baseline`` sequentially.

    Before measuring: one warm-up and one measured wave per cell give its seconds per wave; with the baseline's
    noise they fix each cell's looks (:func:`gate_schedules`: the profile's planned waves first, then 1.5x more per
    round, up to what ``deadline`` (``time.monotonic()`` value), ``budget_waves`` (extra waves in all; default
    ``profile.gate_budget_waves`` when neither a deadline nor ``max_waves`` is given) and ``max_waves`` (per
    cell) allow) and the planned MDE
    of each rule (:func:`bench.sequential.plan_gate`), which ``log`` prints. Then rounds: every undecided cell is measured
    up to its next look and judged by :func:`bench.sequential.sequential_compare` (alpha spending, so the looks keep the
    stated false-alarm rate) until every rule is decided, a regression decides the exit code, or the budget ends.
    ``instance_spread_pct``: the spread between server instances, folded into every look (a stored baseline from
    another instance; :class:`bench.sequential.Look`). ``gpu``: a GPU sampler (:mod:`bench.server.gpu`) around each
    cell's measured waves.

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
        st = _GateState(session, baseline, rules, seed, deadline, instance_spread_pct)
        try:
            return await _gate(st, out, force, (budget_waves, max_waves), log or (lambda s: None))
        except (asyncio.CancelledError, KeyboardInterrupt):
            await _interrupted(session, st.cells(), out, got)
            raise
        finally:
            await session.close()


async def _gate(st: _GateState, out: RunOutput, force: bool, budget: tuple[int | None, int | None],
                say: Callable[[str], None]) -> GateOutcome:
    session, profile = st.session, st.session.profile
    # fail fast, before measuring anything, when the model or the backend differ
    check_comparable(st.baseline, session.results([]), force, ignore_interrupted=True)
    cells = {c.id: c for c in profile.cells()}
    for cell in cells.values():  # the plan's wave: a warm-up and one measured wave per cell, timed
        t0 = time.monotonic()
        st.runs[cell.id] = run = await st.sweep.run_cell(cell, waves=1)
        st.wave_s[cell.id] = max(run.wall_s, 1e-3)
        st.warm_s[cell.id] = max(time.monotonic() - t0 - run.wall_s, 0.0)
        out.progress(st.results())
    failed = [c.id for c in st.cells() if c.requests_ok == 0 and c.requests_failed > 0]
    if failed:
        out.final(st.results(complete=True))
        raise GateCouldNotRun(f"every request failed in cell(s) {', '.join(failed)}; see "
                              f"{out.out_dir or 'the results'} (nothing to compare)")
    diffs = check_comparable(st.baseline, st.results(complete=True), force)
    for cid in uncovered_cells(st.baseline, st.results()):  # a warning as every other: through the observer
        text = warning("cell-not-covered", cell=cid, which="the candidate")
        if session.observer is not None:
            session.observer.note(text)
        else:
            say(f"warning {text}")
    plan = _make_plan(st, budget, say)
    ran_out = await _rounds(st, cells, say)
    if st.left() > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.measure_drift(), timeout=min(st.left(), 60.0))
    results = st.results(complete=True)
    verdicts = st.verdicts()
    out.final(results)
    return GateOutcome(results, verdicts, overall_exit(verdicts), sum(st.extra.values()), dict(st.extra), diffs,
                       plan, st.schedules, st.looks, st.wave_s, st.warm_s, ran_out)


def _gated_cells(st: _GateState) -> set[str]:
    """Cells some rule can judge (in both runs and covered by a rule's cell)."""
    base = {c.id for c in st.baseline.cells}
    return {cid for cid in st.runs if cid in base and any(r.cell in ("*", cid) for r in st.rules)}


def _make_plan(st: _GateState, budget: tuple[int | None, int | None], say: Callable[[str], None]
               ) -> list[dict[str, Any]]:
    profile = st.session.profile
    budget_waves, max_waves = budget
    if budget_waves is None and st.deadline is None and max_waves is None:
        budget_waves = profile.gate_budget_waves  # no budget given: the profile's extra waves
    first = {cid: st.sweep.planned_waves(run.cell) for cid, run in st.runs.items()}
    gated = _gated_cells(st)
    costs = {cid: (st.wave_s[cid], st.warm_s[cid]) for cid in first}
    reserve = 1.0 + 2.0 * max(st.warm_s.values(), default=0.0)  # the drift probes at the end
    st.schedules = gate_schedules(first, costs, gated, time_left=st.left() - reserve, waves_left=budget_waves,
                                  max_waves=max_waves)
    st.looks = {cid: [] for cid in st.schedules}
    plan = plan_gate(st.baseline, st.rules, {cid: s for cid, s in st.schedules.items() if cid in gated},
                     seed=st.seed, spread_pct=st.spread_pct)
    st.planned = {p["name"]: p["planned_mde_pct"] for p in plan}
    for line in plan_lines(plan, st.schedules, costs, st.left() if st.deadline is not None else None):
        say(line)
    return plan


async def _rounds(st: _GateState, cells: Mapping[str, Any], say: Callable[[str], None]) -> bool:
    """Measure every undecided cell up to its next look and judge, until all are decided, a regression decides
    the exit code, or the budget ends; returns True when the budget stopped an undecided cell."""
    open_cells = list(st.schedules)
    ran_out = False
    while open_cells:
        for cid in list(open_cells):
            if not await _next_look(st, cid, cells[cid], say):
                ran_out = True
                open_cells.remove(cid)
        verdicts = st.verdicts()
        if overall_exit(verdicts) == EXIT_CHECK_FAILED:
            break  # a regression already decides the exit code
        todo = set(inconclusive_cells(verdicts))
        open_cells = [c for c in open_cells if c in todo and len(st.looks[c]) < len(st.schedules[c])]
    return ran_out


async def _next_look(st: _GateState, cid: str, cell: Any, say: Callable[[str], None]) -> bool:
    """Bring ``cid`` to its next look's waves; False (nothing measured) when that does not fit the budget."""
    run = st.runs[cid]
    target = st.schedules[cid][len(st.looks[cid])]
    k = target - len(run.waves)
    if k > 0:
        cost = st.warm_s[cid] + k * st.wave_s[cid]
        if cost * 1.1 > st.left():
            say(f"{cid}: the budget ends before look {len(st.looks[cid]) + 1} ({k} more waves, ~{cost:.0f} s)")
            return False
        run.extend(await st.sweep.run_cell(cell, waves=k, first_wave=len(run.waves)))
        st.sweep.summarize(run)
        planned = st.sweep.planned_waves(cell)
        st.extra[cid] = max(0, len(run.waves) - planned)
        if not st.extra[cid]:
            del st.extra[cid]
    st.looks[cid].append(len(run.waves))
    return True


@dataclass
class ABRounds:
    """Sequential rounds for :func:`run_ab`: the rules to decide and the budget; :func:`run_ab` fills in the looks.

    Without ``deadline`` (``time.monotonic()`` value) and ``max_waves`` each cell gets its planned waves and one
    look (the fixed comparison). With them, a cell's looks are its planned waves and then 1.5x more per round up
    to what its share of the time left (and ``max_waves``) allows; it stops at the first look that decides every
    rule on it (both sides grow together, so the information grows like the waves).
    """

    rules: Sequence[Rule]
    deadline: float | None = None
    max_waves: int | None = None
    seed: int = 0
    schedules: dict[str, list[int]] = field(default_factory=dict)
    looks: dict[str, list[int]] = field(default_factory=dict)
    budget_ran_out: bool = False

    def look_map(self) -> dict[str, Look]:
        """``{cell id: Look}`` of the last look taken in each cell."""
        return {cid: Look(tuple(ws), self.schedules[cid][-1], None) for cid, ws in self.looks.items() if ws}

    def schedule(self, first: int, pair_s: float, cells_left: int) -> list[int]:
        """A cell's looks from its planned waves, one A+B pair's seconds and the cells still to measure."""
        top = first
        if self.deadline is not None:
            share = max(self.deadline - time.monotonic() - 1.0, 0.0) / max(cells_left, 1)
            top = min(first + int(share / max(pair_s, 1e-3)), MAX_GROWTH * first)
            top = min(top, self.max_waves) if self.max_waves is not None else top
        elif self.max_waves is not None:
            top = self.max_waves
        return look_schedule(first, max(top, first))


async def _ab_pairs(sa: Sweep, sb: Sweep, ra: CellRun, rb: CellRun, start: int, stop: int) -> None:
    """Waves ``start .. stop - 1`` of a cell, A then B each (each side warms up before its wave 0)."""
    for w in range(start, stop):
        for sweep, acc in ((sa, ra), (sb, rb)):
            acc.extend(await sweep.run_cell(ra.cell, waves=1, warmup=(w == 0), first_wave=w))


async def _ab_cell(sa: Sweep, sb: Sweep, cell: Any, rounds: ABRounds | None, cells_left: int
                   ) -> tuple[CellResult, CellResult]:
    ra, rb = CellRun(cell), CellRun(cell)
    first = sa.planned_waves(cell)
    await _ab_pairs(sa, sb, ra, rb, 0, 1)
    t0 = time.monotonic()
    await _ab_pairs(sa, sb, ra, rb, 1, first)
    if rounds is None:
        return sa.summarize(ra), sb.summarize(rb)
    pair_s = (time.monotonic() - t0) / (first - 1) if first > 1 else max(ra.wall_s + rb.wall_s, 1e-3)
    sched = rounds.schedules[cell.id] = rounds.schedule(first, pair_s, cells_left)
    looks = rounds.looks[cell.id] = []
    for target in sched:
        k = target - len(ra.waves)
        if k > 0 and rounds.deadline is not None and k * pair_s * 1.1 > rounds.deadline - time.monotonic():
            rounds.budget_ran_out = True
            break
        await _ab_pairs(sa, sb, ra, rb, len(ra.waves), target)
        looks.append(len(ra.waves))
        a, b = sa.session.results([sa.summarize(ra)]), sb.session.results([sb.summarize(rb)])
        vs = sequential_compare(a, b, rounds.rules, rounds.look_map(), seed=rounds.seed)
        if overall_exit(vs) == EXIT_CHECK_FAILED or cell.id not in inconclusive_cells(vs):
            break
    return sa.summarize(ra), sb.summarize(rb)


async def run_ab(base_a: str, base_b: str, profile: Profile, settings: ClientSettings, *, model_a: str | None = None,
                 model_b: str | None = None, observer: Observer | None = None, out_a: Path | None = None,
                 out_b: Path | None = None, views: Views | None = None,
                 rounds: ABRounds | None = None) -> tuple[Results, Results]:
    """Measure two endpoints with interleaved waves: per cell, waves go A, B, A, B, ... (each side warms up before
    its first wave of a cell), so slow drift of the machine or the network falls on both alike.

    Each side runs the cell's planned waves (``target_ci`` is not used), and with ``rounds`` more pairs of waves
    until the cell's rules are decided or the budget ends (:class:`ABRounds`; its looks are filled in for
    :func:`bench.sequential.sequential_compare`). Each side is summarized by the same step as ``bench run``. Writes each
    side's folder (``out_a``/``out_b``) incrementally. Returns ``(a, b)``.
    """
    oa, ob = RunOutput(out_a, views or {}), RunOutput(out_b, views or {})
    async with stoppable() as got:
        sa = await Session.open(base_a, settings, profile, model=model_a, observer=_side(observer, "A"), out_dir=out_a)
        try:
            sb = await Session.open(base_b, settings, profile, model=model_b, observer=_side(observer, "B"),
                                    out_dir=out_b)
        except BaseException:
            await sa.close()
            raise
        ca: list[CellResult] = []
        cb: list[CellResult] = []
        sweep_a, sweep_b = Sweep(sa), Sweep(sb)
        try:
            cells = profile.cells()
            for i, cell in enumerate(cells):
                sum_a, sum_b = await _ab_cell(sweep_a, sweep_b, cell, rounds, len(cells) - i)
                ca.append(sum_a)
                cb.append(sum_b)
                oa.progress(sa.results(ca))
                ob.progress(sb.results(cb))
            await sa.measure_drift()
            await sb.measure_drift()
            a, b = sa.results(ca, complete=True), sb.results(cb, complete=True)
            oa.final(a)
            ob.final(b)
            return a, b
        except (asyncio.CancelledError, KeyboardInterrupt):
            oa.final(sa.results(ca, interrupted=True))
            ob.final(sb.results(cb, interrupted=True))
            raise _ab_interrupted((sa, oa), (sb, ob), got["signal"]) from None
        finally:
            await sa.close()
            await sb.close()


def _side(observer: Observer | None, side: str) -> Observer | None:
    """``observer`` for one side of ``bench ab``: its progress lines and bars say which (A or B)."""
    from bench.report.progress import QuietObserver, Sided

    return Sided(observer, side) if isinstance(observer, QuietObserver) else observer


def _ab_interrupted(a: tuple[Session, RunOutput], b: tuple[Session, RunOutput], signal_name: str) -> RunInterrupted:
    """The interrupt of ``bench ab``: what each side kept (both folders hold their finished records)."""
    na, nb = (s.writer.count if s.writer else 0 for s, _ in (a, b))
    da, db = a[1].out_dir, b[1].out_dir
    if da is None or db is None:
        return RunInterrupted(None, na + nb, signal_name, kept="no records kept (no --out)")
    return RunInterrupted(da.parent, na + nb, signal_name, kept=f"finished records kept: {na} in {da}, {nb} in {db}")
