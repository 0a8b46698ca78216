"""The long-run share over the SLO limit against the offered rate, near the steady-state boundary, on the sim's
engine model (virtual time): logit and probit of each share, to see which one is straight in the rate (docs/load.md,
"How", step 4). Per rate: two Poisson runs of 1,500 s (seeds 1, 2), the first 100 s left out, pooled.

    python benchmarks/capacity_share_curve.py A-ttft-poisson --truth-cache benchmarks/results/capacity_truth-2026-12-02-vm.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from capacity_coverage import SHAPES  # noqa: E402

from bench.sim import truth as T  # noqa: E402

FACTORS = (0.85, 0.9, 0.95, 0.975, 1.0, 1.025, 1.05, 1.1, 1.15)


def share(case: str, rate: float) -> float:
    shape, metric, _ = case.split("-")
    cfg, pt, ot, objs = SHAPES[shape]
    limit = objs[metric][1]
    over = n = 0
    for seed in (1, 2):
        arr = T.load_arrivals_ns(rate, 1500, "poisson", seed, 1.0)
        sim = T.simulate_load(cfg, arr, pt, ot)
        a, first, last = (np.asarray(v, dtype=float) for v in (arr, sim["first_ns"], sim["last_ns"]))
        keep = a >= 100e9
        v = (first - a) / 1e6 if metric == "ttft" else (last - first) / 1e6 / (ot - 1)
        over += int((v[keep] > limit).sum())
        n += int(keep.sum())
    return over / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", help="a Poisson case of capacity_coverage.py, e.g. A-ttft-poisson")
    ap.add_argument("--truth-cache", required=True, help="capacity_coverage.py's truths (JSON)")
    a = ap.parse_args(argv)
    truth = json.loads(Path(a.truth_cache).read_text())[a.case][0]
    print("| x boundary | rate req/s | share | logit | probit |\n|---|---|---|---|---|")
    for f in FACTORS:
        s = share(a.case, f * truth)
        lg = f"{math.log(s / (1 - s)):+.3f}" if 0 < s < 1 else "-"
        pr = f"{NormalDist().inv_cdf(s):+.3f}" if 0 < s < 1 else "-"
        print(f"| {f:g} | {f * truth:.3f} | {s:.4f} | {lg} | {pr} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
