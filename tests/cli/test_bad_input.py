"""Bad input gets one line and a distinct exit code; a run is never lost or mislabelled (SIGTERM, incomplete files,
--out holding a run, --resume, a full disk, a cell with no success)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.errors import ConfigError
from bench.records import RecordWriter, RequestRecord, read_records
from bench.results import load_results
from bench.sim import SimConfig, running_sim

TINY = 'max_tokens = 4\nrequests = 2\nwarmup = 0\noverhead_probes = 1\n[[sweep]]\nstreams = [1]\n'
TWO_CELLS = ('max_tokens = 16\nrequests = 6\nwarmup = 0\noverhead_probes = 1\n[[sweep]]\nstreams = [1]\n'
             'prompts = ["prose", "code"]\n')


def _bench(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "100"}, cwd=cwd)


SIM_CONFIG = SimConfig(decode_step_ms=2.0)  # the shared `sim` fixture


@pytest.fixture(scope="module")
def sim_url(sim: str) -> str:
    return sim


def _table(tmp: Path, sim_url: str) -> list[tuple[list[str], int, str]]:
    (tmp / "latin1.toml").write_bytes("name = 'caf\xe9'\n".encode("latin-1"))
    (tmp / "empty.toml").write_text('[[sweep]]\nstreams = []\n')
    (tmp / "nosweep.toml").write_text('sweep = []\n')
    (tmp / "afile").write_text("x")
    (tmp / "sim-bad.toml").write_text("decode_step_ms = 5\nbogus_field = 1\n")
    (tmp / "sim-syntax.toml").write_text("decode_step_ms = \n")
    bad_types = {"schema": 1, "profile": {"name": "p"}, "endpoint": {"url": "u"}, "run": {"id": "r"},
                 "cells": [{"id": "c", "waves": "three"}]}
    (tmp / "types.json").write_text(json.dumps(bad_types))
    (tmp / "notjson.json").write_text("{")
    (tmp / "cap").mkdir()
    (tmp / "cap" / "capacity.json").write_text(json.dumps({"by": "rate", "points": [{"load": "fast"}]}))
    (tmp / "gate.json").write_text(json.dumps({"exit": 0, "verdicts": [{"name": "n", "metric": "m", "stat": "s",
                                                                       "cell": "c", "verdict": "v", "lo": [1]}]}))
    return [
        (["run", sim_url, "-p", str(tmp / "latin1.toml")], 3, "not UTF-8"),
        (["run", sim_url, "-p", str(tmp / "empty.toml")], 3, "streams is empty"),
        (["run", sim_url, "-p", str(tmp / "nosweep.toml")], 3, "no cells"),
        (["run", sim_url, "--depths", ","], 3, "--depths"),
        (["probe", sim_url, "--api-key-env", ""], 3, "--api-key-env takes the NAME"),
        (["probe", sim_url, "--api-key-env", "sk-not-a-name"], 3, "--api-key-env takes the NAME"),
        (["run", sim_url, "--prompt", "poetry"], 3, "--prompt"),
        (["run", sim_url, "--out", str(tmp / "afile" / "sub")], 3, "--out"),
        (["run", sim_url, "--out", str(tmp / "afile")], 3, "is a file"),
        (["run", "http://127.0.0.1:99999/v1"], 3, "port"),
        (["run", "http://127.0.0.1:abc/v1"], 3, "port"),
        (["compare", str(tmp / "types.json"), str(tmp / "types.json")], 3, "cells[0].waves"),
        (["compare", str(tmp / "notjson.json"), str(tmp / "types.json")], 3, "not valid JSON"),
        (["gate", sim_url, "--baseline", str(tmp / "types.json")], 3, "cells[0].waves"),
        (["report", str(tmp / "cap" / "capacity.json"), "-o", str(tmp / "r.html")], 3, "points[0].load"),
        (["report", str(tmp / "gate.json"), "-o", str(tmp / "r.html")], 3, "verdicts[0].lo"),
        (["sim", "--port", "abc"], 3, "--port"),
        (["sim", "--port", "70000"], 3, "port"),
        (["sim", "--no-such-flag"], 3, "unrecognized"),
        (["sim", "--config", str(tmp / "sim-bad.toml")], 3, "bogus_field"),  # docs/sim.md: bad input, exit 3
        (["sim", "--config", str(tmp / "sim-syntax.toml")], 3, "sim-syntax.toml is not valid TOML"),
        (["sim", "--host", "10.255.255.1", "--port", "0"], 3, "--host: an address of this machine"),
        (["sim", "--decode-step-ms", "-5"], 3, "decode_step_ms"),
        (["sim", "--port", str(urlsplit(sim_url).port)], 3, "another --port"),  # the fixture's sim holds it
        (["probe", sim_url, "--max-tokens", "0"], 3, "--max-tokens"),
        (["run", sim_url, "--rate", "inf", "--duration", "3"], 3, "--rate must be a finite number > 0"),
        (["run", sim_url, "--rate", "nan", "--duration", "3"], 3, "--rate must be a finite number > 0"),
        (["run", sim_url, "--rate", "5", "--duration", "inf"], 3, "--duration must be a finite number > 0"),
        # --burstiness shapes gamma gaps only: with Poisson arrivals it was ignored while the run recorded it
        (["run", sim_url, "--rate", "5", "--duration", "3", "--burstiness", "0.5"], 3,
         "--burstiness 0.5 applies to --arrival gamma only (--arrival poisson ignores it)"),
        (["capacity", sim_url, "--slo", "ttft_p90=300ms", "--burstiness", "0.5", "--out", str(tmp / "capb")], 3,
         "add --arrival gamma, or leave --burstiness out"),
        (["run", "--depths", "16k", "--streams", "1"], 3, "embedded endpoint's model"),  # said before it starts
        (["run", sim_url, "--streams", "1,,2"], 3, "'1,,2' is not a comma list of integers"),  # was taken as 1,2
        (["run", sim_url, "--images", "1", "--endpoint", "completions"], 3, "command line: images need the chat"),
        (["sim", "--config", str(tmp / "no-such.toml")], 3, "--config " + str(tmp / "no-such.toml") + ": No such file"),
    ]


def test_bad_inputs_get_one_line_and_exit_3(tmp_path, sim_url) -> None:
    for args, code, words in _table(tmp_path, sim_url):
        r = _bench(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert len(lines) == 1, (args, r.stderr)
        assert words in lines[0] and "Traceback" not in r.stderr, (args, lines)


def test_full_endpoint_url_is_cut_to_its_base_with_a_note(tmp_path, sim_url) -> None:
    r = _bench("probe", sim_url + "/chat/completions", "--json")
    assert r.returncode == 0, r.stderr
    assert "using its base URL" in r.stderr and json.loads(r.stdout)["ok"] is True


def _terminate_after(args: list[str], recs: Path, lines: int) -> tuple[subprocess.Popen[str], str]:
    """Run ``bench ARGS``, send SIGTERM once ``recs`` holds ``lines`` records (or after 60 s); the process, ended,
    and its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (recs.exists() and len(recs.read_text().splitlines()) >= lines):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc, err


