"""Gate verdicts -> terminal table (rich), JUnit XML and Markdown; the side-by-side table of ``bench compare``.

JUnit: one ``<testcase>`` per verdict (one gated metric in one cell). A regression is a ``<failure
type="regression">``; an inconclusive verdict is a ``<failure type="inconclusive">`` too, not ``<skipped>``, because
it fails the CI job (exit 2) and a report should never show green for a job that failed. Unchanged and improved
verdicts pass. Markdown: a heading with the overall outcome and one table row per verdict, for ``--markdown FILE``
and GitHub's ``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from bench.errors import ConfigError
from bench.gate import Verdict, overall_exit, verdict_counts
from bench.redaction import redact
from bench.report.layout import pack_fields

__all__ = [
    "OUTCOME",
    "fmt_value",
    "fmt_ratio",
    "fmt_mde",
    "resolution_notes",
    "verdict_rows",
    "gate_table",
    "needed_width",
    "stacked",
    "side_by_side_rows",
    "side_by_side_table",
    "summary_line",
    "to_junit",
    "to_markdown",
    "append_step_summary",
]

OUTCOME = {0: "PASS", 1: "REGRESSION", 2: "INCONCLUSIVE"}
_STYLE = {"regression": "bold red", "inconclusive": "yellow", "improved": "green", "unchanged": ""}
_CHANGE = {"regression": "worse", "inconclusive": "~", "improved": "better", "unchanged": "~"}  # docs/gate.md
VERDICT_HEAD = ["verdict", "metric", "stat", "cell", "baseline", "candidate", "ratio", "CI", "limit", "MDE", "n"]


def fmt_value(v: float | None) -> str:
    """A metric value with 4 significant digits or so: ``1,234``, ``98.7``, ``3.142``; ``-`` for None."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(v: float | None) -> str:
    """A ratio with 3 decimals (``0.947``); ``-`` for None."""
    return "-" if v is None else f"{v:.3f}"


def _ci(v: Verdict) -> str:
    return "-" if v.lo is None or v.hi is None else f"[{v.lo:.3f}, {v.hi:.3f}]"


def _junit_ci(v: Verdict) -> str:
    """`` (95 % CI [lo, hi])`` in a sentence; nothing without an interval (a bare ``-`` read as a typo)."""
    return "" if v.lo is None or v.hi is None else f" ({v.level:.0%} CI {_ci(v)})"


def _limit(v: Verdict) -> str:
    r = v.rule
    return f"{'>=' if r.higher_better else '<='} {r.limit:.3f}"


def fmt_mde(v: Verdict) -> str:
    """The minimum detectable effect, ``2.3 %``; ``6.1 % !`` when it exceeds the rule's allowance; ``-`` if none."""
    if v.mde_pct is None:
        return "-"
    return f"{v.mde_pct:.1f} %" + ("" if v.resolution_ok else " !")


