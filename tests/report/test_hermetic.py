"""Issue 26, item 6: tests give the same result whatever terminal the caller has ($COLUMNS, $TERM, NO_COLOR,
locale), and the gate's table keeps cell names and verdicts whole at any width (blocks below its full width)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bench.report.verdicts import gate_table, needed_width, side_by_side_rows, side_by_side_table, verdict_rows
from tests.conftest import HERMETIC_ENV, HERMETIC_UNSET
from tests.test_gate import _mixed_verdicts

ROOT = Path(__file__).resolve().parents[2]
TITLE = "bench gate: profile gate-sim, http://127.0.0.1:43163/v1 vs /tmp/pytest-of-root/base/results.json"


def _render(renderable, width: int) -> list[str]:
    con = Console(width=width, color_system=None, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(renderable)
    return con.export_text().splitlines()


@pytest.mark.parametrize("width", [60, 80, 90, 100, 120, 160, 220])
def test_gate_table_keeps_cell_names_and_verdicts_whole(width) -> None:
    verdicts = _mixed_verdicts()
    head, rows = verdict_rows(verdicts)
    lines = _render(gate_table(verdicts, TITLE), width)
    assert all(len(line) <= width for line in lines), width
    text = "\n".join(lines)
    for v in verdicts:
        assert any(v.cell in line and v.verdict in line for line in lines), (v.cell, v.verdict)
        assert v.rule.metric in text
    for r in rows:  # every value of the row is printed whole, whichever layout
        assert all(cell in text for cell in r), r
    tabular = width >= needed_width(head, rows)
    assert ("┃" in text) == tabular  # the table where it fits, the blocks below its width
    if not tabular:
        assert any(line.startswith("  metric: ") for line in lines)


@pytest.mark.parametrize("width", [60, 220])
def test_ab_and_compare_name_their_sides_a_and_b(width) -> None:
    """bench ab / compare label their sides A and B; their gate rules' lines said baseline / candidate."""
    text = "\n".join(_render(gate_table(_mixed_verdicts(), "gate rules (B against A)", ("A", "B")), width))
    assert "baseline" not in text and "candidate" not in text
    assert ("A: " in text and "; B: " in text) if width == 60 else ("┃ A " in text or " A ┃" in text)


@pytest.mark.parametrize("width", [60, 80, 100, 220])
def test_side_by_side_table_keeps_cells_whole(width) -> None:
    verdicts = _mixed_verdicts()
    head, rows = side_by_side_rows(verdicts, ("A", "B"))
    lines = _render(side_by_side_table(verdicts, "bench ab", ("A", "B")), width)
    assert all(len(line) <= width for line in lines)
    text = "\n".join(lines)
    for r in rows:
        assert all(cell in text for cell in r), r


def test_the_terminal_is_pinned_for_every_test() -> None:
    from bench.report import console

    for k, v in HERMETIC_ENV.items():
        assert os.environ[k] == v, k
    assert not any(k in os.environ for k in HERMETIC_UNSET)
    assert console.stdout.width == int(HERMETIC_ENV["COLUMNS"])


@pytest.mark.parametrize("caller", [
    {"COLUMNS": "100"}, {"COLUMNS": "80", "NO_COLOR": "1"}, {"TERM": "xterm-256color", "FORCE_COLOR": "1"},
    {"LC_ALL": "POSIX", "LANG": "C"}, {"COLUMNS": "40", "LINES": "10", "TERM": "dumb"},
], ids=["cols100", "cols80-nocolor", "forcecolor", "posix", "cols40"])
def test_a_callers_terminal_does_not_reach_the_tests(caller, tmp_path) -> None:
    """A pytest started with the caller's terminal settings sees the pinned ones: the gate's end-to-end test (the
    one COLUMNS=100 broke) passes, and the consoles bench made at import are 220 columns, colourless."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\nfrom bench.report import console\n\n\ndef test_probe():\n"
        "    assert os.environ['COLUMNS'] == '220' and 'NO_COLOR' not in os.environ and 'FORCE_COLOR' not in os.environ\n"
        "    assert console.stdout.width == 220 and console.stdout.color_system is None\n")
    conftest = ROOT / "tests" / "conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.read_text())
    env = {**os.environ, **caller, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_side_by_side_says_when_a_change_is_under_its_decimals() -> None:
    """A deterministic sim's TPOT read 'B/A 1.000; CI [1.000, 1.000]; change: worse': true (the whole CI above 1) but
    not readable; the word now says the change is under 0.1 %."""
    from dataclasses import replace

    v = next(x for x in _mixed_verdicts() if x.lo is not None)
    tiny = replace(v, verdict="regression", ratio=1.0002, lo=1.0001, hi=1.0003)
    big = replace(v, verdict="regression", ratio=1.05, lo=1.04, hi=1.06)
    assert side_by_side_rows([tiny, big])[1][0][-1] == "worse (< 0.1 %)"
    assert side_by_side_rows([tiny, big])[1][1][-1] == "worse"
