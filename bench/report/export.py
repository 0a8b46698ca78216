"""Exporters: the results document -> files (JSON is the source of truth; CSV and Markdown are views of it).

Each exporter is ``Results -> str`` (:mod:`bench.results`). :func:`write_results` writes them atomically (temp file + rename), so a
reader never sees half a file and a crash keeps the last complete version.
"""

from __future__ import annotations

import csv
import io
import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.report.layout import pack_fields
from bench.results import CellResult, Results, to_json, write_atomic

__all__ = ["to_json", "to_csv", "to_markdown", "headline", "table_rows", "write_results", "CSV_COLUMNS", "EXPORTERS",
           "VIEWS", "table_width", "stacked_lines", "slo_field", "gpu_field", "MARKERS", "markers_note", "run_title"]

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
    ("client_cpu_pct", "client_cpu_pct", None),
    ("server_kv_cache_usage_pct_max", "server_metrics", "kv_cache_usage_pct_max"),
    ("server_requests_waiting_max", "server_metrics", "requests_waiting_max"),
    ("server_spec_acceptance_rate", "server_metrics", "spec_acceptance_rate"),
    ("server_prefix_cache_hit_rate", "server_metrics", "prefix_cache_hit_rate"),
    ("decode_pct_of_limit", "roofline", "decode_pct_of_limit"),
    ("prefill_pct_of_limit", "roofline", "prefill_pct_of_limit"),
    ("gpu_power_w_mean", "gpu", "power_w_mean"), ("gpu_power_w_max", "gpu", "power_w_max"),
    ("gpu_energy_j", "gpu", "energy_j"), ("gpu_energy_source", "gpu", "energy_source"),
    ("gpu_tokens_per_joule", "gpu", "tokens_per_joule"), ("gpu_joules_per_token", "gpu", "joules_per_token"),
    ("gpu_joules_per_prompt_token", "gpu", "joules_per_prompt_token"),
    ("gpu_sm_clock_mhz_p5", "gpu", "sm_clock_mhz_p5"), ("gpu_sm_clock_mhz_p50", "gpu", "sm_clock_mhz_p50"),
    ("gpu_mem_clock_mhz_p50", "gpu", "mem_clock_mhz_p50"), ("gpu_throttle_share", "gpu", "throttle_share"),
    ("goodput_rps", "goodput", "rps"), ("goodput_tok_s", "goodput", "tok_s"),
    ("slo_met_fraction", "goodput", "met_fraction"), ("slo_met", "slo_met", None),
    ("images", "images", None), ("image_size", "image_size", None), ("image_bytes_p50", "image_bytes", "median"),
    ("image_prompt_tokens", "image_prompt_tokens", None), ("upload_ms_p50", "upload_ms", "median"),
    ("ttft_reasoning_ms_p50", "ttft_reasoning_ms", "median"), ("ttft_content_ms_p50", "ttft_content_ms", "median"),
    ("reasoning_tok_s_p50", "reasoning_tok_s", "median"), ("content_tok_s_p50", "content_tok_s", "median"),
    ("ttft_tool_ms_p50", "ttft_tool_ms", "median"), ("tool_tok_s_p50", "tool_tok_s", "median"),
    ("tool_calls", "tool_calls", None), ("tool_calls_forced", "tool_calls_forced", None),
    ("tool_calls_missing", "tool_calls_missing", None),
]


def _get(cell: CellResult, key: str, stat: str | None) -> Any:
    v = getattr(cell, key, None)
    if stat is not None:
        v = v.get(stat) if isinstance(v, dict) else None
    return v


def to_csv(results: Results) -> str:
    """One row per cell, the main statistics (columns: :data:`CSV_COLUMNS`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c[0] for c in CSV_COLUMNS])
    for cell in results.cells:
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


def _pct(roofline: dict[str, Any] | None, key: str, when: bool = True) -> str:
    """`` (66 % of limit)`` from a cell's ``roofline`` (docs/roofline.md), or nothing."""
    v = (roofline or {}).get(key)
    return f" ({v:.0f} % of limit)" if when and isinstance(v, int | float) else ""


def _met_pct(fraction: float) -> str:
    """``83.3 %``; never ``100 %`` or ``0 %`` unless every request (or none) met the SLO."""
    pct = min(max(100.0 * fraction, 0.1), 99.9) if 0 < fraction < 1 else 100.0 * fraction
    return f"{pct:.1f}".removesuffix(".0") + " %"


