"""Trends over a run history (``bench report --history DB``): per cell and figure, the value of every stored run,
its change points marked and the gate's allowance band drawn (docs/history.md).

Each figure plots one statistic (the gate rule's, else the median) of one metric in one cell against the run's
position (the order the runs were made); hovering a point shows the run id, start, commit and branch. The bars
are the 95 % bootstrap interval of the run's median (when its samples were stored). The dotted line is each
segment's level between change points (:mod:`bench.history.changepoints`), a vertical line each change (red: a
regression, green: an improvement, with its size), and the shaded band the rule's allowance below (throughputs)
or above (latencies) the level the newest segment is judged against: the segment before the last change, or the
whole series when it has none.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from bench.errors import ConfigError
from bench.history import runs_text
from bench.history.check import CheckSettings, check_history, higher_better
from bench.history.store import HistoryStore, Point

__all__ = ["TREND_METRICS", "trend_figures", "trend_section", "trend_page"]

TREND_METRICS = ("decode_tok_s", "aggregate_decode_tok_s", "ttft_ms", "tpot_ms", "e2e_ms", "prompt_tok_s")


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def _hover(p: Point) -> str:
    r = p.run
    return (f"run {p.index}: {html.escape(r.run_id)}<br>{html.escape(r.started)}<br>commit "
            f"{html.escape((r.commit_sha or '-')[:12])} {html.escape(r.branch or '')}<br>value {p.value:.4g}")


def _points_trace(go: Any, pts: Sequence[Point]) -> Any:
    err = None
    if any(p.lo is not None for p in pts):
        err = {"type": "data", "symmetric": False, "thickness": 1, "width": 2,
               "array": [(p.hi - p.value) if p.hi is not None else 0 for p in pts],
               "arrayminus": [(p.value - p.lo) if p.lo is not None else 0 for p in pts]}
    return go.Scatter(x=[p.index for p in pts], y=[p.value for p in pts], mode="lines+markers", name="run",
                      line={"color": "#1f77b4", "width": 1}, marker={"size": 6}, error_y=err,
                      hovertext=[_hover(p) for p in pts], hoverinfo="text")


def _levels_trace(go: Any, pts: Sequence[Point], changes: Sequence[dict[str, Any]]) -> Any:
    cuts = sorted({c["run_index"] for c in changes})
    xs: list[float | None] = []
    ys: list[float | None] = []
    bounds = [pts[0].index, *cuts, pts[-1].index + 1]
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = [p.value for p in pts if a <= p.index < b]
        if seg:
            lvl = _median(seg)
            xs += [a - 0.5 if a > pts[0].index else a, b - 0.5 if b <= pts[-1].index else b - 1, None]
            ys += [lvl, lvl, None]
    return go.Scatter(x=xs, y=ys, mode="lines", name="level between changes", hoverinfo="skip",
                      line={"color": "#555", "dash": "dot", "width": 2})


def trend_figure(cell: str, metric: str, series: dict[str, Any], pts: Sequence[Point],
                 changes: Sequence[dict[str, Any]]) -> Any:
    """One cell's trend of one metric (see the module docstring)."""
    import plotly.graph_objects as go

    from bench.report.figures import _layout

    fig = go.Figure([_points_trace(go, pts), _levels_trace(go, pts, changes)])
    for c in changes:
        colour = "#c00" if c["direction"] == "regression" else "#070"
        fig.add_vline(x=c["run_index"] - 0.5, line={"color": colour, "dash": "dash", "width": 1.5},
                      annotation_text=f"{c['change_pct']:+.1f} %", annotation_position="top",
                      annotation_font_color=colour)
    last = max(changes, key=lambda c: c["run_index"]) if changes else None
    ref = last["before"]["median"] if last else _median([p.value for p in pts])
    a = float(series["allowance_pct"]) / 100.0
    up = not higher_better(metric)
    if a > 0:
        fig.add_hrect(y0=ref, y1=ref * (1 + a) if up else ref * (1 - a), fillcolor="#ff9900", opacity=0.15,
                      line_width=0, annotation_text=f"allowance {series['allowance_pct']:g} % ({series['rule']})",
                      annotation_position="bottom left", annotation_font_size=10)
    note = f"noise {series['noise_pct']:.2f} %" if series.get("noise_pct") is not None else series["status"]
    return _layout(fig, f"{cell}: {metric} {series['stat']} over {runs_text(len(pts))} ({note}, {len(changes)} "
                   "change point(s))", "run (in the order made)", f"{metric} {series['stat']}", height=380)


def trend_figures(store: HistoryStore, metrics: Sequence[str] = TREND_METRICS,
                  cells: Sequence[str] = ()) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """``(cell, metric, figure, series note)`` for every stored series of ``metrics`` (every cell, or ``cells``)."""
    runs = len(store.runs())
    out = []
    for metric in metrics:
        try:
            doc = check_history(store, CheckSettings(metric, None, tuple(cells), max(runs, 1)))
        except ConfigError:  # no stored series of this metric
            continue
        for s in doc["series"]:
            pts = store.series(metric, s["stat"], [s["cell"]]).get(s["cell"], [])
            ch = [c for c in doc["changes"] if c["cell"] == s["cell"]]
            out.append((s["cell"], metric, trend_figure(s["cell"], metric, s, pts, ch), s))
    return out


def trend_section(store: HistoryStore, metrics: Sequence[str] = TREND_METRICS, cells: Sequence[str] = ()) -> str:
    """The HTML of the trends section: a note, then one figure per cell and metric, grouped by cell."""
    from bench.report.html import _fig_html

    figs = trend_figures(store, metrics, cells)
    n = len(store.runs())
    parts = [f"<h2>Trends over {runs_text(n)} ({html.escape(store.where)})</h2>",
             "<p class='muted'>each point a run (hover: run id, start, commit); bars: the 95 % interval of its "
             "median; dotted: the level between change points; dashed lines: change points (red a regression, "
             "green an improvement); shaded: the gate rule's allowance from the level the newest runs are judged "
             "against. docs/history.md.</p>"]
    if not figs:
        parts.append("<p>no stored series to draw.</p>")
    for cell in sorted({c for c, *_ in figs}):
        parts.append(f"<h3>{html.escape(cell)}</h3>")
        parts += [_fig_html(f) for c, _, f, _ in figs if c == cell]
    return "".join(parts)


def trend_page(store: HistoryStore, title: str | None = None, metrics: Sequence[str] = TREND_METRICS) -> str:
    """A whole page of trends alone (``bench report --history DB -o FILE``), plotly.js inline."""
    from plotly.offline import get_plotlyjs

    from bench.report.html import _CSS

    title = title or f"bench trends: {store.where}"
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style><script>{get_plotlyjs()}</script></head>"
            f"<body><h1>{html.escape(title)}</h1>{trend_section(store, metrics)}<p class='muted'>made by bench from "
            "its run history; opens offline (plotly.js inline).</p></body></html>")
