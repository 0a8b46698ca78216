"""Operating characteristics of the sequential ``bench gate`` on a real llama-server, with ``bench proxy`` making
slowdowns of known size.

One llama-server (bench's embedded engine: SmolLM2-135M) runs for the whole benchmark. Every request goes through
a ``bench proxy`` process: the baseline through one with no delay, the candidate through one adding
``d = itl * (1/f - 1)`` ms per streamed event (``itl`` the baseline's median gap between events), which slows
per-stream decode to the fraction ``f`` exactly (docs/gate.md, "Known slowdowns"). Each round records a fresh
baseline, then runs one gate per case, in rotating order, each with ``--max-time`` as ``bench gate`` would:

* same          f = 1.00, allowance 5 %   -> pass
* 10% slower    f = 0.90, allowance 5 %   -> regression
* 5% slower     f = 0.95, allowance 3 %   -> regression

``--mode ab`` measures ``bench ab`` instead: per case, A through a 0-delay proxy and B through the delayed one,
waves interleaved (the delay from 8 calibration requests per round). ``--url`` gates a running server (the H200
rounds: benchmarks/gpu/gate_oc_h200.sh).

    python benchmarks/gate_oc_real.py --n 20 --max-time 300 --baseline-requests 48
    python benchmarks/gate_oc_real.py --mode ab --n 20 --max-time 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import ClientSettings  # noqa: E402
from bench.config.profile import parse_profile  # noqa: E402
from bench.driver import ABRounds, run_ab, run_gate, run_profile  # noqa: E402
from bench.gate import Rule, Verdict, overall_exit  # noqa: E402
from bench.results import Results  # noqa: E402
from bench.sequential import sequential_compare  # noqa: E402
from bench.tools.engine import LocalEngine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILE = {
    "max_tokens": 32,
    "requests": 16,
    "warmup": 1,
    "overhead_probes": 1,
    "sweep": [{"name": "decode", "depths": [0], "streams": [1]}],
}
CASES = {"same": (1.00, 5.0), "10% slower": (0.90, 5.0), "5% slower": (0.95, 3.0)}


class ProxyProcess:
    """``python -m bench proxy UPSTREAM --port 0 --delay-per-event-ms X`` as a child process (its own GIL)."""

    def __init__(self, upstream: str, delay_ms: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench", "proxy", upstream, "--port", "0",
                                      "--delay-per-event-ms", f"{delay_ms:.4f}"], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"bench proxy did not start: {line!r}")
        self.url = m.group(1)

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def _baseline(upstream: str, requests: int) -> tuple[Results, float]:
    """A baseline of ``requests`` through a 0-delay proxy, and its median gap between events (ms)."""
    prof = parse_profile({**PROFILE, "requests": requests}, "gate-oc-real")
    with ProxyProcess(upstream, 0.0) as px:
        baseline = await run_profile(px.url, prof, ClientSettings(), out_dir=None)
    return baseline, statistics.median(baseline.cells[0].samples["itl_ms_p50"])


async def _gate(upstream: str, baseline: Results, delay: float, rules: list[Rule], args: argparse.Namespace
                ) -> tuple[int, Verdict, list[int] | None, bool]:
    """One ``bench gate`` against the stored ``baseline``: (exit code, verdict, looks, budget ran out)."""
    prof = parse_profile(PROFILE, "gate-oc-real")
    with ProxyProcess(upstream, delay) as px:
        o = await run_gate(px.url, prof, ClientSettings(), baseline, rules,
                           deadline=time.monotonic() + args.max_time - 1.0)
    return o.code, o.verdicts[0], o.looks.get(o.verdicts[0].cell), o.budget_ran_out


async def _ab(upstream: str, delay: float, rules: list[Rule], args: argparse.Namespace
              ) -> tuple[int, Verdict, list[int] | None, bool]:
    """One sequential ``bench ab`` (A: a 0-delay proxy, B: the delayed one, waves interleaved)."""
    prof = parse_profile(PROFILE, "gate-oc-real")
    rounds = ABRounds(rules, time.monotonic() + args.max_time - 1.0)
    with ProxyProcess(upstream, 0.0) as pa, ProxyProcess(upstream, delay) as pb:
        ra, rb = await run_ab(pa.url, pb.url, prof, ClientSettings(), rounds=rounds)
    vs = sequential_compare(ra, rb, rules, rounds.look_map(), seed=rounds.seed)
    return overall_exit(vs), vs[0], rounds.looks.get(vs[0].cell), rounds.budget_ran_out


async def _round(upstream: str, rep: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    baseline, itl = await _baseline(upstream, args.baseline_requests if args.mode == "gate" else 8)
    cases = list(CASES)
    out = []
    for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
        f, allowance = CASES[case]
        delay = itl * (1.0 / f - 1.0)
        rules = [Rule("decode_tok_s", "*", "median", allowance, 0)]
        t0 = time.monotonic()
        if args.mode == "ab":
            code, v, looks, ran_out = await _ab(upstream, delay, rules, args)
        else:
            code, v, looks, ran_out = await _gate(upstream, baseline, delay, rules, args)
        wall = time.monotonic() - t0
        row = {"case": case, "rep": rep, "code": code, "verdict": v.verdict, "f": f, "allowance": allowance,
               "itl_ms": itl, "delay_ms": delay, "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "mde_pct": v.mde_pct,
               "planned_mde_pct": v.planned_mde_pct, "looks": looks, "wall_s": round(wall, 1),
               "budget_ran_out": ran_out}
        print(f"  {case} {rep + 1}/{args.n}: exit {code} {v.verdict} ratio {v.ratio:.3f} (true {f:.3f}, "
              f"+{delay:.2f} ms/event) looks {looks} {wall:.0f} s", file=sys.stderr, flush=True)
        out.append(row)
    return out


def _mode_text(args: argparse.Namespace) -> str:
    if args.mode == "ab":
        return ("sequential bench ab per case (A: 0-delay proxy, B: delayed proxy, waves interleaved, 16 per side "
                "at the first look); the delay from 8 calibration requests per round")
    return (f"{args.baseline_requests} requests per baseline (16 at a gate's first look), a fresh baseline per round "
            "through a 0-delay proxy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="rounds (one gate per case each)")
    ap.add_argument("--max-time", type=float, default=120.0, help="each gate's --max-time (s)")
    ap.add_argument("--threads", type=int, default=1, help="llama-server threads")
    ap.add_argument("--baseline-requests", type=int, default=48,
                    help="requests of each round's baseline (a gate's first look is at 16 candidate requests)")
    ap.add_argument("--json", type=Path, help="also write every gate's row here")
    ap.add_argument("--mode", choices=("gate", "ab"), default="gate",
                    help="gate: a stored baseline per round, then bench gate per case; ab: bench ab per case, A "
                         "through a 0-delay proxy and B through the delayed one, waves interleaved")
    ap.add_argument("--url", help="gate this running server instead of starting the embedded engine")
    ap.add_argument("--engine", default="bench's embedded SmolLM2-135M Q4_1", help="the engine, as printed")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="start no new round after this many seconds (a device call's limit)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    t_all = time.monotonic()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(LocalEngine(parallel=2, ctx_size=4096, threads=args.threads)).url
        for rep in range(args.n):
            if args.stop_after is not None and rep and time.monotonic() - t_all > args.stop_after:
                print(f"stopped after {rep} rounds (--stop-after {args.stop_after:g})", file=sys.stderr)
                break
            rows += asyncio.run(_round(url, rep, args))
    print(f"# {'bench ab' if args.mode == 'ab' else 'gate'} operating characteristics on llama-server through bench proxy "
          f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()})\n")
    print(f"command: python benchmarks/gate_oc_real.py {shlex.join(sys.argv[1:])}\n")
    threads = f", {args.threads} thread(s)" if not args.url else ""
    print(f"engine: llama-server ({args.engine}){threads}; {len(rows) // len(CASES)} rounds; profile: max_tokens "
          f"32, 1 stream; {_mode_text(args)}; "
          f"--max-time {args.max_time:g} s per gate; total {time.monotonic() - t_all:.0f} s\n")
    print("| case | wanted | gates | pass (0) | regression (1) | undecided (2) | ratio median | looks median (max) | "
          "wall s median (max) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for case, (f, allowance) in CASES.items():
        rs = [r for r in rows if r["case"] == case]
        c = Counter(r["code"] for r in rs)
        want = "pass" if f >= 1 - allowance / 100 else "regression"
        looks = [len(r["looks"] or []) for r in rs]
        walls = [r["wall_s"] for r in rs]
        print(f"| {case} (allowance {allowance:g} %) | {want} | {len(rs)} | {c[0]} | {c[1]} | {c[2]} | "
              f"{statistics.median(r['ratio'] for r in rs if r['ratio']):.3f} | {statistics.median(looks):.0f} "
              f"({max(looks)}) | {statistics.median(walls):.0f} ({max(walls):.0f}) |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
