"""Open-loop runs and the capacity search against the real llama-server (SmolLM2-135M, 4 slots): they succeed and
report sane figures (the sim tests check the figures against known truth)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli.app import main

pytestmark = pytest.mark.engine


def test_rate_run_real_engine(llama_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", llama_server, "--rate", "1", "--duration", "5", "--input-tokens", "64", "--max-tokens", "16",
               "--slo", "ttft_p90=5s,tpot_p90=500ms", "--drain", "300", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    c = json.loads(out)["cells"][0]
    assert c["counts"]["planned"] == c["counts"]["finished"] > 0 and c["counts"]["cut"] == 0
    assert c["schedule"]["achieved_rps"] == pytest.approx(c["schedule"]["planned_rps"], rel=0.05)
    assert c["schedule"]["send_lag_ms"]["p50"] < 50
    assert 0 < c["latency"]["ttft_ms"]["from_send"]["median"] <= c["latency"]["ttft_ms"]["from_schedule"]["median"]
    assert set(c["goodput"]) == {"rps", "tok_s", "met_fraction"} and 0 <= c["goodput"]["met_fraction"] <= 1
    assert set(c["slo"]) == {"ttft_p90", "tpot_p90"}
    recs = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["meta"].get("phase") == "measure"]
    assert measured and all(isinstance(r["scheduled_ns"], int) for r in measured)
    assert all(r["usage"]["completion_tokens"] == 16 for r in measured if r["ok"])


def test_capacity_real_engine(llama_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["capacity", llama_server, "--slo", "ttft_p90=2s", "--input-tokens", "32", "--max-tokens", "8",
               "--duration", "4", "--start", "1", "--factor", "2", "--resolution", "0.5", "--trials", "1",
               "--max-points", "5", "--drain", "60", "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["by"] == "rate" and doc["points"]
    assert json.loads((tmp_path / "capacity.json").read_text())["points"] == doc["points"]
    lo, hi = doc["interval"]
    if lo is not None and hi is not None:
        assert lo < hi and lo <= doc["boundary"] <= hi
    for p in doc["points"]:
        assert (p["achieved_rps"] is None or p["achieved_rps"] > 0) and p["completed_rps"] >= 0
        assert (Path(p["dir"]) / "records.jsonl").is_file()


def test_rate_run_checks_its_schedule_not_the_profiles_cells(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A server with a 2,048-token context: the default profile's 2,048-token cell would not fit, but an
    open-loop run never sends it, so 32-token requests run; a schedule whose requests do not fit is refused up
    front with one line (exit 3) naming the schedule's largest request. Found running a rate ladder on a server
    with small slots (benchmarks/gpu/run_h200.sh, step ratecap)."""
    from bench.tools.engine import LocalEngine

    with LocalEngine(parallel=2, ctx_size=2048) as eng:
        rc = main(["run", eng.url, "--rate", "5", "--duration", "3", "--input-tokens", "32", "--max-tokens", "8",
                   "--warmup", "0", "--cooldown", "0", "--out", str(tmp_path / "ok"), "--json"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        c = json.loads(out)["cells"][0]
        assert c["counts"]["finished"] == c["counts"]["planned"] > 0
        rc = main(["run", eng.url, "--rate", "2", "--duration", "2", "--input-tokens", "2100", "--max-tokens", "8",
                   "--out", str(tmp_path / "big")])
        out, err = capsys.readouterr()
    assert rc == 3, err
    assert "the rate schedule: its largest request, 2108 prompt + output tokens, does not fit" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
