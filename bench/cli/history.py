"""``bench history``: keep every run (SQLite or PostgreSQL) and find change points over them.

``add`` stores results.json files (folders are searched for them), ``check`` finds change points in each series
of one metric, a series being one cell of one setup (profile and settings, model, endpoint URL), and exits 1 when
a regression beyond the rule's allowance starts within the last ``--recent`` runs of its setup; ``runs`` lists the
stored runs and their setups, ``export --csv`` writes one row per run x cell x metric. The store is
:mod:`bench.history.store`; the detector :mod:`bench.history.changepoints`; docs/history.md has the details.
Register with ``cli.add_command(history)``; :func:`add_finished` is ``bench run --history``'s hook.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from bench.errors import ConfigError, HistoryError
from bench.history import runs_text

__all__ = ["history", "add_finished", "found_commit", "require_store", "open_existing", "trend_views", "trends_page"]

_DB_HELP = "The store: a file (SQLite, default bench-history.db), sqlite:///path or postgresql://user@host/db."
_ENV_COMMIT = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT")
_ENV_BRANCH = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH", "GIT_BRANCH")


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = p.stdout.strip()
    return out if p.returncode == 0 and out and out != "HEAD" else None


def found_commit(commit: str | None, branch: str | None, *, use_git: bool) -> tuple[str | None, str | None]:
    """The commit and branch: as given, else from the CI's environment (GITHUB_SHA, CI_COMMIT_SHA...), else (with
    ``use_git``) from ``git`` in the current folder; None when none says."""
    commit = commit or next((os.environ[k] for k in _ENV_COMMIT if os.environ.get(k)), None)
    branch = branch or next((os.environ[k] for k in _ENV_BRANCH if os.environ.get(k)), None)
    if use_git:
        commit = commit or _git("rev-parse", "HEAD")
        branch = branch or _git("rev-parse", "--abbrev-ref", "HEAD")
    return commit, branch


def _result_files(inputs: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for i in inputs:
        p = Path(i)
        if p.is_dir():
            found = sorted(p.rglob("results.json"))
            if not found:
                raise ConfigError(f"{p}: no results.json in this folder or below")
            files += found
        else:
            files.append(p)
    return files


def _note(msg: str) -> None:
    from bench.report.console import stderr

    stderr.print(msg, highlight=False, markup=False, soft_wrap=True)


def _width() -> int:
    """The width to print for: ``$COLUMNS``, else the terminal's, else (a pipe, a file) 220, as bench's tables."""
    from bench.report.console import console_width

    return console_width(sys.stdout) or shutil.get_terminal_size().columns


def _wrap(line: str, width: int) -> str:
    """``line`` folded at spaces to ``width``, the folds indented 4 more than the line."""
    if len(line) <= width:
        return line
    lead = " " * (len(line) - len(line.lstrip()))
    return textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=lead + "    ",
                         break_long_words=False, break_on_hyphens=False)


def open_existing(db: str, option: str = "--db") -> Any:
    """The store at ``db``; an SQLite file must exist already (reading never creates one). Messages name the value
    as ``option`` (``--db``, ``bench report``'s ``--history``)."""
    from bench.history.store import open_store, sqlite_file

    path = sqlite_file(db, option)
    if path is not None and not Path(path).exists():
        raise HistoryError(f"{option} {path}: not found (bench history add creates it)")
    return open_store(db, option)


@click.group()
def history() -> None:
    """Keep every run and find where a figure changed (docs/history.md).

    \b
      bench history add bench-results/ --db bench-history.db
          every results.json below the folder
      bench history check --metric decode_tok_s --recent 5
          change points; exit 1 on a recent regression
      bench history export --csv -o history.csv
          one row per run x cell x metric
    """


@history.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--commit", default=None, help="The git commit measured (default: the CI's GITHUB_SHA, "
              "CI_COMMIT_SHA...).")
@click.option("--branch", default=None, help="The git branch (default: the CI's GITHUB_REF_NAME, ...).")
@click.option("--git", "use_git", is_flag=True, help="Take commit and branch from git in the current folder when "
              "neither the options nor the environment give them.")
@click.option("--skip-existing", is_flag=True, help="Skip runs already stored (a note each) instead of refusing; "
              "when every run is stored, say so and exit 0 (re-importing a folder that grew).")
def add(inputs: tuple[str, ...], db: str, commit: str | None, branch: str | None, use_git: bool,
        skip_existing: bool) -> None:
    """Store results.json files (or every results.json below a folder) in the history.

    All or nothing: a run already stored (the same run id, start and figures: a copy of a results file whose
    figures were edited is another run, stored with a note) or given twice is refused (exit 3) and nothing is
    added, unless --skip-existing. Incomplete runs (interrupted, or stopped early) are skipped with a note.
    """
    from bench.history.store import open_store, sqlite_file
    from bench.results import load_results

    new_file = sqlite_file(db)
    loaded = [(f, load_results(f)) for f in _result_files(inputs)]
    commit, branch = found_commit(commit, branch, use_git=use_git)
    plan = None
    if new_file is not None and not os.path.exists(new_file):  # refuse before the file exists: none is left behind
        plan = _to_add(loaded, None, new_file, skip_existing)  # the new store is empty: the plan holds for it
    with open_store(db) as store:
        plan = plan or _to_add(loaded, store, store.where, skip_existing)
        for n in plan.notes:
            _note(n)
        rows = sum(store.add(r, source=str(f), commit=commit, branch=branch) for f, r in plan.todo)
        total = len(store.runs())
    if not plan.todo:
        _note(f"nothing new: {runs_text(plan.stored)} already stored in {store.where} ({runs_text(total)} stored)")
        return
    _note(f"added {len(plan.todo)} run(s), {rows} statistics, to {store.where} ({runs_text(total)} stored)")


@dataclass
class _Plan:
    """What ``add`` does: the runs to add, the notes to print, how many runs given are stored already."""

    todo: list[tuple[Path, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stored: int = 0
    incomplete: int = 0


def _incomplete(results: Any) -> str:
    if results.run.interrupted:
        return "the run was interrupted (Ctrl-C or a signal); its figures are partial"
    return "the run is incomplete: it stopped early (e.g. on a server error, or was killed); its figures are partial"


def _to_add(loaded: list[tuple[Path, Any]], store: Any, where: str, skip_existing: bool) -> _Plan:
    """The complete runs of ``loaded`` not yet in ``store`` (None: a new, empty one), with notes; HistoryError for
    a run stored or given twice (unless ``skip_existing``: a note), or when nothing is new and nothing stored."""
    from bench.history.store import run_key

    plan = _Plan()
    seen: set[str] = set()
    starts: dict[tuple[str, str], str] = {}  # (run id, start) -> the file of a run added in this call
    for f, r in loaded:
        if not r.run.complete:
            plan.notes.append(f"skipped {f}: {_incomplete(r)}")
            plan.incomplete += 1
            continue
        key = run_key(r)
        if key in seen or (store is not None and store.has_run(key)):
            what = ("is given twice (the same run and figures in two of the files)" if key in seen
                    else "is already stored")
            if not skip_existing:
                raise HistoryError(f"history {where}: run {r.run.id} (started {r.run.started or r.created}, {f}) "
                                   f"{what}; nothing added (--skip-existing skips it)")
            plan.notes.append(f"skipped {f}: run {r.run.id} {what}")
            plan.stored += key not in seen
            continue
        start = (r.run.id, r.run.started or r.created)
        twin = starts.get(start) or next((src or "?" for _, src in (store.same_start(r) if store else [])), None)
        if twin is not None:
            plan.notes.append(f"{f}: stored as another run: its figures differ from run {r.run.id}'s (same id "
                              f"and start) from {twin}")
        seen.add(key)
        starts.setdefault(start, str(f))
        plan.todo.append((f, r))
    if not plan.todo and not (skip_existing and plan.stored):
        for n in plan.notes:  # each file skipped and why, then the error
            _note(n)
        why = f" ({plan.incomplete} incomplete run(s) skipped)" if plan.incomplete else ""
        raise HistoryError(f"history {where}: nothing to add{why}")
    return plan


def require_store(db: str | None) -> None:
    """``bench run --history DB`` before measuring: open (create, migrate) the store, so a bad one fails first."""
    if db is not None:
        from bench.history.store import open_store

        open_store(db, "--history").close()


def add_finished(results: Any, out: Path, db: str) -> None:
    """``bench run --history DB``: store the run just written (commit and branch from the CI or git)."""
    from bench.history.store import open_store

    commit, branch = found_commit(None, None, use_git=True)
    with open_store(db, "--history") as store:
        store.add(results, source=str(out / "results.json"), commit=commit, branch=branch)
        _note(f"history: run {results.run.id} added to {store.where} ({runs_text(len(store.runs()))} stored)")


@history.command()
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--metric", default="decode_tok_s", show_default=True, help="The figure: decode_tok_s, ttft_ms, "
              "tpot_ms, e2e_ms, prompt_tok_s, aggregate_decode_tok_s...")
@click.option("--stat", default=None, type=click.Choice(["mean", "median", "p10", "p90", "p99", "min", "max"]),
              help="The statistic of each run (default: the gate rule's, else the median).")
@click.option("--cell", "cells", multiple=True, help="Only this cell (repeatable; default every cell).")
@click.option("--recent", type=int, default=5, show_default=True, help="Exit 1 when a regression beyond the "
              "allowance starts within the last K runs; at least 3 (a change is seen 3 runs after it at the "
              "earliest), with --method threshold 1.")
@click.option("--allowance", "allowance_pct", type=click.FloatRange(min=0), default=None, help="The allowed "
              "worsening in % (default: the newest run's gate rule for the metric, else the default rule).")
@click.option("--method", default="pelt", show_default=True, type=click.Choice(["pelt", "binseg", "threshold"]),
              help="The detector (docs/history.md).")
@click.option("--profile", default=None, help="Only the runs of this profile (default: every setup, each its "
              "own series).")
@click.option("--model", default=None, help="Only the runs of this model.")
@click.option("--endpoint", default=None, help="Only the runs against this endpoint URL.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
def check(db: str, metric: str, stat: str | None, cells: tuple[str, ...], recent: int, allowance_pct: float | None,
          method: str, profile: str | None, model: str | None, endpoint: str | None, as_json: bool) -> None:
    """Find change points in each series of METRIC over the stored runs.

    A series is one cell of one setup (profile and its settings, overrides such as
    --max-tokens included; model; endpoint URL): runs of another profile, other
    settings, another model or server are never mixed into it. Prints, per change,
    the run where it starts, its size with an interval, and the runs on each side;
    series too short or too noisy say so. Exit 1 when a regression beyond the rule's
    allowance starts within the last --recent runs of its setup, else 0.
    """
    from bench.history.check import CheckSettings, check_history

    with open_existing(db) as store:
        doc = check_history(store, CheckSettings(metric, stat, cells, recent, method, allowance_pct, profile, model,
                                                 endpoint))
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        width = _width()
        for line in _check_lines(doc, width):
            click.echo(_wrap(line, width))
    raise SystemExit(doc["exit"])


def _series_lines(s: dict[str, Any], ind: str) -> list[str]:
    head = f"{ind}{s['cell']} {s['metric']} {s['stat']}"
    if s["status"] == "too short":
        return [f"{head}: too short ({s['note']})"]
    if s["status"] != "ok":
        return [f"{head}: {runs_text(s['runs'])}, {s['status']} ({s['note']})"]
    return [f"{head}: {runs_text(s['runs'])}, noise {s['noise_pct']:.2f} %, {s['changes']} change(s)",
            f"{ind}    allowance {s['allowance_pct']:g} % ({s['rule']})"]


def _change_lines(c: dict[str, Any], ind: str) -> list[str]:
    b, a = c["before"], c["after"]
    flag = " FAIL" if c["direction"] == "regression" and c["recent"] and c["beyond_allowance"] else ""
    return [f"{ind}{c['cell']} {c['metric']} {c['stat']}: {c['change_pct']:+.2f} % {c['direction']} at run "
            f"{c['run_index']}{flag}",
            f"{ind}    99 % interval {c['ci_pct'][0]:+.2f} .. {c['ci_pct'][1]:+.2f} %, p {c['p_value']:.2g}",
            f"{ind}    run {c['run_id']}, started {c['started']}, commit {(c['commit'] or '-')[:12]}",
            f"{ind}    before: runs {b['first_run_index']}-{b['last_run_index']} ({b['runs']}, median "
            f"{b['median']:.4g}); after: runs {a['first_run_index']}-{a['last_run_index']} ({a['runs']}, median "
            f"{a['median']:.4g})"]


def _check_lines(doc: dict[str, Any], width: int) -> list[str]:
    """The check's text: per setup (named when there are several), its series, then its changes; the verdict (on
    its own line when the line would pass ``width``)."""
    multi = len(doc["setups"]) > 1
    ind = "  " if multi else ""
    out: list[str] = []
    for su in doc["setups"]:
        if multi:
            out.append(f"setup {su['setup']}, {runs_text(su['runs'])}: {su['label']}")
        for s in doc["series"]:
            out += _series_lines(s, ind) if s["setup"] == su["setup"] else []
        for c in doc["changes"]:
            out += _change_lines(c, ind + "  ") if c["setup"] == su["setup"] else []
    verdict = _verdict(doc, f"the last {runs_text(doc['recent'])}{' of each setup' if multi else ''}")
    runs = sum(su["runs"] for su in doc["setups"])
    where = f" in {len(doc['setups'])} setups" if multi else ""
    total = f"{runs_text(runs)}{where}; {len(doc['changes'])} change point(s)"
    return out + ([f"{total}; {verdict}"] if len(total) + len(verdict) + 2 <= width else [total, verdict])


def _verdict(doc: dict[str, Any], last: str) -> str:
    """The check's last words: the regressions found, else none, else (no series judged) ``nothing judged`` and
    why; the series not judged named by cause (``1 series too short (fewer than 6 runs)``)."""
    skipped = [s for s in doc["series"] if s["status"] != "ok"]
    causes: dict[str, list[dict[str, Any]]] = {}
    for s in skipped:
        causes.setdefault(s["status"], []).append(s)
    need = max((s.get("min_runs") or 0 for s in causes.get("too short", [])), default=0)
    if skipped and len(skipped) == len(doc["series"]):
        if list(causes) == ["too short"]:
            return f"nothing judged: every series has fewer than {need} runs (need {need})"
        return f"nothing judged: {_causes(causes, need)}"
    found = (f"{doc['failing']} regression(s) beyond the allowance within {last}" if doc["failing"]
             else f"no regression beyond the allowance within {last}")
    return f"{found}; not judged: {_causes(causes, need)}" if skipped else found


def _causes(causes: dict[str, list[dict[str, Any]]], need: int) -> str:
    """``2 series too short (fewer than 6 runs), 1 too noisy``: the series not judged, by cause."""
    parts = []
    for i, (status, ss) in enumerate(causes.items()):
        what = f"{status} (fewer than {need} runs)" if status == "too short" else status
        parts.append(f"{len(ss)}{' series' if i == 0 else ''} {'with ' if status == 'bad values' else ''}{what}")
    return ", ".join(parts)


def _when(started: str) -> str:
    """A run's start as ``YYYY-MM-DD HH:MM:SS`` UTC (as stored when it is not an ISO time with an offset)."""
    try:
        t = datetime.fromisoformat(started)
    except ValueError:
        return started
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if t.tzinfo else started


def _fit(text: str, width: int, *, left: bool = False) -> str:
    """``text`` cut to ``width`` with ``...`` (at its start when ``left``: a path keeps its end)."""
    if len(text) <= width:
        return text
    return "..." + text[len(text) - width + 3:] if left else text[:width - 3] + "..."


def _table(head: list[str], rows: list[list[str]], width: int) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, the first right-aligned; the last one (a path) cut
    at its start so that a line fits ``width``."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    over = sum(widths) + 2 * (len(head) - 1) - width
    if over > 0:
        widths[-1] = max(len(head[-1]), 16, widths[-1] - over)
    out = []
    for r in [head, *rows]:
        cells = [r[0].rjust(widths[0]), *(c.ljust(w) for c, w in zip(r[1:-1], widths[1:-1])),
                 _fit(r[-1], widths[-1], left=True)]
        out.append("  ".join(cells).rstrip())
    return out


def _runs_lines(runs: list[Any], setups: list[tuple[Any, int]], width: int) -> list[str]:
    """``bench history runs``' table, then the setups (numbered when several: the table's ``setup`` column), folded
    to ``width``."""
    from bench.history.store import setup_labels

    labels = setup_labels(runs)
    number = {su: i + 1 for i, (su, _) in enumerate(setups)}
    multi = len(setups) > 1
    head = ["#", "run id", "started (UTC)", "commit", "branch", *(["setup"] if multi else []), "source"]
    rows = [[str(i), r.run_id, _when(r.started), (r.commit_sha or "-")[:10], _fit(r.branch or "-", 16),
             *([str(number[r.setup])] if multi else []), r.source or "-"] for i, r in enumerate(runs)]
    if multi:
        legend = [f"setup {number[su]}, {runs_text(n)}: {labels[su]}" for su, n in setups]
    else:
        legend = [f"{runs_text(n)} of {labels[su]}" for su, n in setups]
    return _table(head, rows, width) + [_wrap(line, width) for line in legend]


@history.command()
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON list on stdout.")
def runs(db: str, as_json: bool) -> None:
    """List the stored runs in the order they were made, and the setups (profile and settings, model, endpoint)
    they measured."""

    with open_existing(db) as store:
        stored = store.runs()
        setups = store.setups(stored)
        where = store.where
    if not stored:
        _note(f"no runs stored in {where}")
    if as_json:
        click.echo(json.dumps([{"run_index": i, **r.to_dict()} for i, r in enumerate(stored)], indent=1))
        return
    for line in _runs_lines(stored, setups, _width()) if stored else []:
        click.echo(line)


def trend_views(store: Any) -> list[Any]:
    """``bench report --history``: the stores to draw trends of, one per setup when it holds several (each setup's
    series apart, :meth:`bench.history.store.HistoryStore.view`), else the store itself; a note when it is empty."""
    from bench.history.store import setup_labels

    stored = store.runs()
    setups = store.setups(stored)
    if not setups:
        _note(f"no runs stored in {store.where}")
    if len(setups) <= 1:
        return [store]
    labels = setup_labels(stored)  # only where several setups are named apart
    return [store.view(su, labels[su]) for su, _ in setups]


def trends_page(views: list[Any], title: str) -> str:
    """A page of the trends of several setups (``bench report --history DB`` alone), plotly.js inline."""
    import html

    from plotly.offline import get_plotlyjs

    from bench.report.html import _CSS
    from bench.report.trends import trend_section

    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style><script>{get_plotlyjs()}</script></head>"
            f"<body><h1>{html.escape(title)}</h1>{''.join(trend_section(v) for v in views)}<p class='muted'>made "
            "by bench from its run history, one section per setup (profile and settings, model, endpoint); opens "
            "offline (plotly.js inline).</p></body></html>")


@history.command()
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--csv", "as_csv", is_flag=True, required=True, help="CSV: one row per run x cell x metric.")
@click.option("-o", "--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="The file to write (default: stdout).")
def export(db: str, as_csv: bool, out_file: str | None) -> None:
    """Export the history for other tools (CSV: run index, run id, start, commit, ..., cell, metric, statistics)."""
    from bench.results import write_atomic

    with open_existing(db) as store:
        rows = store.export_rows()
        if not store.runs():
            _note(f"no runs stored in {store.where}")
    buf = io.StringIO()
    cols = ["run_index", "run_id", "started", "commit", "branch", "profile", "model", "backend", "hostname",
            "source", "cell", "metric", "n", "mean", "median", "p10", "p90", "p99", "min", "max", "median_lo",
            "median_hi", "endpoint_url", "settings_key"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    if out_file:
        write_atomic(out_file, buf.getvalue())
        _note(f"wrote {len(rows)} rows to {out_file}")
    else:
        click.echo(buf.getvalue(), nl=False)
