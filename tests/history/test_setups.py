"""bench history: a series is one cell of one setup (profile, model, endpoint URL), never runs of several mixed;
the check's filters; the messages of an empty store, of a store URL of another scheme, of the option given; the
text layout at 80 columns (runs table, check lines, plurals)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.results import save_results
from tests.history.test_history import CELLS, make_results, run_cli, stepped, write_series

pytest.importorskip("ruptures", reason="bench history needs pip install 'bench[history]'")

SMALL = {"profile": "small", "url": "http://127.0.0.1:8000/v1", "model": "bench-sim"}
MID = {"profile": "mid", "url": "http://127.0.0.1:8000/v1", "model": "bench-sim"}


def _add(capsys, db: Path, *paths: Path) -> None:
    rc, _, err = run_cli(capsys, "history", "add", *map(str, paths), "--db", str(db))
    assert rc == 0, err


def _two_profiles(tmp_path: Path, capsys) -> Path:
    """The trial's store: 7 runs of profile small, then 3 of profile mid (twice the tokens: half the decode speed,
    twice the TTFT), against the same server; the only step is between the profiles."""
    db = tmp_path / "h.db"
    _add(capsys, db, *write_series(tmp_path / "small", [50.0] * 7, ttft=[100.0] * 7, **SMALL))
    _add(capsys, db, *write_series(tmp_path / "mid", [25.0] * 3, ttft=[200.0] * 3, first=7, **MID))
    return db


def test_runs_of_two_profiles_are_two_series_and_no_regression(tmp_path, capsys, monkeypatch) -> None:
    db = _two_profiles(tmp_path, capsys)
    for metric in ("decode_tok_s", "ttft_ms"):
        rc, out, err = run_cli(capsys, "history", "check", "--db", str(db), "--metric", metric, "--cell",
                               "d0-s1-prose", "--json")
        assert rc == 0, (metric, out, err)
        doc = json.loads(out)
        assert doc["exit"] == 0 and doc["changes"] == [] and doc["failing"] == 0 and doc["runs"] == 10
        got = [(s["profile"], s["model"], s["endpoint_url"], s["runs"], s["status"]) for s in doc["series"]]
        assert got == [("small", "bench-sim", SMALL["url"], 7, "ok"), ("mid", "bench-sim", MID["url"], 3, "too short")]
        assert [(s["setup"], s["profile"], s["runs"]) for s in doc["setups"]] == [(1, "small", 7), (2, "mid", 3)]
        assert {s["cell"] for s in doc["series"]} == {"d0-s1-prose"}  # the old keys are all still there
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--metric", "ttft_ms")
    assert rc == 0
    lines = out.splitlines()
    assert "setup 1, 7 runs: profile small, model bench-sim, http://127.0.0.1:8000/v1" in lines
    assert "setup 2, 3 runs: profile mid, model bench-sim, http://127.0.0.1:8000/v1" in lines
    assert "  d0-s1-prose ttft_ms p90: too short (3 runs; at least 6 are needed)" in lines
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert " ".join(ln.strip() for ln in lines[-2:]) == ("no regression beyond the allowance within the last 5 "
                                                          "runs of each setup; not judged: 2 series too short "
                                                          "(fewer than 6 runs)")  # the judged and the others


def test_a_step_inside_one_setup_is_found_among_interleaved_setups(tmp_path, capsys) -> None:
    """bench ab's folder (a/ and b/: two endpoints) goes in as two setups; a step in one of them is found where it
    is, and "recent" counts that setup's runs."""
    ab = tmp_path / "ab"
    a_vals = stepped(12, 8, -10.0, seed=1)
    for i in range(12):  # runs alternate between the two endpoints, as a bench ab series would
        save_results(make_results(2 * i, a_vals[i], url="http://a:8000/v1"), ab / f"{i:02d}" / "a" / "results.json")
        save_results(make_results(2 * i + 1, 80.0, url="http://b:8000/v1"), ab / f"{i:02d}" / "b" / "results.json")
    db = tmp_path / "h.db"
    _add(capsys, db, ab)
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["failing"] == len(CELLS)
    assert {(c["endpoint_url"], c["run_index"], c["setup_run_index"], c["direction"], c["recent"]) for c in
            doc["changes"]} == {("http://a:8000/v1", 16, 8, "regression", True)}
    assert all(-13 < c["change_pct"] < -7 for c in doc["changes"])
    assert {s["endpoint_url"]: s["changes"] for s in doc["series"]} == {"http://a:8000/v1": 1, "http://b:8000/v1": 0}
    # only the other endpoint: nothing to report
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--json", "--endpoint", "http://b:8000/v1/")
    assert rc == 0 and json.loads(out)["changes"] == [] and {s["setup"] for s in json.loads(out)["series"]} == {2}


