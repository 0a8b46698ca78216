"""One self-contained HTML report of one or several runs (``bench report``; docs/report.md).

Reads only what a run wrote: ``results.json`` and the ``records.jsonl`` beside it (measured requests), plus a
``capacity.json`` beside it, and gate documents (``gate.json`` / ``ab.json``) given as arguments or found beside.
The page carries plotly.js inline and every figure's data: it opens offline and loads nothing from the network.
Sections appear only when the data has something for them.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.measure.metrics import request_metrics
from bench.records import read_records
from bench.report.export import headline
from bench.report.figures import (
    Source,
    capacity_figure,
    cdf_figure,
    decode_vs_streams,
    depth_figure,
    gate_figure,
    server_metrics_figure,
    timeline_figure,
)
from bench.report.gpu import gpu_figure, gpu_table
from bench.report.tables import cells_html, points_html
from bench.results import capacity_from_dict, gate_from_dict, load_capacity, load_gate, results_from_dict, write_atomic

__all__ = ["load_inputs", "build_report", "write_report", "write_images", "require_plotly", "check_out", "Source",
           "REPORT_SUFFIXES"]

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1280px;
color:#222;padding:0 16px}h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;
margin-top:32px}table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;
padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}.warn{color:#a15c00}
.muted{color:#777;font-size:12px}.reg{color:#c00;font-weight:600}.ok{color:#070}.scroll{overflow-x:auto}
table.figures td:nth-child(-n+2){text-align:left;white-space:nowrap}"""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not JSON: {e}") from None


def _source(path: Path, doc: dict[str, Any], name: str) -> Source:
    recs = []
    rp = path.parent / "records.jsonl"
    if rp.exists():
        recs = [r for r in read_records(rp) if r.meta.get("phase") == "measure"]
    cap = path.parent / "capacity.json"
    capacity = load_capacity(cap).to_dict() if cap.exists() and cap != path else None  # validated, typed
    return Source(name, doc, recs, [request_metrics(r) for r in recs], capacity)


def _names(paths: Sequence[Path]) -> list[str]:
    """Short labels: the results folder's name, made unique."""
    out: list[str] = []
    for p in paths:
        n = p.parent.name or p.stem
        out.append(n if n not in out else f"{n} ({len(out) + 1})")
    return out


_FOLDER_FILES = ("results.json", "capacity.json", "ab.json", "gate.json")


def _input_files(p: Path) -> list[Path]:
    """The files an argument stands for: a file itself; a folder its results.json (the run's), else capacity.json
    (``bench capacity --out``), else ab.json with ``a/`` and ``b/`` beside it (``bench ab --out``), else gate.json."""
    if not p.is_dir():
        return [p]
    for name in _FOLDER_FILES:
        if (p / name).is_file():
            sides = [p / s / "results.json" for s in ("a", "b")] if name == "ab.json" else []
            return [q for q in sides if q.is_file()] + [p / name]
    raise ConfigError(f"{p}: no {', '.join(_FOLDER_FILES)} in this folder (give a folder bench run, capacity, "
                      "gate or ab wrote, or one of its files)")


REPORT_SUFFIXES = (".html", ".htm")


