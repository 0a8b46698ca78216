"""Live progress of a run: on a terminal a rich display (the cell, requests done of total, live tok/s, elapsed and
ETA, and whether streams are waiting for their first token, a long prefill); in a log (stdout not a terminal, a CI
job) plain lines, one when each cell starts, one when it ends with its decode figure, and one every
``interval_s`` (30 s) inside a long cell; so a quiet run never looks hung."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from collections.abc import Awaitable
from typing import Any, TextIO, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bench.client import StreamTap
from bench.config.profile import Cell
from bench.measure.metrics import request_metrics
from bench.measure.slo import SLO, meets
from bench.report.console import say, warn
from bench.report.tables import num
from bench.results import CellResult

__all__ = ["CapacityProgress", "RichObserver", "QuietObserver", "PlainObserver", "Sided", "cell_result_text",
           "PROGRESS_EVERY_S", "make_observer", "observed", "shown_notes"]

PROGRESS_EVERY_S = 30.0
T = TypeVar("T")
_SHOWN: set[str] = set()  # the notes this command's observer printed live (the end's list leaves them out)


def shown_notes() -> frozenset[str]:
    """The run-level warnings the current command's observer already printed while it ran."""
    return frozenset(_SHOWN)


class QuietObserver:
    """An observer that only collects notes (for --json / non-terminal use)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console
        _SHOWN.clear()  # a new command's observer: nothing of this command printed yet
        self.side = ""  # bench ab: the side (A or B) the calls are for now (set by :class:`Sided`), shown in lines

    def __enter__(self) -> QuietObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to stop."""

    def tick(self) -> None:
        """Nothing to refresh."""

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        """Nothing to show."""

    def cell_kept(self, cell: Cell) -> None:
        """A cell a resumed run keeps from the run it continues (not measured now): nothing to show."""

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        """Nothing to show."""

    def request_done(self, cell: Cell, ok: bool) -> None:
        """Nothing to show."""

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        """Nothing to show."""

    def counts_at_end(self, cell: Cell) -> None:
        """The cell's requests are read by worker processes and counted when they end (an open loop spread over
        workers): progress shows the time, not a count stuck at 0."""

    def note(self, text: str) -> None:
        """Warnings go to stderr (once: :func:`shown_notes`)."""
        if self.console is not None:
            warn(text, self.console, soft_wrap=False)
            _SHOWN.add(text)


