"""Plotly figures of one or several runs (the report's pictures; :mod:`bench.report.html` puts them in a page).

Each builder takes a list of :class:`Source` (one run each: its results document and its measured records) and
returns a ``plotly.graph_objects.Figure``, or None when the data has nothing for that figure. Several sources are
drawn on the same axes, one colour each, so A vs B reads at a glance. Roofline ceilings, when a cell carries
``roofline``, are drawn as dotted lines beside the measured figures.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.measure.metrics import RequestMetrics
from bench.records import RequestRecord

__all__ = ["Source", "decode_vs_streams", "depth_figure", "cdf_figure", "timeline_figure", "capacity_figure",
           "server_metrics_figure", "gate_figure", "COLOURS"]

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
CDF_POINTS = 300
TIMELINE_MAX = 2000


@dataclass
class Source:
    """One run: a label, its results document, its measured records and their metrics (same order)."""

    name: str
    results: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    metrics: list[RequestMetrics] = field(default_factory=list)
    capacity: dict[str, Any] | None = None


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _layout(fig: Any, title: str, x: str, y: str, height: int = 430, **kw: Any) -> Any:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=height,
                      margin={"l": 60, "r": 20, "t": 80, "b": 50}, legend={"font": {"size": 10}}, showlegend=True,
                      **kw)
    return fig


def _med(c: dict[str, Any], key: str, stat: str = "median") -> Any:
    v = c.get(key)
    return v.get(stat) if isinstance(v, dict) else None


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _pct_text(c: dict[str, Any], key: str) -> str:
    pct = (c.get("roofline") or {}).get(key)
    return f"<br>{pct:.1f} % of the limit" if isinstance(pct, (int, float)) else ""


def decode_vs_streams(sources: Sequence[Source]) -> Any:
    """Per-stream decode tok/s (p50 with the p10-p90 band) and aggregate tok/s against concurrent streams."""
    go = _go()
    fig = go.Figure()
    k = 0  # one colour per series (run, depth, prompt), each named in the legend
    for s in sources:
        series: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
        for c in s.results.get("cells", []):
            series[(c["depth"], c["prompt"])].append(c)
        for (depth, prompt), cs in sorted(series.items()):
            cs = sorted(cs, key=lambda c: c["streams"])
            if len({c["streams"] for c in cs}) < 2:
                continue
            _stream_traces(go, fig, cs, f"{s.name}: {prompt}, depth {depth}", COLOURS[k % len(COLOURS)])
            k += 1
    if not fig.data:
        return None
    fig.update_xaxes(type="log", dtick=0.30103)
    return _layout(fig, "Decode tok/s vs concurrent streams", "concurrent streams", "decode tok/s")


def _stream_traces(go: Any, fig: Any, cs: list[dict[str, Any]], label: str, colour: str) -> None:
    xs = [c["streams"] for c in cs]
    lo, hi = [_med(c, "decode_tok_s", "p10") for c in cs], [_med(c, "decode_tok_s", "p90") for c in cs]
    if None not in lo and None not in hi:
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=hi + lo[::-1], fill="toself", fillcolor=_rgba(colour, 0.15),
                                 line={"width": 0}, hoverinfo="skip", name=f"p10-p90 per stream: {label}",
                                 legendgroup=label))
    fig.add_trace(go.Scatter(x=xs, y=[_med(c, "decode_tok_s") for c in cs], mode="lines+markers",
                             name=f"per stream p50: {label}", line={"color": colour}, legendgroup=label,
                             text=[_pct_text(c, "decode_pct_of_limit") if c["streams"] == 1 else "" for c in cs],
                             hovertemplate="%{x} streams: %{y:.1f} tok/s per stream%{text}<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs, y=[_med(c, "aggregate_decode_tok_s") for c in cs], mode="lines+markers",
                             name=f"aggregate: {label}", line={"color": colour, "dash": "dash"},
                             marker={"symbol": "square"}, legendgroup=label,
                             text=[_pct_text(c, "decode_pct_of_limit") if c["streams"] > 1 else "" for c in cs],
                             hovertemplate="%{x} streams: %{y:.1f} tok/s aggregate%{text}<extra></extra>"))
    lim = [(c.get("roofline") or {}).get("decode_tok_s_limit") for c in cs]
    if None not in lim:
        fig.add_trace(go.Scatter(x=xs, y=lim, mode="lines", name=f"aggregate ceiling (roofline): {label}",
                                 line={"color": colour, "dash": "dot", "width": 1}, legendgroup=label))


def depth_figure(sources: Sequence[Source]) -> Any:
    """Prefill (prompt tok/s) and decode tok/s against context depth, at one stream, with their ceilings."""
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Prefill: prompt tok/s (uncached / TTFT)",
                                                        "Decode tok/s after the prompt"))
    depths = {c["depth"] for s in sources for c in s.results.get("cells", []) if c["streams"] == 1 and c["depth"] > 0}
    if len(depths) < 2:
        return None  # one depth is one dot, not a curve: the per-cell table has its figures
    k = 0
    for s in sources:
        one = sorted((c for c in s.results.get("cells", []) if c["streams"] == 1 and c["depth"] > 0 and not c.get("load")),
                     key=lambda c: (c["prompt"], c["depth"]))
        for prompt in sorted({c["prompt"] for c in one}):
            colour = COLOURS[k % len(COLOURS)]
            k += 1
            cs = [c for c in one if c["prompt"] == prompt]
            xs, label = [c["depth"] for c in cs], f"{s.name}: {prompt}"
            for col, key, lim_key, pct_key in ((1, "prompt_tok_s", "prefill_tok_s_limit", "prefill_pct_of_limit"),
                                               (2, "decode_tok_s", "decode_tok_s_limit", "decode_pct_of_limit")):
                fig.add_trace(go.Scatter(x=xs, y=[_med(c, key) for c in cs], mode="lines+markers", name=label,
                                         line={"color": colour}, legendgroup=label, showlegend=col == 1,
                                         text=[_pct_text(c, pct_key) for c in cs],
                                         hovertemplate="depth %{x}: %{y:.1f} tok/s%{text}<extra></extra>"),
                              row=1, col=col)
                lim = [(c.get("roofline") or {}).get(lim_key) for c in cs]
                if None not in lim:
                    fig.add_trace(go.Scatter(x=xs, y=lim, mode="lines", name=f"ceiling (roofline): {label}",
                                             line={"color": colour, "dash": "dot", "width": 1},
                                             legendgroup=label, showlegend=col == 1), row=1, col=col)
    if not fig.data:
        return None
    fig.update_xaxes(type="log", title_text="prompt tokens (depth)")
    fig.update_yaxes(title_text="tok/s")
    return _layout(fig, "Prefill and decode vs context depth (1 stream)", "prompt tokens (depth)", "tok/s")


def _ecdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    if n == 0:
        return [], []
    step = max(1, n // CDF_POINTS)
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return [xs[i] for i in idx], [(i + 1) / n for i in idx]


def cdf_figure(sources: Sequence[Source]) -> Any:
    """Distributions (empirical CDFs) of TTFT, ITL and E2E per cell, from records.jsonl."""
    from plotly.subplots import make_subplots

    go = _go()
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT ms", "ITL ms", "E2E ms"))
    for si, s in enumerate(sources):
        by_cell: dict[str, list[RequestMetrics]] = defaultdict(list)
        for r, m in zip(s.records, s.metrics):
            if m.ok:
                by_cell[str(r.meta.get("cell"))].append(m)
        dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
        for ci, (cell, ms) in enumerate(sorted(by_cell.items())):
            label = f"{s.name}: {cell}"
            vals: list[list[float | None]] = [[m.ttft_ms for m in ms], [x for m in ms for x in m.itl_ms],
                                              [m.e2e_ms for m in ms]]
            for col, v in enumerate(vals, start=1):
                xs, ys = _ecdf([x for x in v if x is not None])
                if xs:
                    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=label, legendgroup=label,
                                             showlegend=col == 1, line={"color": COLOURS[si % len(COLOURS)],
                                                                        "dash": dashes[ci % len(dashes)]},
                                             hovertemplate="%{x:.1f} ms: %{y:.3f}<extra>" + label + "</extra>"),
                                  row=1, col=col)
    if not fig.data:
        return None
    fig.update_yaxes(title_text="share of requests (ITL: of gaps)", range=[0, 1.0])
    return _layout(fig, "Latency distributions (CDF)", "ms", "share")


def timeline_figure(source: Source) -> Any:
    """Per-request timeline: send -> first token (grey) -> last token (coloured by the request's longest ITL)."""
    go = _go()
    rows = []
    for r, m in zip(source.records, source.metrics):
        tev = [e for e in r.events if e.has_text]
        if m.ok and tev:
            rows.append((r.sent_ns, r.sent_ns + tev[0].t_ns, r.sent_ns + tev[-1].t_ns, m, r))
    if not rows:
        return None
    rows.sort(key=lambda t: t[0])
    rows = rows[:TIMELINE_MAX]
    t0 = rows[0][0]
    ys = list(range(len(rows)))
    send = [(a - t0) / 1e9 for a, _, _, _, _ in rows]
    first = [(b - t0) / 1e9 for _, b, _, _, _ in rows]
    last = [(c - t0) / 1e9 for _, _, c, _, _ in rows]
    itl = [m.itl_ms_max or 0.0 for _, _, _, m, _ in rows]
    text = [f"{r.request_id} ({r.meta.get('cell')})<br>TTFT {m.ttft_ms:.1f} ms, ITL p50 {m.itl_ms_p50 or 0:.2f} / "
            f"max {m.itl_ms_max or 0:.1f} ms, {m.output_tokens} tokens" for _, _, _, m, r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=ys, x=[f - s for s, f in zip(send, first)], base=send, orientation="h",
                         marker={"color": "#bbbbbb"}, name="waiting for the first token", text=text,
                         textposition="none", hovertemplate="%{text}<extra>send -> first token</extra>"))
    fig.add_trace(go.Bar(y=ys, x=[la - f for f, la in zip(first, last)], base=first, orientation="h",
                         marker={"color": itl, "colorscale": "Viridis", "showscale": True,
                                 "colorbar": {"title": {"text": "longest ITL ms"}}},
                         name="decoding (colour: longest ITL)", text=text, textposition="none",
                         hovertemplate="%{text}<extra>first -> last token</extra>"))
    fig.update_layout(barmode="overlay", bargap=0.1, yaxis={"autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.25})
    return _layout(fig, f"Per-request timeline: {source.name}", "seconds since the first measured send",
                   "request (by send time)", height=max(300, min(900, 12 * len(rows) + 120)))


def capacity_figure(sources: Sequence[Source]) -> Any:
    """Goodput against load: capacity.json points (SLO met or not, the boundary) or cells carrying ``goodput``."""
    go = _go()
    fig = go.Figure()
    for si, s in enumerate(sources):
        colour = COLOURS[si % len(COLOURS)]
        cap = s.capacity or {}
        pts = sorted((p for p in cap.get("points") or [] if isinstance(p, dict)
                      and isinstance(p.get("load"), (int, float))), key=lambda p: (p["load"], p.get("trial") or 0))
        if pts:  # joined in load order, not in the order the search tried them
            fig.add_trace(go.Scatter(
                x=[p["load"] for p in pts], y=[(p.get("goodput") or {}).get("rps") for p in pts],
                mode="lines+markers", name=f"{s.name}: goodput req/s ({cap.get('by', 'load')})", line={"color": colour},
                marker={"symbol": ["circle" if p.get("slo_met") else "x" for p in pts], "size": 9}))
            b, iv = cap.get("boundary"), cap.get("interval")
            if isinstance(b, (int, float)):
                fig.add_vline(x=b, line={"color": colour, "dash": "dash"}, annotation_text=f"SLO boundary {b:g}")
            if isinstance(iv, list) and len(iv) == 2 and all(isinstance(v, (int, float)) for v in iv):
                fig.add_vrect(x0=iv[0], x1=iv[1], fillcolor=_rgba(colour, 0.12), line_width=0)
        cells = [c for c in s.results.get("cells", []) if isinstance(c.get("goodput"), dict)]
        if cells:
            fig.add_trace(go.Scatter(x=[c["streams"] for c in cells], y=[c["goodput"].get("rps") for c in cells],
                                     mode="markers", name=f"{s.name}: cell goodput req/s (x: streams)",
                                     marker={"color": colour, "size": 9},
                                     text=[c["id"] for c in cells], hovertemplate="%{text}: %{y:.2f} req/s"))
    if not fig.data:
        return None
    return _layout(fig, "Capacity: goodput (requests meeting every SLO) vs load", "load", "goodput req/s")


def server_metrics_figure(sources: Sequence[Source]) -> Any:
    """Server metrics: each numeric field of ``server_metrics.series`` samples over time, else per-cell maxima."""
    go = _go()
    fig = go.Figure()
    for s in sources:
        for c in s.results.get("cells", []):
            sm = c.get("server_metrics")
            if not isinstance(sm, dict):
                continue
            series = [p for p in sm.get("series") or [] if isinstance(p, dict)]
            if series:
                tkey = next((k for k in ("t_s", "t", "time_s") if k in series[0]), None)
                xs = [p.get(tkey) for p in series] if tkey else list(range(len(series)))
                for k in sorted({k for p in series for k, v in p.items() if k != tkey and _isnum(v)}):
                    fig.add_trace(go.Scatter(x=xs, y=[p.get(k) for p in series], mode="lines",
                                             name=f"{s.name}: {c['id']}: {k}"))
        bars = {k: [(c["id"], (c.get("server_metrics") or {}).get(k)) for c in s.results.get("cells", [])]
                for k in ("kv_cache_usage_pct_max", "requests_running_max", "requests_waiting_max")}
        for k, pairs in bars.items():
            pairs = [(i, v) for i, v in pairs if _isnum(v)]
            if pairs and not any(isinstance(t, go.Scatter) for t in fig.data):
                fig.add_trace(go.Bar(x=[i for i, _ in pairs], y=[v for _, v in pairs], name=f"{s.name}: {k}"))
    if not fig.data:
        return None
    return _layout(fig, "Server metrics (scraped /metrics)", "seconds (or cell)", "value")


def _isnum(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def gate_figure(gate: dict[str, Any], name: str) -> Any:
    """The gate's verdicts: each rule's candidate/baseline ratio with its confidence interval, coloured by verdict."""
    go = _go()
    vs = [v for v in gate.get("verdicts") or [] if isinstance(v, dict) and _isnum(v.get("ratio"))]
    if not vs:
        return None
    colour = {"unchanged": "#2ca02c", "regression": "#d62728", "improved": "#1f77b4", "inconclusive": "#ff7f0e"}
    labels = [f"{v.get('name') or v.get('metric')} [{v.get('cell')}]" for v in vs]
    ratios = [v["ratio"] for v in vs]
    plus = [(v["hi"] - v["ratio"]) if _isnum(v.get("hi")) else 0 for v in vs]
    minus = [(v["ratio"] - v["lo"]) if _isnum(v.get("lo")) else 0 for v in vs]
    fig = go.Figure(go.Scatter(
        x=ratios, y=labels, mode="markers", error_x={"type": "data", "array": plus, "arrayminus": minus},
        marker={"size": 10, "color": [colour.get(str(v.get("verdict")), "#ff7f0e") for v in vs]},
        text=[v.get("verdict") for v in vs], hovertemplate="%{y}: ratio %{x:.3f} (%{text})<extra></extra>"))
    fig.add_vline(x=1.0, line={"color": "#888", "dash": "dot"})
    return _layout(fig, f"Gate verdicts: {name} (candidate / baseline, {vs[0].get('level', 0.95):.0%} interval)",
                   "ratio", "", height=max(250, 40 * len(vs) + 120))
