"""``bench gate`` on the real llama-server: self-gates (fresh and warm server, both orders) and a real slowdown.

benchmarks/gate_fairness.py proves the gate on ``bench sim``, whose timing is exact. This script asks the same of
the embedded llama-server (SmolLM2-135M, ``bench.tools.engine.LocalEngine``), where server state drifts between runs:

* **warm self-gate**: one server; a baseline run, then ``bench gate`` of the same server against it (with the
  profile's re-measure budget). Should pass: never exit 1, and "improved" only beyond the noise.
* **fresh self-gate**: a baseline run on one server, the gate on a fresh server of the same flags.
* **both orders**: for each self-gate pair the two runs are also compared the other way (``bench compare`` of the
  candidate as baseline), so a drift that favours the second run shows up as an asymmetry.
* **slowdown**: baseline on a server with ``--threads 2``, gate on one with ``--threads 1`` (a real engine
  slowdown, about 1.6-2x on decode): should be exit 1; and the reverse (faster candidate): never exit 1. With
  ``--slow-args`` the slow side is the same server with those flags instead (on a GPU, where threads do not
  matter: ``--server-args "-ngl 99" --slow-args "-ngl 99 -ub 8 -b 8"``, say).

The engine is ``bench.tools.engine.LocalEngine``'s: ``$BENCH_LLAMA_SERVER`` and ``$BENCH_MODEL`` choose another binary
and model (the H200 run: a CUDA build and a random SmolLM2-shaped model, ``benchmarks/gpu/run_h200.sh gate``).

Prints, per scenario, the exit codes (0 pass, 1 regression, 2 inconclusive) and verdict counts, with the median
minimum detectable effect (MDE) of the decode rule, and writes the same table to ``--out`` (Markdown).

    python benchmarks/gate_real.py                       # 10 rounds (10 warm + 10 fresh self-gates, 2 x 10
                                                         # reversed, 10 + 10 slowdown gates): about 1-2 hours
    python benchmarks/gate_real.py --rounds 1 --quick    # a smoke run: one round, 4 short requests per cell

On a shared 2-core machine the threads comparison is not a clean slowdown (other jobs take the cores), and a full
run takes long (on the project's shared 2-core VM at load ~9, one round of the default profile did not finish in
25 minutes: a 1K-token prompt took ~36 s): run it on a quiet machine with at least 4 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import ClientSettings
from bench.config.profile import parse_profile  # noqa: E402
from bench.driver import run_gate, run_profile  # noqa: E402
from bench.gate import compare, overall_exit, profile_rules  # noqa: E402
from bench.results import Results  # noqa: E402
from bench.tools.engine import LocalEngine, find_model  # noqa: E402

PROFILE: dict[str, Any] = {
    "max_tokens": 48,
    "requests": 8,
    "warmup": 1,
    "overhead_probes": 2,
    "gate_budget_waves": 6,
    "sweep": [
        {"name": "decode", "depths": [0], "streams": [1]},
        {"name": "depth", "depths": ["1k"], "streams": [1], "requests": 6},
    ],
    "gate": [
        {"metric": "decode_tok_s", "cell": "d0-s1-prose", "stat": "median", "max_drop_pct": 5},
        {"metric": "ttft_ms", "cell": "d1024-s1-prose", "stat": "median", "max_rise_pct": 10},
    ],
}
WANT = {  # scenario -> (what a fair gate does, exit codes that satisfy it)
    "warm self-gate": ("pass", (0,)), "warm reversed": ("pass", (0,)),
    "fresh self-gate": ("pass", (0,)), "fresh reversed": ("pass", (0,)),
    "slower candidate": ("regression", (1,)), "faster candidate": ("no regression", (0, 2)),
}


class Tally:
    """Exit codes, verdict counts and decode MDEs per scenario."""

    def __init__(self, log: Path | None = None) -> None:
        self.codes: dict[str, list[int]] = {k: [] for k in WANT}
        self.verdicts: dict[str, Counter[str]] = {k: Counter() for k in WANT}
        self.mde: dict[str, list[float]] = {k: [] for k in WANT}
        self.lines: list[str] = []
        self.log = log
        if log is not None and log.exists():  # an earlier call's gates: this one continues the count
            for line in log.read_text(encoding="utf-8").splitlines():
                o = json.loads(line)
                self._count(o["scenario"], o["code"], o["verdicts"], o["mde"], o["detail"])

    @property
    def rounds(self) -> int:
        """Rounds complete (each ends with the faster-candidate gate)."""
        return len(self.codes["faster candidate"])

    def add(self, scenario: str, code: int, verdicts: list[Any]) -> None:
        """One gate's outcome: printed at once (a long run shows its progress) and appended to the log."""
        dec = [v for v in verdicts if v.rule.metric == "decode_tok_s"]
        detail = (f"decode ratio {dec[0].ratio:.3f} [{dec[0].lo:.3f}, {dec[0].hi:.3f}] MDE {dec[0].mde_pct:.1f} %"
                  if dec and dec[0].lo is not None and dec[0].mde_pct is not None else "")
        names = [v.verdict for v in verdicts]
        mde = [v.mde_pct for v in verdicts if v.rule.metric == "decode_tok_s" and v.mde_pct]
        self._count(scenario, code, names, mde, detail)
        print(self.lines[-1], file=sys.stderr, flush=True)
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"scenario": scenario, "code": code, "verdicts": names, "mde": mde,
                                    "detail": detail}) + "\n")

    def _count(self, scenario: str, code: int, verdicts: list[str], mde: list[float], detail: str) -> None:
        self.codes[scenario].append(code)
        self.verdicts[scenario].update(verdicts)
        self.mde[scenario] += mde
        self.lines.append(f"  {scenario}: exit {code}, {', '.join(verdicts)}; {detail}")

    def table(self) -> list[str]:
        """The Markdown table of rates."""
        out = ["| scenario | wanted | gates | pass (0) | regression (1) | inconclusive (2) | fair | verdicts "
               "(reg/inc/impr/same) | decode MDE median |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
        for k, (wanted, ok) in WANT.items():
            cs = self.codes[k]
            if not cs:
                continue
            c, v, m = Counter(cs), self.verdicts[k], sorted(self.mde[k])
            mde = f"{m[len(m) // 2]:.1f} %" if m else "-"
            out.append(f"| {k} | {wanted} | {len(cs)} | {c[0]} | {c[1]} | {c[2]} | {sum(c[x] for x in ok)}/"
                       f"{len(cs)} | {v['regression']}/{v['inconclusive']}/{v['improved']}/{v['unchanged']} | {mde} |")
        return out


async def _run(url: str, prof: Any) -> Results:
    return await run_profile(url, prof, ClientSettings(), out_dir=None)


def _engine(threads: int, extra: list[str]) -> LocalEngine:
    return LocalEngine(parallel=1, ctx_size=8192, threads=threads, extra_args=extra)


async def _self_gates(tally: Tally, prof: Any, rules: list[Any], threads: int, extra: list[str]) -> None:
    with _engine(threads, extra) as eng:
        base = await _run(eng.url, prof)
        o = await run_gate(eng.url, prof, ClientSettings(), base, rules)
        tally.add("warm self-gate", o.code, o.verdicts)
        rev = compare(o.results, base, rules)
        tally.add("warm reversed", overall_exit(rev), rev)
    with _engine(threads, extra) as eng:
        o = await run_gate(eng.url, prof, ClientSettings(), base, rules)
        tally.add("fresh self-gate", o.code, o.verdicts)
        rev = compare(o.results, base, rules)
        tally.add("fresh reversed", overall_exit(rev), rev)


async def _slowdown(tally: Tally, prof: Any, rules: list[Any], fast: tuple[int, list[str]],
                    slow: tuple[int, list[str]]) -> None:
    results = []
    for threads, extra in (fast, slow):
        with _engine(threads, extra) as eng:
            results.append(await _run(eng.url, prof))
    for name, b, c in (("slower candidate", 0, 1), ("faster candidate", 1, 0)):
        vs = compare(results[b], results[c], rules)  # stored results both ways; no re-measure budget here
        tally.add(name, overall_exit(vs), vs)


def main() -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=10, help="rounds (each: 2 self-gates, 2 reversed, 2 slowdowns)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads of the self-gates and the fast side")
    ap.add_argument("--server-args", default="", help="more llama-server flags for every server (e.g. '-ngl 99')")
    ap.add_argument("--slow-args", default=None,
                    help="the slow side's flags instead of half the threads (e.g. '-ngl 99 -ub 8 -b 8')")
    ap.add_argument("--quick", action="store_true", help="4 requests per cell (a smoke run)")
    ap.add_argument("--out", default=None, help="write the Markdown table here (e.g. benchmarks/results/gate_real.md)")
    a = ap.parse_args()
    spec = PROFILE
    if a.quick:  # a smoke run: fewer, shorter requests and a shorter prompt
        spec = dict(PROFILE, requests=4, gate_budget_waves=2, max_tokens=24,
                    sweep=[PROFILE["sweep"][0], dict(PROFILE["sweep"][1], depths=["512"], requests=4)],
                    gate=[PROFILE["gate"][0], dict(PROFILE["gate"][1], cell="d512-s1-prose")])
    prof = parse_profile(spec, "gate-real")
    rules, _ = profile_rules(prof.gate)
    tally = Tally(Path(a.out).with_suffix(".jsonl") if a.out else None)
    t0 = time.monotonic()
    extra = a.server_args.split()
    fast = (a.threads, extra)
    slow = (a.threads, a.slow_args.split()) if a.slow_args is not None else (max(1, a.threads // 2), extra)
    head = (f"`python benchmarks/gate_real.py {' '.join(sys.argv[1:])}` (llama-server {Path(find_model()).name}; "
            f"fast side --threads {fast[0]} {' '.join(fast[1])}, slow side --threads {slow[0]} {' '.join(slow[1])})")
    while tally.rounds < a.rounds:  # the table is rewritten after every round: a cut run keeps what it measured
        asyncio.run(_self_gates(tally, prof, rules, a.threads, extra))
        asyncio.run(_slowdown(tally, prof, rules, fast, slow))
        print(f"round {tally.rounds}/{a.rounds} done ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        _write(a.out, head, tally)
    _write(a.out, head, tally)
    _write(None, head, tally)
    return 0


def _write(out: str | None, head: str, tally: Tally) -> None:
    """The table and every gate's line, to ``out`` (or stdout)."""
    lines = [head, "", f"{tally.rounds} rounds.", "", *tally.table(), "", "Per gate (decode rule: ratio [95 % CI], MDE):",
             "", "```", *tally.lines, "```"]
    if out:
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