class RichObserver(QuietObserver):
    """A rich Progress display on stderr; use as a context manager around the run."""

    def __init__(self, console: Console, total_cells: int) -> None:
        super().__init__(console)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[live]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=4,
            transient=False,
        )
        self.total_cells = total_cells
        self.cell_no = 0
        self.numbers: dict[str, int] = {}  # a cell measured again (a gate's next look) keeps its number
        self.completed: dict[tuple[str, str], int] = {}  # (side, cell id) -> requests it had when it finished
        self.task: Any = None
        self.tasks: dict[tuple[str, str], Any] = {}  # (side, cell id) -> its bar: bench ab's sides have one each
        self.taps: list[StreamTap] = []
        self.wave_t0 = 0.0
        self._last = (0.0, 0)
        self._rate = 0.0
        self._past = 0  # events of the cell's earlier waves: the live rate spans waves (a short wave had none)

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _live(self) -> str:
        if not self.taps:
            return ""
        waiting = sum(1 for t in self.taps if t.started and not t.finished and t.events == 0)
        events = self._past + sum(t.events for t in self.taps)
        now = time.monotonic()
        t0, e0 = self._last
        if now - t0 >= 1.0:
            self._rate = (events - e0) / (now - t0) if t0 else 0.0
            self._last = (now, events)
        if waiting:
            return f"[cyan]prefill: {waiting} stream(s) waiting for first token {now - self.wave_t0:.0f}s[/cyan]"
        return f"~{self._rate:,.0f} tok/s live"

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        """A new (or extended) cell: its bar (one per side of bench ab; a cell measured again, a gate's next look,
        goes on from the requests it had)."""
        key = (self.side, cell.id)
        if self._current() is not None and self.tasks.get(key) == self.task:
            self.progress.update(self.task, total=total_requests)
            return
        self.cell_no = self.numbers.setdefault(cell.id, len(self.numbers) + 1)
        if self._current() is not None:
            self.progress.remove_task(self.task)
        side = f"{self.side} " if self.side else ""
        self.task = self.tasks[key] = self.progress.add_task(
            f"[{side}{self.cell_no}/{self.total_cells}] {cell.id}", total=total_requests, live="",
            completed=self.completed.get(key, 0),
        )

    def cell_kept(self, cell: Cell) -> None:
        """A cell kept from the run a resumed run continues: it has its number, and a line says so."""
        self.cell_no = self.numbers.setdefault(cell.id, len(self.numbers) + 1)
        say(f"[{self.cell_no}/{self.total_cells}] {cell.id} kept from the run resumed (measured before it stopped)",
            self.progress.console)

    def _current(self) -> Any:
        """The live bar's task (rich's ``Task``), or None."""
        return next((t for t in self.progress.tasks if t.id == self.task), None)

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        """Track this wave's in-flight requests (the live rate goes on from the cell's earlier waves)."""
        self._past += sum(t.events for t in self.taps)
        if not self.taps:  # the cell's first wave: a new rate
            self._past, self._last, self._rate = 0, (0.0, 0), 0.0
        self.taps = taps
        self.wave_t0 = time.monotonic()

    def request_done(self, cell: Cell, ok: bool) -> None:
        """Advance the bar."""
        if self.task is not None:
            self.progress.update(self.task, advance=1, live=self._live())

    def counts_at_end(self, cell: Cell) -> None:
        """The bar says why it does not move."""
        if self.task is not None:
            self.progress.update(self.task, live="read by worker processes: counted when the point ends")

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        """The cell's headline figures as a line of its own above the live bar (which goes): every finished cell
        stays on screen, and the line fits 80 columns where a bar row with them would not."""
        txt = escape(cell_result_text(cell, summary))
        if summary.requests_failed:
            txt = txt.replace(f"{summary.requests_failed} failed", f"[red]{summary.requests_failed} failed[/red]")
        self.taps = []
        t = self._current()
        if t is None:
            return
        self.completed[(self.side, cell.id)] = int(t.completed)
        self.progress.console.print(f"[bold]{escape(t.description)}[/bold] {int(t.completed)}/{int(t.total or 0)} "
                                    f"in {_clock(t.finished_time or t.elapsed or 0.0)}: {txt}", highlight=False)
        self.progress.remove_task(self.task)
        self.task = None

    def tick(self) -> None:
        """Refresh the live column (called periodically)."""
        if self.task is not None and self.taps:
            self.progress.update(self.task, live=self._live())


class Sided:
    """One side of ``bench ab`` seen through the observer both sides share: each call first sets the side (``A``
    or ``B``) the observer shows in its lines and bars (the sides' waves alternate, never overlap); notes
    (warnings) pass as they are."""

    def __init__(self, inner: QuietObserver, side: str) -> None:
        self.inner, self.side = inner, side

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        self.inner.side = self.side
        self.inner.cell_started(cell, total_requests)

    def cell_kept(self, cell: Cell) -> None:
        self.inner.side = self.side
        self.inner.cell_kept(cell)

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        self.inner.side = self.side
        self.inner.wave_started(cell, taps)

    def request_done(self, cell: Cell, ok: bool) -> None:
        self.inner.side = self.side
        self.inner.request_done(cell, ok)

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        self.inner.side = self.side
        self.inner.cell_done(cell, summary)

    def note(self, text: str) -> None:
        self.inner.note(text)


def cell_result_text(cell: Cell, summary: CellResult) -> str:
    """``decode 123.4 tok/s/stream, 456.7 aggregate, 1 failed``: a cell's headline figures in a few words."""
    d = summary.stat("decode_tok_s")
    a = summary.stat("aggregate_decode_tok_s")
    txt = f"decode {d:,.1f} tok/s/stream" if d else "no decode figure"
    if a and cell.streams > 1:
        txt += f", {a:,.1f} aggregate"
    if summary.requests_failed:
        txt += f", {summary.requests_failed} failed"
    return txt


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _clock(s: float) -> str:
    m, sec = divmod(int(s), 60)
    return f"{m}m{sec:02d}s" if m else f"{s:.1f}s"


