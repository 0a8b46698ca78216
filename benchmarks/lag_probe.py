"""Why a worker's dispatcher wakes late: one ``bench run --rate`` point (as benchmarks/schedule_accuracy.py runs
it) while a thread samples, every ``--every-ms``, each worker process's /proc/PID/schedstat (CPU time and time
spent runnable but waiting for a CPU) and the host's /proc/stat (all CPUs busy). Prints per tenth of the run the
send-lag p99 and dispatch-lag max, then per worker: CPU s, run-queue wait s, the worst wait in one sample window,
and the host's busy cores beyond this process tree and the servers.

    python benchmarks/lag_probe.py --rate 20000 --duration 3 --workers auto,auto --server blast --sims 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from schedule_accuracy import SimGroup  # noqa: E402
from simproc import BlastProcess  # noqa: E402

from bench.client import ClientSettings  # noqa: E402
from bench.config.load import LoadSettings  # noqa: E402
from bench.config.profile import Profile  # noqa: E402
from bench.driver import run_load  # noqa: E402


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _schedstat(pid: int) -> tuple[int, int] | None:
    try:
        cpu, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return None


def _fds(pid: int) -> int | None:
    """Open file descriptors of ``pid`` (its sockets among them: a burst of new connections shows as a jump)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _host_busy() -> tuple[float, float]:
    """All CPUs' busy seconds (not idle, iowait or steal) and steal seconds (the hypervisor ran something else)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in f]
    tck = os.sysconf("SC_CLK_TCK")
    steal = v[7] if len(v) > 7 else 0
    return (sum(v[:8]) - v[3] - v[4] - steal) / tck, steal / tck


class Sampler(threading.Thread):
    """Samples the workers' schedstat and the host's busy time every ``every_s``."""

    def __init__(self, every_s: float, servers: list[int]) -> None:
        super().__init__(daemon=True)
        self.every_s, self.servers, self.stop = every_s, servers, threading.Event()
        self.rows: list[tuple[float, tuple[float, float], dict[int, tuple[int, int]]]] = []
        self.fds: list[tuple[float, dict[int, int]]] = []  # (when, open fds per client process)

    def run(self) -> None:
        me = os.getpid()
        self.over: list[tuple[float, float]] = []  # (when, how late) of this thread's own wake-ups
        due = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            if now - due > 0.002:
                self.over.append((now, now - due))
            pids = [p for p in _children(me) if p not in self.servers] + [me] + self.servers
            st = {p: s for p in pids if (s := _schedstat(p)) is not None}
            self.rows.append((time.perf_counter_ns() / 1e9, _host_busy(), st))
            self.fds.append((self.rows[-1][0], {p: n for p in pids if p not in self.servers
                                                and (n := _fds(p)) is not None}))
            due = time.perf_counter() + self.every_s
            time.sleep(self.every_s)


def report(rows: list[Any], servers: list[int], t_from: float, t_to: float) -> None:
    """Each process's CPU and run-queue wait between ``t_from`` and ``t_to`` (perf_counter seconds: the
    schedule's span), from the samples in which it appears."""
    rows = [r for r in rows if t_from <= r[0] <= t_to]
    if len(rows) < 2:
        print("  (too few samples)")
        return
    wall = rows[-1][0] - rows[0][0]
    pids = sorted({p for r in rows for p in r[2]})
    host, ours = rows[-1][1][0] - rows[0][1][0], 0.0
    steal = rows[-1][1][1] - rows[0][1][1]
    lines = []
    for p in pids:
        mine = [r for r in rows if p in r[2]]
        if len(mine) < 2:
            continue
        cpu = (mine[-1][2][p][0] - mine[0][2][p][0]) / 1e9
        ours += cpu
        waits = [(b[2][p][1] - a[2][p][1]) / 1e6 for a, b in zip(mine, mine[1:])]
        role = "server" if p in servers else ("driver" if p == os.getpid() else "worker")
        lines.append(f"  {role} {p}: cpu {cpu / wall:.2f} cores, run-queue wait {sum(waits):.1f} ms, worst "
                     f"window {max(waits):.1f} ms")
    print(f"  {wall:.2f} s sampled: host busy {host / wall:.2f} cores; these processes {ours / wall:.2f}; "
          f"others {(host - ours) / wall:.2f}; steal {steal / wall:.2f}")
    print("\n".join(lines))


def fd_report(fds: list[tuple[float, dict[int, int]]], t_from: float, t_to: float) -> None:
    """Per client process: open fds when the schedule started, their most during it and when (connections opened
    in a burst), and at its end."""
    rows = [r for r in fds if t_from <= r[0] <= t_to]
    for p in sorted({p for _, d in rows for p in d}):
        mine = [(t, d[p]) for t, d in rows if p in d]
        t_max, n_max = max(mine, key=lambda x: x[1])
        print(f"  process {p}: open fds {mine[0][1]} at the start, most {n_max} at {t_max - t_from:.2f} s, "
              f"{mine[-1][1]} at the end")


