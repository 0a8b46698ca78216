"""bench history: the store (SQLite always, PostgreSQL with a server this module starts), migrations, duplicate
runs, the check's JSON interface and exit codes, CSV export, import of older results files, bench run --history."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from glob import glob
from pathlib import Path

import numpy as np
import pytest

from bench.cli import main
from bench.results import CellResult, EndpointInfo, ProfileInfo, Results, RunInfo, save_results
from tests.paths import FIXTURES

pytest.importorskip("ruptures", reason="bench history needs pip install 'bench[history]'")

CELLS = ("d0-s1-prose", "d2048-s1-prose")


def _stat(values: list[float]) -> dict:
    xs = np.asarray(values)
    return {"n": len(values), "mean": float(xs.mean()), "median": float(np.median(xs)),
            "p10": float(np.quantile(xs, 0.1)), "p90": float(np.quantile(xs, 0.9)),
            "p99": float(np.quantile(xs, 0.99)), "min": float(xs.min()), "max": float(xs.max()), "thin": []}


def make_results(i: int, decode: float, ttft: float = 100.0, *, seed: int = 0, cells: tuple[str, ...] = CELLS,
                 gate: list | None = None, profile: str = "t", url: str = "http://h/v1", model: str = "m",
                 settings: dict | None = None) -> Results:
    """Run ``i`` (started i minutes after midnight) whose cells decode at ``decode`` tok/s (8 samples, 0.1 % spread),
    of ``profile`` (with ``settings``, as results.json's ``profile.settings``) against ``model`` at ``url``."""
    rng = np.random.default_rng(seed * 1000 + i)
    out = []
    for c in cells:
        dec = list(decode * np.exp(rng.normal(0, 0.001, 8)))
        tt = list(ttft * np.exp(rng.normal(0, 0.001, 8)))
        out.append(CellResult(id=c, requests_ok=8, waves=8, decode_tok_s=_stat(dec), ttft_ms=_stat(tt),
                              samples={"decode_tok_s": dec, "ttft_ms": tt}))
    return Results(profile=ProfileInfo(profile, settings={**(settings or {}), "gate": gate or []}),
                   endpoint=EndpointInfo(url, model),
                   run=RunInfo(id=f"{i:08x}", started=f"2026-12-01T{i // 60:02d}:{i % 60:02d}:00+00:00",
                               complete=True), cells=out, machine={"hostname": "vm"}, server={"backend": "sim"})


def write_series(folder: Path, values: list[float], *, ttft: list[float] | None = None, first: int = 0,
                 **kw) -> list[Path]:
    """One results.json per value, runs ``first``, ``first + 1``... (their ids and starts)."""
    paths = []
    for i, v in enumerate(values):
        p = folder / f"run{i:03d}" / "results.json"
        save_results(make_results(first + i, v, ttft[i] if ttft else 100.0, **kw), p)
        paths.append(p)
    return paths


def stepped(n: int, at: int, pct: float, *, noise: float = 0.01, seed: int = 0, level: float = 50.0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [level * float(np.exp(rng.normal(0, noise))) * (1 + pct / 100 if i >= at else 1.0) for i in range(n)]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# --- add, duplicates, order -------------------------------------------------------------------------------------


def test_add_stores_runs_and_refuses_the_same_run_again(tmp_path, capsys) -> None:
    files = write_series(tmp_path, [50.0, 51.0, 49.0])
    db = str(tmp_path / "h.db")
    rc, _, err = run_cli(capsys, "history", "add", *map(str, files), "--db", db, "--commit", "abc123", "--branch", "main")
    assert rc == 0, err
    assert "added 3 run(s)" in err
    rc, _, err = run_cli(capsys, "history", "add", str(files[1]), "--db", db)
    assert rc == 3
    assert len(err.strip().splitlines()) == 1 and "already stored" in err and "00000001" in err
    rc, _, err = run_cli(capsys, "history", "add", str(files[1]), str(files[1]), "--db", str(tmp_path / "b.db"))
    assert rc == 3 and "is given twice" in err and "already stored" not in err  # twice in one call: nothing added
    assert not (tmp_path / "b.db").exists()  # refused before a new store was made: no empty file is left
    rc, _, err = run_cli(capsys, "history", "add", str(files[1]), str(files[1]), "--db", f"sqlite:///{db}")
    assert rc == 3 and "already stored" in err  # an existing store is still asked
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", db, "--json")
    runs = json.loads(out)
    assert [r["run_id"] for r in runs] == ["00000000", "00000001", "00000002"]
    assert all(r["commit"] == "abc123" and r["branch"] == "main" for r in runs)
    rc, _, err = run_cli(capsys, "history", "add", *map(str, files), "--db", db, "--skip-existing")
    assert rc == 0, err  # every one skipped: re-importing a folder with nothing new is success
    assert "nothing new: 3 runs already stored" in err and "error" not in err
    assert err.count("already stored") == 4  # a note per run skipped, then the summary
    rc, _, err = run_cli(capsys, "history", "add", str(files[0]), "--db", db, "--skip-existing")
    assert rc == 0 and "nothing new: 1 run already stored" in err
    rc, _, err = run_cli(capsys, "history", "add", *map(str, files), "--db", db)
    assert rc == 3 and "already stored" in err  # without --skip-existing: still refused


def test_a_file_edited_after_the_run_is_another_run(tmp_path, capsys) -> None:
    a = make_results(0, 50.0)
    save_results(a, tmp_path / "a" / "results.json")
    a.cells[0].decode_tok_s["median"] = 40.0  # same run id and start, other figures
    save_results(a, tmp_path / "b" / "results.json")
    db = str(tmp_path / "h.db")
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "a"), str(tmp_path / "b"), "--db", db)
    assert rc == 0 and "added 2 run(s)" in err
    assert f"{tmp_path / 'b' / 'results.json'}: stored as another run: its figures differ from run 00000000's" in err
    assert run_cli(capsys, "history", "add", str(tmp_path / "b"), "--db", db)[0] == 3
    # across calls: the store is asked for a run of the same id and start
    a.cells[0].decode_tok_s["median"] = 30.0
    save_results(a, tmp_path / "c" / "results.json")
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "c"), "--db", db)
    assert rc == 0 and "stored as another run: its figures differ from run 00000000's" in err
    assert str(tmp_path / "a" / "results.json") in err  # the first stored one is named
    # the help says what the identity is (not "same run id and start")
    rc, out, _ = run_cli(capsys, "history", "add", "--help")
    assert rc == 0 and "same run id and start)" not in out and "start and figures" in out


