"""bench.sim.collector: the `bench sim` process never runs a full garbage collection while it serves a stream."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.sim import SimConfig
from bench.sim.runner import running_sim


def _collections(err: str) -> list[tuple[int, int, int]]:
    """``(generation, start_ns, duration_ns)`` of every ``collect`` line."""
    return [(int(g), int(t), int(d)) for g, t, d in re.findall(r"^collect (\d) (\d+) (\d+)$", err, re.M)]


def test_the_sim_process_collects_fully_only_when_idle(tmp_path: Path) -> None:
    """`bench sim --late-write-ms` reports every collection of its process (here: every one, 1 ns threshold).
    While requests stream one after another (the engine idle for far less than IDLE_GRACE_S between them) the
    young generations are collected and no full one starts; once the sim has been idle, it runs a full one."""
    from bench.sim.collector import IDLE_GRACE_S

    err_path = tmp_path / "sim.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench.sim", "--port", "0", "--decode-step-ms", "0.2", "--prefill-tok-s", "1e9",
                                 "--late-write-ms", "0.000001"], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        spans = []
        many = {"messages": [{"role": "user", "content": "x"}] * 1000}  # 1,000 dicts per body: the young
        # generations fill up within a few requests
        with httpx.Client(base_url=url, timeout=30) as c:
            for _ in range(200):
                t0 = time.perf_counter_ns()
                with c.stream("POST", "/chat/completions", json={**many, "max_tokens": 4, "stream": True}) as r:
                    r.read()
                spans.append((t0, time.perf_counter_ns()))
            time.sleep(IDLE_GRACE_S * 4)
            c.get("/models")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got = _collections(err_path.read_text())
    busy_start, busy_end = spans[0][0], spans[-1][1]
    assert any(g < 2 and busy_start <= t <= busy_end for g, t, _ in got)  # young ones ran while serving
    full = [t for g, t, _ in got if g == 2]
    assert not [t for t in full if any(a <= t <= b for a, b in spans)]  # none began inside a request
    assert any(t > busy_end for t in full)  # the idle one


def test_a_sim_in_a_thread_leaves_its_host_process_collector_alone() -> None:
    """running_sim (a sim in a test's or a tool's process) does not freeze or reconfigure that process's collector."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with running_sim(SimConfig(decode_step_ms=1)) as url, httpx.Client(base_url=url, timeout=10) as c:
        c.post("/completions", json={"prompt": "x", "max_tokens": 2})
    # a freeze would add every live object; frozen objects freed meanwhile (an earlier test's freeze) may lower it
    assert gc.get_threshold() == before and gc.get_freeze_count() <= frozen and gc.isenabled()
