"""The one driver: every measuring mode stops the same way on SIGINT and SIGTERM (exit 130, every finished record
kept, results.json / capacity.json marked interrupted, no traceback), and ``--resume`` never appends a second run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from bench.sim import SimConfig

SIM_CONFIG = SimConfig(decode_step_ms=10.0, prefill_tok_s=1e6)  # the shared `sim` fixture


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _measuring(records: Path) -> bool:
    return records.exists() and '"phase":"measure"' in records.read_text()


def _stop_when(p: subprocess.Popen[str], ready: Callable[[], bool], sig: signal.Signals, timeout_s: float = 60) -> str:
    """Send ``sig`` once ``ready()`` (the run is measuring), then wait; returns stderr."""
    t0 = time.monotonic()
    while not ready():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < timeout_s, "the run never started measuring"
        time.sleep(0.1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    return err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_open_loop_interrupt_keeps_a_typed_partial_result(sim: str, tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "ol"
    p = _start(["run", sim, "--rate", "5", "--duration", "60", "--max-tokens", "64", "--out", str(out)])
    err = _stop_when(p, lambda: _measuring(out / "records.jsonl"), sig)
    assert p.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and f"interrupted ({sig.name})" in err
    doc = json.loads((out / "results.json").read_text())
    assert doc["run"]["interrupted"] is True and doc["run"]["complete"] is False
    (cell,) = doc["cells"]
    recs = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["meta"].get("phase") == "measure"]
    assert cell["counts"]["finished"] + cell["counts"]["failed"] + cell["counts"]["cut"] == len(measured) >= 1
    assert cell["counts"]["planned"] > len(measured)
    assert any("interrupted" in w for w in cell["warnings"])
    # the depth a finished point reports (the median planned prompt), not 0
    import statistics

    assert cell["depth"] == int(statistics.median(r["meta"]["target_tokens"] for r in measured)) > 0
    assert (out / "results.csv").exists() and (out / "results.md").exists()
    from bench.results import load_results

    assert load_results(out / "results.json").run.interrupted  # the partial document loads back

    r = subprocess.run([sys.executable, "-m", "bench", "run", sim, "--rate", "5", "--duration", "60", "--out",
                        str(out), "--resume"], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_BAD_INPUT and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--resume" in r.stderr and (out / "records.jsonl").read_text().splitlines() == \
        [json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in recs]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_open_loop_interrupt_from_worker_processes_keeps_their_records(sim: str, tmp_path: Path,
                                                                      sig: signal.Signals) -> None:
    """``--workers 2``: the workers hold their records until the schedule ends, so an interrupt kept none of
    them (0 of 143 ended, a new user found). Now the pool stops the workers (nothing more sent, in flight cut)
    and keeps what they finished."""
    out = tmp_path / "olw"
    p = _start(["run", sim, "--rate", "8", "--duration", "60", "--max-tokens", "16", "--workers", "2",
                "--out", str(out)])
    started: list[float] = []

    def sending() -> bool:  # the workers' records come back at the end: wait a few seconds into the schedule
        if not (out / "records.jsonl").exists():
            return False
        started.append(started[0] if started else time.monotonic())
        return time.monotonic() - started[0] > 4.0

    err = _stop_when(p, sending, sig)
    assert p.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    (cell,) = json.loads((out / "results.json").read_text())["cells"]
    recs = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    measured = [r for r in recs if r["meta"].get("phase") == "measure"]
    assert cell["counts"]["finished"] >= 10 and cell["counts"]["planned"] > len(measured)
    assert cell["counts"]["finished"] + cell["counts"]["failed"] + cell["counts"]["cut"] == len(measured)
    assert all(r["error_kind"] == "cancelled" for r in measured if r.get("error"))


def test_capacity_interrupt_writes_the_points_so_far(sim: str, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    p = _start(["capacity", sim, "--slo", "ttft_p90=300ms", "--input-tokens", "64", "--max-tokens", "8",
                "--duration", "3", "--start", "2", "--out", str(out)])
    err = _stop_when(p, lambda: any(_measuring(f) for f in (out / "points").glob("*/records.jsonl")), signal.SIGTERM)
    assert p.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["interrupted"] is True and doc["boundary"] is None
    done = sorted((out / "points").glob("*/point.json"))
    assert len(doc["points"]) == len(done)
    # the point it cut: named with its folder and the records it kept (that folder has no point.json)
    cut = doc["cut_point"]
    folders = sorted((out / "points").iterdir())
    if cut is None:  # the signal came between two points: every folder is a finished point
        assert all((f / "point.json").exists() for f in folders), folders
    else:
        assert not (Path(cut["dir"]) / "point.json").exists() and "cut_point" in doc["note"], cut
        assert cut["records"] == len((Path(cut["dir"]) / "records.jsonl").read_text().splitlines())
    r = subprocess.run([sys.executable, "-m", "bench", "capacity", sim, "--slo", "ttft_p90=300ms", "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_BAD_INPUT and "--overwrite" in r.stderr, r.stderr


def test_resume_refuses_other_settings(sim: str, tmp_path: Path) -> None:
    """``--resume`` with other flags measured the rest with them and merged both into one results file (cells of
    32 and 64 output tokens side by side, ``profile.settings`` saying 64). Now it is refused, naming what changed;
    the same flags resume."""
    out = tmp_path / "rs"
    base = ["run", sim, "--streams", "1,2", "--depths", "0", "--repeats", "40", "--out", str(out)]
    p = _start([*base, "--max-tokens", "32"])
    _stop_when(p, lambda: _measuring(out / "records.jsonl"), signal.SIGTERM)
    assert p.returncode == EXIT_INTERRUPTED
    before = (out / "records.jsonl").read_text()
    r = subprocess.run([sys.executable, "-m", "bench", *base, "--max-tokens", "64", "--resume"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EXIT_BAD_INPUT and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "max_tokens 32 -> 64" in r.stderr and (out / "records.jsonl").read_text() == before
    r = subprocess.run([sys.executable, "-m", "bench", *base[:-2], "--streams", "1,4", "--out", str(out),
                        "--max-tokens", "32", "--resume"], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_BAD_INPUT and "streams [1, 2] -> [1, 4]" in r.stderr, r.stderr