def test_folder_import_orders_runs_by_start_and_keeps_statistics(tmp_path, capsys) -> None:
    from bench.history.store import open_store

    vals = [50.0, 40.0, 60.0, 45.0]
    write_series(tmp_path / "res", vals)
    # a folder's runs are found in any order; the store orders them by run.started
    os.rename(tmp_path / "res" / "run000", tmp_path / "res" / "zzz")
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", str(tmp_path / "res"), "--db", str(db))[0] == 0
    with open_store(db) as s:
        series = s.series("decode_tok_s")
        assert list(series) == list(CELLS)
        pts = series["d0-s1-prose"]
        assert [p.index for p in pts] == [0, 1, 2, 3]
        assert [round(p.value, 0) for p in pts] == vals
        assert all(p.lo is not None and p.lo <= p.value <= p.hi for p in pts)  # the median's interval
        assert s.series("ttft_ms", "p90")["d2048-s1-prose"][0].lo is None  # an interval is the median's only


def test_incomplete_runs_are_skipped_with_a_note_by_cause(tmp_path, capsys) -> None:
    r = make_results(0, 50.0)
    r.run.complete = False
    r.run.interrupted = True
    save_results(r, tmp_path / "a" / "results.json")
    stopped = make_results(2, 50.0)  # stopped on a server error: incomplete, not interrupted
    stopped.run.complete = False
    save_results(stopped, tmp_path / "c" / "results.json")
    save_results(make_results(1, 50.0), tmp_path / "b" / "results.json")
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path), "--db", str(tmp_path / "h.db"))
    assert rc == 0 and "added 1 run(s)" in err and "(1 run stored)" in err
    notes = {ln.split(": ", 1)[0].split()[-1]: ln for ln in err.splitlines() if ln.startswith("skipped")}
    assert "interrupted" in notes[str(tmp_path / "a" / "results.json")]
    assert "stopped early" in notes[str(tmp_path / "c" / "results.json")]
    assert "interrupted" not in notes[str(tmp_path / "c" / "results.json")]
    assert err.count("skipped") == 2  # each note once
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "c"), "--db", str(tmp_path / "n.db"))
    assert rc == 3 and "nothing to add (1 incomplete run(s) skipped)" in err and not (tmp_path / "n.db").exists()
    # nothing left to add: each file skipped is still named with its reason, before the one error line
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "a"), str(tmp_path / "c"), "--db",
                         str(tmp_path / "h.db"))
    lines = err.strip().splitlines()
    assert rc == 3 and len(lines) == 3 and lines[-1].startswith("bench: error:"), err
    assert lines[0].startswith(f"skipped {tmp_path / 'a' / 'results.json'}: the run was interrupted")
    assert lines[1].startswith(f"skipped {tmp_path / 'c' / 'results.json'}: the run is incomplete: it stopped early")
    assert "nothing to add (2 incomplete run(s) skipped)" in lines[-1]


