"""Schedule accuracy of bench's open-loop generator: how late does bench send each request of a schedule?

    python benchmarks/schedule_accuracy.py                       # 10, 100, 1000, 5000 req/s
    python benchmarks/schedule_accuracy.py --rates 10,100 --duration 3 --workers 1,2

Method. ``bench sim`` runs in its own process (no prefill, 1 ms steps, 1 output token, 100k slots: the server
side stays cheap). For each rate, bench runs one open-loop point exactly as ``bench run URL --rate R --duration D
--arrival constant`` does (:func:`bench.driver.run_load`) and reports, over every request of the point:

* dispatch lag: when bench's dispatcher started the request - its scheduled time (bench's own lateness);
* send lag: the record's ``sent_ns - scheduled_ns`` (dispatch lag plus the client's work before the bytes go out);
* achieved vs planned rate, failures, client CPU (``time.process_time`` of this process over the point, set-up
  and summary included, plus the CPU of the worker processes, which end with the point) and the sim's CPU
  (/proc), in % of the point's wall time (one core = 100 %) and in ms per planned request;
* steal cores: the CPU time the hypervisor gave to other guests meanwhile (/proc/stat), in cores: on a shared
  virtual machine a point that lost cores this way can miss its schedule for a reason outside bench.

``--workers 1,2,4`` repeats every rate with the schedule sent from that many processes (``bench run --workers``;
``auto``: the count ``bench run --workers auto`` picks, shown as ``auto N``).
``--sims N`` serves from N sim processes listening on one port
(``bench sim --reuse-port``; the kernel spreads the connections), for rates one sim process cannot serve; the sim
CPU column is then their sum. ``--server blast`` serves from ``benchmarks/blastserver.py`` instead (one write per
short answer, the server side nearly free): for per-host rates that the sims and the client cannot share a host at.
Results go to
``benchmarks/results/schedule_accuracy-<UTC date>-<host>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from simproc import BlastProcess, SimProcess  # noqa: E402

from bench.client import ClientSettings  # noqa: E402
from bench.config.load import LoadSettings  # noqa: E402
from bench.config.profile import Profile  # noqa: E402
from bench.driver import run_load  # noqa: E402


class SimGroup:
    """``n`` sim processes (or blast servers: ``kind``) on one port (SO_REUSEPORT): ``base`` and ``cpu_s()`` as
    one :class:`SimProcess`."""

    def __init__(self, n: int, kind: type[SimProcess] = SimProcess, **flags: Any) -> None:
        first = kind(**flags, reuse_port=True)
        port = first.base.rsplit(":", 1)[1].split("/")[0]
        self.procs = [first] + [kind(**flags, reuse_port=True, port=port) for _ in range(n - 1)]
        self.base = first.base

    def cpu_s(self) -> float:
        return sum(p.cpu_s() for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            p.proc.terminate()
        for p in self.procs:
            p.proc.wait()


def _client_cpu_s() -> float:
    """CPU seconds of this process and of its ended children: the worker processes of a point are joined at its
    end, so a point's difference holds them too (the servers, still running, are not in it)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def _steal_s() -> float:
    """CPU seconds the hypervisor gave to others, all CPUs (/proc/stat's steal column; NaN where there is none):
    on a shared virtual machine a run that lost cores this way misses its schedule for a reason outside bench."""
    try:
        v = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(v[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def one_rate(sim: Any, rate: float, duration: float, workers: int | str = 1, stamps: str = "auto") -> dict[str, Any]:
    """Run one point at ``rate`` (sent from ``workers`` processes, ``"auto"``: as many as bench picks, shown as
    ``auto N``; arrival stamps from ``stamps``: auto, kernel or user) and return its schedule figures."""
    prof = Profile(name="schedule", max_tokens=1, warmup=0, overhead_probes=1)
    ls = LoadSettings(rate=rate, duration_s=duration, arrival="constant", input_tokens="16", warmup_s=0.0,
                      cooldown_s=0.0, drain_s=30.0)
    c0, s0, t0, st0 = _client_cpu_s(), sim.cpu_s(), time.perf_counter(), _steal_s()
    res = asyncio.run(run_load(sim.base, prof, ClientSettings(stamps=stamps), ls, out_dir=None,
                              workers=workers))
    wall = time.perf_counter() - t0
    client_s, sim_s, steal_s = _client_cpu_s() - c0, sim.cpu_s() - s0, _steal_s() - st0
    cell = res.cells[0].to_dict()
    sc = cell["schedule"]
    chosen = f"auto {res.run.workers}" if workers == "auto" else workers
    return {"rate": rate, "workers": chosen, "stamps": stamps, "duration_s": duration, "requests": sc["planned_requests"],
            "achieved_rps": sc["achieved_rps"], "dispatch_lag_ms": sc["dispatch_lag_ms"],
            "send_lag_ms": sc["send_lag_ms"], "failed": cell["counts"]["failed"],
            "cut": cell["counts"]["cut"], "errors": cell.get("errors") or {},
            "client_cpu_pct": round(100 * client_s / wall, 1), "sim_cpu_pct": round(100 * sim_s / wall, 1),
            "steal_cores": round(steal_s / wall, 2),
            "client_cpu_ms_per_req": round(1e3 * client_s / sc["planned_requests"], 4),
            "sim_cpu_ms_per_req": round(1e3 * sim_s / sc["planned_requests"], 4), "wall_s": round(wall, 2)}


def to_markdown(doc: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    m = doc["machine"]
    out = [f"# Schedule accuracy ({doc['date']}, {m['host']}, {m['cpus']} CPUs)", "",
           f"bench run --rate (constant arrivals) from 1 or more processes, {doc['duration_s']} s per rate, "
           "`bench sim` in its own process. "
           f"Command: `{doc['command']}`.", "",
           "| rate req/s | workers | requests | achieved req/s | dispatch lag p50 / p99 / max ms "
           "| send lag p50 / p99 / max ms | failed / cut | client CPU % | sim CPU % | client / sim CPU ms per request | steal cores |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        d, s = r["dispatch_lag_ms"], r["send_lag_ms"]
        out.append(f"| {r['rate']:g} | {r['workers']}{'' if r.get('stamps', 'auto') == 'auto' else ' (' + r['stamps'] + ' stamps)'} | {r['requests']} | {r['achieved_rps']} | "
                   f"{d['p50']} / {d['p99']} / {d['max']} "
                   f"| {s['p50']} / {s['p99']} / {s['max']} | {r['failed']} / {r.get('cut', '-')} | {r['client_cpu_pct']} | "
                   f"{r['sim_cpu_pct']} | {r.get('client_cpu_ms_per_req', '-')} / {r.get('sim_cpu_ms_per_req', '-')} | {r.get('steal_cores', '-')} |")
    if doc.get("note"):
        out += ["", doc["note"]]
    return "\n".join(out) + "\n"


def run_rows(a: argparse.Namespace, sim: Any) -> list[dict[str, Any]]:
    """Every (workers, stamps, rate) row, under cProfile when asked."""
    import cProfile
    import pstats

    prof = cProfile.Profile() if a.cprofile else None
    rows = []
    for w in (x if x == "auto" else int(x) for x in a.workers.split(",")):
        for st in a.stamps.split(","):
            for r in (float(x) for x in a.rates.split(",")):
                if prof:
                    prof.enable()
                rows.append(one_rate(sim, r, a.duration, w, st))
                if prof:
                    prof.disable()
                print(json.dumps(rows[-1]), flush=True)
    if prof:
        prof.dump_stats(a.cprofile)
        pstats.Stats(str(a.cprofile)).sort_stats("tottime").print_stats(25)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="10,100,1000,5000", help="comma list of req/s")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per rate")
    ap.add_argument("--workers", default="1", help="comma list of worker counts (or auto), each run at every rate")
    ap.add_argument("--sims", type=int, default=1, help="server processes on one port (SO_REUSEPORT)")
    ap.add_argument("--server", choices=("sim", "blast"), default="sim", help="what answers: bench sim (default) or "
                    "benchmarks/blastserver.py (one write per short answer: the server side nearly free, for rates "
                    "a host's sims cannot serve beside the client)")
    ap.add_argument("--stamps", default="auto", help="comma list of stamp sources (auto, kernel, user), each run "
                    "at every rate")
    ap.add_argument("--cprofile", type=Path, help="profile the client process (cProfile) into this file; the top "
                    "functions by own time are printed")
    ap.add_argument("--note", default="", help="a line added under the table")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args(argv)
    if a.server == "blast":
        sim = SimGroup(a.sims, BlastProcess)
    else:
        sim = SimGroup(a.sims, decode_step_ms=1, prefill_tok_s=1e12, max_running=100_000)
    try:
        rows = run_rows(a, sim)
    finally:
        sim.close()
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    host = socket.gethostname()
    doc = {"date": date, "machine": {"host": host, "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
           "duration_s": a.duration,
           "command": "python benchmarks/schedule_accuracy.py " + " ".join(argv or sys.argv[1:]),
           "rows": rows, "note": a.note}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"schedule_accuracy-{date}-{host}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(to_markdown(doc), encoding="utf-8")
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
