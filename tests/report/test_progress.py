"""Progress of every command that measures (issue 31, point 2): open-loop (``--rate``, ``--trace``), ``gate`` and
``ab`` runs print the same progress as closed-loop cells (bench.report.progress): plain lines on stdout in a log,
each line read while bench still runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.sim import SimConfig

ROOT = Path(__file__).resolve().parents[2]
SIM_CONFIG = SimConfig(decode_step_ms=5.0, prefill_tok_s=50000.0)


def _piped(args: list[str], cwd: Path) -> dict[str, Any]:
    """Run bench with stdout a pipe; each stdout line with whether bench was still running when it came."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "80", "HOME": str(cwd)}
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True, cwd=cwd)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[tuple[str, bool]] = []
    for line in iter(proc.stdout.readline, ""):
        lines.append((line.rstrip("\n"), proc.poll() is None))
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return {"rc": proc.returncode, "lines": lines, "stderr": err}


def _progress(run: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(ln, live) for ln, live in run["lines"] if ln.startswith("bench: [")]


def test_rate_run_in_a_log_prints_progress_while_it_runs(sim, tmp_path):
    run = _piped(["run", sim, "--rate", "4", "--duration", "3", "--max-tokens", "8", "--out", "r",
                  "--progress-every", "0.5"], tmp_path)
    assert run["rc"] == 0, run["stderr"]
    prog = _progress(run)
    m = re.fullmatch(r"bench: \[1/1\] rate-4 started: (\d+) requests", prog[0][0]) if prog else None
    assert m, run["lines"]
    assert prog[0][1]  # read while the schedule ran, not dumped at the end
    ticks = [ln for ln, live in prog if f"/{m.group(1)} requests" in ln and live]
    assert ticks, prog  # a line every 0.5 s inside the point
    assert any(ln.startswith("bench: [1/1] rate-4 done in ") for ln, _ in prog)


def test_trace_run_in_a_log_prints_progress(sim, tmp_path):
    trace = tmp_path / "mini.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 300 * i, "input_length": 64, "output_length": 4}) + "\n"
                             for i in range(6)))
    run = _piped(["run", sim, "--trace", str(trace), "--out", "t", "--progress-every", "0.2"], tmp_path)
    assert run["rc"] == 0, run["stderr"]
    prog = [ln for ln, _ in _progress(run)]
    assert prog[0] == "bench: [1/1] trace-mini started: 6 requests"
    assert prog[-1].startswith("bench: [1/1] trace-mini done in ")


PROFILE = """name = "tiny-gate"
max_tokens = 16
requests = 4
warmup = 1
overhead_probes = 1

[[sweep]]
depths = [0]
streams = [1]
prompts = ["prose"]

[[gate]]
metric = "decode_tok_s"
max_drop_pct = 20
"""