def test_older_results_files_are_imported(tmp_path, capsys) -> None:
    """A file written before run.complete existed (and the stored sample run) goes in like a new one."""
    d = make_results(0, 50.0).to_dict()
    del d["run"]["complete"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps(d))
    sample = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "readme-sample.json"
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "old"), str(sample), "--db", str(tmp_path / "h.db"))
    assert rc == 0, err
    assert "added 2 run(s)" in err


@pytest.mark.parametrize("what", ["not-json", "missing", "folder-without-results"])
def test_bad_input_is_one_line_exit_3(tmp_path, capsys, what) -> None:
    if what == "not-json":
        (tmp_path / "x.json").write_text("{")
        arg = str(tmp_path / "x.json")
    elif what == "missing":
        arg = str(tmp_path / "nope.json")
    else:
        (tmp_path / "empty").mkdir()
        arg = str(tmp_path / "empty")
    rc, _, err = run_cli(capsys, "history", "add", arg, "--db", str(tmp_path / "h.db"))
    assert rc == 3 and len(err.strip().splitlines()) == 1 and err.startswith("bench: error:")


def test_reading_commands_never_create_a_store(tmp_path, capsys) -> None:
    for cmd in (["check"], ["runs"], ["export", "--csv"]):
        rc, _, err = run_cli(capsys, "history", *cmd, "--db", str(tmp_path / "none.db"))
        assert rc == 3 and "not found" in err
    assert not (tmp_path / "none.db").exists()


# --- migrations ---------------------------------------------------------------------------------------------------


def test_migrations_are_versioned_and_applied_once(tmp_path) -> None:
    from bench.errors import HistoryError
    from bench.history.store import MIGRATIONS, SCHEMA_VERSION, HistoryStore, open_store

    db = tmp_path / "h.db"
    with open_store(db) as s:
        assert s.schema_versions() == [v for v, *_ in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    with open_store(db) as s:  # reopening applies nothing again
        assert s.schema_versions() == list(range(1, SCHEMA_VERSION + 1))
    # a store left at version 1 (an older bench) keeps its runs and gets the rest
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied TEXT NOT NULL, about TEXT NOT NULL)")
    for stmt in MIGRATIONS[0][2]:
        conn.execute(stmt.replace("{pk}", "INTEGER PRIMARY KEY AUTOINCREMENT"))
    conn.execute("INSERT INTO schema_version VALUES (1, 'then', 'v1')")
    conn.commit()
    conn.close()
    with open_store(old) as s:
        assert s.schema_versions() == list(range(1, SCHEMA_VERSION + 1))
        s.add(make_results(0, 50.0))
        assert len(s.runs()) == 1
        idx = {r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"stats_series", "runs_started"} <= idx
    # a store written by a newer bench is refused, not misread
    conn = sqlite3.connect(old)
    conn.execute("INSERT INTO schema_version VALUES (99, 'later', 'future')")
    conn.commit()
    conn.close()
    with pytest.raises(HistoryError, match="newer bench"):
        open_store(old)
    assert isinstance(HistoryStore, type)


def test_a_store_made_before_settings_were_stored_opens_and_keeps_its_series(tmp_path, capsys) -> None:
    """A store of schema version 2 (made by bench before the setup had settings: tests/fixtures/history) opens,
    gets version 3, and keeps its runs as one series; runs added now, with their settings, are another setup."""
    from bench.history.store import SCHEMA_VERSION, open_store

    db = tmp_path / "v2.db"
    conn = sqlite3.connect(db)
    conn.executescript((FIXTURES / "history" / "store-v2.sql").read_text())
    conn.close()
    with open_store(db) as s:
        assert s.schema_versions() == list(range(1, SCHEMA_VERSION + 1)) and SCHEMA_VERSION >= 3
        old = s.runs()
        assert len(old) == 7 and {(r.settings, r.settings_key, r.commit_sha) for r in old} == {(None, "", "abc123")}
        assert len(s.series("decode_tok_s")["d0-s1-prose"]) == 7
    files = write_series(tmp_path / "new", [50.0] * 6, first=100, settings={"max_tokens": 32})
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc, out, err = run_cli(capsys, "history", "check", "--db", str(db), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(su["runs"], su["settings_key"] == "") for su in doc["setups"]] == [(7, True), (6, False)]
    assert doc["setups"][0]["label"] == "profile t, model m, http://h/v1, settings not recorded"
    assert {s["status"] for s in doc["series"]} == {"ok"}