def test_sigterm_keeps_records_and_marks_the_run_interrupted(tmp_path) -> None:
    prof = tmp_path / "slow.toml"
    prof.write_text(TWO_CELLS.replace("requests = 6", "requests = 60"))
    out = tmp_path / "res"
    with running_sim(SimConfig(decode_step_ms=10.0)) as url:
        proc, err = _terminate_after(["run", url, "-p", str(prof), "--out", str(out), "--history",
                                      str(tmp_path / "h.db")], out / "records.jsonl", 5)
    assert proc.returncode == 130, err
    assert "SIGTERM" in err
    assert "history: this run was not added (it did not finish" in err  # --history said nothing
    res = load_results(out / "results.json")
    assert res.run.interrupted and not res.run.complete
    assert (out / "results.csv").exists() and (out / "results.md").exists()
    assert "Interrupted" in (out / "results.md").read_text()
    assert len(read_records(out / "records.jsonl")) >= 5


def test_incomplete_results_are_refused_by_compare_unless_forced(tmp_path, sim_url) -> None:
    prof = tmp_path / "t.toml"
    prof.write_text(TINY)
    out = tmp_path / "a"
    assert _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--json").returncode == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["run"]["complete"] is True and doc["run"]["interrupted"] is False
    doc["run"]["complete"] = False  # what a killed run leaves behind
    (tmp_path / "killed.json").write_text(json.dumps(doc))
    r = _bench("compare", str(tmp_path / "killed.json"), str(out / "results.json"))
    assert r.returncode == 3 and "incomplete" in r.stderr
    r = _bench("compare", str(tmp_path / "killed.json"), str(out / "results.json"), "--force")
    assert r.returncode == 0, r.stderr
    r = _bench("compare", str(out), str(out))  # run folders, as report and history add take them
    assert r.returncode == 0, r.stderr
    r = _bench("compare", str(tmp_path), str(out))
    assert r.returncode == 3 and f"{tmp_path / 'results.json'}: not found" in r.stderr