def test_a_local_server_on_a_new_free_port_each_run_is_one_setup(tmp_path, capsys) -> None:
    """The embedded endpoint (and bench sim --port 0) listens on a free port, another each run: still one setup;
    two servers on fixed ports of one machine are two."""
    db = tmp_path / "h.db"
    vals = stepped(12, 8, -10.0, seed=2)
    for i, v in enumerate(vals):
        save_results(make_results(i, v, url=f"http://127.0.0.1:{41000 + 37 * i}/v1"), tmp_path / f"e{i}" / "results.json")
    for i in range(6):
        save_results(make_results(20 + i, 50.0, url=f"http://127.0.0.1:{8000 + i % 2}/v1"),
                     tmp_path / f"f{i}" / "results.json")
    _add(capsys, db, tmp_path)
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--json", "--cell", "d0-s1-prose")
    doc = json.loads(out)
    assert [(su["endpoint_url"], su["runs"]) for su in doc["setups"]] == [
        ("http://127.0.0.1:*/v1", 12), ("http://127.0.0.1:8000/v1", 3), ("http://127.0.0.1:8001/v1", 3)]
    assert rc == 1 and [(c["run_index"], c["endpoint_url"]) for c in doc["changes"]] == [(8, "http://127.0.0.1:*/v1")]
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--json", "--endpoint", "http://127.0.0.1:41000/v1")
    assert rc == 1 and [su["runs"] for su in json.loads(out)["setups"]] == [12]  # a run's own URL finds its setup


def _quick(max_tokens: int, requests: int = 2) -> dict:
    """profile.settings as results.json records them for ``-p quick --max-tokens N --repeats R`` (overrides on)."""
    sweep = {"name": "decode", "depths": [0], "streams": [1], "prompts": ["prose"], "max_tokens": None,
             "requests": None}
    return {"name": "quick", "description": "short decode", "max_tokens": max_tokens, "requests": requests,
            "sweeps": [sweep, {**sweep, "name": "depth", "requests": 2}], "temperature": 0.0, "load": [],
            "overrides": ["--depths", "--streams", "--max-tokens", "--repeats"]}


QUICK = {"profile": "quick", "url": "http://127.0.0.1:8123/v1", "model": "bench-sim"}


def test_runs_of_one_profile_with_other_settings_are_other_series(tmp_path, capsys, monkeypatch) -> None:
    """The trial: 10 runs with --max-tokens 16, then runs with --max-tokens 64 (E2E, here TTFT, quadruples) against
    the same server: two setups, no change point. Other --repeats (the sample's size) is the same setup."""
    db = tmp_path / "h.db"
    _add(capsys, db, *write_series(tmp_path / "m16", [50.0] * 10, ttft=[326.0] * 10, settings=_quick(16), **QUICK))
    _add(capsys, db, *write_series(tmp_path / "m64", [50.0] * 2, ttft=[1288.0] * 2, first=10, settings=_quick(64),
                                   **QUICK))
    _add(capsys, db, *write_series(tmp_path / "m64r5", [50.0] * 2, ttft=[1288.0] * 2, first=12,
                                   settings=_quick(64, requests=5), **QUICK))
    rc, out, err = run_cli(capsys, "history", "check", "--db", str(db), "--metric", "ttft_ms", "--json")
    assert rc == 0, (out, err)
    doc = json.loads(out)
    assert doc["changes"] == [] and doc["failing"] == 0
    setups = doc["setups"]
    assert [(su["setup"], su["profile"], su["runs"]) for su in setups] == [(1, "quick", 10), (2, "quick", 4)]
    keys = [su["settings_key"] for su in setups]
    assert len(set(keys)) == 2 and all(re.fullmatch(r"[0-9a-f]{8}", k) for k in keys)
    assert {s["settings_key"] for s in doc["series"]} == set(keys)
    assert [su["label"] for su in setups] == [
        f"profile quick, model bench-sim, http://127.0.0.1:8123/v1, settings {keys[0]} (max_tokens 16)",
        f"profile quick, model bench-sim, http://127.0.0.1:8123/v1, settings {keys[1]} (max_tokens 64)"]
    monkeypatch.setenv("COLUMNS", "120")
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--metric", "ttft_ms")
    assert rc == 0 and f"setup 2, 4 runs: {setups[1]['label']}" in out.splitlines()
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db))
    assert rc == 0 and f"setup 1, 10 runs: {setups[0]['label']}" in out.splitlines()
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db), "--json")
    assert [r["settings_key"] for r in json.loads(out)] == [keys[0]] * 10 + [keys[1]] * 4
    # which cells a sweep has (a cell's id names them) is not a setting: adding a depth keeps the d0 series
    from bench.history.store import measured_settings, settings_key

    def key(settings: dict) -> str:
        return settings_key(measured_settings(json.dumps({"profile": settings, "load": None})))

    wider = _quick(16)
    wider["sweeps"][1] = {**wider["sweeps"][1], "depths": [0, 32768], "streams": [1, 4]}
    assert key(wider) == key(_quick(16)) == keys[0]
    assert key({**wider, "sweeps": [{**wider["sweeps"][0], "max_tokens": 64}, wider["sweeps"][1]]}) != keys[0]


