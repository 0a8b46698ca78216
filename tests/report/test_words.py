"""Numbers and words (issue 31, point 7): no raw floats in what bench prints, the table's markers explained, help
texts as printed, flags that do not apply refused with one line, a header that says what ran, no empty results
folder from a failed run, one lag warning per cell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from bench.cli.app import cli
from bench.load.point import describe_point
from bench.report.console import results_text
from bench.report.export import run_title
from bench.report.tables import capacity_answer, num
from bench.results import results_from_dict

RAW = re.compile(r"\d\.\d{4,}")


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(cwd)})


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[str, click.Command]]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or name == "sim":  # bench sim's help is argparse's (checked below)
            continue
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            out += [(f"{name} {n}", c) for n, c in _commands(cmd, click.Context(cmd, info_name=name, parent=ctx))]
    return out


def test_no_help_shows_a_doubled_percent_sign():
    ctx = click.Context(cli, info_name="bench")
    for name, cmd in _commands(cli, ctx):
        text = cmd.get_help(click.Context(cmd, info_name=name, parent=ctx))
        assert "%%" not in text, name
    assert "20 % of the span" in cli.get_command(ctx, "run").get_help(click.Context(cli, info_name="run"))


def test_sim_help_prints(tmp_path):
    r = _bench("sim", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "%;" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", [["--rate", "3"], ["--trace", "x.jsonl"], ["--sessions", "2"]])
def test_capacity_refuses_the_load_flags_it_would_ignore(tmp_path, flag):
    r = _bench("capacity", "http://127.0.0.1:9/v1", "--slo", "ttft_p90=1s", *flag, "--out", "c", cwd=tmp_path)
    assert r.returncode == 3
    [line] = r.stderr.strip().splitlines()
    assert f"{flag[0]} does not apply" in line and "bench run --rate R" in line
    assert not (tmp_path / "c").exists()


def test_capacity_help_lists_only_the_options_that_apply():
    """capacity's --help once listed --rate, --trace, --sessions... that it refuses ("does not apply"); they are
    hidden there (still refused in one line, above), and still listed by bench run."""
    ctx = click.Context(cli, info_name="bench")
    cap = cli.get_command(ctx, "capacity").get_help(click.Context(cli, info_name="capacity"))
    run = cli.get_command(ctx, "run").get_help(click.Context(cli, info_name="run"))
    for flag in ("--rate", "--trace", "--sessions", "--block-tokens", "--speed", "--turns", "--think"):
        assert f"  {flag} " not in cap and f"  {flag} " in run, flag
    assert "  --duration " in cap and "  --slo " in cap


def test_a_second_slo_is_refused_not_dropped(tmp_path):
    r = _bench("run", "http://127.0.0.1:9/v1", "--slo", "ttft_p90=1s", "--slo", "tpot_p90=50ms", cwd=tmp_path)
    assert r.returncode == 3
    [line] = r.stderr.strip().splitlines()
    assert "given 2 times" in line and "--slo ttft_p90=2s,tpot_p90=60ms" in line


def test_a_failed_run_leaves_no_empty_folder(tmp_path):
    r = _bench("run", "http://127.0.0.1:9/v1", "-p", "quick", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))  # not even bench-results/
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("x")
    r = _bench("run", "http://127.0.0.1:9/v1", "-p", "quick", "--out", "kept", cwd=tmp_path)
    assert r.returncode == 4 and (tmp_path / "kept" / "mine.txt").exists()  # a folder that held something stays


def _results(**kw) -> dict:
    doc = {"schema": 1, "profile": {"name": "quick", "settings": kw.pop("settings", {})},
           "endpoint": {"url": "http://h/v1", "model": "m"}, "run": {"id": "r", "started": "x"}, "cells": []}
    doc.update(kw)
    return doc


def test_the_header_says_what_ran():
    assert run_title(results_from_dict(_results())) == "bench: profile quick on m"
    over = results_from_dict(_results(settings={"overrides": ["--streams", "--depths"]}))
    assert run_title(over) == "bench: profile quick (with --streams, --depths) on m"
    rate = results_from_dict(_results(load={"id": "rate-10", "mode": "rate"}))
    assert run_title(rate) == "bench: rate-10 (rate load) on m"
    assert run_title(rate, "`") == "bench: `rate-10` (rate load) on `m`"


def test_overrides_are_recorded_on_the_profile():
    from bench.config.profile import load_profile, profile_settings

    p = load_profile("quick").with_overrides(streams=(4,), depths=(0,), max_tokens=32)
    assert p.overrides == ("--depths", "--streams", "--max-tokens")
    assert list(profile_settings(p)["overrides"]) == ["--depths", "--streams", "--max-tokens"]
    assert load_profile("quick").overrides == ()
    think = load_profile("quick").with_overrides(thinking="on", tools="builtin")
    assert think.overrides == ("--thinking", "--tools")


def test_markers_are_explained_under_the_table():
    cell = {"id": "d0-s1-prose", "sweep": "s", "depth": 0, "streams": 1, "prompt": "prose", "max_tokens": 8,
            "requests_ok": 4, "requests_failed": 0, "waves": 4,
            "decode_tok_s": {"median": 50.0, "p10": 49.0, "p90": 51.0},
            "ttft_ms": {"median": 20.0, "p90": 22.0, "p99": 23.0, "thin": ["p99"]}}
    text = results_text(results_from_dict(_results(cells=[cell])))
    assert "23*" in text and "* fewer samples than the percentile needs" in text
    assert "! the fixed overhead" not in text  # only the markers shown are explained


def test_point_lines_hold_no_raw_float():
    s = {"id": "rate-2", "mode": "rate",
         "schedule": {"planned_requests": 80, "planned_rps": 1.9752, "achieved_rps": 1.97512345,
                      "send_lag_ms": {"p50": 0.9692, "p99": 5.75, "max": 6.7125}},
         "counts": {"planned": 80, "finished": 80, "failed": 0, "cut": 0},
         "window": {"from_s": 7.999, "to_s": 35.997, "requests": 56}, "steady": True,
         "goodput": {"rps": 1.8234567, "tok_s": 230.123456, "met_fraction": 0.264706},
         "slo": {"ttft_p90": {"value": 123.456789, "limit_ms": 2000.0, "held": True}}}
    lines = describe_point(s)
    assert not [ln for ln in lines if RAW.search(ln)], lines
    assert "SLO met by 26.5 % of requests" in " ".join(lines) and "(56 of 80 requests)" in lines[3]
    assert max(len(ln) for ln in lines) <= 80, lines  # each fits an 80-column terminal


def test_numbers_and_the_capacity_answer():
    assert [num(x) for x in (18.61959774044124, 1234.5, 0.264706, None, 3)] == ["18.6", "1,234", "0.26", "-", "3"]
    doc = {"by": "rate", "slo": "ttft_p90=2s", "boundary": 12.345678, "interval": [11.8123, 12.9], "confidence": 0.95,
           "saturated_at": None}
    assert capacity_answer(doc) == "capacity (ttft_p90=2s): 12.35 req/s, interval [11.81, 12.90] (confidence 95%)"
    conc = {"by": "concurrency", "slo": "s", "boundary": 16.0, "interval": [16.0, None], "confidence": None,
            "saturated_at": 32.0}
    assert capacity_answer(conc) == ("capacity (s): 16 in flight, interval [16, open] (no confidence level); saturated "
                                     "at 32 in flight")


def test_the_busy_machine_lag_warning_names_no_cure_bench_took_away():
    from bench.session.loop_lag import lag_warning

    w = lag_warning({"p99_ms": 20.0, "max_ms": 30.0}, workers=1, streams=1)
    assert w is not None and "more workers cannot help" in w and "--workers" not in w
    assert "e.g. fewer server threads" not in w


def test_the_capacity_curve_fits_the_terminal():
    from bench.report.tables import curve_text

    pts = [{"load": x, "trial": t, "achieved_rps": 1022.14, "completed_rps": 724.36, "ttft_p90_ms": 2486.6,
            "tpot_p50_ms": 19.9, "per_user_tok_s": 50.3, "aggregate_tok_s": 16016.5, "goodput": {"rps": 0.0},
            "slo_met": False, "steady": False} for x in (1024, 1.5) for t in (0, 1)]
    doc = {"by": "rate", "points": pts}
    wide = curve_text(doc, 220)
    assert len(wide) == 5 and "total tok/s" in wide[0] and max(map(len, wide)) > 100
    assert [ln.split()[0] for ln in wide[1:]] == ["1.5", "1.5", "1024", "1024"]  # sorted by load, then trial
    for width in (100, 80):
        lines = curve_text(doc, width)
        assert max(map(len, lines)) <= width, lines
        assert "16,016.5" in "".join(lines) or "tok/s columns" in lines[-1]
        assert "2,486.6" in lines[-2] and "missed" in lines[-2]  # figures whole
