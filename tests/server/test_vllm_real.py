"""bench against a real vLLM server (issue 26 item 5): probe, a tiny sweep and an open-loop point, each checked
against vLLM's own counters on its /metrics page.

Runs only where vLLM is installed: ``BENCH_VLLM_PYTHON`` names a Python that imports vllm (else this one must) and
``BENCH_VLLM_MODEL`` a model folder it serves offline. ``bash benchmarks/vllm_cpu.sh install model`` makes both on a
CPU-only machine and ``bash benchmarks/vllm_cpu.sh env`` prints them. Elsewhere (CI) every test skips with one reason.
The server is started here on a free 127.0.0.1 port (up in 1-2 minutes on 2 cores) and stopped at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cli.app import main
from bench.records import read_records
from bench.server.metrics import Snapshot, parse_page, summarize_snapshots
from bench.tools.engine import free_port

START_TIMEOUT_S = 600.0
SERVED_NAME = "smollm2-135m"


def _why_not() -> str:
    """Why these tests cannot run here ("" when they can): the one skip reason of the module."""
    py = os.environ.get("BENCH_VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else "")
    if not py:
        return "vLLM not installed: set BENCH_VLLM_PYTHON and BENCH_VLLM_MODEL (bash benchmarks/vllm_cpu.sh)"
    if not Path(py).is_file():
        return f"BENCH_VLLM_PYTHON={py} does not exist"
    if not (Path(os.environ.get("BENCH_VLLM_MODEL", "")) / "config.json").is_file():
        return "BENCH_VLLM_MODEL is not a model folder (bash benchmarks/vllm_cpu.sh model makes one)"
    return ""


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


def _where() -> tuple[str, str]:
    py = os.environ.get("BENCH_VLLM_PYTHON") or sys.executable
    return py, os.environ["BENCH_VLLM_MODEL"]


def _wait_up(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before serving; its log: {log}")
        try:
            if httpx.get(url + "/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vLLM did not serve within {START_TIMEOUT_S:.0f} s; its log: {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's own process group (the API server and its engine-core child), SIGKILL after 30 s."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    py, model = _where()
    port, log = free_port(), tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env.pop("PYTHONPATH", None)  # bench's tree is no part of vLLM's interpreter
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", SERVED_NAME,
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_up(proc, url, log)
        yield url
    finally:
        _stop(proc)


def _scrape(url: str) -> Snapshot:
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10.0).text
    return Snapshot(time.monotonic(), parse_page(text))


def _usage_sums(recs: list[Any]) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) of the successful records, from the usage vLLM sent."""
    ok = [r for r in recs if r.ok]
    return (len(ok), sum(r.usage["prompt_tokens"] for r in ok), sum(r.usage["completion_tokens"] for r in ok))


def test_probe(vllm_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _scrape(vllm_url)
    assert main(["probe", vllm_url, "--max-tokens", "16", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    d = summarize_snapshots("vllm", [before, _scrape(vllm_url)])
    assert rec["usage"]["completion_tokens"] == d["generation_tokens"] == 16
    assert rec["usage"]["prompt_tokens"] == d["prompt_tokens"] and d["requests"] == 1


def test_run_and_point_tokens_equal_vllms_counters(vllm_url: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Every request of a tiny sweep and of one open-loop point (set-up probes and warm-ups too), summed from the
    records' usage, against vLLM's counter deltas over the whole command; and each cell's ``server_metrics``
    (bench's own scrape) against that cell's measured records."""
    for name, args in (("run", ["-p", "quick", "--depths", "0,256", "--streams", "1,2", "--max-tokens", "16",
                                "--repeats", "2"]),
                       ("rate", ["--rate", "2", "--requests", "6", "--input-tokens", "64", "--max-tokens", "8"])):
        out, before = tmp_path / name, _scrape(vllm_url)
        rc = main(["run", vllm_url, *args, "--out", str(out), "--json"])
        d = summarize_snapshots("vllm", [before, _scrape(vllm_url)])
        stdout, err = capsys.readouterr()
        assert rc == 0, err
        recs = read_records(out / "records.jsonl")
        assert recs and all(r.ok for r in recs)
        assert _usage_sums(recs) == (d["requests"], d["prompt_tokens"], d["generation_tokens"])
        for c in json.loads(stdout)["cells"]:
            sm = c["server_metrics"]
            assert sm["backend"] == "vllm" and not [w for w in c["warnings"] if "token" in w]
            mine = [r for r in recs if r.meta.get("phase") == "measure" and c["id"] in (r.meta.get("cell"),
                                                                                    r.meta.get("point"))]
            assert _usage_sums(mine) == (sm["requests"], sm["prompt_tokens"], sm["generation_tokens"]), c["id"]
            assert sm["server_ttft_count"] == sm["requests"]