async def _with_stalls(coro: Any, stalls: list[float], stall_ms: float) -> Any:
    """Run ``coro`` while this process's event loop is blocked for ``stall_ms`` at each of ``stalls`` (seconds
    after the start; a page fault, a collector pause or a burst of records does that to a client): only where the
    schedule runs in this process (one worker)."""
    loop = asyncio.get_running_loop()
    for t in stalls:
        loop.call_later(t, time.sleep, stall_ms / 1e3)
    return await coro


def one(base: str, rate: float, dur: float, workers: int | str, warm: float, sampler: Sampler,
        stalls: tuple[list[float], float] = ([], 0.0), max_tokens: int = 1) -> None:
    prof = Profile(name="schedule", max_tokens=max_tokens, warmup=0, overhead_probes=1)
    ls = LoadSettings(rate=rate, duration_s=dur, arrival="constant", input_tokens="16", warmup_s=warm,
                      cooldown_s=0.0, drain_s=30.0)
    d = Path(tempfile.mkdtemp())
    res = asyncio.run(_with_stalls(run_load(base, prof, ClientSettings(), ls, out_dir=d, workers=workers), *stalls))
    recs = [json.loads(line) for line in open(d / "records.jsonl")]
    recs = [r for r in recs if r.get("scheduled_ns")]
    s0 = min(r["scheduled_ns"] for r in recs)
    off = np.array([(r["scheduled_ns"] - s0) / 1e9 for r in recs])
    dl = np.array([r["meta"].get("dispatch_lag_ns", 0) / 1e6 for r in recs])
    sl = np.array([(r["sent_ns"] - r["scheduled_ns"]) / 1e6 for r in recs])
    print(f"rate {rate:g} workers {res.run.workers} ({workers}) n {len(recs)} send p99 {np.percentile(sl, 99):.2f} "
          f"dispatch p99 {np.percentile(dl, 99):.2f} ms", flush=True)
    print(f"  send lag max {sl.max():.1f} ms; {int((sl > 1).sum())} requests sent over 1 ms late, "
          f"{int((sl > 10).sum())} over 10 ms")
    late = off >= 0.1 * off.max()
    print(f"  after the first tenth: send p99 {np.percentile(sl[late], 99):.2f} dispatch p99 "
          f"{np.percentile(dl[late], 99):.2f} ms")
    edges = np.linspace(0, off.max() + 1e-9, 11)
    cells = []
    for a, b in zip(edges[:-1], edges[1:]):
        m = (off >= a) & (off < b)
        cells.append(f"{np.percentile(sl[m], 99):.1f}/{dl[m].max():.0f}")
    print("  per tenth, send p99 / dispatch max ms:", " ".join(cells))
    report(sampler.rows, sampler.servers, s0 / 1e9, max(r["sent_ns"] for r in recs) / 1e9)
    fd_report(sampler.fds, s0 / 1e9, max(r["sent_ns"] for r in recs) / 1e9)
    peaks: dict[float, float] = {}
    for i in np.argsort(dl)[::-1][:2000]:
        b = round(float(off[i]) * 20) / 20
        peaks[b] = max(peaks.get(b, 0.0), float(dl[i]))
    top = sorted(peaks.items(), key=lambda kv: -kv[1])[:6]
    print("  worst dispatch lags (s into the run, ms):", [(t, round(v, 1)) for t, v in top])
    t_lo, t_hi = s0 / 1e9, max(r["sent_ns"] for r in recs) / 1e9
    print("  the sampler thread's wake-ups over 2 ms late (s into the run, ms):",
          [(round(t - t_lo, 3), round(1e3 * d, 1)) for t, d in sampler.over if t_lo <= t <= t_hi])
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=20000)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--sims", type=int, default=3)
    ap.add_argument("--server", choices=("sim", "blast"), default="blast")
    ap.add_argument("--every-ms", type=float, default=20.0)
    ap.add_argument("--step-ms", type=float, default=1.0, help="--server sim: its decode step, ms")
    ap.add_argument("--max-tokens", type=int, default=1, help="tokens per answer (with --server sim and --step-ms: "
                    "how long a request holds its connection)")
    ap.add_argument("--stall-at", default="", help="comma list of seconds after the start at which this process's "
                    "event loop is blocked (one worker only: the schedule runs here)")
    ap.add_argument("--stall-ms", type=float, default=40.0, help="how long each stall blocks the loop, ms")
    a = ap.parse_args()
    srv = SimGroup(a.sims, BlastProcess) if a.server == "blast" else SimGroup(
        a.sims, decode_step_ms=a.step_ms, prefill_tok_s=1e12, max_running=100_000)
    sampler = Sampler(a.every_ms / 1e3, [p.proc.pid for p in srv.procs])
    sampler.start()
    try:
        for w in a.workers.split(","):
            one(srv.base, a.rate, a.duration, w if w == "auto" else int(w), a.warmup, sampler,
                ([float(x) for x in a.stall_at.split(",") if x], a.stall_ms), a.max_tokens)
    finally:
        sampler.stop.set()
        srv.close()


if __name__ == "__main__":
    main()
