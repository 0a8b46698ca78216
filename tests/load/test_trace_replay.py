"""Trace replay as a new user meets it (issue 31, point 4): each request's output compared with its own
``output_length``, every request of a trace in the statistics, hash ids that do not fit ``--block-tokens`` refused
with one line, and warnings that name the point (``trace-NAME``), not an internal cell id."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config.load import LoadSettings
from bench.errors import ConfigError
from bench.load.point import default_window
from bench.load.traces import load_trace
from bench.sim import SimConfig

SIM_CONFIG = SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6)
OUTPUTS = [3, 14, 5, 9, 14, 7]


def _six(path: Path, block: int = 16, ids_per: int | None = None) -> Path:
    lines = []
    for i, out in enumerate(OUTPUTS):
        n_in = 40 + 8 * i
        ids = list(range(100 * i, 100 * i + (ids_per if ids_per is not None else -(-n_in // block))))
        lines.append(json.dumps({"timestamp": 500 * i, "input_length": n_in, "output_length": out,
                                 "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HOME": str(cwd)})


def test_a_six_line_trace_replays_every_request_each_to_its_own_length(sim, tmp_path):
    trace = _six(tmp_path / "mooncake.jsonl")
    r = _bench("run", sim, "--trace", str(trace), "--block-tokens", "16", "--out", "t", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    [cell] = res["cells"]
    assert cell["id"] == "trace-mooncake"
    assert cell["requests_ok"] == 6 and cell["window"]["requests"] == 6  # no warm-up/cool-down cut
    assert cell["output_tokens"]["max"] == max(OUTPUTS)
    warns = cell["warnings"] + res["warnings"]
    assert not [w for w in warns if "stopped before" in w], warns
    assert not [w for w in warns if re.search(r"\bd\d+-s\d+-", w)], warns  # the point's name, not a cell id


def test_a_request_that_stops_early_is_named_against_its_own_length():
    from bench.config.profile import Cell
    from bench.measure.summary import summarize_cell
    from bench.records import Event, RequestRecord

    def rec(i: int, asked: int, got: int) -> RequestRecord:
        ev = [Event(t_ns=1_000_000 * (k + 1), content="x", tokens=1) for k in range(got)]
        return RequestRecord(f"r{i}", "chat", "m", sent_ns=1, end_ns=1_000_000 * (got + 1), status=200, events=ev,
                             done=True, finish_reason="stop", usage={"completion_tokens": got, "prompt_tokens": 8},
                             meta={"max_tokens": asked})

    cell = Cell("trace", 8, 0, "prose", 14, 3, label="trace-x")
    ok = summarize_cell(cell, [rec(0, 3, 3), rec(1, 14, 14), rec(2, 5, 5)], [["r0", "r1", "r2"]], None)
    assert not [w for w in ok.warnings if "stopped before" in w]
    short = summarize_cell(cell, [rec(0, 3, 3), rec(1, 14, 9), rec(2, 5, 5)], [["r0", "r1", "r2"]], None)
    [w] = [w for w in short.warnings if "stopped before" in w]
    assert w.startswith("trace-x: 1 request(s) stopped before the max_tokens each asked for")


def test_trace_window_keeps_every_request_unless_asked():
    class Run:
        span_s = 3.0

    ls = LoadSettings(mode="trace", trace="x.jsonl")
    assert default_window(Run(), ls) == (0.0, 3.0)
    assert default_window(Run(), LoadSettings(mode="trace", trace="x.jsonl", warmup_s=1.0)) == (1.0, 3.0)
    lo, hi = default_window(Run(), LoadSettings(mode="rate", rate=2.0, duration_s=3.0))
    assert lo > 0 and hi < 3.0  # synthetic load keeps its window


def test_hash_ids_that_do_not_fit_block_tokens_are_refused(tmp_path):
    coarse = _six(tmp_path / "t.jsonl", block=512)  # one id per request: made with blocks of 512
    assert load_trace(coarse, block_tokens=512)[0].blocks == (0,)
    with pytest.raises(ConfigError, match=r"no request's hash_ids match its input_length in blocks of --block-tokens "
                                          r"16; the file fits --block-tokens 512 \(the published"):
        load_trace(coarse, block_tokens=16)
    fine = _six(tmp_path / "f.jsonl", block=16)  # made with blocks of 16
    with pytest.raises(ConfigError, match=r"f.jsonl:1: 3 hash_ids for input_length 40, more than its 1 blocks of "
                                          r"--block-tokens 64; the file fits --block-tokens 16"):
        load_trace(fine, block_tokens=64)
    assert load_trace(fine, block_tokens=16)[0].blocks == (0, 1, 2)
    partial = _six(tmp_path / "p.jsonl", block=16, ids_per=3)  # some with fewer ids than blocks: the rest unique
    assert load_trace(partial, block_tokens=16)[5].blocks == (500, 501, 502)


def test_cli_refuses_an_inconsistent_trace_with_one_line(sim, tmp_path):
    trace = _six(tmp_path / "t.jsonl", block=16)
    r = _bench("run", sim, "--trace", str(trace), "--block-tokens", "8", "--out", "t", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--block-tokens 16" in lines[0], r.stderr
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())