class PlainObserver(QuietObserver):
    """Plain progress lines for a log (stdout not a terminal): cell started, cell done with its decode figure, and
    a line every ``interval_s`` inside a cell (requests done, elapsed, live tok/s). Each line is flushed at once.

    Call :meth:`tick` periodically (more often than ``interval_s``); warnings go to ``console`` (stderr). Lines
    longer than ``width`` are wrapped at spaces.
    """

    def __init__(self, stream: TextIO, total_cells: int, interval_s: float = PROGRESS_EVERY_S,
                 console: Console | None = None, width: int | None = None) -> None:
        super().__init__(console)
        self.stream = stream
        self.width = width
        self.total_cells = total_cells
        self.interval_s = interval_s
        self.cell_no = 0
        self.numbers: dict[str, int] = {}  # a cell measured again (a gate's next look) keeps its number
        self.seen: set[tuple[str, str]] = set()  # (side, cell id) started: bench ab's B starts a cell A started
        self.cell_id = ""
        self.ended = False
        self.done = 0
        self.total = 0
        self.taps: list[StreamTap] = []
        self.blind = ""  # the cell whose requests are counted only when it ends (:meth:`counts_at_end`)
        self.t0 = self.last = time.monotonic()

    def __enter__(self) -> PlainObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.flush()

    def _line(self, text: str) -> None:
        side = f"{self.side} " if self.side else ""  # bench ab: [A 1/2], [B 1/2]
        line = f"bench: [{side}{self.cell_no}/{self.total_cells}] {text}"
        if self.width and len(line) > self.width:  # wrap at spaces: every number stays whole
            line = "\n".join(textwrap.wrap(line, self.width, subsequent_indent="    ", break_long_words=False))
        self.stream.write(line + "\n")
        self.stream.flush()
        self.last = time.monotonic()

    def cell_kept(self, cell: Cell) -> None:
        """A cell kept from the run a resumed run continues: it has its number, and a line says so."""
        self.cell_no = self.numbers.setdefault(cell.id, len(self.numbers) + 1)
        self._line(f"{cell.id} kept from the run resumed (measured before it stopped)")

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        """A line when a cell starts (an extended cell only updates its total; a cell measured again after it
        ended, as a gate's next look, keeps its number and says so)."""
        self.total = total_requests
        if cell.id == self.cell_id and not self.ended:
            return
        again = (self.side, cell.id) in self.seen
        self.seen.add((self.side, cell.id))
        self.cell_no = self.numbers.setdefault(cell.id, len(self.numbers) + 1)
        self.cell_id, self.done, self.t0, self.ended = cell.id, 0, time.monotonic(), False
        streams = f", {cell.streams} stream(s)" if cell.streams and not cell.label else ""
        what = "measured again" if again else "started"
        self._line(f"{cell.id} {what}: {total_requests} {_plural(total_requests, 'request')}{streams}")

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        """Track the wave's streams for the live rate."""
        self.taps = taps

    def request_done(self, cell: Cell, ok: bool) -> None:
        """Count it."""
        self.done += 1

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        """A line with the cell's decode figure (once per measurement: a second report of the same end is not
        printed again)."""
        self.taps = []
        if self.ended and cell.id == self.cell_id:
            return
        self.ended = True
        self._line(f"{cell.id} done in {_clock(time.monotonic() - self.t0)}: {cell_result_text(cell, summary)}")

    def tick(self) -> None:
        """Every ``interval_s`` inside a cell: requests done, elapsed, tokens streamed so far in this wave."""
        now = time.monotonic()
        if not self.cell_id or now - self.last < self.interval_s:
            return
        waiting = sum(1 for t in self.taps if t.started and not t.finished and t.events == 0)
        live = f", {waiting} stream(s) waiting for the first token" if waiting else ""
        if self.blind == self.cell_id:
            self._line(f"{self.cell_id}: {_clock(now - self.t0)} of its schedule (its {self.total} requests are "
                       "read by the worker processes and counted when the point ends)")
            return
        self._line(f"{self.cell_id}: {self.done}/{self.total} requests, {_clock(now - self.t0)}{live}")

    def counts_at_end(self, cell: Cell) -> None:
        """Ticks say the time and why there is no count."""
        self.blind = cell.id