def test_the_migration_reads_the_settings_of_stored_runs_whose_files_are_still_there(tmp_path, monkeypatch) -> None:
    """Version 3 fills in the settings of a run stored before it from its results file, when the file is where it
    was read from and is still that run (the same figures); the rest stay without."""
    from bench.history.store import open_store

    monkeypatch.chdir(tmp_path)  # the fixture's runs were read from old/run000/results.json...
    files = write_series(tmp_path / "old", [50.0] * 7, settings={"max_tokens": 16})
    files[5].unlink()
    edited = make_results(6, 50.0)
    edited.cells[0].decode_tok_s["median"] = 40.0  # another run now: not the stored one's settings
    save_results(edited, files[6])
    conn = sqlite3.connect(tmp_path / "v2.db")
    conn.executescript((FIXTURES / "history" / "store-v2.sql").read_text())
    conn.close()
    with open_store(tmp_path / "v2.db") as s:
        got = [r.settings for r in s.runs()]
    assert got == [{"max_tokens": 16}] * 5 + [None, None]


def test_a_migration_that_fails_half_way_leaves_the_store_as_it_was(tmp_path, monkeypatch) -> None:
    import bench.history.store as st
    from bench.errors import HistoryError

    db = tmp_path / "h.db"
    with st.open_store(db) as s:
        s.add(make_results(0, 50.0))
    last = st.SCHEMA_VERSION
    broken = (last + 1, "half of it fails", ("CREATE TABLE extra (x INTEGER)", "CREATE TABLE runs (x INTEGER)"))
    monkeypatch.setattr(st, "MIGRATIONS", (*st.MIGRATIONS, broken))
    monkeypatch.setattr(st, "SCHEMA_VERSION", last + 1)
    with pytest.raises(HistoryError, match="migrating"):
        st.open_store(db)
    conn = sqlite3.connect(db)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "extra" not in tables  # the first statement of the failed migration was rolled back with it
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == last
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    conn.close()


# --- check: the interface -----------------------------------------------------------------------------------------


def _check(capsys, db: Path, *extra: str) -> tuple[int, dict]:
    rc, out, err = run_cli(capsys, "history", "check", "--db", str(db), "--json", *extra)
    assert rc in (0, 1), err
    return rc, json.loads(out)


def test_check_finds_a_recent_regression_and_exits_1(tmp_path, capsys) -> None:
    files = write_series(tmp_path, stepped(24, 18, -10.0, seed=1))
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc, doc = _check(capsys, db, "--metric", "decode_tok_s", "--recent", "6")
    assert rc == 1 and doc["exit"] == 1
    ch = [c for c in doc["changes"] if c["cell"] == "d0-s1-prose"]
    assert len(ch) == 1
    c = ch[0]
    assert c["metric"] == "decode_tok_s" and c["run_index"] == 18 and c["run_id"] == f"{18:08x}"
    assert c["direction"] == "regression"
    assert -13 < c["change_pct"] < -7 and c["ci_pct"][0] < c["change_pct"] < c["ci_pct"][1]
    assert c["before"]["runs"] == 18 and c["after"]["runs"] == 6
    # the same change lies outside the last 5 runs: exit 0, the change still listed
    rc, doc = _check(capsys, db, "--metric", "decode_tok_s", "--recent", "5")
    assert rc == 0 and any(c["run_index"] == 18 for c in doc["changes"])