def test_check_filters_by_profile_model_endpoint(tmp_path, capsys) -> None:
    db = _two_profiles(tmp_path, capsys)
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--profile", "mid", "--json")
    assert rc == 0 and {s["profile"] for s in json.loads(out)["series"]} == {"mid"}
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--model", "bench-sim", "--endpoint",
                         SMALL["url"], "--json")
    assert rc == 0 and [s["profile"] for s in json.loads(out)["setups"]] == ["small", "mid"]
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--profile", "small")
    assert rc == 0 and "setup" not in out  # one setup: no setup names
    for opt, val in (("--profile", "big"), ("--model", "other"), ("--endpoint", "http://x/v1")):
        rc, _, err = run_cli(capsys, "history", "check", "--db", str(db), opt, val)
        assert rc == 3 and len(err.strip().splitlines()) == 1 and f"no stored run matches {opt} {val}" in err
        assert "profile small" in err and "profile mid" in err  # what is stored


def test_report_history_draws_each_setup_apart(tmp_path, capsys) -> None:
    pytest.importorskip("plotly")
    db = _two_profiles(tmp_path, capsys)
    out = tmp_path / "t.html"
    rc, _, err = run_cli(capsys, "report", "--history", str(db), "-o", str(out))
    assert rc == 0, err
    page = out.read_text(encoding="utf-8")
    assert "d0-s1-prose: decode_tok_s median over 7 runs" in page and "over 10 runs" not in page
    assert "profile small, model bench-sim" in page and "profile mid, model bench-sim" in page
    run = tmp_path / "small" / "run000" / "results.json"
    rc, _, err = run_cli(capsys, "report", str(run), "--history", str(db), "-o", str(tmp_path / "both.html"))
    assert rc == 0, err
    assert "over 10 runs" not in (tmp_path / "both.html").read_text(encoding="utf-8")


# --- empty stores, URLs, the option named ------------------------------------------------------------------------


def test_an_empty_store_says_so(tmp_path, capsys) -> None:
    from bench.history.store import open_store

    db = tmp_path / "e.db"
    open_store(db).close()
    rc, out, err = run_cli(capsys, "history", "runs", "--db", str(db))
    assert rc == 0 and out == "" and f"no runs stored in {db}" in err
    rc, out, err = run_cli(capsys, "history", "runs", "--db", str(db), "--json")
    assert rc == 0 and json.loads(out) == [] and "no runs stored" in err
    rc, out, err = run_cli(capsys, "history", "export", "--csv", "--db", str(db))
    assert rc == 0 and len(out.splitlines()) == 1 and "no runs stored" in err
    rc, _, err = run_cli(capsys, "history", "check", "--db", str(db))
    assert rc == 3 and "no runs stored" in err and len(err.strip().splitlines()) == 1
    pytest.importorskip("plotly")
    rc, _, err = run_cli(capsys, "report", "--history", str(db), "-o", str(tmp_path / "t.html"))
    assert rc == 0 and f"no runs stored in {db}" in err