def resolution_notes(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per verdict whose MDE exceeds its allowance: ``name: resolution: ...waves...``."""
    return [f"{v.name}: {v.resolution()}" for v in verdicts if v.resolution()]


def verdict_rows(verdicts: Sequence[Verdict]) -> tuple[list[str], list[list[str]]]:
    """Header and one row of strings per verdict (columns :data:`VERDICT_HEAD`); notes go in the CI column."""
    rows = []
    for v in verdicts:
        ci = _ci(v) if v.lo is not None else (v.note or "-")
        rows.append([v.verdict, v.rule.metric, v.rule.stat, v.cell, fmt_value(v.baseline), fmt_value(v.candidate),
                     fmt_ratio(v.ratio), ci, _limit(v), fmt_mde(v), f"{v.n_baseline}/{v.n_candidate}"])
    return list(VERDICT_HEAD), rows


def summary_line(verdicts: Sequence[Verdict], code: int | None = None, why: str | None = None) -> str:
    """``PASS: 3 unchanged, 1 improved`` / ``REGRESSION: 2 regressions, 1 unchanged``. ``code``: the exit the
    command gives when something beside the verdicts decided it (other work on the host), with ``why``: what the
    verdicts found, then that the verdict is withheld and why, e.g. ``INCONCLUSIVE: 1 regression found (2
    unchanged), but the verdict is withheld: other work on this host changed between the runs (...)``."""
    own = overall_exit(verdicts)
    counts = verdict_counts(verdicts)
    parts = {k: f"{n} {k}{'s' if k == 'regression' and n != 1 else ''}" for k, n in counts.items() if n}
    if code is None or code == own:
        return f"{OUTCOME[own]}: " + (", ".join(parts.values()) if parts else "nothing compared")
    found = f"{parts.pop('regression')} found" if "regression" in parts else "no regression found"
    rest = f" ({', '.join(parts.values())})" if parts else ""
    return f"{OUTCOME[code]}: {found}{rest}, but the verdict is withheld: {why or 'see the warnings'}"


def gate_table(verdicts: Sequence[Verdict], title: str = "bench gate",
               sides: tuple[str, str] = ("baseline", "candidate")) -> RenderableType:
    """The verdicts for the terminal: a rich table, one line per verdict (verdict, metric, cell, baseline, candidate,
    ratio [lo, hi], limit, MDE, n) where the console is wide enough for every value whole; narrower, one block per
    verdict (``verdict  cell``, then ``label: value`` fields wrapped between fields), so cell names and verdicts are
    never folded. The layout is chosen when printed, for the console's width. ``sides``: the two columns' names
    (``bench ab``: A and B)."""
    head, rows = verdict_rows(verdicts)
    head = [dict(zip(("baseline", "candidate"), sides)).get(h, h) for h in head]
    styles = [_STYLE.get(v.verdict, "") for v in verdicts]
    return _Fitted(title, head, rows, styles, right=(*sides, "ratio", "MDE", "n"), key=(0, 3))


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]], styles: Sequence[str],
           right: Sequence[str]) -> Table:
    t = Table(title=Text(title), header_style="bold")  # Text: no markup read in a path, a cell id or a value
    for h in head:
        t.add_column(h, justify="right" if h in right else "left")
    for style, r in zip(styles, rows):
        t.add_row(Text(r[0], style=style), *(Text(v) for v in r[1:]))
    return t


def needed_width(head: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """Columns a rich table needs with every header and value on one line: each column's widest text, plus rich's
    padding and borders (3 per column, 1 more at the edge)."""
    return 1 + sum(max([len(h), *(len(r[i]) for r in rows)]) + 3 for i, h in enumerate(head))


def stacked(head: Sequence[str], rows: Sequence[Sequence[str]], width: int, key: tuple[int, int]) -> list[str]:
    """The rows as blocks for a narrow terminal: per row a line of its two ``key`` columns (e.g. verdict and
    cell, whole even when wider than ``width``), then the other columns as ``label: value`` fields joined with
    ``; `` and wrapped between fields (a field wider than ``width`` stands on its own line, whole)."""
    out: list[str] = []
    for r in rows:
        out.append(f"{r[key[0]]}  {r[key[1]]}")
        out += pack_fields([(h, v) for i, (h, v) in enumerate(zip(head, r)) if i not in key], width)
    return out


class _Fitted:
    """A table that stacks itself (:func:`stacked`) when the console is narrower than it needs
    (:func:`needed_width`)."""

    def __init__(self, title: str, head: Sequence[str], rows: Sequence[Sequence[str]], styles: Sequence[str],
                 right: Sequence[str], key: tuple[int, int]) -> None:
        self.title, self.head, self.rows, self.styles, self.right, self.key = title, head, rows, styles, right, key

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if width >= needed_width(self.head, self.rows):
            yield _table(self.title, self.head, self.rows, self.styles, self.right)
            return
        yield Text(self.title, style="italic")
        lines = stacked(self.head, self.rows, width, self.key)
        starts = iter(self.styles)
        for line in lines:
            style = next(starts, "") if not line.startswith(" ") else ""
            yield Text(line, style=style, no_wrap=True, overflow="ignore")


def side_by_side_rows(main: Sequence[Verdict],
                      names: tuple[str, str] = ("A", "B")) -> tuple[list[str], list[list[str]]]:
    """Rows of the side-by-side table: per cell and main metric, both medians, ratio, CI and a change word.

    ``main`` are verdicts of zero-allowance median rules (``worse`` / ``better`` when the whole CI is on one side of
    1, ``~`` when it holds 1; ``worse (< 0.1 %)`` when all of it is within 0.1 % of 1, where "[1.000, 1.000]; worse"
    read as a contradiction).
    """
    a, b = names
    head = ["cell", "metric", a, b, f"{b}/{a}", "CI", "change"]
    rows = []
    for v in main:
        word = _CHANGE.get(v.verdict, v.verdict) if v.lo is not None else (v.note or "-")
        if v.lo is not None and v.hi is not None and word in ("worse", "better") and max(abs(v.lo - 1),
                                                                                      abs(v.hi - 1)) < 0.001:
            word += " (< 0.1 %)"  # the whole CI off 1, but by less than its 3 decimals show
        rows.append([v.cell, v.rule.metric, fmt_value(v.baseline), fmt_value(v.candidate), fmt_ratio(v.ratio),
                     _ci(v), word])
    return head, rows


def side_by_side_table(main: Sequence[Verdict], title: str, names: tuple[str, str] = ("A", "B")) -> RenderableType:
    """The rich version of :func:`side_by_side_rows` (stacked per cell and metric when the console is narrow)."""
    head, rows = side_by_side_rows(main, names)
    right = [h for h in head if h not in ("cell", "metric", "CI", "change")]
    return _Fitted(title, head, rows, [""] * len(rows), right=right, key=(0, 1))


def to_junit(
    verdicts: Sequence[Verdict],
    *,
    suite: str = "bench gate",
    properties: Mapping[str, Any] | None = None,
    time_s: float | None = None,
) -> str:
    """JUnit XML (the common Ant/Jenkins schema that GitHub, GitLab and Jenkins read): one ``<testsuite>``, one
    ``<testcase classname="bench.gate.<cell>" name="<metric> <stat>">`` per verdict; regression and inconclusive
    are ``<failure>`` with ``type`` set to the verdict. ``properties`` (profile, files, URLs) go in
    ``<properties>``. Returns the document as a string (UTF-8 declaration included).
    """
    failures = sum(1 for v in verdicts if v.failed)
    common = {"tests": str(len(verdicts)), "failures": str(failures), "errors": "0", "skipped": "0",
              "time": f"{time_s or 0.0:.3f}"}
    root = ET.Element("testsuites", {"name": suite, **common})
    ts = ET.SubElement(root, "testsuite", {
        "name": suite, **common, "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
    })
    if properties:
        props = ET.SubElement(ts, "properties")
        for k, val in properties.items():
            ET.SubElement(props, "property", {"name": str(k), "value": "" if val is None else str(val)})
    for v in verdicts:
        r = v.rule
        word = "drop" if r.higher_better else "rise"
        tc = ET.SubElement(ts, "testcase", {
            "classname": f"bench.gate.{v.cell}", "name": f"{r.metric} {r.stat} ({word} <= {r.max_change_pct:g} %)",
            "time": "0",
        })
        detail = (f"{v.name}: baseline {fmt_value(v.baseline)}, candidate {fmt_value(v.candidate)}, "
                  f"ratio {fmt_ratio(v.ratio)}{_junit_ci(v)}, limit {_limit(v)}, MDE {fmt_mde(v)}, "
                  f"samples {v.n_baseline}/{v.n_candidate}. "
                  f"{v.explain()}")
        if v.failed:
            f = ET.SubElement(tc, "failure", {"type": v.verdict, "message": v.explain()})
            f.text = detail
        else:
            ET.SubElement(tc, "system-out").text = detail
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in head) + " |",
           "|" + "|".join("---:" if h in ("baseline", "candidate", "ratio", "MDE", "n") else "---" for h in head) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return out


def to_markdown(
    verdicts: Sequence[Verdict],
    *,
    title: str = "bench gate",
    context: Mapping[str, Any] | None = None,
    side_by_side: tuple[Sequence[str], Sequence[Sequence[str]]] | None = None,
    code: int | None = None,
    why: str | None = None,
) -> str:
    """A Markdown report: ``### title: OUTCOME``, a context list (profile, files, URLs, notes), the verdict table
    (regressions first, then inconclusive, then the rest), and optionally a side-by-side table (head, rows).
    ``code``/``why``: the command's exit when something beside the verdicts decided it (:func:`summary_line`)."""
    order = {"regression": 0, "inconclusive": 1, "improved": 2, "unchanged": 3}
    vs = sorted(verdicts, key=lambda v: order.get(v.verdict, 9))
    icon = {0: ":white_check_mark:", 1: ":x:", 2: ":warning:"}[overall_exit(verdicts) if code is None else code]
    lines = [f"### {icon} {_md_cell(title)}: {summary_line(verdicts, code, why)}", ""]
    for k, val in (context or {}).items():
        if val not in (None, "", []):
            lines.append(f"- **{_md_cell(str(k))}**: {_md_cell(str(val))}")
    if context:
        lines.append("")
    if vs:
        levels = {round(v.level, 4) for v in vs}
        head, rows = verdict_rows(vs)
        if len(levels) == 1:  # one level: in the header; else each row's interval names its own
            head = [f"{vs[0].level:.0%} CI" if h == "CI" else h for h in head]
        else:
            ci = head.index("CI")
            for v, r in zip(vs, rows):
                r[ci] = f"{v.level:.0%}: {r[ci]}" if v.lo is not None else r[ci]
        rows = [[f"**{r[0]}**" if v.failed else r[0], *r[1:]] for v, r in zip(vs, rows)]
        lines += _md_table(head, rows)
        lines.append("")
        lines.append("ratio = candidate / baseline of the statistic; CI: two-sample bootstrap (docs/gate.md). "
                     "A regression needs the whole CI beyond the limit. MDE: the smallest change this comparison "
                     "detects at the measured noise (80 % power); `!` when it exceeds the allowance.")
        lines.append("")
        lines += [f"- {_md_cell(n)}" for n in resolution_notes(vs)]
        if resolution_notes(vs):
            lines.append("")
    if side_by_side is not None:
        lines.append("#### Main metrics (medians)")
        lines.append("")
        lines += _md_table(*side_by_side)
        lines.append("")
    return "\n".join(lines)


def append_step_summary(markdown: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Append ``markdown`` to the file named by ``$GITHUB_STEP_SUMMARY`` (GitHub Actions' job summary), if set.

    Returns the path written, or None when the variable is unset or empty. Every secret bench knows of is
    redacted first, as in every file bench writes.

    Raises:
        ConfigError: the file cannot be appended to (a folder, a missing folder, no permission).
    """
    target = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    p = Path(target)
    try:
        with p.open("a", encoding="utf-8") as fh:
            fh.write(redact(markdown if markdown.endswith("\n") else markdown + "\n"))
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror or e}") from None
    return p
