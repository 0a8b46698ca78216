"""Terminal output with rich: plain when stdout is not a terminal or ``NO_COLOR`` is set.

Both consoles write through :class:`bench.redaction.RedactingStream`: whatever is printed, the API key is not.
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from bench.redaction import RedactingStream
from bench.results import Results

__all__ = ["stdout", "stderr", "request_table", "results_table", "results_note", "results_text", "console_width",
           "warn", "say", "fit"]


def console_width(stream: TextIO, environ: dict[str, str] | None = None) -> int | None:
    """The width to render for: ``$COLUMNS`` when set; else the terminal's (None: rich asks it); else 220.

    Not a terminal (a pipe, a file, CI logs) and no ``$COLUMNS``: 220, so tables stay readable when saved.
    """
    cols = (os.environ if environ is None else environ).get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return None if stream.isatty() else 220


stdout = Console(file=RedactingStream.stdout(), width=console_width(sys.stdout))  # type: ignore[arg-type]
stderr = Console(file=RedactingStream.stderr(), stderr=True,  # type: ignore[arg-type]
                 width=console_width(sys.stderr))

def fit(text: str, width: int) -> str:
    """``text`` wrapped at spaces to ``width`` columns with no space left at a line's end (rich leaves one at each
    break); a word wider than the line (a path) stays whole; a line's indent is kept on its continuation lines."""
    out = []
    for line in text.split("\n"):
        indent = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(line, width=max(20, width), subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False) or [""]
    return "\n".join(out)


def warn(text: str, con: Console | None = None, *, soft_wrap: bool = True) -> None:
    """One warning line on ``con`` (stderr): ``warning`` in yellow, a space, then ``text`` exactly as it is: no
    markup is read in it, so a ``[[gate]]``, a path or a server's message keeps its brackets. ``soft_wrap``
    False: wrapped at the console's width (:func:`fit`)."""
    c = con or stderr
    body = text if soft_wrap else fit("warning " + text, c.width)[len("warning "):]
    c.print(Text.assemble(("warning", "yellow"), " ", body), highlight=False, soft_wrap=True)


def say(text: str, con: Console | None = None, *, soft_wrap: bool = True) -> None:
    """One line of plain text (a note, a path, a progress line) on ``con`` (stderr), no markup read in it;
    ``soft_wrap`` False: wrapped at the console's width (:func:`fit`)."""
    c = con or stderr
    c.print(text if soft_wrap else fit(text, c.width), markup=False, highlight=False, soft_wrap=True)


_ROWS: list[tuple[str, str, str]] = [
    ("ok", "ok", ""),
    ("error", "error", ""),
    ("status", "HTTP status", ""),
    ("finish_reason", "finish reason", ""),
    ("ttft_ms", "TTFT", "ms"),
    ("ttfc_ms", "time to first content", "ms"),
    ("e2e_ms", "E2E latency", "ms"),
    ("prompt_tokens", "prompt tokens", "tok"),
    ("cached_tokens", "cached tokens", "tok"),
    ("output_tokens", "output tokens", "tok"),
    ("output_tokens_estimated", "output tokens estimated", ""),
    ("reasoning_tokens", "reasoning tokens", "tok"),
    ("chunks", "token-bearing events", ""),
    ("tokens_per_event", "tokens per event", "tok"),
    ("decode_tok_s", "decode", "tok/s"),
    ("itl_ms_p50", "ITL p50", "ms"),
    ("itl_ms_p99", "ITL p99", "ms"),
    ("itl_ms_max", "ITL max", "ms"),
    ("itl_count", "ITL samples", ""),
    ("tpot_ms", "TPOT", "ms"),
    ("prefill_tok_s", "prefill", "tok/s"),
    ("prefill_source", "prefill from", ""),
    ("queue_ms", "client queueing", "ms"),
]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def request_table(m: dict[str, Any], title: str) -> Table:
    """A two-column table of one request's metrics (the dict of ``RequestMetrics.to_dict()``)."""
    t = Table(title=Text(title), show_header=True, header_style="bold")  # Text: no markup read in a URL or a name
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("unit")
    for key, label, unit in _ROWS:
        if key == "error" and m.get("error") is None:
            continue
        value = m.get("prefill_note") or m.get(key) if key == "prefill_source" else m.get(key)  # bench probe's
        t.add_row(label, Text(_fmt(value)), unit)  # a server's error message keeps its brackets
    return t


def results_table(results: Results, width: int | None = None) -> RenderableType:
    """The final per-cell table of a run (same rows as the Markdown report).

    With ``width`` narrower than the table needs with every figure whole (:func:`bench.report.export.table_width`),
    a stacked layout instead: one block per cell, ``label value`` fields wrapped at ``width`` (figures never split).
    """
    from bench.report.export import run_title, stacked_lines, table_rows, table_width

    head, rows = table_rows(results)
    title = run_title(results)
    if width is not None and width < table_width(head, rows):
        return Group(*(Text(line, no_wrap=True, overflow="ignore") for line in stacked_lines(results, width, title)))
    t = Table(title=Text(title), header_style="bold", show_lines=False)
    fit = width is not None and width < table_width(head, rows, natural=True)
    for i, h in enumerate(head):  # squeezed: each column as wide as its widest value (headers wrap at spaces)
        w = max([len(r[i]) for r in rows] + [len(x) for x in h.split()]) if fit else None
        t.add_column(Text(h), justify="left" if i in (0, 2) or h == "SLO goodput" else "right", overflow="fold",
                     width=w)  # Text: "[p10-p90]" is not markup
    for r in rows:
        t.add_row(*(Text(v) for v in r))
    return t


def results_note(results: Results) -> str:
    """The line under the per-cell table explaining the markers it shows (``*``, ``!``, ``~``), or ``""``."""
    from bench.report.export import markers_note, table_rows

    return markers_note(table_rows(results)[1])


def results_text(results: Results, width: int = 80) -> str:
    """What ``bench run`` prints on stdout at the end, as plain text for a ``width``-column terminal: the per-cell
    table (stacked when narrow) and the headline lines (README's sample is this, tested)."""
    import io

    from bench.report.export import headline

    con = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    con.print(results_table(results, width=width))
    note = results_note(results)
    if note:
        say(note, con, soft_wrap=False)
    for h in headline(results):
        say(f"  {h}", con, soft_wrap=False)
    return "\n".join(line.rstrip() for line in con.export_text().splitlines())