@pytest.fixture(scope="module")
def baseline(sim: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gate")
    (d / "tiny.toml").write_text(PROFILE)
    r = subprocess.run([sys.executable, "-m", "bench", "run", sim, "-p", "tiny.toml", "--out", "base"], cwd=d,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return d


def test_gate_in_a_log_prints_progress(sim, baseline):
    run = _piped(["gate", sim, "-p", "tiny.toml", "--baseline", "base/results.json", "--out", "g"], baseline)
    assert run["rc"] in (0, 1, 2), run["stderr"]
    prog = [ln for ln, _ in _progress(run)]
    assert prog and prog[0].startswith("bench: [1/1] d0-s1-prose started: "), run["lines"]
    assert any(" done in " in ln for ln in prog)


def test_ab_in_a_log_prints_progress(sim, baseline):
    run = _piped(["ab", sim, sim, "-p", "tiny.toml"], baseline)
    assert run["rc"] in (0, 1, 2), run["stderr"]
    prog = [ln for ln, _ in _progress(run)]
    assert prog and prog[0].startswith("bench: [A 1/1] d0-s1-prose started: "), run["lines"]
    assert any(ln.startswith("bench: [B 1/1] d0-s1-prose started: ") for ln in prog)  # each side says which it is


def test_gate_json_keeps_stdout_for_the_document(sim, baseline):
    r = subprocess.run([sys.executable, "-m", "bench", "gate", sim, "-p", "tiny.toml", "--baseline",
                        "base/results.json", "--out", "gj", "--json"], cwd=baseline, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode in (0, 1, 2), r.stderr
    assert json.loads(r.stdout)["verdicts"]  # no progress line mixed into the JSON


def test_one_progress_is_chosen_for_every_command():
    import io

    from rich.console import Console

    from bench.report.progress import PlainObserver, QuietObserver, RichObserver, make_observer

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Console(file=Tty(), force_terminal=True)
    assert type(make_observer(1, term, stream=Tty())) is RichObserver  # a terminal: live
    assert type(make_observer(1, term, stream=io.StringIO())) is PlainObserver  # a log: plain lines
    assert type(make_observer(1, term, quiet=True, stream=io.StringIO())) is QuietObserver  # --json


def test_plain_lines_number_each_cell_once_and_print_each_end_once() -> None:
    """A gate measures a cell again at its next look: the cell keeps its number ([1/2], never [3/2]), its line says
    'measured again', and a second report of the same end prints no second 'done' line."""
    import io

    from bench.config.profile import Cell
    from bench.report.progress import PlainObserver

    class Summary:
        requests_failed = 0

        def stat(self, key: str) -> float | None:
            return 50.0 if key == "decode_tok_s" else None

    a, b = Cell("s", 0, 1, "prose", 8, 1), Cell("s", 1024, 1, "prose", 8, 1)
    out = io.StringIO()
    obs = PlainObserver(out, 2)
    for cell, n in ((a, 1), (b, 1), (a, 7)):
        obs.cell_started(cell, n)
        obs.cell_done(cell, Summary())  # type: ignore[arg-type]
        obs.cell_done(cell, Summary())  # type: ignore[arg-type]
    lines = [re.sub(r"done in [0-9.]+s", "done in T", ln) for ln in out.getvalue().splitlines()]
    assert lines == ["bench: [1/2] d0-s1-prose started: 1 request, 1 stream(s)",
                     "bench: [1/2] d0-s1-prose done in T: decode 50.0 tok/s/stream",
                     "bench: [2/2] d1024-s1-prose started: 1 request, 1 stream(s)",
                     "bench: [2/2] d1024-s1-prose done in T: decode 50.0 tok/s/stream",
                     "bench: [1/2] d0-s1-prose measured again: 7 requests, 1 stream(s)",
                     "bench: [1/2] d0-s1-prose done in T: decode 50.0 tok/s/stream"]


def test_a_terminal_keeps_every_finished_cell_on_a_line_of_its_own_within_80_columns() -> None:
    """The live display put each cell's headline figures in its bar's row and blanked the row when the next cell
    started: at 80 columns the figures squeezed the bar and the times ("0:0…"), and every finished cell but the
    last lost its figures. Now a finished cell is a line of its own above the bar, within 80 columns."""
    import io

    from rich.console import Console

    from bench.config.profile import Cell
    from bench.report.progress import RichObserver

    class Summary:
        requests_failed = 0

        def stat(self, key: str) -> float | None:
            return {"decode_tok_s": 50.0, "aggregate_decode_tok_s": 96.9}.get(key)

    out = io.StringIO()
    obs = RichObserver(Console(file=out, width=80, force_terminal=True, color_system=None), 2)
    with obs:
        for cell in (Cell("s", 0, 1, "prose", 4, 4), Cell("s", 0, 2, "prose", 4, 4)):
            obs.cell_started(cell, 4)
            for _ in range(4):
                obs.request_done(cell, True)
            obs.cell_done(cell, Summary())  # type: ignore[arg-type]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).replace("\r", "\n")
    lines = {ln.rstrip() for ln in text.split("\n") if " in " in ln and "decode" in ln}
    assert {re.sub(r"in [0-9.]+s", "in T", ln) for ln in lines} == {
        "[1/2] d0-s1-prose 4/4 in T: decode 50.0 tok/s/stream",
        "[2/2] d0-s2-prose 4/4 in T: decode 50.0 tok/s/stream, 96.9 aggregate"}
    assert max(len(ln) for ln in text.split("\n")) <= 80


def test_warnings_notes_and_tables_print_brackets_as_they_are() -> None:
    """Rich reads '[...]' as markup: text from users, servers and files (a '[[gate]]', a '[bold]' in a server's
    error, a path) is printed as it is, in warnings, notes and tables."""
    import io

    from rich.console import Console

    from bench.report.console import request_table, say, warn
    from bench.report.verdicts import _table

    con = Console(file=io.StringIO(), width=200, color_system=None)
    warn("cell [[gate]] in [bold]x[/bold]", con)
    say("note: the profile has no [[gate]] tables", con)
    con.print(request_table({"ok": False, "error": "HTTP 400: [red]bad[/red] [x]"}, "probe [b]u[/b]"))
    con.print(_table("[i]t[/i]", ["verdict", "cell"], [["regression", "[c]"]], ["red"], right=()))
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert "warning cell [[gate]] in [bold]x[/bold]" in out and "no [[gate]] tables" in out
    assert "HTTP 400: [red]bad[/red] [x]" in out and "probe [b]u[/b]" in out
    assert "[i]t[/i]" in out and "[c]" in out


def test_ab_sides_are_named_in_plain_lines_and_bars() -> None:
    """bench ab's progress never said which side a wave was for: the lines read [A 1/2] / [B 1/2], B's first wave
    of a cell 'started' (not 'measured again'), and the live display keeps one bar per side and cell."""
    import io

    from rich.console import Console

    from bench.config.profile import Cell
    from bench.report.progress import PlainObserver, RichObserver, Sided

    class Summary:
        requests_failed = 0

        def stat(self, key: str) -> float | None:
            return 50.0 if key == "decode_tok_s" else None

    cell = Cell("s", 0, 1, "prose", 8, 1)
    out = io.StringIO()
    obs = PlainObserver(out, 2, console=Console(file=io.StringIO(), color_system=None))
    for side in "ABAB":
        Sided(obs, side).cell_started(cell, 1)
        Sided(obs, side).cell_done(cell, Summary())  # type: ignore[arg-type]
    starts = [ln for ln in out.getvalue().splitlines() if " done in " not in ln]
    assert starts == ["bench: [A 1/2] d0-s1-prose started: 1 request, 1 stream(s)",
                      "bench: [B 1/2] d0-s1-prose started: 1 request, 1 stream(s)",
                      "bench: [A 1/2] d0-s1-prose measured again: 1 request, 1 stream(s)",
                      "bench: [B 1/2] d0-s1-prose measured again: 1 request, 1 stream(s)"]
    rich = RichObserver(Console(file=io.StringIO(), color_system=None), 1)
    bars = []
    for side in "ABAB":  # the live bar is the side's (a finished side's cell is a line of its own)
        Sided(rich, side).cell_started(cell, 1)
        bars.append(rich._current().description)
    assert bars == ["[A 1/1] d0-s1-prose", "[B 1/1] d0-s1-prose"] * 2


def test_a_resumed_run_numbers_its_cells_by_their_place_in_the_profile() -> None:
    """A resumed run numbered its first measured cell [1/2] although cell 1 was kept from the run it continued
    (a new user found). A kept cell now takes its number, and a line says it was kept."""
    import io

    from bench.config.profile import Cell
    from bench.report.progress import PlainObserver

    a, b = Cell("s", 0, 1, "prose", 8, 1), Cell("s", 0, 2, "prose", 8, 1)
    out = io.StringIO()
    obs = PlainObserver(out, 2)
    obs.cell_kept(a)
    obs.cell_started(b, 4)
    assert out.getvalue().splitlines() == [
        "bench: [1/2] d0-s1-prose kept from the run resumed (measured before it stopped)",
        "bench: [2/2] d0-s2-prose started: 4 requests, 2 stream(s)"]


def test_a_run_level_warning_is_printed_once(sim, tmp_path, capsys):
    """Shown live as it happens, not again in the end's list (it was printed twice)."""
    from bench.cli.app import main

    rc = main(["run", sim, "--streams", "1", "--depths", "0", "--repeats", "1", "--max-tokens", "8",
               "--hardware", "h200", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 0 and err.count("the server reports no model size") == 1, err
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    assert sum("the server reports no model size" in w for w in doc["warnings"]) == 1


def test_the_live_rate_spans_the_waves_of_a_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wave restarted the rate's baseline, so a cell of waves shorter than ~1 s showed "~0 tok/s live"
    all along (a 1-stream cell at 50 tok/s)."""
    import io

    from rich.console import Console

    import bench.report.progress as prog
    from bench.client import StreamTap
    from bench.config.plan import Cell
    from bench.report.progress import RichObserver

    now = [100.0]
    monkeypatch.setattr(prog.time, "monotonic", lambda: now[0])
    obs = RichObserver(Console(file=io.StringIO(), color_system=None), 1)
    cell = Cell("s", 0, 1, "prose", 4, 4)
    obs.cell_started(cell, 4)
    for _ in range(4):  # waves of 0.6 s, 30 events each: 50 tok/s
        tap = StreamTap()
        tap.started = True
        obs.wave_started(cell, [tap])
        live = obs._live()
        tap.events, now[0] = 30, now[0] + 0.6
        tap.finished = True
        live = obs._live()
    assert live == "~50 tok/s live"


def test_an_open_loop_read_by_workers_says_its_counts_come_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """With --workers 2 --rate, a CI log read "rate-4: 0/267 requests, 30.0s" and "... 1m00s": the records come
    back from the workers when the point ends."""
    import io

    import bench.report.progress as prog
    from bench.config.plan import Cell
    from bench.report.progress import PlainObserver

    now = [10.0]
    monkeypatch.setattr(prog.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    obs = PlainObserver(out, 1, 30.0)
    cell = Cell("s", 0, 0, "prose", 4, 267, label="rate-4")
    obs.cell_started(cell, 267)
    obs.counts_at_end(cell)
    now[0] += 31
    obs.tick()
    last = out.getvalue().strip().splitlines()[-1]
    assert "0/267" not in last and "31.0s of its schedule" in last and "counted when the point ends" in last
