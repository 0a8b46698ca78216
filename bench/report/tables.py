"""The figures as tables: the per-cell table of a run (the terminal's and the Markdown's rows, with the note on its
markers) and the per-point table of a capacity search (the curve, sorted by load), as rows of text and as HTML.

The HTML report leads with these tables, as guidellm's and AIPerf's reports do: the numbers first, the plots after.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from bench.report.export import markers_note, table_rows
from bench.results import Results

__all__ = ["curve_rows", "curve_text", "curve_note", "html_table", "cells_html", "points_html", "num",
           "capacity_answer"]

def _f(v: Any, digits: int = 1) -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:,.{digits}f}"


def num(v: Any, digits: int | None = None) -> str:
    """A figure as printed: ``-`` when missing; ``digits`` decimals, or by size (3 significant figures, at most
    2 decimals: 1,234 / 56.8 / 1.98 / 0.05); never a raw float."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "-"
    if digits is None:
        a = abs(v)
        digits = 0 if a >= 100 or v == int(v) else 1 if a >= 10 else 2
    return f"{v:,.{digits}f}"


def capacity_answer(doc: dict[str, Any]) -> str:
    """The search's answer in one line: ``capacity (SLO): 12.3 req/s, interval [11.8, 12.9] (confidence 95 %);
    saturated at 20 req/s`` (a load in requests in flight for ``--by concurrency``)."""
    rate = doc.get("by", "rate") == "rate"
    unit = "req/s" if rate else "in flight"

    def load(v: Any) -> str:
        return "open" if v is None else num(v, 2 if rate else 0)

    if doc.get("interrupted"):
        return _interrupted_answer(doc, load, unit)
    b, iv = doc.get("boundary"), doc.get("interval")
    text = f"capacity ({doc.get('slo')}): " + (f"{load(b)} {unit}" if b is not None else "none found")
    if isinstance(iv, list | tuple) and len(iv) == 2:
        text += f", interval [{load(iv[0])}, {load(iv[1])}]"
    conf = doc.get("confidence")
    text += " (no confidence level)" if conf is None else f" (confidence {conf:.0%})"
    sat = doc.get("saturated_at")
    return text + (f"; saturated at {load(sat)} {unit}" if sat is not None else "")


def _interrupted_answer(doc: dict[str, Any], load: Any, unit: str) -> str:
    """An interrupted search's line: the bracket of its finished points (``method.finished_bracket``), no level."""
    lo, hi = ((doc.get("method") or {}).get("finished_bracket") or [None, None])[:2]
    if lo is not None and hi is not None:
        said = f"between {load(lo)} and {load(hi)} {unit}"
    elif lo is not None:
        said = f"at least {load(lo)} {unit}"
    elif hi is not None:
        said = f"below {load(hi)} {unit}"
    else:
        said = "none found"
    sat = doc.get("saturated_at")
    return (f"capacity ({doc.get('slo')}): {said} (interrupted: finished points only, no confidence level)"
            + (f"; saturated at {load(sat)} {unit}" if sat is not None else ""))


def curve_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A capacity search's points as a table, sorted by load then trial: the kind of point (probe, refine, or a
    bracketing point; ``t1``, ``t2``: its second, third trial), throughput against latency, per-user against
    aggregate tok/s, goodput and whether the SLO held. The req/s columns are all over the point's window
    (:func:`curve_note`): ``sent`` is the window's realized arrival rate (``rate``; a concurrency point's is its
    Little's-law rate, ``achieved_rps``), not ``achieved_rps`` over the whole point."""
    head = ["load", "point", "sent req/s", "done req/s", "TTFT p90 ms", "TPOT p50 ms", "user tok/s",
            "total tok/s", "goodput req/s", "SLO", "steady"]
    closed = doc.get("by") == "concurrency"
    rows = []
    pts = [p for p in doc.get("points") or [] if isinstance(p, dict) and isinstance(p.get("load"), int | float)]
    for p in sorted(pts, key=lambda x: (x["load"], x.get("trial") or 0)):
        g = p.get("goodput") or {}
        kind = f"{p.get('phase') or 'point'}" + (f" t{p['trial']}" if p.get("trial") else "")  # t1: a second trial
        rows.append([f"{p['load']:.4g}", kind, _f(p.get("achieved_rps" if closed else "rate"), 2),
                     _f(p.get("completed_rps"), 2), _f(p.get("ttft_p90_ms")), _f(p.get("tpot_p50_ms"), 2),
                     _f(p.get("per_user_tok_s")), _f(p.get("aggregate_tok_s")), _f(g.get("rps"), 2),
                     "met" if p.get("slo_met") else "missed", "yes" if p.get("steady") else "no"])
    return head, rows