def test_check_improvement_and_small_regressions_do_not_fail(tmp_path, capsys) -> None:
    db = tmp_path / "h.db"
    files = write_series(tmp_path / "up", stepped(24, 18, +10.0, seed=2))
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc, doc = _check(capsys, db, "--recent", "6")
    assert rc == 0 and doc["changes"] and all(c["direction"] == "improvement" for c in doc["changes"])
    # a 3 % drop with 0.3 % noise is a change point, but inside the default rule's 5 % allowance
    db2 = tmp_path / "h2.db"
    files = write_series(tmp_path / "small", stepped(24, 18, -3.0, noise=0.003, seed=3))
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db2))[0] == 0
    rc, doc = _check(capsys, db2, "--recent", "6")
    assert rc == 0
    c = next(c for c in doc["changes"] if c["cell"] == "d0-s1-prose")
    assert c["direction"] == "regression" and not c["beyond_allowance"] and c["allowance_pct"] == 5.0
    rc, doc = _check(capsys, db2, "--recent", "6", "--allowance", "2")
    assert rc == 1


def test_check_uses_the_stored_gate_rule_and_latency_direction(tmp_path, capsys) -> None:
    """ttft_ms is lower-better: a rise is the regression; the profile's max_rise_pct and stat are used."""
    gate = [{"metric": "ttft_ms", "cell": "*", "stat": "median", "max_rise_pct": 20}]
    ttft = stepped(24, 18, +15.0, seed=4, level=100.0)
    files = write_series(tmp_path, [50.0] * 24, ttft=ttft, gate=gate)
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc, doc = _check(capsys, db, "--metric", "ttft_ms", "--recent", "6")
    c = next(c for c in doc["changes"] if c["cell"] == "d0-s1-prose")
    assert c["direction"] == "regression" and c["allowance_pct"] == 20.0 and c["stat"] == "median"
    assert rc == 0  # 15 % is inside the profile's 20 %
    rc, _ = _check(capsys, db, "--metric", "ttft_ms", "--recent", "6", "--allowance", "10")
    assert rc == 1


def test_check_says_when_a_series_is_too_short_or_too_noisy(tmp_path, capsys) -> None:
    db = tmp_path / "h.db"
    files = write_series(tmp_path / "a", [50.0, 50.0, 50.0, 45.0])
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc, doc = _check(capsys, db)
    assert rc == 0 and not doc["changes"]
    assert {s["status"] for s in doc["series"]} == {"too short"} and {s["min_runs"] for s in doc["series"]} == {6}
    assert (doc["judged"], doc["not_judged"]) == (0, len(CELLS))
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db))
    assert rc == 0 and "too short (4 runs; at least 6 are needed)" in out
    # nothing was judged: the verdict says so, and no all-clear (exit 0 still: a new history starts short)
    assert out.splitlines()[-1].endswith("; nothing judged: every series has fewer than 6 runs (need 6)")
    assert "no regression" not in out
    db2 = tmp_path / "h2.db"
    files = write_series(tmp_path / "b", stepped(20, 10, -10.0, noise=0.4, seed=5))
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db2))[0] == 0
    rc, doc = _check(capsys, db2)
    assert rc == 0 and {s["status"] for s in doc["series"]} == {"too noisy"} and not doc["changes"]
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db2))
    assert rc == 0 and out.splitlines()[-1].endswith("; nothing judged: 2 series too noisy")
    assert "no regression" not in out


def test_the_threshold_method_calls_a_series_too_short_when_its_recent_runs_lack_10_runs_before_them(
        tmp_path, capsys) -> None:
    """The trial: a -20 % step after 8 runs, 12 runs in all. The threshold method judges a run against the 10 before
    it, so it cannot see that step: too short for it (with the runs it needs), not "0 changes, no regression"."""
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, write_series(tmp_path / "a", stepped(12, 8, -20.0, seed=3))),
                   "--db", str(db))[0] == 0
    rc, doc = _check(capsys, db)
    assert rc == 1 and doc["failing"] == len(CELLS)  # pelt finds it
    rc, doc = _check(capsys, db, "--method", "threshold")
    assert rc == 0 and doc["judged"] == 0 and not doc["changes"]
    assert {(s["status"], s["min_runs"]) for s in doc["series"]} == {("too short", 15)}  # 10 before each of 5
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--method", "threshold")
    assert "too short (12 runs; at least 15 are needed (10 before each of the last 5))" in out
    assert "no regression" not in out and "0 change(s)" not in out
    assert out.splitlines()[-1].endswith("nothing judged: every series has fewer than 15 runs (need 15)")
    rc, doc = _check(capsys, db, "--method", "threshold", "--recent", "2")  # the last 2 have 10 runs before them
    assert rc == 0 and {(s["status"], s["min_runs"]) for s in doc["series"]} == {("ok", 12)}  # the step is older
    # with 10 runs before the step, the threshold sees it
    db2 = tmp_path / "h2.db"
    assert run_cli(capsys, "history", "add", *map(str, write_series(tmp_path / "b", stepped(15, 10, -20.0, seed=3))),
                   "--db", str(db2))[0] == 0
    rc, doc = _check(capsys, db2, "--method", "threshold")
    assert rc == 1 and {c["setup_run_index"] for c in doc["changes"]} == {10}


