"""Operating characteristics of the sequential ``bench gate`` on ``bench sim`` with seeded noise.

Each gate starts two fresh sim processes (new seeds, so new per-step jitter and, with ``--drift-pct``, a new
per-instance speed factor), records a baseline on the first with ``bench run``'s loop, then runs the sequential
gate on the second with a time budget (``--max-time``), as ``bench gate URL --baseline FILE --max-time S`` does.
The truth of every gate is known: the true decode ratio is ``(step_b * F_b) / (step_c * F_c)`` with ``F`` each
instance's drift factor (:func:`bench.sim.truth.drift_factor`) and ``step_c = step_b / slowdown``; a verdict is a
false alarm when it says regression while the true ratio is at or above the limit, and a miss when it passes while
the true ratio is below it.

Cases (rule: decode_tok_s median may drop 5 % in the one 1-stream cell):

* same         slowdown 1.00                  -> pass
* 3% slower    slowdown 0.97 (5 % allowed)    -> not a regression
* 7% slower    slowdown 0.93 (allowance + 2)  -> regression (power)
* 10% slower   slowdown 0.90                  -> regression

    python benchmarks/gate_oc.py --n 20 --max-time 60 --jitter-pct 10 --drift-pct 0
    python benchmarks/gate_oc.py --n 10 --cases same --drift-pct 1      # self-gates across drifting instances
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simproc import SimProcess  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from bench.client import ClientSettings  # noqa: E402
from bench.config.profile import parse_profile  # noqa: E402
from bench.driver import run_gate, run_profile  # noqa: E402
from bench.gate import profile_rules  # noqa: E402
from bench.sim import SimConfig  # noqa: E402
from bench.sim.truth import drift_factor  # noqa: E402

STEP_MS = 10.0
ALLOWANCE = 5.0
PROFILE = {
    "max_tokens": 32,
    "requests": 16,
    "warmup": 1,
    "overhead_probes": 1,
    "sweep": [{"name": "decode", "depths": [0], "streams": [1]}],
    "gate": [{"metric": "decode_tok_s", "cell": "*", "stat": "median", "max_drop_pct": ALLOWANCE}],
}
CASES = {"same": 1.00, "3% slower": 0.97, "7% slower": 0.93, "10% slower": 0.90}


def _sim(step_ms: float, seed: int, jitter: float, drift: float) -> SimProcess:
    return SimProcess(decode_step_ms=f"{step_ms:.6f}", prefill_tok_s=20000, seed=seed, step_jitter_pct=jitter,
                      drift_pct=drift)


async def _one_gate(case: str, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    prof = parse_profile(PROFILE, "gate-oc")
    base_prof = parse_profile({**PROFILE, "requests": args.baseline_waves}, "gate-oc")  # same name, more waves
    rules, _ = profile_rules(prof.gate)
    slowdown = CASES[case]
    sb, sc = 1000 + 2 * rep + 100_000 * list(CASES).index(case), 1001 + 2 * rep + 100_000 * list(CASES).index(case)
    step = args.step_ms
    fb = drift_factor(SimConfig(seed=sb, drift_pct=args.drift_pct))
    fc = drift_factor(SimConfig(seed=sc, drift_pct=args.drift_pct))
    true_ratio = (step * fb) / (step / slowdown * fc)
    with _sim(step, sb, args.jitter_pct, args.drift_pct) as base_sim, \
            _sim(step / slowdown, sc, args.jitter_pct, args.drift_pct) as cand_sim:
        baseline = await run_profile(base_sim.base, base_prof, ClientSettings(), out_dir=None)
        t0 = time.monotonic()
        o = await run_gate(cand_sim.base, prof, ClientSettings(), baseline, rules,
                           deadline=t0 + args.max_time - 1.0)
        wall = time.monotonic() - t0
    v = o.verdicts[0]
    return {"case": case, "rep": rep, "code": o.code, "verdict": v.verdict, "true_ratio": true_ratio,
            "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "mde_pct": v.mde_pct, "planned_mde_pct": v.planned_mde_pct,
            "looks": o.looks.get(v.cell), "schedule": o.schedules.get(v.cell), "wall_s": round(wall, 2),
            "budget_ran_out": o.budget_ran_out, "baseline_waves": v.waves_baseline}


def _row(case: str, rows: list[dict[str, Any]]) -> str:
    lim = 1.0 - ALLOWANCE / 100.0
    c = Counter(r["code"] for r in rows)
    false_alarm = sum(1 for r in rows if r["code"] == 1 and r["true_ratio"] >= lim)
    truly_worse = [r for r in rows if r["true_ratio"] < lim]
    caught = sum(1 for r in truly_worse if r["code"] == 1)
    missed = sum(1 for r in truly_worse if r["code"] == 0)
    walls = [r["wall_s"] for r in rows]
    looks = [len(r["looks"] or []) for r in rows]
    waves = [(r["looks"] or [0])[-1] for r in rows]
    tr = [r["true_ratio"] for r in rows]
    power = f"{caught}/{len(truly_worse)}" if truly_worse else "-"
    err = statistics.median(r["ratio"] / r["true_ratio"] - 1.0 for r in rows if r["ratio"]) * 100.0
    return (f"| {case} | {min(tr):.3f}-{max(tr):.3f} | {len(rows)} | {c[0]} | {c[1]} | {c[2]} | {false_alarm} | "
            f"{power} | {missed} | {statistics.median(looks):.0f} ({max(looks)}) | "
            f"{statistics.median(waves):.0f} ({max(waves)}) | {statistics.median(walls):.1f} ({max(walls):.1f}) | "
            f"{err:+.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="gates per case")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--max-time", type=float, default=60.0, help="each gate's --max-time (s)")
    ap.add_argument("--baseline-waves", type=int, default=16, help="waves of each baseline (the candidate's first "
                    "look is at the profile's 16)")
    ap.add_argument("--step-ms", type=float, default=STEP_MS, help="the baseline sim's decode step (ms)")
    ap.add_argument("--jitter-pct", type=float, default=10.0, help="sim --step-jitter-pct")
    ap.add_argument("--drift-pct", type=float, default=0.0, help="sim --drift-pct")
    ap.add_argument("--json", type=Path, help="also write every gate's row here")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    t_all = time.monotonic()
    for rep in range(args.n):
        for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:  # rotate the order
            r = asyncio.run(_one_gate(case, rep, args))
            rows[case].append(r)
            print(f"  {case} {rep + 1}/{args.n}: exit {r['code']} {r['verdict']} ratio {r['ratio']:.3f} "
                  f"(true {r['true_ratio']:.3f}) looks {r['looks']} {r['wall_s']:.1f} s", file=sys.stderr,
                  flush=True)
    print(f"# gate operating characteristics on bench sim ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()}, {platform.processor() or platform.machine()})\n")
    print(f"command: python benchmarks/gate_oc.py {' '.join(sys.argv[1:])}\n")
    print(f"sim: decode step {args.step_ms:g} ms, step jitter {args.jitter_pct} %, drift {args.drift_pct} %; profile: "
          f"max_tokens 32, {args.baseline_waves} requests (waves) per baseline, first look at 16, 1 stream; rule decode_tok_s median drop <= "
          f"{ALLOWANCE:g} %; --max-time {args.max_time:g} s per gate; total {time.monotonic() - t_all:.0f} s\n")
    print("| case | true ratio | gates | pass (0) | regression (1) | undecided (2) | false alarms | caught "
          "(true ratio < limit) | missed | looks median (max) | candidate waves median (max) | "
          "wall s median (max) | measured / true ratio, median |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        print(_row(case, rows[case]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