def curve_note(doc: dict[str, Any]) -> str:
    """What the curve's req/s columns count, all over each point's window (:func:`curve_rows`)."""
    if doc.get("by") == "concurrency":
        return ("req/s over each point's window (its first and last N requests left out): sent = done = the "
                "closed loop's rate by Little's law; goodput = the window's requests that met every objective, per s")
    return ("req/s over each point's window (a probe: the second half of its schedule; a refine point: after its "
            "warm-up): sent = requests scheduled in it, done = requests that ended in it, goodput = its requests "
            "that met every objective (it can exceed done: requests sent in the window that end after it, in a "
            "window shorter than a request or when the server falls behind); the whole point's send rate is "
            "achieved_rps in capacity.json")


def _two_lines(h: str) -> tuple[str, str]:
    top, _, bottom = h.rpartition(" ")
    return (top, bottom) if top else ("", h)


def _layout(head: Sequence[str], rows: Sequence[Sequence[str]], two: bool) -> list[str]:
    heads = [_two_lines(h) if two else ("", h) for h in head]
    widths = [max(len(a), len(b), *(len(r[i]) for r in rows)) for i, (a, b) in enumerate(heads)]
    lines = ["  ".join(x.rjust(w) for (x, _), w in zip(heads, widths))] if two else []
    lines.append("  ".join(x.rjust(w) for (_, x), w in zip(heads, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return [line.rstrip() for line in lines]


CURVE_OPTIONAL = ("user tok/s", "total tok/s")  # left out first when the terminal is narrow


def curve_text(doc: dict[str, Any], width: int = 80) -> list[str]:
    """The capacity curve (:func:`curve_rows`) as plain lines within ``width`` columns: headers on one line, else
    on two, else on two without the tok/s columns (capacity.json and the HTML report keep them; a last line says
    so). Figures are never split."""
    head, rows = curve_rows(doc)
    for two in (False, True):
        lines = _layout(head, rows, two)
        if max(map(len, lines)) <= width:
            return lines
    keep = [i for i, h in enumerate(head) if h not in CURVE_OPTIONAL]
    lines = _layout([head[i] for i in keep], [[r[i] for i in keep] for r in rows], True)
    return lines + ["(tok/s columns: in capacity.json, the HTML report and a wider terminal)"]


def html_table(head: Sequence[str], rows: Sequence[Sequence[str]], *, cls: str = "figures") -> str:
    """``<table>`` of text cells (escaped); the first columns left-aligned by the page's style."""
    h = "".join(f"<th>{html.escape(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return (f"<div class='scroll'><table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"
            "</div>")


def cells_html(named: Sequence[tuple[str, Results]]) -> str:
    """One table of every run's cells (a ``run`` column first when there are several), the markers explained."""
    head: list[str] = []
    rows: list[list[str]] = []
    for name, res in named:
        h, rs = table_rows(res)
        ids = [c.id for c in res.cells]
        if len(h) > len(head):
            head = h
        rows += [([name] if len(named) > 1 else []) + [cid] + r for cid, r in zip(ids, rs)]
    if not rows:
        return ""
    width = len(head) + 1 + (len(named) > 1)
    rows = [r + ["-"] * (width - len(r)) for r in rows]
    head = (["run"] if len(named) > 1 else []) + ["cell"] + head
    note = markers_note(rows)
    return html_table(head, rows) + (f"<p class='muted'>{html.escape(note)}</p>" if note else "")


def points_html(name: str, doc: dict[str, Any]) -> str:
    """The capacity search's points (sorted by load), its answer above them."""
    head, rows = curve_rows(doc)
    if not rows:
        return ""
    answer = capacity_answer(doc)
    return (f"<h3>{html.escape(name)}</h3><p>{html.escape(answer)}</p>" + html_table(head, rows)
            + f"<p class='muted'>{html.escape(curve_note(doc))}</p>"
            + (f"<p class='muted'>{html.escape(str(doc['note']))}</p>" if doc.get("note") else ""))