def test_check_bad_options_exit_3(tmp_path, capsys) -> None:
    files = write_series(tmp_path, [50.0] * 6)
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    for extra in (["--metric", "no_such_metric"], ["--recent", "0"], ["--cell", "d9-s9-x"], ["--recent", "2"],
                  ["--recent", "1", "--method", "binseg"], ["--recent", "0", "--method", "threshold"]):
        rc, _, err = run_cli(capsys, "history", "check", "--db", str(db), *extra)
        assert rc == 3 and len(err.strip().splitlines()) == 1, (extra, err)
    # a change is seen 3 runs after it at the earliest: --recent below 3 could never fire (the threshold's: 1 run)
    rc, _, err = run_cli(capsys, "history", "check", "--db", str(db), "--recent", "2")
    assert "--recent 2: must be at least 3 (--method pelt sees a change 3 runs after it at the earliest)" in err
    rc, _, err = run_cli(capsys, "history", "check", "--db", str(db), "--recent", "1", "--method", "threshold")
    assert rc == 0, err


# --- export -------------------------------------------------------------------------------------------------------


def test_export_csv_one_row_per_run_cell_metric(tmp_path, capsys) -> None:
    vals = [50.0, 52.0, 48.0]
    files = write_series(tmp_path, vals)
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db), "--commit", "c0ffee")[0] == 0
    rc, out, _ = run_cli(capsys, "history", "export", "--csv", "--db", str(db))
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 * len(CELLS) * 2  # runs x cells x (decode_tok_s, ttft_ms)
    dec = [r for r in rows if r["cell"] == "d0-s1-prose" and r["metric"] == "decode_tok_s"]
    assert [int(r["run_index"]) for r in dec] == [0, 1, 2]
    assert [round(float(r["median"])) for r in dec] == vals and {r["commit"] for r in rows} == {"c0ffee"}
    rc, _, _ = run_cli(capsys, "history", "export", "--csv", "--db", str(db), "-o", str(tmp_path / "h.csv"))
    assert rc == 0 and (tmp_path / "h.csv").read_text() == out


# --- bench run --history ------------------------------------------------------------------------------------------


def test_commit_and_branch_come_from_the_options_the_ci_or_git(monkeypatch, tmp_path) -> None:
    from bench.cli.history import found_commit

    for k in ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT", "GITHUB_HEAD_REF", "GITHUB_REF_NAME",
              "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH", "GIT_BRANCH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)  # not a git work tree
    assert found_commit(None, None, use_git=True) == (None, None)
    monkeypatch.setenv("GITHUB_SHA", "a1b2c3")
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    assert found_commit(None, None, use_git=False) == ("a1b2c3", "main")
    assert found_commit("given", "topic", use_git=True) == ("given", "topic")
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", "-b", "work"], check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
                       check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        monkeypatch.delenv("GITHUB_SHA")
        monkeypatch.delenv("GITHUB_REF_NAME")
        assert found_commit(None, None, use_git=True) == (head, "work")
        assert found_commit(None, None, use_git=False) == (None, None)  # `history add` asks git only with --git


def test_run_history_adds_the_finished_run(tmp_path, capsys) -> None:
    from bench.sim import SimConfig, running_sim

    prof = tmp_path / "p.toml"
    prof.write_text('max_tokens = 8\nrequests = 2\nwarmup = 0\noverhead_probes = 1\n[[sweep]]\nstreams = [1]\n')
    db = tmp_path / "h.db"
    with running_sim(SimConfig(decode_step_ms=5.0, prefill_tok_s=50_000.0)) as url:
        rc, _, err = run_cli(capsys, "run", url, "--profile", str(prof), "--out", str(tmp_path / "r"),
                             "--history", str(db))
    assert rc == 0, err
    assert "added to" in err
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db), "--json")
    runs = json.loads(out)
    assert len(runs) == 1 and runs[0]["run_id"] == json.loads((tmp_path / "r" / "results.json").read_text())["run"]["id"]
    rc, _, err = run_cli(capsys, "history", "add", str(tmp_path / "r"), "--db", str(db))
    assert rc == 3 and "already stored" in err
    rc, _, err = run_cli(capsys, "run", "http://127.0.0.1:9/v1", "--profile", str(prof), "--out", str(tmp_path / "r2"),
                         "--history", str(tmp_path))
    assert rc == 3 and "is a folder" in err  # a bad store fails before the run, not after it
    rc, _, err = run_cli(capsys, "run", "http://127.0.0.1:9/v1", "--profile", str(prof), "--out", str(tmp_path / "r3"),
                         "--history", str(tmp_path / "none" / "h.db"))
    assert rc == 3 and f"its folder {tmp_path / 'none'} does not exist" in err  # not "cannot open it as SQLite"