def test_out_holding_a_run_is_refused_then_overwritten_or_resumed(tmp_path, sim_url) -> None:
    prof = tmp_path / "two.toml"
    prof.write_text(TWO_CELLS)
    out = tmp_path / "res"
    assert _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--json").returncode == 0
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out))
    assert r.returncode == 3 and "--resume" in r.stderr and "--overwrite" in r.stderr
    kept = (out / "results.json").read_bytes()  # gate and ab have no --overwrite: the baseline as --out is refused
    for args in (["gate", sim_url, "--baseline", str(out / "results.json")], ["ab", sim_url, sim_url]):
        r = _bench(*args, "-p", str(prof), "--out", str(out))
        assert r.returncode == 3 and "already holds a run" in r.stderr and "never writes over one" in r.stderr, r
        assert len(r.stderr.strip().splitlines()) == 1 and (out / "results.json").read_bytes() == kept
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--resume")
    assert r.returncode == 3 and "complete" in r.stderr
    # make it look interrupted after its first cell, then resume: the first cell is kept as it was
    doc = json.loads((out / "results.json").read_text())
    first = doc["cells"][0]
    doc["cells"], doc["run"]["complete"], doc["run"]["interrupted"] = [first], False, True
    (out / "results.json").write_text(json.dumps(doc))
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--resume", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [c["id"] for c in res["cells"]] == [first["id"], "d0-s1-code"]
    assert res["cells"][0] == first and res["run"]["complete"] is True
    assert any("resumed run" in w for w in res["warnings"])
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--overwrite", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["run"]["id"] != doc["run"]["id"]
    # stopped inside its first cell: nothing is kept, and the warning does not say the kept cells were measured
    doc = json.loads((out / "results.json").read_text())
    doc["cells"], doc["run"]["complete"], doc["run"]["interrupted"] = [], False, True
    (out / "results.json").write_text(json.dumps(doc))
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--resume", "--json")
    assert r.returncode == 0, r.stderr
    ws = json.loads(r.stdout)["warnings"]
    assert any("none of its 2 cell(s) had finished" in w for w in ws) and not any("kept cells" in w for w in ws)
    (out / "results.json").unlink()  # a run that stopped before it wrote any results: records only
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--resume")
    assert r.returncode == 3 and "no results.json" in r.stderr and "--overwrite" in r.stderr
    r = _bench("run", sim_url, "-p", str(prof), "--out", str(out), "--resume", "--overwrite")
    assert r.returncode == 3 and "choose one" in r.stderr
    for where in (["--out", str(tmp_path / "none")], []):  # nothing to continue: refused, not a fresh run
        r = _bench("run", sim_url, "-p", str(prof), *where, "--resume", cwd=tmp_path)
        assert r.returncode == 3 and "holds no run to continue" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists() and not (tmp_path / "bench-results").exists()


def _picky_server() -> tuple[str, object]:
    """A server that answers the 1-token set-up probes and fails every longer request with HTTP 500."""
    import asyncio
    import threading

    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "owned_by": "test"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("max_tokens", 0) > 1:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"OK"}}]}\n\n')
        usage = b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}'
        await resp.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],' + usage + b"}\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/chat/completions", chat)])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}/v1", loop


def test_a_cell_with_no_success_exits_5(tmp_path) -> None:
    prof = tmp_path / "t.toml"
    prof.write_text(TINY)
    url, loop = _picky_server()
    try:
        r = _bench("run", url, "-p", str(prof), "--out", str(tmp_path / "o"))
    finally:
        loop.call_soon_threadsafe(loop.stop)  # type: ignore[attr-defined]
    assert r.returncode == 5, r.stderr
    assert "no request succeeded in cell(s) d0-s1-prose" in r.stderr.splitlines()[-1]
    assert load_results(tmp_path / "o" / "results.json").cells[0].requests_failed == 2


def test_an_interrupted_ab_names_what_each_side_kept(tmp_path) -> None:
    """SIGTERM in bench ab: the line once named only a/ ('8 finished records kept in ab2/a') though b/ held as
    many; it names both sides' folders and counts, and both keep their partial results."""
    prof = tmp_path / "ab.toml"
    prof.write_text(TINY.replace("requests = 2", "requests = 60"))
    out = tmp_path / "ab"
    with running_sim(SimConfig(decode_step_ms=10.0)) as url:
        proc, err = _terminate_after(["ab", url, url, "-p", str(prof), "--out", str(out)], out / "b" / "records.jsonl", 3)
    assert proc.returncode == 130, err
    line = err.strip().splitlines()[-1]
    n_a, n_b = (len(read_records(out / side / "records.jsonl")) for side in "ab")
    assert f"finished records kept: {n_a} in {out / 'a'}, {n_b} in {out / 'b'}" in line, line
    assert line.startswith("interrupted (SIGTERM): ") and "error" not in line  # as bench run says it
    for side in "ab":
        assert load_results(out / side / "results.json").run.interrupted


