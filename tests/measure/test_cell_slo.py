"""``--slo`` in concurrency mode (issue 14): each cell of a sweep gets ``goodput``, ``slo`` and ``slo_met``,
computed by the open-loop code (bench.measure.slo) over the cell's measured waves; checked against ``bench sim``,
whose timing is known, and the sweep's own records.

Sim of the sweep: no prefill to speak of, decode steps of ``t(b) = 10 + 4 * b`` ms for a batch of b, 16 output
tokens: TPOT is about 14 ms at 1 stream and 26 ms at 4 streams, so ``tpot_p90=20ms`` holds for every request of
the 1-stream cell and for none of the 4-stream cell, and ``ttft_p90=60s`` for all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.cli.app import main
from bench.config.profile import parse_profile
from bench.errors import ConfigError
from bench.measure.metrics import request_metrics
from bench.records import read_records
from bench.results import load_results

ROOT = Path(__file__).resolve().parents[2]
SLO = "ttft_p90=60s,tpot_p90=20ms"
PROFILE = """name = "slo-cells"
max_tokens = 16
requests = 8
warmup = 1
overhead_probes = 1

[[sweep]]
depths = [0]
streams = [1, 4]
prompts = ["prose"]
"""


@pytest.fixture(scope="module")
def slo_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``bench run URL -p PROFILE --slo SLO`` (no --rate) against the sim, stdout a pipe, COLUMNS=80."""
    from bench.sim import SimConfig, running_sim

    d = tmp_path_factory.mktemp("slo")
    prof = d / "p.toml"
    prof.write_text(PROFILE)
    out = d / "res"
    env = {**os.environ, "COLUMNS": "80"}
    with running_sim(SimConfig(decode_step_ms=10.0, decode_step_ms_per_seq=4.0, prefill_tok_s=1e9)) as url:
        proc = subprocess.run([sys.executable, "-m", "bench", "run", url, "-p", str(prof), "--out", str(out),
                               "--slo", SLO], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    yield {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "out": out}


def _waves(out: Path) -> dict[str, list[list[Any]]]:
    """The measured records of each cell, per wave (from records.jsonl, by their meta)."""
    by: dict[str, dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for r in read_records(out / "records.jsonl"):
        if r.meta.get("phase") == "measure":
            by[r.meta["cell"]][r.meta["wave"]].append(r)
    return {cid: [w[k] for k in sorted(w)] for cid, w in by.items()}


def test_the_flag_is_accepted_without_rate_and_every_cell_has_goodput_and_slo(slo_sweep):
    assert slo_sweep["rc"] == 0, slo_sweep["stderr"]
    doc = json.loads((slo_sweep["out"] / "results.json").read_text())
    assert load_results(slo_sweep["out"] / "results.json").cells  # the typed loader accepts the document
    assert [c["id"] for c in doc["cells"]] == ["d0-s1-prose", "d0-s4-prose"]
    for c in doc["cells"]:
        assert set(c["goodput"]) == {"rps", "tok_s", "met_fraction"}, c["id"]
        assert set(c["slo"]) == {"ttft_p90", "tpot_p90"}, c["id"]
        assert all(set(v) == {"value", "limit_ms", "held"} for v in c["slo"].values())
        assert c["slo"]["ttft_p90"]["limit_ms"] == 60000.0 and c["slo"]["tpot_p90"]["limit_ms"] == 20.0
    assert dict(doc["profile"]["settings"]["load"])["slo"] == SLO  # the SLO the cells were scored against


def test_goodput_is_exact_over_the_measured_waves(slo_sweep):
    """rps = requests that met the SLO / the waves' wall time (each wave: first send -> last response end),
    tok_s likewise with their output tokens, met_fraction = met / all measured requests."""
    assert slo_sweep["rc"] == 0, slo_sweep["stderr"]
    cells = {c["id"]: c for c in json.loads((slo_sweep["out"] / "results.json").read_text())["cells"]}
    waves = _waves(slo_sweep["out"])
    for cid, streams, met_all in (("d0-s1-prose", 1, True), ("d0-s4-prose", 4, False)):
        c, ws = cells[cid], waves[cid]
        assert len(ws) == c["waves"] == 8 // streams and all(len(w) == streams for w in ws)
        spans = [(max(r.sent_ns + r.end_ns for r in w) - min(r.sent_ns for r in w)) / 1e9 for w in ws]
        n = sum(len(w) for w in ws)
        # the sim's timing: 16 steps of 10 + 4 * streams ms per wave (a loaded machine only adds)
        assert all(16 * (10 + 4 * streams) / 1000 <= s < 2.5 * 16 * (10 + 4 * streams) / 1000 for s in spans), spans
        if met_all:  # an objective every request meets
            assert c["goodput"] == {"rps": round(n / sum(spans), 4), "tok_s": round(16 * n / sum(spans), 3),
                                    "met_fraction": 1.0}
            assert c["slo_met"] is True and all(v["held"] for v in c["slo"].values())
        else:  # one no request meets (TPOT about 26 ms > 20)
            assert c["goodput"] == {"rps": 0.0, "tok_s": 0.0, "met_fraction": 0.0}
            assert c["slo_met"] is False and c["slo"]["ttft_p90"]["held"] and not c["slo"]["tpot_p90"]["held"]


def test_each_objective_is_computed_per_cell(slo_sweep):
    """Each cell's tpot_p90 is the 90th percentile of its own requests' TPOT, near the sim's step time."""
    assert slo_sweep["rc"] == 0, slo_sweep["stderr"]
    cells = {c["id"]: c for c in json.loads((slo_sweep["out"] / "results.json").read_text())["cells"]}
    waves = _waves(slo_sweep["out"])
    for cid, streams in (("d0-s1-prose", 1), ("d0-s4-prose", 4)):
        tpot = [request_metrics(r).tpot_ms for w in waves[cid] for r in w]
        ttft = [request_metrics(r).ttft_ms for w in waves[cid] for r in w]
        got = cells[cid]["slo"]
        assert got["tpot_p90"]["value"] == pytest.approx(float(np.percentile(tpot, 90)), abs=1e-3)
        assert got["ttft_p90"]["value"] == pytest.approx(float(np.percentile(ttft, 90)), abs=1e-3)
        assert got["tpot_p90"]["value"] == pytest.approx(10 + 4 * streams, rel=0.25)


def test_terminal_summary_shows_each_cells_slo_within_80_columns(slo_sweep):
    assert slo_sweep["rc"] == 0, slo_sweep["stderr"]
    lines = slo_sweep["stdout"].splitlines() + slo_sweep["stderr"].splitlines()
    assert not [ln for ln in lines if len(ln) > 80]
    out = slo_sweep["stdout"]
    from bench.report.export import slo_field

    for c in load_results(slo_sweep["out"] / "results.json").cells:
        assert slo_field(c) in out, (c.id, out)
    assert "100 % met; held" in out and "0 % met; missed tpot_p90 (" in out
    assert "SLO ttft_p90 <= 60 s, tpot_p90 <= 20 ms: held in 1 of 2 cells" in out


def test_a_profile_slo_scores_concurrency_cells_and_the_flag_wins() -> None:
    from bench.cli.capacity import load_settings, with_cell_slo

    data = {"sweep": [{"streams": [1, 2]}], "load": {"slo": "ttft_p90=2s"}}
    p = parse_profile(data, "x")
    assert p.mode == "concurrency" and p.slo == "ttft_p90=2s"
    flags = {k: None for k in ("rate", "duration", "trace", "users", "slo")}
    assert load_settings(p, {**flags, "slo": "tpot_p90=60ms"}) is None  # concurrency: not an open-loop run
    assert with_cell_slo(p, "tpot_p90=60ms").slo == "tpot_p90=60ms"
    assert with_cell_slo(p, None) is p
    assert parse_profile({"sweep": [{}]}, "y").slo is None
    with pytest.raises(ConfigError, match="load: slo"):
        parse_profile({**data, "load": {"slo": "ttft_p90=fast"}}, "x")
    with pytest.raises(ConfigError, match="--slo"):
        with_cell_slo(p, "ttft <= 2")  # no unit
    with pytest.raises(ConfigError, match="--duration applies to open-loop runs"):
        load_settings(p, {**flags, "slo": "ttft_p90=2s", "duration": 5.0})
    for extra in ({}, {"rate": 1.0, "requests": 2}):  # it said "add --rate R", then --rate ignored --turns
        with pytest.raises(ConfigError, match="--turns applies to multi-turn runs: add --sessions N"):
            load_settings(p, {**flags, **extra, "turns": 2})
    with pytest.raises(ConfigError, match="--think applies to multi-turn runs"):
        load_settings(p, {**flags, "think": 2.0})
    assert load_settings(p, {**flags, "users": 2, "turns": 2}).turns == 2  # type: ignore[union-attr]
    for a, b in (("users", "rate"), ("trace", "users"), ("trace", "rate")):  # one silently won
        with pytest.raises(ConfigError, match="ask for two open-loop modes"):
            load_settings(p, {**flags, a: 2 if a == "users" else "t.csv", b: 5.0 if b == "rate" else 2})


def test_the_session_scores_cells_from_the_profile_slo(tmp_path: Path) -> None:
    """The ``[load]`` key alone (no flag) gives the cells goodput, through ``bench run -p``."""
    from bench.sim import SimConfig, running_sim

    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE.replace("streams = [1, 4]", "streams = [2]").replace("requests = 8", "requests = 2")
                    + '\n[load]\nslo = "e2e_max=60s"\n')
    out = tmp_path / "res"
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e9)) as url:
        assert main(["run", url, "-p", str(prof), "--out", str(out), "--json"]) == 0
    [c] = json.loads((out / "results.json").read_text())["cells"]
    assert c["goodput"]["met_fraction"] == 1.0 and c["slo_met"] is True and set(c["slo"]) == {"e2e_max"}


