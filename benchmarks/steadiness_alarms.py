"""How often the capacity search's steadiness test calls a point "not steady", per load level (issue 24).

Each point is one open-loop point of ``--duration`` s as ``bench capacity`` runs it, against the sim's engine
model in virtual time (:class:`bench.load.capacity_model.ModelPoints`: the schedule bench sends, the sim's
scheduler replayed exactly), with the window and the test of a live point (``trend`` in docs/load.md: TTFT
from the schedule and the number in flight both rising). Loads are shares of each shape's saturation throughput
(:func:`bench.sim.truth.saturation_rps`). Below 1 a "not steady" is a false alarm (the queue is stable); above
1 it is the test's power. The two shapes are those of ``tests/load/test_capacity.py`` and
benchmarks/capacity_coverage.py: A (256 slots, ``t(b) = 40 + 2b`` ms, 200 prompt / 16 output tokens) and B
(4 slots, ``t(b) = 20 + b`` ms, 32 / 8).

    python benchmarks/steadiness_alarms.py --seeds 200
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config.slo import parse_slo  # noqa: E402
from bench.load.capacity_model import ModelPoints  # noqa: E402
from bench.load.point import LoadSettings  # noqa: E402
from bench.sim import truth as T  # noqa: E402
from bench.sim.config import SimConfig  # noqa: E402

SHAPES = {
    "A": (SimConfig(decode_step_ms=40, decode_step_ms_per_seq=2, prefill_tok_s=20000), 200, 16),
    "B": (SimConfig(decode_step_ms=20, decode_step_ms_per_seq=1, max_running=4, prefill_tok_s=1e12), 32, 8),
}
SLO = "ttft_p90=300ms"


def alarm(job: tuple[str, float, int, float, str, float]) -> bool:
    """One point; True when it is called not steady."""
    shape, share, seed, duration, arrival, burstiness = job
    cfg, prompt, out = SHAPES[shape]
    ls = LoadSettings(duration_s=duration, input_tokens=str(prompt), slo=SLO, seed=seed, arrival=arrival,
                      burstiness=burstiness)
    mp = ModelPoints(cfg, ls, parse_slo(SLO), max_tokens=out)
    rate = share * T.saturation_rps(cfg, prompt, out)
    return not asyncio.run(mp(rate, 0))["steady"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200, help="points per shape and level (seeds 1000..)")
    ap.add_argument("--levels", default="0.5,0.65,0.75,0.85,1.05,1.2", help="shares of saturation throughput")
    ap.add_argument("--duration", type=float, default=50.0, help="each point's schedule, s (--duration)")
    ap.add_argument("--arrival", default="poisson", help="poisson, gamma or constant (--arrival)")
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma's shape (--burstiness)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    levels = [float(x) for x in a.levels.split(",")]
    jobs = [(s, lv, 1000 + i, a.duration, a.arrival, a.burstiness) for s in SHAPES for lv in levels for i in range(a.seeds)]
    t0 = time.monotonic()
    with Pool(a.jobs) as pool:
        res = pool.map(alarm, jobs)
    got = {(j[0], j[1]): 0 for j in jobs}
    for j, r in zip(jobs, res):
        got[(j[0], j[1])] += r
    what = a.arrival + (f" (burstiness {a.burstiness:g})" if a.arrival == "gamma" else "")
    print(f"{a.duration:g}-s points, {what} arrivals, {a.seeds} seeds per cell; "
          "'not steady' per shape and load (share of saturation)\n")
    print("| shape | saturation req/s | " + " | ".join(f"{lv:g}" for lv in levels) + " |")
    print("|---|---|" + "---|" * len(levels))
    for s, (cfg, prompt, out) in SHAPES.items():
        cells = " | ".join(f"{got[(s, lv)]}/{a.seeds} ({100 * got[(s, lv)] / a.seeds:.1f} %)" for lv in levels)
        print(f"| {s} | {T.saturation_rps(cfg, prompt, out):.2f} | {cells} |")
    print(f"(wall {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