def check_out(out: str | os.PathLike[str], inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """The report's ``-o``, checked before anything is read or written: it must end in ``.html`` or ``.htm`` (so
    no results.json, records.jsonl, results.md, capacity.json, gate.json or history store is ever written over)
    and must not be one of ``inputs`` or a document they stand for. An HTML page may be replaced (a results
    folder's report.html, written again). Raises ConfigError (one line) otherwise."""
    p = Path(out)
    if p.suffix.lower() not in REPORT_SUFFIXES:
        raise ConfigError(f"-o {p}: the report is an HTML page; give a file name ending in .html or .htm "
                          "(bench report never writes over a run's own files)")
    files = [f for i in inputs for f in ((Path(i), *_input_files(Path(i))) if Path(i).is_dir() else (Path(i),))]
    if any(f.resolve() == p.resolve() for f in files):
        raise ConfigError(f"-o {p}: is one of the report's inputs; give another file name")
    return p


def _capacity_results(doc: dict[str, Any]) -> dict[str, Any]:
    """What a capacity document says of its run, in a results document's shape (no cells): its endpoint, server
    and SLO, for the report's run table."""
    ep: dict[str, Any] = doc["endpoint"] if isinstance(doc.get("endpoint"), dict) else {}
    return {"cells": [], "endpoint": {**ep, "kind": (doc.get("load") or {}).get("endpoint") or ep.get("kind")},
            "server": doc.get("server") if isinstance(doc.get("server"), dict) else {},
            "profile": {"name": f"capacity search ({doc.get('by', 'rate')}, SLO {doc.get('slo')})"},
            "run": {"id": doc.get("run_id"), "duration_s": doc.get("elapsed_s")}}


def load_inputs(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Source], list[tuple[str, dict[str, Any]]]]:
    """Classify each argument: a results file (``cells``; a folder means its results.json), a capacity document
    (``points``) or a gate document (``verdicts``). Returns ``(sources, gates)``; raises ConfigError otherwise, and
    for a results file with no cells (and no capacity.json beside it): nothing to report."""
    files = [f for p in paths for f in _input_files(Path(p))]
    docs = [(f, _read_json(f)) for f in files]
    sources: list[Source] = []
    gates: list[tuple[str, dict[str, Any]]] = []
    res = [(f, d) for f, d in docs if isinstance(d, dict) and "cells" in d]
    for (f, d), name in zip(res, _names([f for f, _ in res])):
        d = results_from_dict(d, f"results file {f}").to_dict()  # the one validating loader
        sources.append(_source(f, d, name))
        if not d["cells"] and sources[-1].capacity is None:  # an empty page that exits 0 hides a broken input
            raise ConfigError(f"no cells in {f}: nothing to report")
        g = f.parent / "gate.json"
        if g.exists() and all(g != x for x in files):
            gates.append((f"{name}/gate.json", load_gate(g).to_dict()))
    for f, d in docs:
        if isinstance(d, dict) and "verdicts" in d:
            gates.append((f.name, gate_from_dict(d, f"gate file {f}").to_dict()))
        elif isinstance(d, dict) and "points" in d:
            cap = capacity_from_dict(d, f"capacity file {f}").to_dict()
            if not sources:
                sources.append(Source(f.parent.name or f.stem, _capacity_results(cap)))
            sources[-1].capacity = cap
        elif not (isinstance(d, dict) and "cells" in d):
            raise ConfigError(f"{f}: not a bench results, capacity or gate file (no 'cells', 'points' or 'verdicts')")
    if not sources and not gates:
        raise ConfigError("bench report: give at least one results.json")
    return sources, gates


def _fig_html(fig: Any) -> str:
    import plotly.io as pio

    return str(pio.to_html(fig, include_plotlyjs=False, full_html=False,
                           config={"displaylogo": False, "responsive": True}))


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                   for k, v in rows if v not in (None, "", [], {}))
    return f"<table>{body}</table>"


def _run_info(s: Source) -> str:
    r = s.results
    ep, srv, run, prof = (r.get(k) or {} for k in ("endpoint", "server", "run", "profile"))
    st = prof.get("settings") or {}
    spec = r.get("roofline_spec") or {}
    where = " ".join(str(x) if i == 0 else f"({x})" for i, x in enumerate((ep.get("url"), ep.get("kind"))) if x)
    rows = [("model", ep.get("model")), ("endpoint", where),
            ("server", f"{srv.get('backend') or 'unknown backend'} {srv.get('version') or ''}".strip()),
            ("context size", srv.get("context_size")), ("profile", prof.get("name")),
            ("state", _state(r)), ("load", _load_line(r.get("load"))),
            ("settings", _settings_line(st, r.get("cells") or [], bool(r.get("load")))),
            ("created", r.get("created")), ("duration s", _fmt(run.get("duration_s"), 0, "")),
            ("fixed overhead ms", _fmt(run.get("overhead_ms"), 1, "")), ("bench", r.get("bench_version")),
            ("machine", (r.get("machine") or {}).get("hostname")),
            ("roofline", _spec_line(spec) if spec else None)]
    warns = "".join(f"<li class='warn'>{html.escape(str(w))}</li>" for w in r.get("warnings") or [])
    heads = "".join(f"<li>{html.escape(h)}</li>" for h in headline(results_from_dict(r))) if r.get("cells") else ""
    state = _state(r)
    return (f"<h3>{html.escape(s.name)}</h3>"
            + (f"<p class='warn'><b>{html.escape(state[0].upper() + state[1:])}.</b></p>" if state else "")
            + _kv_table(rows)
            + (f"<p><b>Headline</b></p><ul>{heads}</ul>" if heads else "")
            + (f"<p><b>Warnings</b></p><ul>{warns}</ul>" if warns else ""))