def slo_field(c: CellResult) -> str:
    """A cell's SLO result in one short field: ``5.17 req/s, 83 tok/s, 100 % met; held``, or ``...; missed
    tpot_p90 (18.0 > 15 ms)`` naming each objective that did not hold (``-`` without an SLO). Definitions:
    docs/load.md ("SLOs and goodput")."""
    g = c.goodput
    if not g:
        return "-"
    met = "-" if g.get("met_fraction") is None else _met_pct(g["met_fraction"])
    out = f"{_n(g.get('rps'), 2)} req/s, {_n(g.get('tok_s'), 0)} tok/s, {met} met"
    missed = [f"{k} ({_n(v.get('value'))} > {v.get('limit_ms'):g} ms)" if v.get("value") is not None
              else f"{k} (failed requests)" for k, v in (c.slo or {}).items() if not v.get("held")]
    return out + ("; missed " + ", ".join(missed) if missed else "; held")


def three_digits(v: float) -> str:
    """A ratio such as tok/J: three significant digits below 1 (0.0142 and 0.0122 must not both read 0.01), two
    decimals below 10, one below 100, none above."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def gpu_field(c: CellResult) -> str:
    """Output tokens per joule of a cell (docs/gpu-telemetry.md): ``3.41``, ``3.41 est`` when the energy is power
    integrated over the samples (no usable energy counter), ``-`` without GPU figures."""
    g = c.gpu or {}
    v = g.get("tokens_per_joule")
    if not isinstance(v, int | float):
        return "-"
    return three_digits(v) + (" est" if g.get("energy_source") != "counter" else "")


MARKERS = {
    "*": "fewer samples than the percentile needs (read it as a bound, not a figure)",
    "!": "the fixed overhead is over 30 % of TTFT (prompt tok/s understated; see the corrected figure)",
    "~": "the decode CI is wider than the profile's target_ci (the cell's noise: waves that would meet it)",
}
"""The markers of the per-cell table and what each means (printed under every table that shows one)."""


def markers_note(rows: Sequence[Sequence[str]]) -> str:
    """One line explaining the markers that appear in ``rows`` (``""`` when none does)."""
    used = [m for m in MARKERS if any(_has_marker(v, m) for r in rows for v in r)]
    return "; ".join(f"{m} {MARKERS[m]}" for m in used)


def _has_marker(v: str, m: str) -> bool:
    return v.endswith(m) or f"{m} (" in v or f" {m} " in v or f"{m}]" in v


def run_title(results: Results, code: str = "") -> str:
    """The header of a run's table: ``bench: profile quick on MODEL``; with the cell-changing flags given
    (``profile quick (with --streams, --depths)``), or the open-loop load that replaced the profile's cells
    (``rate-10 (rate load)``). ``code``: the quote around names (a backtick in Markdown)."""
    q, model = code, results.endpoint.model
    if results.load:
        return f"bench: {q}{results.load.get('id')}{q} ({results.load.get('mode')} load) on {q}{model}{q}"
    given = results.profile.settings.get("overrides") if isinstance(results.profile.settings, dict) else None
    with_ = f" (with {', '.join(str(g) for g in given)})" if given else ""
    return f"bench: profile {q}{results.profile.name}{q}{with_} on {q}{model}{q}"


def table_rows(results: Results) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell table shared by the terminal and Markdown views.

    With a roofline (``bench run --hardware/--bandwidth``), decode (per stream at 1 stream, aggregate at N) and
    prompt tok/s get their share of the physical limit beside them. With GPU figures, output tokens per joule
    (:func:`gpu_field`). With an SLO (``--slo``), a last column: goodput and which objectives held
    (:func:`slo_field`). An open-loop cell (``--rate``, ``--trace``, ``--sessions``: no fixed stream count) reads
    ``open`` under streams."""
    head = ["depth", "streams", "prompt", "ok/fail", "decode tok/s per stream p50 [p10-p90]", "aggregate tok/s",
            "TTFT ms p50 / p90 / p99", "prompt tok/s (corrected)", "ITL ms p50 / p99", "TPOT ms", "E2E ms p50",
            "tok/event"]
    with_think = any(c.stat("reasoning_tok_s") is not None for c in results.cells)
    if with_think:
        head.append("think / answer tok/s")
    with_tools = any(c.tool_calls or c.tool_calls_forced for c in results.cells)
    if with_think or with_tools:  # thinking delays the answer: TTFT counts the first reasoning token
        head.append("first answer / tool call ms p50")
    if with_tools:
        head.append("tool calls (missing)")
    with_gpu = any(c.gpu for c in results.cells)
    if with_gpu:
        head.append("tok/J")
    with_slo = any(c.goodput for c in results.cells)
    if with_slo:
        head.append("SLO goodput")
    rows = []
    for c in results.cells:
        d, t = c.decode_tok_s, c.ttft_ms
        thin = "*" if "p99" in t.get("thin", []) else ""
        shown = c.measures_prefill
        pt = c.stat("prompt_tok_s") if shown else None
        ptc = c.stat("prompt_tok_s_corrected") if shown else None
        noisy = " ~" if (c.noise or {}).get("ci_wide") else ""
        rows.append([
            _depth(c.depth), str(c.streams) if c.streams else "open",
            c.prompt + (f" +{c.images} img {c.image_size}" if c.images else ""),
            f"{c.requests_ok}/{c.requests_failed}",
            f"{_n(d.get('median'))} [{_n(d.get('p10'))}-{_n(d.get('p90'))}]{noisy}"
            + _pct(c.roofline, "decode_pct_of_limit", c.streams == 1),
            _n(c.stat("aggregate_decode_tok_s")) + _pct(c.roofline, "decode_pct_of_limit", c.streams > 1),
            f"{_n(t.get('median'), 0)} / {_n(t.get('p90'), 0)} / {_n(t.get('p99'), 0)}{thin}",
            f"{_n(pt, 0)} ({_n(ptc, 0)})" + (" !" if c.overhead_flag and shown else "")
            + _pct(c.roofline, "prefill_pct_of_limit", shown),
            f"{_n(c.stat('itl_ms'), 2)} / {_n(c.stat('itl_ms', 'p99'), 2)}",
            _n(c.stat("tpot_ms"), 2), _n(c.stat("e2e_ms"), 0), _n(c.stat("tokens_per_event"), 2),
        ] + ([f"{_n(c.stat('reasoning_tok_s'))} / {_n(c.stat('content_tok_s'))}"] if with_think else [])
            + ([f"{_n(c.stat('ttft_content_ms'), 0)} / {_n(c.stat('ttft_tool_ms'), 0)}"]
               if with_think or with_tools else [])
            + ([f"{c.tool_calls} ({c.tool_calls_missing})"] if with_tools else [])
            + ([gpu_field(c)] if with_gpu else []) + ([slo_field(c)] if with_slo else []))
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


