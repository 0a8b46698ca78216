"""The report's GPU section (docs/gpu-telemetry.md): power and SM clock over each cell's measured waves, and per
cell the energy figures beside decode tok/s. Built from the cells' ``gpu`` sections only."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from bench.report.export import three_digits
from bench.report.figures import COLOURS, Source

__all__ = ["gpu_figure", "gpu_table"]


def _num(v: Any, digits: int = 1) -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:,.{digits}f}"


def _ratio(v: Any) -> str:
    """tok/J and J/token as results.md prints tok/J (:func:`bench.report.export.three_digits`)."""
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else three_digits(float(v))


def gpu_figure(sources: Sequence[Source]) -> Any:
    """Total GPU power (solid, left axis) and mean SM clock (dotted, right axis) against seconds into each cell's
    measured waves, one colour per cell (runs told apart in the legend); None without GPU series."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    k = 0
    for s in sources:
        for c in s.results.get("cells", []):
            series = (c.get("gpu") or {}).get("series") or []
            if not series:
                continue
            colour = COLOURS[k % len(COLOURS)]
            k += 1
            xs = [p[0] for p in series]
            name = f"{s.name}: {c['id']}" if len(sources) > 1 else c["id"]
            fig.add_trace(go.Scatter(x=xs, y=[p[1] for p in series], mode="lines", name=f"{name}: power W",
                                     line={"color": colour}), secondary_y=False)
            fig.add_trace(go.Scatter(x=xs, y=[p[2] for p in series], mode="lines", name=f"{name}: SM clock MHz",
                                     line={"color": colour, "dash": "dot"}), secondary_y=True)
    if not fig.data:
        return None
    fig.update_layout(title="GPU power and SM clock during each cell's measured waves", template="plotly_white",
                      height=430, margin={"l": 60, "r": 60, "t": 80, "b": 50}, legend={"font": {"size": 10}})
    fig.update_xaxes(title_text="seconds into the cell's measured waves")
    fig.update_yaxes(title_text="total power W", secondary_y=False)
    fig.update_yaxes(title_text="SM clock MHz (mean over GPUs)", secondary_y=True)
    return fig


def gpu_table(s: Source) -> str:
    """Per cell: decode tok/s (per stream and aggregate p50) beside power, energy, tokens per joule, clocks and
    throttle share; an estimated energy is marked. Empty without GPU figures."""
    cells = [c for c in s.results.get("cells", []) if isinstance(c.get("gpu"), dict)]
    if not cells:
        return ""
    head = ("<tr><th>cell</th><th>decode tok/s p50</th><th>aggregate tok/s p50</th><th>power W mean / max</th>"
            "<th>energy J</th><th>tok/J</th><th>J/token</th><th>SM clock MHz p5 / p50</th><th>throttled</th>"
            "<th>GPUs</th></tr>")
    rows = []
    for c in cells:
        g = c["gpu"]
        est = "" if g.get("energy_source") == "counter" else " (estimate)"
        share = g.get("throttle_share")
        rows.append(
            f"<tr><td>{html.escape(c['id'])}</td><td>{_num((c.get('decode_tok_s') or {}).get('median'))}</td>"
            f"<td>{_num((c.get('aggregate_decode_tok_s') or {}).get('median'))}</td>"
            f"<td>{_num(g.get('power_w_mean'), 0)} / {_num(g.get('power_w_max'), 0)}</td>"
            f"<td>{_num(g.get('energy_j'), 0)}{est}</td><td>{_ratio(g.get('tokens_per_joule'))}</td>"
            f"<td>{_ratio(g.get('joules_per_token'))}</td>"
            f"<td>{_num(g.get('sm_clock_mhz_p5'), 0)} / {_num(g.get('sm_clock_mhz_p50'), 0)}</td>"
            f"<td>{'-' if share is None else f'{share:.0%}'}</td><td>{len(g.get('gpus') or [])} "
            f"({html.escape(str(g.get('source') or ''))})</td></tr>")
    return f"<h3>{html.escape(s.name)}: GPU power and energy per cell</h3><table>{head}{''.join(rows)}</table>"