def _state(r: dict[str, Any]) -> str | None:
    """None for a complete run; else what results.md says of it, with the cells it holds."""
    run = r.get("run") or {}
    if run.get("complete", True):
        return None
    n = len(r.get("cells") or [])
    what = "interrupted: partial results" if run.get("interrupted") else "incomplete: the run did not finish"
    return f"{what} ({n} cell{'' if n == 1 else 's'} measured)"


def _load_line(load: dict[str, Any] | None) -> str | None:
    """An open-loop run's offered load (results.json ``load``: rate, arrivals, duration, trace, sessions...)."""
    if not load:
        return None
    return ", ".join(f"{k}={v}" for k, v in load.items() if k != "id" and v not in (None, "", [], {}))


def _settings_line(st: dict[str, Any], cells: Sequence[dict[str, Any]], open_loop: bool = False) -> str:
    """The profile's settings; ``images`` and ``image_size`` as the cells ran them, only when every cell ran the
    same images (a sweep's cells each name their own; a run without images has none to show); an open-loop run's
    without the waves' ``requests`` and ``warmup`` (its load says what ran)."""
    keys = ["max_tokens", "requests", "warmup", "endpoint", "thinking", "prefix_cache", "tools", "tool_choice"]
    if open_loop:
        keys = [k for k in keys if k not in ("requests", "warmup")]
    shown = {k: st[k] for k in keys if st.get(k) not in (None, "")}
    imgs = {(c.get("images") or 0, c.get("image_size") or "") for c in cells}
    if len(imgs) == 1 and (one := next(iter(imgs)))[0]:
        shown.update(images=one[0], image_size=one[1])
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def _spec_line(spec: dict[str, Any]) -> str:
    bits = [f"{spec.get('hardware') or 'custom'} x{spec.get('devices', 1)}",
            f"{spec['bandwidth'] / 1e12:.3g} TB/s"]
    if spec.get("flops"):
        bits.append(f"{spec['flops'] / 1e12:.4g} TFLOP/s")
    if spec.get("weight_bytes"):
        bits.append(f"weights read per step {spec['weight_bytes'] / 1e9:.4g} GB ({spec.get('model_source')})")
    if spec.get("kv_bytes_per_token"):
        bits.append(f"KV {spec['kv_bytes_per_token']:.0f} B/token")
    return ", ".join(bits)


def _fmt(v: Any, digits: int = 1, missing: str = "-") -> str:
    return missing if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:,.{digits}f}"


def _roofline_table(s: Source) -> str:
    cells = [c for c in s.results.get("cells", []) if isinstance(c.get("roofline"), dict)]
    if not cells:
        return ""
    head = ("<tr><th>cell</th><th>decode tok/s p50 (aggregate at N &gt; 1)</th><th>decode limit</th>"
            "<th>% of limit</th><th>prompt tok/s p50</th><th>prefill limit</th><th>% of limit</th></tr>")
    rows = []
    for c in cells:
        rf = c["roofline"]
        dec = (c.get("decode_tok_s") if c["streams"] == 1 else c.get("aggregate_decode_tok_s")) or {}
        pt = (c.get("prompt_tok_s") or {}).get("median") if c.get("depth") and not c.get("load") else None
        rows.append(f"<tr><td>{html.escape(c['id'])}</td><td>{_fmt(dec.get('median'))}</td>"
                    f"<td>{_fmt(rf.get('decode_tok_s_limit'))}</td><td>{_fmt(rf.get('decode_pct_of_limit'))}</td>"
                    f"<td>{_fmt(pt, 0)}</td><td>{_fmt(rf.get('prefill_tok_s_limit'), 0)}</td>"
                    f"<td>{_fmt(rf.get('prefill_pct_of_limit'))}</td></tr>")
    return f"<h3>{html.escape(s.name)}: % of the physical limit (roofline)</h3><table>{head}{''.join(rows)}</table>"


