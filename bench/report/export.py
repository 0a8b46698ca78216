"""Exporters: the results document -> files (JSON is the source of truth; CSV and Markdown are views of it).

Each exporter is ``results dict -> str``. :func:`write_results` writes them atomically (temp file + rename), so a
reader never sees half a file and a crash keeps the last complete version.
"""

from __future__ import annotations

import csv
import io
import json
import os
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["to_json", "to_csv", "to_markdown", "headline", "write_results", "CSV_COLUMNS", "table_rows",
           "table_width", "stacked_lines"]

# (column, cell key, stat) ; stat None = the plain value
CSV_COLUMNS: list[tuple[str, str, str | None]] = [
    ("cell", "id", None), ("sweep", "sweep", None), ("depth", "depth", None), ("streams", "streams", None),
    ("prompt", "prompt", None), ("requests_ok", "requests_ok", None), ("requests_failed", "requests_failed", None),
    ("waves", "waves", None),
    ("decode_tok_s_p50", "decode_tok_s", "median"), ("decode_tok_s_p10", "decode_tok_s", "p10"),
    ("decode_tok_s_p90", "decode_tok_s", "p90"),
    ("aggregate_decode_tok_s_p50", "aggregate_decode_tok_s", "median"),
    ("ttft_ms_p50", "ttft_ms", "median"), ("ttft_ms_p90", "ttft_ms", "p90"), ("ttft_ms_p99", "ttft_ms", "p99"),
    ("ttfc_ms_p50", "ttfc_ms", "median"), ("ttfc_ms_p90", "ttfc_ms", "p90"), ("ttfc_ms_p99", "ttfc_ms", "p99"),
    ("itl_ms_p50", "itl_ms", "median"), ("itl_ms_p99", "itl_ms", "p99"), ("tpot_ms_p50", "tpot_ms", "median"),
    ("e2e_ms_p50", "e2e_ms", "median"), ("e2e_ms_p90", "e2e_ms", "p90"),
    ("prompt_tok_s_p50", "prompt_tok_s", "median"), ("prompt_tok_s_corrected_p50", "prompt_tok_s_corrected", "median"),
    ("server_prefill_tok_s_p50", "server_prefill_tok_s", "median"), ("overhead_ms", "overhead_ms", None),
    ("prompt_tokens_p50", "prompt_tokens", "median"), ("output_tokens_p50", "output_tokens", "median"),
    ("tokens_per_event_p50", "tokens_per_event", "median"), ("cached_tokens", "cached_tokens", None),
    ("decode_wave_spread_pct", "noise", "spread_pct"), ("decode_ci_half_pct", "noise", "ci_half_pct"),
    ("decode_ci_wide", "noise", "ci_wide"), ("decode_waves_needed", "noise", "waves_needed"),
]


def _get(cell: dict[str, Any], key: str, stat: str | None) -> Any:
    v = cell.get(key)
    if stat is not None:
        v = v.get(stat) if isinstance(v, dict) else None
    return v


def to_json(results: dict[str, Any]) -> str:
    """The whole results document, indented."""
    return json.dumps(results, indent=1, ensure_ascii=False) + "\n"


def to_csv(results: dict[str, Any]) -> str:
    """One row per cell, the main statistics (columns: :data:`CSV_COLUMNS`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c[0] for c in CSV_COLUMNS])
    for cell in results.get("cells", []):
        w.writerow(["" if (v := _get(cell, k, s)) is None else v for _, k, s in CSV_COLUMNS])
    return buf.getvalue()


def _n(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if abs(v) < 100 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _depth(d: int) -> str:
    if d == 0:
        return "short"
    return f"{d // 1024}K" if d % 1024 == 0 else str(d)


def table_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell table shared by the terminal and Markdown views."""
    head = ["depth", "streams", "prompt", "ok/fail", "decode tok/s per stream p50 [p10-p90]", "aggregate tok/s",
            "TTFT ms p50 / p90 / p99", "prompt tok/s (corrected)", "ITL ms p50 / p99", "TPOT ms", "E2E ms p50",
            "tok/event"]
    rows = []
    for c in results.get("cells", []):
        d = c["decode_tok_s"]
        t = c["ttft_ms"]
        thin = "*" if "p99" in t.get("thin", []) else ""
        pt = c["prompt_tok_s"]["median"] if c["depth"] else None
        ptc = c["prompt_tok_s_corrected"]["median"] if c["depth"] else None
        wide = " ~" if (c.get("noise") or {}).get("ci_wide") else ""
        rows.append([
            _depth(c["depth"]), str(c["streams"]), c["prompt"], f"{c['requests_ok']}/{c['requests_failed']}",
            f"{_n(d['median'])} [{_n(d['p10'])}-{_n(d['p90'])}]{wide}",
            _n(c["aggregate_decode_tok_s"]["median"]),
            f"{_n(t['median'], 0)} / {_n(t['p90'], 0)} / {_n(t['p99'], 0)}{thin}",
            f"{_n(pt, 0)} ({_n(ptc, 0)})" + (" !" if c.get("overhead_flag") and c["depth"] else ""),
            f"{_n(c['itl_ms']['median'], 2)} / {_n(c['itl_ms']['p99'], 2)}",
            _n(c["tpot_ms"]["median"], 2), _n(c["e2e_ms"]["median"], 0), _n(c["tokens_per_event"]["median"], 2),
        ])
    return head, rows


