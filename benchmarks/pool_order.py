"""Does the order in which bench's connection pool reuses idle connections change what a thread-per-connection
server does? llama.cpp's llama-server (cpp-httplib) serves each connection on one of its HTTP threads for as long
as the connection lives, so a pool that keeps more connections in use than the server has threads could leave a
request waiting on a connection no thread serves. bench.transport.http.FastPool takes the most recently used
connection first; the order tried for issue 26 took the one that waited longest (first in, first out, patched in
here: benchmarks/results/schedule_accuracy-2026-12-05c-h100.md says why). This runs open-loop points against a
real llama-server (SmolLM2-135M of bench's tests, 4 slots) with each order, alternating, and prints each point's
end-to-end latency from the schedule. ``--starve N`` first opens N connections at once (FastPool.preconnect), then sends 2N short
requests one after another with each order and prints each request's time: the test of a pool that holds more
connections than the server has HTTP threads.

    python benchmarks/pool_order.py --rates 3,5,10,30 --duration 6
    python benchmarks/pool_order.py --rates '' --starve 10 --repeats 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import bench.transport.http as http  # noqa: E402
from bench.client import ClientSettings  # noqa: E402
from bench.config.profile import Profile  # noqa: E402
from bench.driver import run_load  # noqa: E402
from bench.load.point import LoadSettings  # noqa: E402
from bench.tools.engine import LocalEngine  # noqa: E402

LIFO = http.FastPool._take_idle  # the pool's own order: the most recently used idle connection first


def _fifo(self: Any, key: tuple[str, str, int]) -> Any:
    """The order tried for issue 26: the idle connection that waited longest first."""
    conns = self._idle.get(key)
    now = time.monotonic()
    while conns:
        c = conns.popleft()
        if c.usable and now - c.idle_since <= self.keepalive_expiry:
            return c
        c.close()
    return None


def point(url: str, rate: float, duration: float, order: str) -> str:
    """One Poisson point at ``rate`` with the pool order ``order``; a line of its figures."""
    http.FastPool._take_idle = _fifo if order == "fifo" else LIFO  # type: ignore[method-assign]
    ls = LoadSettings(rate=rate, duration_s=duration, arrival="poisson", input_tokens="16", warmup_s=0.0, seed=1)
    d = Path(tempfile.mkdtemp())
    asyncio.run(run_load(url, Profile(name="t", max_tokens=4, warmup=0, overhead_probes=1), ClientSettings(), ls,
                         out_dir=d))
    recs = [json.loads(line) for line in open(d / "records.jsonl")]
    recs = [r for r in recs if r.get("scheduled_ns")]
    e2e = np.array([(r["sent_ns"] - r["scheduled_ns"] + r["end_ns"]) / 1e6 for r in recs if r.get("end_ns")])
    ok = sum(1 for r in recs if r.get("ok"))
    return (f"| {rate:g} | {order} | {len(recs)} | {ok} | {np.percentile(e2e, 50):.0f} | {np.percentile(e2e, 90):.0f} "
            f"| {np.percentile(e2e, 99):.0f} | {e2e.max():.0f} |")


async def _starve(url: str, n: int, order: str) -> list[float]:
    """``n`` connections opened at once, then ``2 n`` one-token requests one after another: each one's ms."""
    http.FastPool._take_idle = _fifo if order == "fifo" else LIFO  # type: ignore[method-assign]
    pool = http.FastPool()
    await pool.preconnect(url, n, timeout=5.0)
    body = b'{"prompt":"hi","max_tokens":1,"stream":false}'
    out = []
    for _ in range(2 * n):
        t = time.perf_counter()
        r = await pool.stream("POST", url + "/completions", {"Content-Type": "application/json"}, body,
                              connect_timeout=5.0, read_timeout=30.0)
        await r.aread()
        await r.aclose()
        out.append(1e3 * (time.perf_counter() - t))
    await pool.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="3,5,10,30", help="comma list of req/s")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per point")
    ap.add_argument("--starve", type=int, default=0, metavar="N", help="first the N-connection test (0: none)")
    ap.add_argument("--repeats", type=int, default=1, help="times the N-connection test runs per order [1]")
    a = ap.parse_args()
    print(f"Command: `python benchmarks/pool_order.py --rates '{a.rates}' --duration {a.duration:g} --starve {a.starve} --repeats {a.repeats}`\n")
    for k in range(a.repeats if a.starve else 0):  # a fresh server each time: the stalls came on fresh ones
        for order in ("fifo", "lifo"):
            with LocalEngine(parallel=4, ctx_size=32768) as eng:
                ms = asyncio.run(_starve(eng.url, a.starve, order))
            print(f"{k + 1}. {order}, {a.starve} connections opened, then {2 * a.starve} requests one after another, "
                  f"ms: " + ", ".join(f"{x:.0f}" for x in ms) + "\n", flush=True)
    with LocalEngine(parallel=4, ctx_size=32768) as eng:
        if a.rates:
            print("| rate req/s | order | requests | ok | E2E from schedule p50 ms | p90 | p99 | max |")
            print("|---|---|---|---|---|---|---|---|")
        for rate in (float(x) for x in a.rates.split(",") if x):
            for order in ("lifo", "fifo", "lifo", "fifo"):
                print(point(eng.url, rate, a.duration, order), flush=True)


if __name__ == "__main__":
    main()
