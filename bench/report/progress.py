"""Live progress of a run (rich): the cell, requests done of total, live tok/s, elapsed and ETA, and whether
streams are waiting for their first token (a long prefill), so a quiet run never looks hung."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..client import StreamTap
from ..profile import Cell
from ..results import CellResult

__all__ = ["RichObserver", "QuietObserver"]


class QuietObserver:
    """An observer that only collects notes (for --json / non-terminal use)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        """Nothing to show."""

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        """Nothing to show."""

    def request_done(self, cell: Cell, ok: bool) -> None:
        """Nothing to show."""

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        """Nothing to show."""

    def note(self, text: str) -> None:
        """Warnings go to stderr."""
        if self.console is not None:
            self.console.print(f"[yellow]warning[/yellow] {text}", highlight=False)


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
        self.task: Any = None
        self.taps: list[StreamTap] = []
        self.wave_t0 = 0.0
        self._last = (0.0, 0)
        self._rate = 0.0

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _live(self) -> str:
        if not self.taps:
            return ""
        waiting = sum(1 for t in self.taps if t.started and not t.finished and t.events == 0)
        events = sum(t.events for t in self.taps)
        now = time.monotonic()
        t0, e0 = self._last
        if now - t0 >= 1.0:
            self._rate = (events - e0) / (now - t0) if t0 else 0.0
            self._last = (now, events)
        if waiting:
            return f"[cyan]prefill: {waiting} stream(s) waiting for first token {now - self.wave_t0:.0f}s[/cyan]"
        return f"~{self._rate:,.0f} tok/s live"

    def cell_started(self, cell: Cell, total_requests: int) -> None:
        """A new (or extended) cell."""
        if self.task is not None and self.progress.tasks[self.task].description.endswith(cell.id):
            self.progress.update(self.task, total=total_requests)
            return
        self.cell_no += 1
        if self.task is not None:
            self.progress.update(self.task, live="")
        self.task = self.progress.add_task(
            f"[{self.cell_no}/{self.total_cells}] {cell.id}", total=total_requests, live=""
        )

    def wave_started(self, cell: Cell, taps: list[StreamTap]) -> None:
        """Track this wave's in-flight requests."""
        self.taps = taps
        self.wave_t0 = time.monotonic()
        self._last = (0.0, 0)

    def request_done(self, cell: Cell, ok: bool) -> None:
        """Advance the bar."""
        self.progress.update(self.task, advance=1, live=self._live())

    def cell_done(self, cell: Cell, summary: CellResult) -> None:
        """Show the cell's headline number."""
        d = summary.stat("decode_tok_s")
        a = summary.stat("aggregate_decode_tok_s")
        txt = f"decode {d:,.1f} tok/s/stream" if d else "no decode figure"
        if a and cell.streams > 1:
            txt += f", {a:,.1f} aggregate"
        if summary.requests_failed:
            txt += f" [red]{summary.requests_failed} failed[/red]"
        self.taps = []
        self.progress.update(self.task, live=txt)

    def tick(self) -> None:
        """Refresh the live column (called periodically)."""
        if self.task is not None and self.taps:
            self.progress.update(self.task, live=self._live())