def _workload_table(s: Source) -> str:
    """Images, thinking and tool calls per cell (docs/workloads.md), when a cell has any of them."""
    def med(c: dict[str, Any], k: str, digits: int = 1) -> str:
        return _fmt((c.get(k) or {}).get("median"), digits)

    cells = [c for c in s.results.get("cells", []) if c.get("images") or c.get("tool_calls_forced")
             or c.get("tool_calls") or (c.get("reasoning_tok_s") or {}).get("median") is not None]
    if not cells:
        return ""
    head = ("<tr><th>cell</th><th>images</th><th>image bytes p50</th><th>tokens per image</th><th>upload ms p50</th>"
            "<th>TTFT ms p50</th><th>first reasoning ms</th><th>first content ms</th><th>reasoning tok/s</th>"
            "<th>content tok/s</th><th>first tool call ms</th><th>tool calls (missing)</th></tr>")
    rows = [f"<tr><td>{html.escape(str(c.get('id')))}</td><td>{c.get('images') or 0}</td>"
            f"<td>{med(c, 'image_bytes', 0)}</td><td>{_fmt(c.get('image_prompt_tokens'))}</td>"
            f"<td>{med(c, 'upload_ms')}</td><td>{med(c, 'ttft_ms')}</td><td>{med(c, 'ttft_reasoning_ms')}</td>"
            f"<td>{med(c, 'ttft_content_ms')}</td><td>{med(c, 'reasoning_tok_s')}</td><td>{med(c, 'content_tok_s')}</td>"
            f"<td>{med(c, 'ttft_tool_ms')}</td><td>{c.get('tool_calls', 0)} ({c.get('tool_calls_missing', 0)})</td></tr>"
            for c in cells]
    return f"<h3>{html.escape(s.name)}</h3><table>{head}{''.join(rows)}</table>"


def _gate_section(name: str, gate: dict[str, Any]) -> str:
    rows = []
    for v in gate.get("verdicts") or []:
        cls = "reg" if v.get("verdict") == "regression" else "ok" if v.get("verdict") in ("unchanged", "improved") else ""
        iv = f"[{_fmt(v.get('lo'), 3)}, {_fmt(v.get('hi'), 3)}]"
        rows.append(f"<tr><td>{html.escape(str(v.get('name') or v.get('metric')))}</td>"
                    f"<td>{html.escape(str(v.get('cell')))}</td><td class='{cls}'>{html.escape(str(v.get('verdict')))}"
                    f"</td><td>{_fmt(v.get('baseline'), 2)}</td><td>{_fmt(v.get('candidate'), 2)}</td>"
                    f"<td>{_fmt(v.get('ratio'), 3)}</td><td>{iv}</td>"
                    f"<td style='text-align:left'>{html.escape(str(v.get('note') or ''))}</td></tr>")
    head = ("<tr><th>rule</th><th>cell</th><th>verdict</th><th>baseline</th><th>candidate</th><th>ratio</th>"
            "<th>interval</th><th>note</th></tr>")
    fig = gate_figure(gate, name)
    return (f"<h3>{html.escape(name)} (exit {html.escape(str(gate.get('exit')))})</h3>"
            f"<table>{head}{''.join(rows)}</table>" + (_fig_html(fig) if fig is not None else ""))


def _figures_tables(sources: Sequence[Source]) -> list[str]:
    """The report's lead: every run's cells in one table, every capacity search's points in another."""
    named = [(s.name, results_from_dict(s.results)) for s in sources if s.results.get("cells")]
    out = []
    cells = cells_html(named)
    if cells:
        out += ["<h2>Figures per cell</h2>", cells]
    points = [t for t in (points_html(s.name, s.capacity) for s in sources if s.capacity) if t]
    if points:
        out += ["<h2>Figures per point of the capacity search</h2>"] + points
    return out


def _figures(sources: Sequence[Source]) -> dict[str, Any]:
    """The main figures by file stem (also the PNG/SVG names); absent when the data has nothing for them."""
    figs = {"decode_vs_streams": decode_vs_streams(sources), "depth": depth_figure(sources),
            "latency_cdf": cdf_figure(sources), "capacity": capacity_figure(sources),
            "server_metrics": server_metrics_figure(sources), "gpu": gpu_figure(sources)}
    return {k: f for k, f in figs.items() if f is not None}