def table_width(head: list[str], rows: list[list[str]], natural: bool = False) -> int:
    """Columns the per-cell table needs with every value whole: the widest value or header word of each column
    (headers wrap at their spaces), plus rich's padding and borders (3 per column, 1 more at the edge).
    ``natural``: the width with headers on one line instead."""
    need = 1
    for i, h in enumerate(head):
        word = len(h) if natural else max((len(w) for w in h.split()), default=1)
        need += max([word, *(len(r[i]) for r in rows)]) + 3
    return need


def stacked_lines(results: dict[str, Any], width: int, title: str | None = None) -> list[str]:
    """The per-cell table stacked for a narrow terminal: per cell a line ``cell id`` then its ``label: value``
    fields (the table's own headers and cells) joined with ``;`` and wrapped at ``width`` between fields; a field
    wider than ``width`` puts its value on the next line (wrapped at spaces, never inside a number)."""
    head, rows = table_rows(results)
    out: list[str] = textwrap.wrap(title, width) if title else []
    for c, r in zip(results.get("cells", []), rows):
        out.append(f"{c['id']}")
        line = ""
        for h, v in zip(head[3:], r[3:]):
            field = f"{h}: {v}"
            if line and len(line) + 2 + len(field) <= width:
                line += "; " + field
                continue
            if line:
                out.append(line)
            line = "  " + field
            if len(line) > width:  # the label on its line, the value under it (wrapped at spaces only if need be)
                out += textwrap.wrap(f"{h}:", width, initial_indent="  ", subsequent_indent="  ")
                out += textwrap.wrap(v, width, initial_indent="    ", subsequent_indent="    ",
                                     break_long_words=False)
                line = ""
        if line:
            out.append(line)
    return out


def headline(results: dict[str, Any]) -> list[str]:
    """Sentences in the shape serving recipes publish, from whichever cells exist.

    single-stream short decode; decode after each depth; prompt tokens over TTFT at each depth; aggregate decode
    at each stream count (depth 0, first prompt type).
    """
    cells = results.get("cells", [])
    out: list[str] = []
    if not cells:
        return out
    kind = cells[0]["prompt"]
    short = [c for c in cells if c["depth"] == 0 and c["prompt"] == kind]
    one = next((c for c in short if c["streams"] == 1), None)
    if one and one["decode_tok_s"]["median"] is not None:
        out.append(f"single stream, short decode: {_n(one['decode_tok_s']['median'])} tok/s")
    deep = sorted({c["depth"] for c in cells if c["depth"] > 0})
    found = [(d, next((c for c in cells if c["depth"] == d and c["streams"] == 1), None)) for d in deep]
    after = [(d, c) for d, c in found if c is not None]
    if after:
        out.append("decode after a " + " / ".join(_depth(d) for d, _ in after) + " prompt: "
                   + " / ".join(_n(c["decode_tok_s"]["median"]) for _, c in after) + " tok/s")
        out.append("prompt tokens over TTFT at " + " / ".join(_depth(d) for d, _ in after) + ": "
                   + " / ".join(_n(c["prompt_tok_s"]["median"], 0) for _, c in after) + " tok/s")
    multi = sorted(short, key=lambda c: c["streams"])
    if len(multi) > 1:
        out.append("decode at " + ", ".join(str(c["streams"]) for c in multi) + " streams: "
                   + " / ".join(_n(c["aggregate_decode_tok_s"]["median"]) for c in multi)
                   + " tok/s aggregate (" + " / ".join(_n(c["decode_tok_s"]["median"]) for c in multi)
                   + " per stream)")
    return out


def to_markdown(results: dict[str, Any]) -> str:
    """A Markdown report that pastes into a README: headline, the per-cell table, and notes."""
    ep, srv, run = results.get("endpoint", {}), results.get("server", {}), results.get("run", {})
    lines = [
        f"### bench: profile `{results.get('profile', {}).get('name')}` on `{ep.get('model')}`",
        "",
        f"{srv.get('backend') or 'unknown backend'} at {ep.get('url')}, {ep.get('kind')} endpoint; "
        f"bench {results.get('bench_version')}, {results.get('created')}; fixed overhead "
        f"{_n(run.get('overhead_ms'), 1)} ms.",
        "",
    ]
    for h in headline(results):
        lines.append(f"- {h}")
    lines.append("")
    head, rows = table_rows(results)
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---:" if i > 2 else "---" for i in range(len(head))) + "|")
    for r in rows:
        lines.append("| " + " | ".join(r) + " |")
    lines.append("")
    lines.append("\\* fewer samples than the percentile needs; ! fixed overhead > 30 % of TTFT; ~ the decode CI is "
                 "wider than the profile's target_ci (the cell's `noise`: waves that would meet it).")
    warns = results.get("warnings") or []
    if warns:
        lines.append("")
        lines.append("Notes:")
        lines += [f"- {w}" for w in warns]
    return "\n".join(lines) + "\n"


_EXPORTERS = {"json": ("results.json", to_json), "csv": ("results.csv", to_csv), "md": ("results.md", to_markdown)}


def write_results(results: dict[str, Any], out_dir: str | os.PathLike[str],
                  formats: Iterable[str] = ("json", "csv", "md")) -> list[Path]:
    """Write the chosen formats into ``out_dir`` atomically; returns the paths written."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in formats:
        name, fn = _EXPORTERS[f]
        p = d / name
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(fn(results), encoding="utf-8")
        os.replace(tmp, p)
        paths.append(p)
    return paths