def stacked_lines(results: Results, width: int, title: str | None = None) -> list[str]:
    """The per-cell table stacked for a narrow terminal: per cell a line ``cell id`` then its ``label: value``
    fields (the table's own headers and cells) joined with ``;`` and wrapped at ``width`` between fields; a field
    wider than ``width`` puts its value on the next line (wrapped at spaces, never inside a number)."""
    head, rows = table_rows(results)
    out: list[str] = textwrap.wrap(title, width) if title else []
    for c, r in zip(results.cells, rows):
        out.append(c.id)
        out += pack_fields(list(zip(head[3:], r[3:])), width, split_long=True)
    return out


def headline(results: Results) -> list[str]:
    """Sentences in the shape serving recipes publish, from whichever cells exist.

    single-stream short decode; decode after each depth; prompt tokens over TTFT at each depth; aggregate decode
    at each stream count (depth 0, first prompt type, the first cell of each count); with an SLO, the cells it held
    in and the highest goodput.
    """
    cells = results.cells
    out: list[str] = []
    if not cells:
        return out
    kind = cells[0].prompt
    short = [c for c in cells if c.depth == 0 and c.prompt == kind]
    one = next((c for c in short if c.streams == 1), None)
    if one and one.stat("decode_tok_s") is not None:
        out.append(f"single stream, short decode: {_n(one.stat('decode_tok_s'))} tok/s")
    deep = sorted({c.depth for c in cells if c.depth > 0})
    found = [(d, next((c for c in cells if c.depth == d and c.streams == 1), None)) for d in deep]
    after = [(d, c) for d, c in found if c is not None]
    if after:
        out.append("decode after a " + " / ".join(_depth(d) for d, _ in after) + " prompt: "
                   + " / ".join(_n(c.stat("decode_tok_s")) for _, c in after) + " tok/s")
        out.append("prompt tokens over TTFT at " + " / ".join(_depth(d) for d, _ in after) + ": "
                   + " / ".join(_n(c.stat("prompt_tok_s"), 0) for _, c in after) + " tok/s")
    # one cell per stream count, the first run: a profile that varies images, thinking or tools at each count
    # gives one figure per count, not one per cell
    first: dict[int, CellResult] = {}
    for c in short:
        first.setdefault(c.streams, c)
    multi = sorted(first.values(), key=lambda c: c.streams)
    if len(multi) > 1:
        out.append("decode at " + ", ".join(str(c.streams) for c in multi) + " streams: "
                   + " / ".join(_n(c.stat("aggregate_decode_tok_s")) for c in multi)
                   + " tok/s aggregate (" + " / ".join(_n(c.stat("decode_tok_s")) for c in multi)
                   + " per stream)")
    parts: list[tuple[str, dict[str, Any] | None, str]] = [("single-stream decode", one.roofline if one else None,
                                                             "decode")]
    if len(multi) > 1:
        parts.append((f"aggregate at {multi[-1].streams} streams", multi[-1].roofline, "decode"))
    if after:
        parts.append((f"prompt at {_depth(after[-1][0])}", after[-1][1].roofline, "prefill"))
    out += _roofline_sentence(parts)
    out += _slo_sentence(cells)
    return out