def build_report(sources: Sequence[Source], gates: Sequence[tuple[str, dict[str, Any]]] = (),
                 title: str | None = None, extra_sections: Sequence[str] = ()) -> str:
    """The whole HTML page (a string): plotly.js inline, then the sections the data supports, then
    ``extra_sections`` (HTML, e.g. :func:`bench.report.trends.trend_section`)."""
    from plotly.offline import get_plotlyjs

    title = title or "bench report: " + " vs ".join(s.name for s in sources)
    figs = _figures(sources)
    parts = [f"<h1>{html.escape(title)}</h1>"] + _figures_tables(sources)
    parts += ["<h2>Runs</h2>"] + [_run_info(s) for s in sources]
    for key, head in (("decode_vs_streams", "Decode vs concurrent streams"), ("depth", "Prefill and decode vs depth")):
        if key in figs:
            parts += [f"<h2>{head}</h2>", _fig_html(figs[key])]
    work = [t for t in (_workload_table(s) for s in sources) if t]
    if work:
        parts += ["<h2>Images, thinking and tool calls (docs/workloads.md)</h2>"] + work
    roof = [t for t in (_roofline_table(s) for s in sources) if t]
    if roof:
        parts += ["<h2>Against the physical limit (roofline, docs/roofline.md)</h2>"] + roof
    gpu = [t for t in (gpu_table(s) for s in sources) if t]
    if gpu:  # beside decode tok/s: what each cell's tokens cost (docs/gpu-telemetry.md)
        parts += ["<h2>GPU power, clocks and energy per token</h2>"] + gpu
        parts += [_fig_html(figs["gpu"])] if "gpu" in figs else []
    if "latency_cdf" in figs:
        parts += ["<h2>TTFT, ITL and E2E distributions</h2>", _fig_html(figs["latency_cdf"])]
    tl = [f for f in (timeline_figure(s) for s in sources) if f is not None]
    if tl:
        parts += ["<h2>Per-request timeline</h2>",
                  "<p class='muted'>grey: waiting for the first token; coloured: decoding, by the longest "
                  "inter-token gap of the request (stalls and head-of-line blocking stand out).</p>"]
        parts += [_fig_html(f) for f in tl]
    for key, head in (("capacity", "Capacity and the SLO boundary"), ("server_metrics", "Server metrics")):
        if key in figs:
            parts += [f"<h2>{head}</h2>", _fig_html(figs[key])]
    if gates:
        parts += ["<h2>Gate verdicts</h2>"] + [_gate_section(n, g) for n, g in gates]
    parts += list(extra_sections)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style><script>{get_plotlyjs()}</script></head>"
            f"<body>{''.join(parts)}<p class='muted'>made by bench from results.json and records.jsonl; "
            "opens offline (plotly.js inline).</p></body></html>")


def require_plotly() -> None:
    """Raise ConfigError (with the install line) when plotly is missing; `bench run --report` checks before running."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ConfigError("bench report needs plotly: pip install 'bench[report]' (plotly==7.1.0)") from None


def write_report(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                 title: str | None = None, extra_sections: Sequence[str] = ()) -> Path:
    """Read the inputs, write the HTML report to ``out`` (atomically); returns its path."""
    check_out(out, paths)
    require_plotly()
    sources, gates = load_inputs(paths)
    page = build_report(sources, gates, title, extra_sections)
    return write_atomic(out, page)


def write_images(paths: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                 formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """The main figures as static images (kaleido, which drives a Chrome/Chromium: ``BROWSER_PATH`` or
    ``/usr/bin/chromium``). Raises ConfigError when kaleido or the browser is missing."""
    require_plotly()
    sources, _ = load_inputs(paths)
    if "BROWSER_PATH" not in os.environ and Path("/usr/bin/chromium").exists():
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise ConfigError("--images needs kaleido: pip install 'bench[report]' (kaleido==1.5.0) and a Chromium") from None
    import plotly.io as pio

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    figs = _figures(sources)
    jobs = [(fig, d / f"{name}.{fmt}") for name, fig in figs.items() for fmt in formats]
    try:  # one browser for every image
        pio.write_images([f for f, _ in jobs], [p for _, p in jobs], width=1100, height=450)
    except Exception as e:  # noqa: BLE001 - kaleido raises its own classes (no browser, browser crashed)
        raise ConfigError(f"--images: kaleido could not draw the figures ({type(e).__name__}: {e}); "
                          "install chromium or set BROWSER_PATH") from None
    return [p for _, p in jobs]
