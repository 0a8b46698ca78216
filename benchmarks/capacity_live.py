"""Live ``bench capacity`` searches against ``bench sim`` (HTTP, real time), several at once with their own sim
each, seeded: the default search of issue 24 (``--slo ttft_p90=300ms --by rate --input-tokens 200
--max-tokens 16``, sim ``t(b) = 40 + 2b`` ms, prefill 20,000 tok/s). Prints per search the boundary, the interval,
the confidence, the wall time and the exit status, and the error against ``--truth``.

    python benchmarks/capacity_live.py --searches 12 --truth 22.10 --out /tmp/live
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIM = ["--decode-step-ms", "40", "--decode-step-ms-per-seq", "2", "--prefill-tok-s", "20000", "--port", "0"]
CAP = ["--slo", "ttft_p90=300ms", "--by", "rate", "--input-tokens", "200", "--max-tokens", "16", "--json"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--searches", type=int, default=12)
    ap.add_argument("--truth", type=float, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--extra", default="", help="more bench capacity flags, space separated")
    a = ap.parse_args(argv)
    sims, caps = [], []
    for k in range(a.searches):
        p = subprocess.Popen([sys.executable, "-m", "bench.sim", *SIM], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        m = re.search(r"http://\S+", p.stdout.readline())
        assert m, "the sim printed no URL"
        sims.append(p)
        d = a.out / f"s{k:02d}"
        cmd = [sys.executable, "-m", "bench", "capacity", m.group(0), *CAP, "--seed", str(k), "--out", str(d),
               *a.extra.split()]
        caps.append((time.monotonic(), subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                        text=True), d))
    print("| seed | boundary | error | interval | covers | confidence | wall s | rc |\n|---|---|---|---|---|---|---|---|")
    errs, cov, walls = [], [], []
    for k, (t0, c, _d) in enumerate(caps):
        out, _ = c.communicate()
        wall = time.monotonic() - t0
        doc = json.loads(out) if c.returncode == 0 else {}
        b, (lo, hi) = doc.get("boundary"), doc.get("interval", [None, None])
        e = b / a.truth - 1 if b else float("nan")
        ok = lo is not None and hi is not None and lo <= a.truth <= hi
        errs.append(e)
        cov.append(ok)
        walls.append(wall)
        print(f"| {k} | {b} | {100 * e:+.1f} % | [{lo}, {hi}] | {ok} | {doc.get('confidence')} | {wall:.0f} "
              f"| {c.returncode} |", flush=True)
    for p in sims:
        p.terminate()
    print(f"within 2 %: {sum(abs(e) <= 0.02 for e in errs)}/{len(errs)}, intervals covering: {sum(cov)}/{len(cov)}, "
          f"median |error| {100 * statistics.median(abs(e) for e in errs):.1f} %, wall median {statistics.median(walls):.0f} s, "
          f"max {max(walls):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
