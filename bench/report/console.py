"""Terminal output with rich: plain when stdout is not a terminal or ``NO_COLOR`` is set.

Both consoles write through :class:`bench.redaction.RedactingStream`: whatever is printed, the API key is not.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..redaction import RedactingStream
from ..results import Results

__all__ = ["stdout", "stderr", "request_table"]

# Not a terminal (a pipe, a file, CI logs): no wrapping at 80 columns, so tables stay readable when saved.
stdout = Console(file=RedactingStream.stdout(), width=None if sys.stdout.isatty() else 220)  # type: ignore[arg-type]
stderr = Console(file=RedactingStream.stderr(), stderr=True,  # type: ignore[arg-type]
                 width=None if sys.stderr.isatty() else 220)

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
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("unit")
    for key, label, unit in _ROWS:
        if key == "error" and m.get("error") is None:
            continue
        t.add_row(label, _fmt(m.get(key)), unit)
    return t


def results_table(results: Results) -> Table:
    """The final per-cell table of a run (same rows as the Markdown report)."""
    from .export import table_rows

    head, rows = table_rows(results)
    t = Table(title=f"bench: profile {results.profile.name} on {results.endpoint.model}", header_style="bold",
              show_lines=False)
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i in (0, 2) else "right", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t
