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

    python benchmarks/gate_oc_real.py --n 5 --max-time 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
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
from bench.driver import run_gate, run_profile  # noqa: E402
from bench.gate import Rule  # noqa: E402
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


async def _round(upstream: str, rep: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    prof = parse_profile(PROFILE, "gate-oc-real")
    with ProxyProcess(upstream, 0.0) as px:
        baseline = await run_profile(px.url, prof, ClientSettings(), out_dir=None)
    cell = baseline.cells[0]
    itl = statistics.median(cell.samples["itl_ms_p50"])
    cases = list(CASES)
    out = []
    for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
        f, allowance = CASES[case]
        delay = itl * (1.0 / f - 1.0)
        rules = [Rule("decode_tok_s", "*", "median", allowance, 0)]
        with ProxyProcess(upstream, delay) as px:
            t0 = time.monotonic()
            o = await run_gate(px.url, prof, ClientSettings(), baseline, rules, deadline=t0 + args.max_time - 1.0)
            wall = time.monotonic() - t0
        v = o.verdicts[0]
        row = {"case": case, "rep": rep, "code": o.code, "verdict": v.verdict, "f": f, "allowance": allowance,
               "itl_ms": itl, "delay_ms": delay, "ratio": v.ratio, "lo": v.lo, "hi": v.hi, "mde_pct": v.mde_pct,
               "planned_mde_pct": v.planned_mde_pct, "looks": o.looks.get(v.cell), "wall_s": round(wall, 1),
               "budget_ran_out": o.budget_ran_out}
        print(f"  {case} {rep + 1}/{args.n}: exit {o.code} {v.verdict} ratio {v.ratio:.3f} (true {f:.3f}, "
              f"+{delay:.2f} ms/event) looks {row['looks']} {wall:.0f} s", file=sys.stderr, flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5, help="rounds (one gate per case each)")
    ap.add_argument("--max-time", type=float, default=120.0, help="each gate's --max-time (s)")
    ap.add_argument("--threads", type=int, default=1, help="llama-server threads")
    ap.add_argument("--json", type=Path, help="also write every gate's row here")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    t_all = time.monotonic()
    with LocalEngine(parallel=2, ctx_size=4096, threads=args.threads) as eng:
        for rep in range(args.n):
            rows += asyncio.run(_round(eng.url, rep, args))
    print(f"# gate operating characteristics on llama-server through bench proxy "
          f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()})\n")
    print(f"command: python benchmarks/gate_oc_real.py {' '.join(sys.argv[1:])}\n")
    print(f"engine: llama-server (bench's embedded SmolLM2-135M Q4_1), {args.threads} thread(s); profile: max_tokens "
          f"32, 16 requests per baseline, 1 stream; a fresh baseline per round through a 0-delay proxy; "
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
