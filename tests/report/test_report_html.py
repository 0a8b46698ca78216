"""`bench report` and `bench run --report`: one self-contained HTML page, checked as a file and in a real headless
Chromium (Debian's package, driven by Playwright): the plots draw, the console stays clean, and the page asks for
nothing outside 127.0.0.1 / file://."""

from __future__ import annotations

import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench.cli.app import main

pytest.importorskip("plotly")

CHROMIUM = "/usr/bin/chromium"
TINY = """name = "tiny"
max_tokens = 16
requests = 4
warmup = 0
overhead_probes = 1
[[sweep]]
depths = [0]
streams = [1, 2]
prompts = ["prose"]
[[sweep]]
depths = [256, 1024]
streams = [1]
prompts = ["prose"]
requests = 2
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real small run against bench sim, with a roofline and --report."""
    from bench.sim import SimConfig, running_sim

    d = tmp_path_factory.mktemp("report")
    (d / "tiny.toml").write_text(TINY)
    out = d / "a"
    with running_sim(SimConfig(decode_step_ms=5.0, prefill_tok_s=20000.0)) as url:
        rc = main(["run", url, "--profile", str(d / "tiny.toml"), "--out", str(out), "--report", "--hardware", "h200",
                   "--model-params", "7.385b", "--weight-bits", "16", "--kv-bytes-per-token", "128KiB"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def full_report(run_dir: Path) -> Path:
    """Two results side by side (the second with goodput, server metrics and a capacity.json), and a gate.json."""
    b = run_dir.parent / "b"
    b.mkdir(exist_ok=True)
    res = json.loads((run_dir / "results.json").read_text())
    for i, c in enumerate(res["cells"]):
        c["goodput"] = {"rps": 2.0 + i, "tok_s": 30.0 + i, "met_fraction": 1.0}
        c["server_metrics"] = {"backend": "llama.cpp", "kv_cache_usage_pct_max": 10.0 + i,
                               "series": [{"t_s": t * 0.5, "kv_cache_usage_pct": 5.0 * t, "requests_running": t % 3}
                                          for t in range(6)]}
    (b / "results.json").write_text(json.dumps(res))
    shutil.copy(run_dir / "records.jsonl", b / "records.jsonl")
    (b / "capacity.json").write_text(json.dumps({"by": "rate", "boundary": 4.0, "interval": [3.5, 4.5],
                                                 "saturated_at": None, "points": [
        {"load": x, "slo_met": x <= 4, "goodput": {"rps": min(x, 4.0), "tok_s": 10 * x}} for x in (1, 2, 4, 8)]}))
    gate = {"exit": 1, "verdicts": [
        {"name": "decode_tok_s p50", "metric": "decode_tok_s", "stat": "median", "cell": "d0-s1-prose", "verdict": "regression",
         "baseline": 200.0, "candidate": 180.0, "ratio": 0.9, "lo": 0.87, "hi": 0.93, "level": 0.95, "note": ""},
        {"name": "ttft_ms p50", "metric": "ttft_ms", "stat": "median", "cell": "d0-s1-prose", "verdict": "unchanged",
         "baseline": 8.0, "candidate": 8.1, "ratio": 1.01, "lo": 0.97, "hi": 1.05, "level": 0.95, "note": ""}]}
    (b / "gate.json").write_text(json.dumps(gate))
    out = run_dir.parent / "full.html"
    assert main(["report", str(run_dir / "results.json"), str(b / "results.json"), str(b / "gate.json"),
                 "-o", str(out)]) == 0
    return out


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "srcset", "action", "data")]