def make_observer(total_cells: int, console: Console, *, quiet: bool = False, every_s: float = PROGRESS_EVERY_S,
                  width: int | None = None, stream: TextIO | None = None) -> QuietObserver:
    """The progress of a run, chosen once for every command that measures (run in waves or open loop, gate, ab):
    plain lines on ``stream`` (stdout) when it is not a terminal (a log, a CI job), a rich display on ``console``
    (stderr) when that is a terminal, else nothing but warnings. ``quiet`` (``--json``): nothing but warnings."""
    out = sys.stdout if stream is None else stream
    if not quiet and not out.isatty():
        return PlainObserver(out, total_cells, every_s, console, width=width)
    if quiet or not console.is_terminal:
        return QuietObserver(console)
    return RichObserver(console, total_cells)


async def observed(observer: QuietObserver, work: Awaitable[T], every_s: float = PROGRESS_EVERY_S) -> T:
    """Await ``work`` with ``observer`` shown: a live display started and stopped around it, its :meth:`tick`
    called twice a second (more often for a short ``every_s``), so a plain log gets its line every ``every_s``."""
    async def ticks() -> None:
        while True:
            await asyncio.sleep(min(0.5, every_s / 4))
            observer.tick()

    with observer:
        ticker = asyncio.create_task(ticks())
        try:
            return await work
        finally:
            ticker.cancel()


class CapacityProgress:
    """The progress of ``bench capacity``: live counters of the point in flight (``run_plan`` updates ``sent``,
    ``done``, ``ok``; :meth:`on_done` scores each record against the SLO), printed on ``stream``: one rewritten line
    on a terminal, a plain line every ``plain_every_s`` otherwise, and a line as each point ends."""

    def __init__(self, stream: TextIO | None, slo: SLO, *, tty: bool, plain_every_s: float = 5.0) -> None:
        self.stream, self.slo, self.tty, self.every = stream, slo, tty, plain_every_s
        self.sent = self.done = self.ok = self.met = 0
        self.label, self.point_no, self.t_start, self.t_end = "", 0, 0.0, 0.0
        self.cap: int | None = None
        self._last = 0.0

    def begin(self, label: str, span_s: float, cap: int | None = None) -> None:
        self.cap = cap
        self.sent = self.done = self.ok = self.met = 0
        self.point_no += 1
        self.label, self.t_start = label, time.monotonic()
        self.t_end = self.t_start + span_s

    def on_done(self, rec: Any) -> None:
        self.met += meets(rec, request_metrics(rec), self.slo)

    def line(self) -> str:
        left = max(0.0, self.t_end - time.monotonic())
        att = f"{100.0 * self.met / self.done:.0f} %" if self.done else "-"
        busy = self.sent - self.done if self.cap is None else min(self.cap, self.sent - self.done)
        return (f"point {self.point_no} {self.label}: {self.done}/{self.sent} done, {busy} in flight, "
                f"SLO met {att}, {left:.0f} s left")

    def tick(self) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        elif now - self._last >= self.every:
            self.stream.write(self.line() + "\n")
            self._last = now
        self.stream.flush()

    def end(self, summary: dict[str, Any]) -> None:
        if self.stream is None:
            return
        verdict = "met" if summary.get("slo_met") else "missed"
        sched = summary.get("schedule", {})
        # steady: the point's trend test (a queue that grows fails it); whether the search calls the point saturated
        # is its own decision (capacity.json's points[].saturated), not said here
        steady = "steady" if summary.get("steady") else "not steady"
        self.stream.write(("\r\x1b[2K" if self.tty else "") + f"point {self.point_no} {self.label}: SLO {verdict}, "
                          f"{num(sched.get('achieved_rps'))} req/s achieved, {steady}\n")
        self.stream.flush()