def test_capacity_by_concurrency_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.sim import SimConfig, running_sim

    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e9, max_running=2)) as url:
        rc = main(["capacity", url, "--by", "concurrency", "--slo", "ttft_p90=2s", "--input-tokens", "16",
                   "--max-tokens", "4", "--start", "1", "--max-load", "4", "--trials", "1", "--max-points", "4",
                   "--out", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["by"] == "concurrency" and doc["points"]
    for p in doc["points"]:
        assert set(p["goodput"]) == {"rps", "tok_s", "met_fraction"} and p["load"] == int(p["load"])
        assert (Path(p["dir"]) / "point.json").is_file()


def test_waves_wall_time_runs_from_first_send_to_last_end_per_wave() -> None:
    from bench.measure.slo import waves_wall_s
    from bench.records import RequestRecord

    s = 1_000_000_000

    def r(rid: str, sent_s: float, took_s: float, ok: bool = True) -> RequestRecord:
        rec = RequestRecord(rid, "chat", "m", sent_ns=int(sent_s * s), end_ns=int(took_s * s))
        rec.error = None if ok else "HTTP 500"
        return rec

    recs = [r("a", 10.0, 0.5), r("b", 10.1, 0.2), r("c", 20.0, 0.3), r("d", 20.05, 0.75, ok=False)]
    # wave 1: 10.0 -> 10.5; wave 2: 20.0 -> 20.8 (the failed request ends it); the 9.5 s between waves not counted
    assert waves_wall_s(recs, [["a", "b"], ["c", "d", "lost"]]) == pytest.approx(0.5 + 0.8)
    assert waves_wall_s(recs, [["lost"]]) == 0.0
    assert waves_wall_s([*recs, RequestRecord("never", "chat", "m")], [["a", "never"]]) == pytest.approx(0.5)


def test_slo_field_is_short_and_names_what_missed() -> None:
    from bench.report.export import slo_field
    from bench.results import CellResult

    c = CellResult(id="x", goodput={"rps": 1.23456, "tok_s": 78.9, "met_fraction": 0.9996},
                   slo={"ttft_p90": {"value": 2345.6, "limit_ms": 2000.0, "held": False},
                        "tpot_p90": {"value": None, "limit_ms": 60.0, "held": False},
                        "e2e_max": {"value": 10.0, "limit_ms": 30000.0, "held": True}})
    assert slo_field(c) == ("1.23 req/s, 79 tok/s, 99.9 % met; missed ttft_p90 (2,346 > 2000 ms), "
                            "tpot_p90 (failed requests)")
    assert slo_field(CellResult(id="y")) == "-"
    few = CellResult(id="z", goodput={"rps": 0.01, "tok_s": 0.2, "met_fraction": 0.0004},
                     slo={"ttft_max": {"value": 99.0, "limit_ms": 100.0, "held": True}})
    assert slo_field(few) == "0.01 req/s, 0 tok/s, 0.1 % met; held"  # some met: never shown as 0 %