def test_messages_name_the_option_given(tmp_path, capsys) -> None:
    run = write_series(tmp_path / "runs", [50.0])[0]
    rc, _, err = run_cli(capsys, "report", str(run), "--history", str(tmp_path / "none.db"), "-o",
                         str(tmp_path / "r.html"))
    assert rc == 3 and f"--history {tmp_path / 'none.db'}: not found" in err and "--db" not in err
    rc, _, err = run_cli(capsys, "report", "--history", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert rc == 3 and "--history" in err and "--db" not in err  # a folder


@pytest.mark.parametrize("url", ["mysql://x", "mysql://u:s3cret@host/db", "sqlite://h.db", "http://host/h.db"])
def test_a_store_url_of_another_scheme_is_refused(tmp_path, capsys, monkeypatch, url) -> None:
    monkeypatch.chdir(tmp_path)
    run = write_series(tmp_path / "runs", [50.0])[0]
    for args in (["history", "runs", "--db", url], ["history", "add", str(run), "--db", url],
                 ["history", "check", "--db", url], ["history", "export", "--csv", "--db", url],
                 ["report", "--history", url, "-o", "r.html"]):
        rc, _, err = run_cli(capsys, *args)
        assert rc == 3 and len(err.strip().splitlines()) == 1, (args, err)
        assert "unsupported: give a file path, sqlite:///path or postgresql://..." in err, (args, err)
        assert "s3cret" not in err and "not found" not in err and "cannot open" not in err
    assert list(tmp_path.iterdir()) == [tmp_path / "runs"]  # no file made of the URL


# --- the text at 80 columns ---------------------------------------------------------------------------------------


def test_runs_is_a_table_that_fits_80_columns(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    deep = tmp_path / "a-rather-long-folder-name-for-results" / "nightly"
    db = tmp_path / "h.db"
    rc, _, err = run_cli(capsys, "history", "add", *map(str, write_series(deep, [50.0, 51.0], **SMALL)), "--db",
                         str(db), "--commit", "0123456789abcdef", "--branch", "main")
    assert rc == 0 and "(2 runs stored)" in err
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db))
    lines = out.splitlines()
    assert rc == 0 and all(len(ln) <= 80 for ln in lines), lines
    assert re.split(r"\s{2,}", lines[0].strip()) == ["#", "run id", "started (UTC)", "commit", "branch", "source"]
    row = re.split(r"\s{2,}", lines[1].strip())
    assert row[:5] == ["0", "00000000", "2026-12-01 00:00:00", "0123456789", "main"]
    assert row[5].startswith("...") and row[5].endswith("run000/results.json")  # a long path keeps its end
    assert lines[1].index("00000000") == lines[0].index("run id")  # the columns line up
    assert lines[2].index("...") == lines[0].index("source")
    assert lines[-1] == "2 runs of profile small, model bench-sim, http://127.0.0.1:8000/v1"
    # several setups: a setup column and a numbered legend
    _add(capsys, db, *write_series(tmp_path / "mid", [25.0], first=2, **MID))
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db))
    lines = out.splitlines()
    assert "setup" in lines[0].split() and re.split(r"\s{2,}", lines[3].strip())[5] == "2"
    assert lines[-2:] == ["setup 1, 2 runs: profile small, model bench-sim, http://127.0.0.1:8000/v1",
                          "setup 2, 1 run: profile mid, model bench-sim, http://127.0.0.1:8000/v1"]


def test_check_lines_fit_80_columns_and_say_1_run(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for k in ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT"):
        monkeypatch.delenv(k, raising=False)  # no commit known
    db = tmp_path / "h.db"
    files = write_series(tmp_path / "r", stepped(24, 18, -10.0, seed=1), cells=("d2048-s1-prose",))
    _add(capsys, db, *files)
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(db), "--recent", "6")
    lines = out.splitlines()
    assert rc == 1 and all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert lines[0] == "d2048-s1-prose decode_tok_s median: 24 runs, noise " + lines[0].split("noise ")[1]
    assert lines[1] == "    allowance 5 % (default rule max_drop_pct = 5)"
    assert lines[2].startswith("  d2048-s1-prose decode_tok_s median: -") and lines[2].endswith(
        " % regression at run 18 FAIL")
    assert lines[4] == "      run 00000012, started 2026-12-01T00:18:00+00:00, commit -"  # none: as history runs
    rc, out, _ = run_cli(capsys, "history", "runs", "--db", str(db))
    assert out.splitlines()[1].split()[4] == "-"  # the commit column
    assert lines[-2:] == ["24 runs; 1 change point(s)",
                          "1 regression(s) beyond the allowance within the last 6 runs"]
    one = tmp_path / "one.db"
    rc, _, err = run_cli(capsys, "history", "add", str(files[0]), "--db", str(one))
    assert rc == 0 and "(1 run stored)" in err
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(one))
    assert rc == 0 and "too short (1 run; at least 6 are needed)" in out and "1 runs" not in out
    assert out.splitlines()[-2:] == ["1 run; 0 change point(s)",
                                     "nothing judged: every series has fewer than 6 runs (need 6)"]
    monkeypatch.setenv("COLUMNS", "120")  # wider: one line
    rc, out, _ = run_cli(capsys, "history", "check", "--db", str(one))
    assert out.splitlines()[-1] == "1 run; 0 change point(s); nothing judged: every series has fewer than 6 runs (need 6)"
