"""``bench history``: keep every run (SQLite or PostgreSQL) and find change points over them.

``add`` stores results.json files (folders are searched for them), ``check`` finds change points in each cell's
series of one metric (exit 1 when a regression beyond the rule's allowance starts within the last ``--recent``
runs), ``runs`` lists the stored runs, ``export --csv`` writes one row per run x cell x metric. The store is
:mod:`bench.history.store`; the detector :mod:`bench.history.changepoints`; docs/history.md has the details.
Register with ``cli.add_command(history)``; :func:`add_finished` is ``bench run --history``'s hook.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import click

from bench.errors import ConfigError, HistoryError

__all__ = ["history", "add_finished", "found_commit", "require_store", "open_existing"]

_DB_HELP = "The store: a file (SQLite, default bench-history.db) or postgresql://user@host/db."
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


def open_existing(db: str) -> Any:
    """The store at ``db``; an SQLite file must exist already (reading never creates one)."""
    from bench.history.store import open_store

    path = db[len("sqlite:///"):] if db.startswith("sqlite:///") else db
    if not db.startswith(("postgresql://", "postgres://")) and not Path(path).exists():
        raise HistoryError(f"--db {path}: not found (bench history add creates it)")
    return open_store(db)


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
@click.option("--skip-existing", is_flag=True, help="Skip runs already stored (with a note) instead of refusing.")
def add(inputs: tuple[str, ...], db: str, commit: str | None, branch: str | None, use_git: bool,
        skip_existing: bool) -> None:
    """Store results.json files (or every results.json below a folder) in the history.

    All or nothing: a run already stored (same run id and start) or given twice is refused (exit 3) and nothing is
    added, unless --skip-existing. Incomplete (interrupted) runs are skipped with a note.
    """
    from bench.history.store import open_store, sqlite_file
    from bench.results import load_results

    loaded = [(f, load_results(f)) for f in _result_files(inputs)]
    commit, branch = found_commit(commit, branch, use_git=use_git)
    new_file = sqlite_file(db)
    if new_file is not None and not os.path.exists(new_file):  # refuse before the file exists: none is left behind
        _to_add(loaded, lambda key: False, new_file, skip_existing)
    with open_store(db) as store:
        todo = _to_add(loaded, store.has_run, store.where, skip_existing)
        rows = sum(store.add(r, source=str(f), commit=commit, branch=branch) for f, r in todo)
        total = len(store.runs())
    _note(f"added {len(todo)} run(s), {rows} statistics, to {store.where} ({total} runs stored)")


def _to_add(loaded: list[tuple[Path, Any]], stored: Any, where: str, skip_existing: bool) -> list[tuple[Path, Any]]:
    """The complete runs of ``loaded`` not yet ``stored`` (a key test); HistoryError for a run stored or given
    twice (unless ``skip_existing``: a note) or when nothing is left. Incomplete runs: a note."""
    from bench.history.store import run_key

    todo: list[tuple[Path, Any]] = []
    seen: set[str] = set()
    for f, r in loaded:
        key = run_key(r)
        if not r.run.complete:
            _note(f"skipped {f}: the run is incomplete (interrupted)")
            continue
        if key in seen or stored(key):
            what = ("is given twice (the same run id and start in two of the files)" if key in seen
                    else "is already stored")
            if not skip_existing:
                raise HistoryError(f"history {where}: run {r.run.id} (started {r.run.started or r.created}, {f}) "
                                   f"{what}; nothing added (--skip-existing skips it)")
            _note(f"skipped {f}: run {r.run.id} {what}")
            continue
        seen.add(key)
        todo.append((f, r))
    if not todo:
        raise HistoryError(f"history {where}: nothing to add")
    return todo


def require_store(db: str | None) -> None:
    """``bench run --history DB`` before measuring: open (create, migrate) the store, so a bad one fails first."""
    if db is not None:
        from bench.history.store import open_store

        open_store(db).close()


def add_finished(results: Any, out: Path, db: str) -> None:
    """``bench run --history DB``: store the run just written (commit and branch from the CI or git)."""
    from bench.history.store import open_store

    commit, branch = found_commit(None, None, use_git=True)
    with open_store(db) as store:
        store.add(results, source=str(out / "results.json"), commit=commit, branch=branch)
        _note(f"history: run {results.run.id} added to {store.where} ({len(store.runs())} runs stored)")


@history.command()
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--metric", default="decode_tok_s", show_default=True, help="The figure: decode_tok_s, ttft_ms, "
              "tpot_ms, e2e_ms, prompt_tok_s, aggregate_decode_tok_s...")
@click.option("--stat", default=None, type=click.Choice(["mean", "median", "p10", "p90", "p99", "min", "max"]),
              help="The statistic of each run (default: the gate rule's, else the median).")
@click.option("--cell", "cells", multiple=True, help="Only this cell (repeatable; default every cell).")
@click.option("--recent", type=int, default=5, show_default=True, help="Exit 1 when a regression beyond the "
              "allowance starts within the last K runs (a change is seen 3 runs after it at the earliest).")
@click.option("--allowance", "allowance_pct", type=click.FloatRange(min=0), default=None, help="The allowed "
              "worsening in % (default: the newest run's gate rule for the metric, else the default rule).")
@click.option("--method", default="pelt", show_default=True, type=click.Choice(["pelt", "binseg", "threshold"]),
              help="The detector (docs/history.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
def check(db: str, metric: str, stat: str | None, cells: tuple[str, ...], recent: int, allowance_pct: float | None,
          method: str, as_json: bool) -> None:
    """Find change points in each cell's series of METRIC over the stored runs.

    Prints, per change, the run where it starts, its size with an interval, and the runs on each side; series too
    short or too noisy say so. Exit 1 when a regression beyond the rule's allowance starts within the last
    --recent runs, else 0.
    """
    from bench.history.check import CheckSettings, check_history

    with open_existing(db) as store:
        doc = check_history(store, CheckSettings(metric, stat, cells, recent, method, allowance_pct))
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        _print_check(doc)
    raise SystemExit(doc["exit"])


def _print_check(doc: dict[str, Any]) -> None:
    for s in doc["series"]:
        head = f"{s['cell']} {s['metric']} {s['stat']}: {s['runs']} runs"
        if s["status"] != "ok":
            click.echo(f"{head}: {s['status']} ({s['note']})")
        else:
            click.echo(f"{head}, noise {s['noise_pct']:.2f} %, {s['changes']} change(s); allowance "
                       f"{s['allowance_pct']:g} % ({s['rule']})")
    for c in doc["changes"]:
        b, a = c["before"], c["after"]
        flag = " FAIL" if c["direction"] == "regression" and c["recent"] and c["beyond_allowance"] else ""
        click.echo(f"  {c['cell']} {c['metric']} {c['stat']}: {c['change_pct']:+.2f} % (99 % interval "
                   f"{c['ci_pct'][0]:+.2f} .. {c['ci_pct'][1]:+.2f}) {c['direction']} at run {c['run_index']} ({c['run_id']}, "
                   f"{c['started']}, commit {(c['commit'] or '?')[:12]}){flag}")
        click.echo(f"      before: runs {b['first_run_index']}-{b['last_run_index']} ({b['runs']}, median "
                   f"{b['median']:.4g}); after: runs {a['first_run_index']}-{a['last_run_index']} ({a['runs']}, "
                   f"median {a['median']:.4g})")
    verdict = (f"{doc['failing']} regression(s) beyond the allowance within the last {doc['recent']} runs"
               if doc["failing"] else f"no regression beyond the allowance within the last {doc['recent']} runs")
    click.echo(f"{doc['runs']} runs; {len(doc['changes'])} change point(s); {verdict}")


@history.command()
@click.option("--db", default="bench-history.db", show_default=True, help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="One JSON list on stdout.")
def runs(db: str, as_json: bool) -> None:
    """List the stored runs in the order they were made."""

    with open_existing(db) as store:
        rows = [{"run_index": i, **r.to_dict()} for i, r in enumerate(store.runs())]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        click.echo(f"{r['run_index']:4d}  {r['run_id']}  {r['started']}  {(r['commit'] or '-')[:12]:12}  "
                   f"{r['branch'] or '-'}  {r['profile']}  {r['model']}  {r['source']}")


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
    buf = io.StringIO()
    cols = ["run_index", "run_id", "started", "commit", "branch", "profile", "model", "backend", "hostname",
            "source", "cell", "metric", "n", "mean", "median", "p10", "p90", "p99", "min", "max", "median_lo",
            "median_hi"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    if out_file:
        write_atomic(out_file, buf.getvalue())
        _note(f"wrote {len(rows)} rows to {out_file}")
    else:
        click.echo(buf.getvalue(), nl=False)