def test_run_report_is_self_contained(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    p = _Refs()
    p.feed(page)
    assert [r for r in p.refs if "://" in r or r.startswith("//")] == []
    for section in ("Decode vs concurrent streams", "Prefill and decode vs depth", "physical limit",
                    "TTFT, ITL and E2E distributions", "Per-request timeline", "single stream, short decode"):
        assert section in page
    cells = json.loads((run_dir / "results.json").read_text())["cells"]
    assert all(set(c["roofline"]) == {"decode_tok_s_limit", "decode_pct_of_limit", "prefill_tok_s_limit",
                                      "prefill_pct_of_limit"} for c in cells)
    md = (run_dir / "results.md").read_text()
    assert "% of limit" in md and "of the physical limit (roofline): single-stream decode" in md


def test_full_report_has_every_section(full_report: Path) -> None:
    page = full_report.read_text(encoding="utf-8")
    for section in ("Capacity and the SLO boundary", "Server metrics", "Gate verdicts", "regression", " vs b"):
        assert section in page
    assert full_report.stat().st_size < 6_000_000


def test_report_bad_input(tmp_path, capsys) -> None:
    p = tmp_path / "x.json"
    p.write_text("[1]")
    assert main(["report", str(p), "-o", str(tmp_path / "r.html")]) == 3
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err
    assert "not a bench results" in err and "not found" in err and "Traceback" not in err


@pytest.mark.parametrize("which", ["run", "full"])
def test_report_draws_in_headless_chromium(which, run_dir: Path, full_report: Path) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    path = run_dir / "report.html" if which == "run" else full_report
    outside: list[str] = []
    errors: list[str] = []

    def route(r) -> None:
        url = r.request.url
        if url.startswith(("file://", "http://127.0.0.1", "data:", "blob:")):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length > 0")
            divs = page.eval_on_selector_all(
                ".plotly-graph-div", "ds => ds.map(d => [d.querySelectorAll('.main-svg').length, "
                "d.querySelectorAll('.main-svg path, .main-svg rect').length])")
        finally:
            browser.close()
    assert outside == [], f"the report tried to load {outside}"
    assert errors == [], errors
    drawn = path.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert len(divs) == drawn and drawn >= (4 if which == "run" else 8)
    assert all(n_svg > 0 and n_marks > 0 for n_svg, n_marks in divs), divs


def test_images_png_and_svg(run_dir: Path, tmp_path: Path) -> None:
    """`bench report --images DIR`: the main figures as PNG and SVG through kaleido and the system Chromium."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    pytest.importorskip("kaleido")
    img = tmp_path / "img"
    assert main(["report", str(run_dir), "-o", str(tmp_path / "r.html"), "--images", str(img)]) == 0
    names = sorted(p.name for p in img.iterdir())
    # the sim exposes /metrics, so the run's cells carry server_metrics and that figure is drawn too
    assert names == ["decode_vs_streams.png", "decode_vs_streams.svg", "depth.png", "depth.svg", "latency_cdf.png",
                     "latency_cdf.svg", "server_metrics.png", "server_metrics.svg"]
    assert (img / "depth.png").read_bytes()[:4] == b"\x89PNG" and (img / "depth.png").stat().st_size > 10_000
    assert "<svg" in (img / "depth.svg").read_text(encoding="utf-8")[:500]


def test_inputs_folder_and_capacity_alone(run_dir: Path, tmp_path: Path) -> None:
    from bench.report.html import build_report, load_inputs

    sources, gates = load_inputs([run_dir])  # a folder means its results.json
    assert len(sources) == 1 and sources[0].name == "a" and sources[0].records and gates == []
    assert all(r.meta.get("phase") == "measure" for r in sources[0].records)
    cap = tmp_path / "capacity.json"
    cap.write_text(json.dumps({"by": "concurrency", "boundary": 8, "interval": [6, 10], "points": [
        {"load": 4, "slo_met": True, "goodput": {"rps": 3.0}}, {"load": 16, "slo_met": False, "goodput": {"rps": 1.0}}]}))
    page = build_report(*load_inputs([cap]))
    assert "Capacity and the SLO boundary" in page and "Decode vs concurrent streams" not in page


# --- issue 31, point 5: the report leads with a table; capacity folders; curves in load order; colours ---------


@pytest.fixture(scope="module")
def capacity_dir(tmp_path_factory) -> Path:
    """A real `bench capacity --out` folder (a short search by concurrency against bench sim)."""
    from bench.sim import SimConfig, running_sim

    d = tmp_path_factory.mktemp("cap") / "cap"
    with running_sim(SimConfig(decode_step_ms=5.0, prefill_tok_s=20000.0)) as url:
        rc = main(["capacity", url, "--by", "concurrency", "--slo", "ttft_p90=2s", "--max-tokens", "8",
                   "--max-load", "2", "--trials", "1", "--out", str(d)])
    assert rc == 0
    return d


def _text(page: str) -> str:
    import re

    return re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", page, flags=re.S))


def test_report_of_a_capacity_folder_leads_with_its_points(capacity_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.html"
    assert main(["report", str(capacity_dir), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    body = page[page.index("<h1>"):]
    assert body.index("<table class='figures'>") < body.index("<h2>Runs</h2>")  # the numbers first
    assert "Figures per point of the capacity search" in page
    doc = json.loads((capacity_dir / "capacity.json").read_text())
    loads = [f"<tr><td>{p['load']:g}</td>" for p in sorted(doc["points"], key=lambda p: (p["load"], p["trial"]))]
    pos = [page.index(x) for x in loads]
    assert pos == sorted(pos) and len(loads) >= 2
    text = _text(page)
    assert "None" not in text and doc["endpoint"]["url"] in text


def test_report_table_of_cells_with_markers_explained(run_dir: Path, tmp_path: Path) -> None:
    import re

    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Figures per cell" in page
    for cid in ("d0-s1-prose", "d0-s2-prose", "d256-s1-prose", "d1024-s1-prose"):
        assert f"<td>{cid}</td>" in page
    text = _text(page)
    if re.search(r"\d\*", text):  # a thin percentile is marked, and the mark explained
        assert "* fewer samples than the percentile needs" in text
    assert not re.search(r"\d\.\d{5,}", text), re.findall(r"\S*\d\.\d{5,}\S*", text)[:5]  # no raw floats


def test_report_of_a_partial_run_says_so(run_dir: Path, tmp_path: Path) -> None:
    """results.md said "Interrupted: partial results"; the HTML report showed the cells as if complete."""
    for interrupted, words in ((True, "Interrupted: partial results (1 cell measured)"),
                               (False, "Incomplete: the run did not finish (1 cell measured)")):
        d = tmp_path / str(interrupted)
        d.mkdir()
        res = json.loads((run_dir / "results.json").read_text())
        res["cells"], res["run"]["complete"], res["run"]["interrupted"] = res["cells"][:1], False, interrupted
        (d / "results.json").write_text(json.dumps(res))
        assert main(["report", str(d), "-o", str(d / "r.html")]) == 0
        assert words in _text((d / "r.html").read_text(encoding="utf-8"))
    page = _text((run_dir / "report.html").read_text(encoding="utf-8"))
    assert "partial results" not in page and "did not finish" not in page


def test_report_of_an_open_loop_run_names_its_load(run_dir: Path, tmp_path: Path) -> None:
    """The Runs block showed the profile's waves (requests=4, warmup=1) and nothing of the rate that ran."""
    res = json.loads((run_dir / "results.json").read_text())
    res["load"] = {"id": "rate-10", "mode": "rate", "rate": 10.0, "arrival": "poisson", "duration_s": 20.0,
                   "requests": None, "input_tokens": "100"}
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 0
    text = " ".join(_text((tmp_path / "r.html").read_text(encoding="utf-8")).split())
    assert "load mode=rate, rate=10.0, arrival=poisson, duration_s=20.0, input_tokens=100" in text
    assert "requests=4" not in text and "warmup=" not in text


def test_capacity_curve_in_load_order_and_one_colour_per_depth() -> None:
    from bench.report.figures import Source, capacity_figure, decode_vs_streams, depth_figure

    cap = {"by": "rate", "points": [{"load": x, "trial": 0, "goodput": {"rps": x}} for x in (1, 8, 2, 4, 3)]}
    fig = capacity_figure([Source("s", {"cells": []}, capacity=cap)])
    assert list(fig.data[0].x) == [1, 2, 3, 4, 8]

    def cell(depth: int, streams: int) -> dict:
        return {"id": f"d{depth}-s{streams}-prose", "depth": depth, "streams": streams, "prompt": "prose",
                "decode_tok_s": {"median": 10.0, "p10": 9.0, "p90": 11.0},
                "aggregate_decode_tok_s": {"median": 10.0 * streams}, "prompt_tok_s": {"median": 100.0}}

    two = Source("s", {"cells": [cell(d, n) for d in (0, 1024) for n in (1, 2, 4)]})
    fig = decode_vs_streams([two])
    colours = {t.line.color for t in fig.data if t.name.startswith("per stream p50")}
    assert len(colours) == 2 and fig.layout.showlegend
    assert depth_figure([Source("s", {"cells": [cell(1024, 1)]})]) is None  # one depth: no one-dot curve
    assert depth_figure([Source("s", {"cells": [cell(256, 1), cell(1024, 1)]})]) is not None


@pytest.mark.parametrize("width", [1280, 800])
def test_report_sections_in_the_browser(width: int, run_dir: Path, capacity_dir: Path, tmp_path: Path) -> None:
    """As a reader sees it: each section's screenshot at 1280 and 800 px (kept under $BENCH_SCREENSHOTS when set);
    the lead table is on screen first, and no table pushes the page wider than the window."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("BENCH_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    pages = {"run": tmp_path / "run.html", "capacity": tmp_path / "capacity.html"}
    assert main(["report", str(run_dir), "-o", str(pages["run"])]) == 0
    assert main(["report", str(capacity_dir), "-o", str(pages["capacity"])]) == 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            for name, path in pages.items():
                page.goto(path.as_uri(), wait_until="load")
                first = page.eval_on_selector("h1 ~ h2", "h => h.textContent")
                assert first.startswith("Figures per"), first
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                heads = page.query_selector_all("h2")
                for i, h in enumerate(heads):
                    h.scroll_into_view_if_needed()
                    page.screenshot(path=str(shots / f"{name}-{width}-{i:02d}.png"))
                assert page.is_visible("table.figures")
        finally:
            browser.close()
    assert len(list(shots.glob(f"*-{width}-*.png"))) >= 4


def test_settings_row_shows_images_as_the_cells_ran_them() -> None:
    """A run without images showed 'images=0, image_size=512x512' (the profile's defaults) and a run of
    --images 2 --image-size 64x64 (a sweep's cells) showed none."""
    from bench.report.html import _settings_line

    st = {"max_tokens": 16, "requests": 2, "images": 0, "image_size": "512x512"}
    assert _settings_line(st, [{"images": 0, "image_size": ""}]) == "max_tokens=16, requests=2"
    two = [{"images": 2, "image_size": "64x64"}] * 2
    assert _settings_line(st, two) == "max_tokens=16, requests=2, images=2, image_size=64x64"
    mixed = [{"images": 0, "image_size": ""}, {"images": 2, "image_size": "64x64"}]
    assert _settings_line(st, mixed) == "max_tokens=16, requests=2"  # each cell names its own
    assert _settings_line(st, two, open_loop=True) == "max_tokens=16, images=2, image_size=64x64"