def test_records_never_hold_a_torn_line(tmp_path, monkeypatch) -> None:
    w = RecordWriter(tmp_path / "records.jsonl")
    w.write(RequestRecord("a", "chat", "m"))
    real = os.write

    def short(fd: int, data: bytes) -> int:
        return real(fd, data[: len(data) // 2])  # the disk took half the line, then filled up

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(ConfigError, match="cannot write .*records.jsonl"):
        w.write(RequestRecord("b", "chat", "m"))
    monkeypatch.setattr(os, "write", real)
    w.close()
    text = (tmp_path / "records.jsonl").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 1
    assert [r.request_id for r in read_records(tmp_path / "records.jsonl")] == ["a"]


def test_drift_probes_are_unique_and_leave_the_header_alone(tmp_path) -> None:
    """The closing overhead probes (run.drift) have prefixes of their own: against a prefix cache they are not
    served from the opening probes' cache, and they do not change what the run learned about the template."""
    prof = tmp_path / "t.toml"
    prof.write_text(TINY)
    with running_sim(SimConfig(decode_step_ms=2.0, prefix_cache=True, prefix_block_tokens=4)) as url:
        r = _bench("run", url, "-p", str(prof), "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    drift = res["run"]["drift"]
    assert drift["overhead_ms_start"] > 0 and drift["overhead_ms_end"] > 0
    recs = read_records(tmp_path / "o" / "records.jsonl")
    last_measured = max(x.sent_ns for x in recs if x.meta.get("phase") == "measure")
    closing = [x for x in recs if x.meta.get("phase") == "overhead" and x.sent_ns > last_measured]
    opening = [x for x in recs if x.meta.get("phase") == "overhead" and x.sent_ns < last_measured]
    assert len(closing) == len(opening) == 2
    header = res["run"]["template_cached_tokens"]
    assert all((x.usage or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) <= header + 4 for x in closing)


def test_the_embedded_models_context_is_checked_only_for_the_embedded_endpoint(monkeypatch) -> None:
    """SmolLM2-135M gives a request at most 8,192 tokens whatever ``-c``: a deeper cell is refused before the
    embedded server starts, but not against a URL (that server's own context is checked once it answers) nor with
    ``$BENCH_MODEL`` (another model)."""
    from bench.cli.common import engine_size
    from bench.config.profile import Profile, Sweep

    deep = Profile(name="deep", sweeps=(Sweep(streams=(1,), depths=(16384,)),), max_tokens=8)
    monkeypatch.delenv("BENCH_MODEL", raising=False)
    with pytest.raises(ConfigError, match="use --depths below 8184"):
        engine_size(deep)
    huge = Profile(name="huge", sweeps=(Sweep(streams=(1,), depths=(0,)),), max_tokens=99_999_999)
    with pytest.raises(ConfigError, match="use --max-tokens below 8192"):  # not "--depths below -99991807"
        engine_size(huge)
    assert engine_size(deep, "http://127.0.0.1:8000/v1")[0] >= 1
    monkeypatch.setenv("BENCH_MODEL", "/models/long-context.gguf")
    assert engine_size(deep)[1] >= 16392
    fits = Profile(name="fits", sweeps=(Sweep(streams=(2,), depths=(8000,)),), max_tokens=128)
    monkeypatch.delenv("BENCH_MODEL")
    assert engine_size(fits) == (4, 4 * (8128 + 512))


def test_an_interrupted_gate_exits_130(tmp_path) -> None:
    """It exited 3 ("could not run"), unlike every other command; its finished records stay."""
    prof = tmp_path / "slow.toml"
    prof.write_text(TWO_CELLS.replace("requests = 6", "requests = 60"))
    with running_sim(SimConfig(decode_step_ms=10.0)) as url:
        base = tmp_path / "base"
        quick = tmp_path / "quick.toml"
        quick.write_text(TWO_CELLS)
        assert _bench("run", url, "-p", str(quick), "--out", str(base), "--json").returncode == 0
        out = tmp_path / "g"
        proc, err = _terminate_after(["gate", url, "-p", str(prof), "--baseline", str(base / "results.json"),
                                      "--out", str(out), "--force"], out / "records.jsonl", 5)
    assert proc.returncode == 130, err
    assert "interrupted (SIGTERM)" in err and len(read_records(out / "records.jsonl")) >= 5
