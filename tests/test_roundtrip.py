"""Every document bench writes loads back in every command that reads it (issue 31, point 1).

The unit half stores each shipped profile the way a run does and reads its gate rules back; the end-to-end half
runs ``-p ci-gate`` twice against ``bench sim`` and feeds what the runs wrote to ``compare``, ``report``,
``history add`` and ``gate --baseline``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.config.profile import PROFILES_DIR, load_profile, profile_settings
from bench.gate import Rule, default_rules, rules_from_results
from bench.results import EndpointInfo, ProfileInfo, Results, RunInfo, results_from_dict, to_json
from bench.sim import SimConfig

# 20 ms decode steps and TTFT at 1K about 200 ms (the sim's defaults): figures large against a busy machine's
# jitter, so that two runs of ci-gate against the same sim are decided (exit 0) rather than inconclusive (exit 2;
# with 2 ms steps on a loaded 2-core machine the decode MDE reached 11 % against the 5 % allowance).
SIM_CONFIG = SimConfig(decode_step_ms=20.0, prefill_tok_s=5000.0)


def _stored(profile_name: str) -> Results:
    p = load_profile(profile_name)
    doc = Results(profile=ProfileInfo(p.name, p.source, profile_settings(p)), endpoint=EndpointInfo("u", "m"),
                  run=RunInfo(id="r", started="2026-12-02T00:00:00+00:00"))
    return results_from_dict(json.loads(to_json(doc)), "stored")


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES_DIR.glob("*.toml") if not p.stem.startswith("sim")))
def test_every_shipped_profile_stores_rules_that_read_back(name):
    p = load_profile(name)
    back = rules_from_results(_stored(name))
    assert back == (list(p.gate) if p.gate else default_rules())


def test_ci_gate_rules_are_stored_as_gate_tables():
    settings = _stored("ci-gate").profile.settings
    assert settings["gate"][0] == {"metric": "decode_tok_s", "cell": "d0-s1-prose", "stat": "median",
                                   "max_drop_pct": 5.0}
    assert settings["gate"][2]["max_rise_pct"] == 10.0


def test_results_of_earlier_builds_with_parsed_rules_still_load():
    doc = results_from_dict({"schema": 1, "profile": {"name": "ci-gate", "settings": {"gate": [
        {"metric": "decode_tok_s", "cell": "d0-s1-prose", "stat": "median", "max_change_pct": 5.0, "index": 0},
        {"metric": "ttft_ms", "cell": "*", "stat": "p90", "max_change_pct": 10.0, "index": 1}]}},
        "endpoint": {"url": "u", "model": "m"}, "run": {"id": "r", "started": "x"}, "cells": []})
    assert rules_from_results(doc) == [Rule("decode_tok_s", "d0-s1-prose", "median", 5.0, 0),
                                       Rule("ttft_ms", "*", "p90", 10.0, 1)]


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HOME": str(cwd)})


@pytest.fixture(scope="module")
def two_runs(sim: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("roundtrip")
    for name in ("a", "b"):
        r = _bench("run", sim, "-p", "ci-gate", "--out", name, cwd=d)
        assert r.returncode == 0, r.stderr[-2000:]
    return {"dir": d, "url": sim}


def test_compare_reads_two_ci_gate_runs(two_runs):
    r = _bench("compare", "a/results.json", "b/results.json", cwd=two_runs["dir"])
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 3 would be an error; inconclusive verdicts exit 0
    assert "gate rules" in r.stdout and "unknown key" not in r.stderr


def test_report_history_and_gate_read_a_ci_gate_run(two_runs):
    d = two_runs["dir"]
    r = _bench("report", "a", "b/results.json", "-o", "r.html", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "<table" in (d / "r.html").read_text(encoding="utf-8")
    r = _bench("history", "add", "a/results.json", "b/results.json", "--db", "h.db", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    r = _bench("gate", two_runs["url"], "-p", "ci-gate", "--baseline", "a/results.json", "--out", "g", "--json",
               cwd=d)
    assert r.returncode in (0, 1, 2), r.stderr[-2000:]  # a verdict, whichever: 3 would be the baseline refused
    gate_doc = json.loads(r.stdout)
    assert gate_doc["verdicts"]
    r = _bench("report", "g", "-o", "g.html", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]


def test_ab_and_plot_documents_read_back(two_runs):
    d = two_runs["dir"]
    r = _bench("ab", two_runs["url"], two_runs["url"], "-p", "ci-gate", "--out", "ab", cwd=d)
    assert r.returncode in (0, 1, 2), r.stderr[-2000:]
    assert (d / "ab" / "ab.json").is_file() and (d / "ab" / "a" / "results.json").is_file()
    r = _bench("report", "ab", "-o", "ab.html", cwd=d)  # the folder: ab.json with a/ and b/ beside it
    assert r.returncode == 0, r.stderr[-2000:]
    page = (d / "ab.html").read_text(encoding="utf-8")
    assert "Gate verdicts" in page and "Figures per cell" in page
    r = _bench("compare", "ab/a/results.json", "ab/b/results.json", cwd=d)
    assert r.returncode in (0, 1, 2), r.stderr[-2000:]
    pytest.importorskip("matplotlib")
    r = _bench("plot", "a/results.json", "--out", "png", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