# --- PostgreSQL: a real server, started here ----------------------------------------------------------------------


def _pg_bin() -> Path | None:
    found = sorted(glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("postgres") or shutil.which("initdb")
    return Path(which).resolve().parent if which else None


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throw-away PostgreSQL server on a Unix socket in a temp folder (no TCP port), stopped at the end."""
    pytest.importorskip("psycopg", reason="PostgreSQL needs psycopg (pip install 'bench[history]')")
    bindir = _pg_bin()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("no PostgreSQL server binary (apt-get install postgresql)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as the postgres user
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
        runuser = shutil.which("runuser") or next((p for p in ("/usr/sbin/runuser", "/sbin/runuser")
                                                    if os.path.exists(p)), None)
        if runuser is None:
            pytest.skip("running as root and there is no runuser to start the server as the postgres user")
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
        as_user = [runuser, "-u", "postgres", "--"]
    data = tmp / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench", "--no-sync",
                    "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    opts = f"-c listen_addresses='' -c unix_socket_directories={tmp} -p 5432 -c fsync=off"
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l", str(tmp / "log"),
                    "-o", opts, "start"], check=True, capture_output=True, timeout=90)
    try:
        yield f"postgresql://bench@/postgres?host={tmp}&port=5432"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def pg_db(postgres_url) -> str:
    """A fresh database on the server for each test."""
    import psycopg

    name = f"h{os.urandom(4).hex()}"
    with psycopg.connect(postgres_url, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return postgres_url.replace("/postgres?", f"/{name}?")


def test_postgresql_store_add_duplicate_check_export(tmp_path, capsys, pg_db) -> None:
    from bench.history.store import SCHEMA_VERSION, open_store

    files = write_series(tmp_path, stepped(24, 18, -10.0, seed=1))
    rc, _, err = run_cli(capsys, "history", "add", *map(str, files), "--db", pg_db)
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "history", "add", str(files[3]), "--db", pg_db)
    assert rc == 3 and len(err.strip().splitlines()) == 1 and "already stored" in err
    with open_store(pg_db) as s:
        assert s.kind == "postgresql" and s.schema_versions() == list(range(1, SCHEMA_VERSION + 1))
        assert len(s.runs()) == 24
    rc, out, _ = run_cli(capsys, "history", "check", "--db", pg_db, "--metric", "decode_tok_s", "--recent", "6",
                         "--json")
    doc = json.loads(out)
    assert rc == 1 and any(c["run_index"] == 18 and c["direction"] == "regression" for c in doc["changes"])
    # the same files in SQLite give the same answer
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db))[0] == 0
    rc2, out2, _ = run_cli(capsys, "history", "check", "--db", str(db), "--metric", "decode_tok_s", "--recent", "6",
                           "--json")
    assert rc2 == rc and json.loads(out2)["changes"] == doc["changes"]
    rc, out, _ = run_cli(capsys, "history", "export", "--csv", "--db", pg_db)
    assert rc == 0 and len(out.strip().splitlines()) == 1 + 24 * len(CELLS) * 2


def test_postgresql_migration_that_fails_half_way_is_rolled_back(pg_db, monkeypatch) -> None:
    import psycopg

    import bench.history.store as st
    from bench.errors import HistoryError

    with st.open_store(pg_db) as s:
        s.add(make_results(0, 50.0))
    last = st.SCHEMA_VERSION
    broken = (last + 1, "half of it fails", ("CREATE TABLE extra (x INTEGER)", "CREATE TABLE runs (x INTEGER)"))
    monkeypatch.setattr(st, "MIGRATIONS", (*st.MIGRATIONS, broken))
    monkeypatch.setattr(st, "SCHEMA_VERSION", last + 1)
    with pytest.raises(HistoryError, match="migrating"):
        st.open_store(pg_db)
    with psycopg.connect(pg_db) as c:
        assert c.execute("SELECT to_regclass('extra')").fetchone()[0] is None
        assert c.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == last
        assert c.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_postgresql_unreachable_is_one_line_exit_3(tmp_path, capsys, postgres_url) -> None:
    bad = postgres_url.replace("port=5432", "port=5999")
    rc, _, err = run_cli(capsys, "history", "add", str(write_series(tmp_path, [50.0])[0]), "--db", bad)
    assert rc == 3 and len(err.strip().splitlines()) == 1 and "cannot connect" in err


# --- bench report --history ---------------------------------------------------------------------------------------


@pytest.fixture
def trend_db(tmp_path, capsys) -> Path:
    pytest.importorskip("plotly")
    files = write_series(tmp_path / "runs", stepped(20, 14, -10.0, seed=1))
    db = tmp_path / "h.db"
    assert run_cli(capsys, "history", "add", *map(str, files), "--db", str(db), "--commit", "feedbeef")[0] == 0
    return db


def test_report_history_page_has_trends_change_points_and_band(tmp_path, capsys, trend_db) -> None:
    out = tmp_path / "t.html"
    rc, _, err = run_cli(capsys, "report", "--history", str(trend_db), "-o", str(out))
    assert rc == 0, err
    page = out.read_text(encoding="utf-8")
    assert "Trends over 20 runs" in page and "d0-s1-prose: decode_tok_s median over 20 runs" in page
    assert "allowance 5 % (default rule max_drop_pct = 5)" in page  # the band's label
    assert "-10." in page and "commit feedbeef" in page  # a change point's size; the commit on hover
    assert page.count('class="plotly-graph-div"') == len(CELLS) * 2  # decode_tok_s and ttft_ms of each cell
    # with results files, the usual report and the trends after it
    run = tmp_path / "runs" / "run019" / "results.json"
    rc, _, err = run_cli(capsys, "report", str(run), "--history", str(trend_db), "-o", str(tmp_path / "both.html"))
    assert rc == 0, err
    both = (tmp_path / "both.html").read_text(encoding="utf-8")
    assert both.index("<h2>Runs</h2>") < both.index("Trends over 20 runs")
    rc, _, err = run_cli(capsys, "report", "-o", str(tmp_path / "x.html"))
    assert rc == 3 and "--history" in err


def test_report_history_draws_in_headless_chromium(tmp_path, capsys, trend_db) -> None:
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip(f"no {chromium} (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    out = tmp_path / "t.html"
    assert run_cli(capsys, "report", "--history", str(trend_db), "-o", str(out))[0] == 0
    outside: list[str] = []
    errors: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith(("file://", "data:", "blob:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length > 0")
            drawn = page.eval_on_selector_all(
                ".plotly-graph-div", "ds => ds.map(d => [d.querySelectorAll('.main-svg .scatterlayer path').length, "
                "d.querySelectorAll('.shapelayer path').length])")
        finally:
            browser.close()
    assert outside == [] and errors == [], (outside, errors)
    assert len(drawn) == len(CELLS) * 2 and all(marks > 0 for marks, _ in drawn), drawn
    # the decode figures carry a change-point line and the allowance band (two shapes)
    assert sum(1 for _, shapes in drawn if shapes >= 2) >= len(CELLS), drawn


def test_prompt_rate_is_stored_only_where_it_measures_prefill() -> None:
    """history check --metric prompt_tok_s judged depth-0 cells (a few prompt tokens over TTFT: overhead), where the
    run table shows "-": a slower decode step read as a -16 % prompt-rate regression."""
    from types import SimpleNamespace

    from bench.history.store import _stat_rows
    from bench.results import CellResult

    stat = {"n": 4, "mean": 50.0, "median": 50.0, "p10": 49.0, "p90": 51.0, "p99": 51.0, "min": 49.0, "max": 51.0}
    cells = [CellResult(id=cid, depth=d, streams=1, prompt_tok_s=dict(stat), decode_tok_s=dict(stat))
             for cid, d in (("d0-s1-prose", 0), ("d4096-s1-prose", 4096))]
    rows = {(r[0], r[1]) for r in _stat_rows(SimpleNamespace(cells=cells))}  # type: ignore[arg-type]
    assert ("d4096-s1-prose", "prompt_tok_s") in rows and ("d0-s1-prose", "prompt_tok_s") not in rows
    assert ("d0-s1-prose", "decode_tok_s") in rows