def _duration(ms: float) -> str:
    """``60 ms``, ``2 s``, ``1.5 s``."""
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _slo_sentence(cells: list[CellResult]) -> list[str]:
    """``SLO ttft_p90 <= 2 s, tpot_p90 <= 60 ms: held in 2 of 3 cells`` and ``highest goodput: 5.17 req/s
    (d0-s4-prose)``, from the cells' ``slo`` and ``goodput`` (nothing without an SLO)."""
    scored = [c for c in cells if c.slo]
    if not scored:
        return []
    limits = ", ".join(f"{k} <= {_duration(float(v.get('limit_ms') or 0))}" for k, v in (scored[0].slo or {}).items())
    held = sum(1 for c in scored if c.slo_met)
    out = [f"SLO {limits}: held in {held} of {len(scored)} cell{'s' if len(scored) != 1 else ''}"]
    best = max(scored, key=lambda c: (c.goodput or {}).get("rps") or 0.0)
    rps = (best.goodput or {}).get("rps")
    if rps:
        out.append(f"highest goodput: {_n(rps, 2)} req/s ({best.id})")
    return out


def _roofline_sentence(parts: list[tuple[str, dict[str, Any] | None, str]]) -> list[str]:
    """``of the physical limit: ...`` from ``(label, cell's roofline dict, "decode" | "prefill")`` (docs/roofline.md)."""
    bits = []
    for label, r, kind in parts:
        r = r or {}
        pct, lim = r.get(f"{kind}_pct_of_limit"), r.get(f"{kind}_tok_s_limit")
        if isinstance(pct, int | float) and isinstance(lim, int | float):
            bits.append(f"{label} {pct:.0f} % of {_n(float(lim))} tok/s")
    return ["of the physical limit (roofline): " + "; ".join(bits)] if bits else []


def to_markdown(results: Results) -> str:
    """A Markdown report that pastes into a README: headline, the per-cell table, and notes."""
    ep, run = results.endpoint, results.run
    state = "" if run.complete else (" **Interrupted: partial results.**" if run.interrupted
                                     else " **Incomplete: the run did not finish.**")
    lines = [
        f"### {run_title(results, '`')}",
        "",
        f"{results.server.get('backend') or 'unknown backend'} at {ep.url}, {ep.kind} endpoint; "
        f"bench {results.bench_version}, {results.created}; fixed overhead {_n(run.overhead_ms, 1)} ms.{state}",
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
    note = markers_note(rows)
    if note:
        lines.append(note.replace("*", "\\*").replace("~", "\\~") + ".")
    warns = results.warnings
    if warns:
        lines.append("")
        lines.append("Notes:")
        lines += [f"- {w}" for w in warns]
    return "\n".join(lines) + "\n"


EXPORTERS: dict[str, tuple[str, Callable[[Results], str]]] = {
    "json": ("results.json", to_json), "csv": ("results.csv", to_csv), "md": ("results.md", to_markdown),
}
VIEWS: dict[str, Callable[[Results], str]] = {"results.csv": to_csv, "results.md": to_markdown}
"""The views written beside results.json at the end of a run (:class:`bench.driver.RunOutput`)."""


def write_results(results: Results, out_dir: str | os.PathLike[str],
                  formats: Iterable[str] = ("json", "csv", "md")) -> list[Path]:
    """Write the chosen formats into ``out_dir`` atomically; returns the paths written."""
    return [write_atomic(Path(out_dir) / EXPORTERS[f][0], EXPORTERS[f][1](results)) for f in formats]
