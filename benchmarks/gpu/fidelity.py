"""bench's own fidelity per cell: client CPU use, event/token rate ingested, and bench's timestamps against the
server's own clock (llama.cpp ``timings``). Reads a bench results folder (``records.jsonl``, ``results.json``) and
the CPU samples ``cpu_watch.py`` wrote for that run.

usage: python fidelity.py RESULTS_DIR CPU.json OUT.json

Per cell (measured waves only):
- ``client_cpu_pct``: bench's CPU time over the cells' wall time (wave start -> last byte), % of one core; bench
  runs one event loop on one thread, so near 100 % means it could not keep up. ``client_cpu_pct_decode``: the same
  over the decode windows only (earliest first token -> latest last token of each wave).
- ``tokens_per_s`` / ``events_per_s``: output tokens / token-bearing SSE events ingested per second of decode window.
- ``lag_ms``: per request, bench's decode span (first -> last token event, on bench's clock) minus the server's
  ``predicted_ms`` (first -> last token, on the server's clock); ~0 when bench stamps tokens as they are produced.
- ``decode_ratio``: bench decode tok/s / server ``predicted_per_second`` (both (n-1)/span), per request.
- ``ttft_minus_server_prompt_ms``: TTFT - server ``prompt_ms``: HTTP, queueing, tokenizing, the first token's
  sampling and delivery; the part of TTFT that is not prompt processing.
- ``same_read_pct``: % of token events that arrived in the same read as the one before (same timestamp); a
  client more than a step behind reads several events of a stream at once.
- ``step_burst_ms``: with N streams decoding together, each engine step sends N tokens; bench's stamps of one step
  form a burst. Its width (first -> last stamp of a cluster holding >= 90 % of the wave's streams; clusters split
  at gaps over 0.3 x the median ITL) is the server's send spread plus bench's serial handling of N events: the
  most a token's stamp can be late within a step.
"""
from __future__ import annotations

import bisect
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _stats(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "median": _q(xs, 0.5), "p10": _q(xs, 0.1), "p90": _q(xs, 0.9),
            "min": min(xs) if xs else None, "max": max(xs) if xs else None}


def burst_widths(streams: list[list[float]]) -> list[float]:
    """Widths (ms) of the per-step bursts of one wave; ``streams``: each stream's absolute token times in ms."""
    if len(streams) < 2:
        return []
    gaps = [b - a for ts in streams for a, b in zip(ts, ts[1:])]
    if not gaps:
        return []
    thr = 0.3 * statistics.median(gaps)
    allt = sorted(t for ts in streams for t in ts)
    out, start, n = [], allt[0], 1
    for a, b in zip(allt, allt[1:]):
        if b - a > thr:
            if n >= 0.9 * len(streams):
                out.append(a - start)
            start, n = b, 1
        else:
            n += 1
    if n >= 0.9 * len(streams):
        out.append(allt[-1] - start)
    return out


class CpuCurve:
    """CPU seconds used by the watched process at a CLOCK_MONOTONIC time (linear between samples)."""

    def __init__(self, samples: list[list[float]]) -> None:
        self.t = [s[0] for s in samples]
        self.c = [s[1] for s in samples]

    def at(self, t_ns: float) -> float | None:
        if len(self.t) < 2 or t_ns < self.t[0]:
            return None
        if t_ns >= self.t[-1]:  # the last sample is the total at exit
            return self.c[-1]
        i = bisect.bisect_left(self.t, t_ns)
        if i == 0:
            return self.c[0]
        t0, t1, c0, c1 = self.t[i - 1], self.t[i], self.c[i - 1], self.c[i]
        return c0 + (c1 - c0) * (t_ns - t0) / (t1 - t0) if t1 > t0 else c1

    def used(self, a: float, b: float) -> float | None:
        x, y = self.at(a), self.at(b)
        return None if x is None or y is None else y - x


def analyze(results_dir: Path, cpu_doc: dict[str, Any] | None) -> dict[str, Any]:
    recs = [json.loads(line) for line in (results_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    curve = CpuCurve(cpu_doc["samples"]) if cpu_doc else None
    by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        if r.get("meta", {}).get("phase") == "measure" and r.get("ok"):
            by_cell[r["meta"]["cell"]].append(r)
    cells = {}
    for cell, rs in by_cell.items():
        waves: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            waves[r["meta"].get("wave", 0)].append(r)
        wall = dec_wall = cpu = cpu_dec = 0.0
        cpu_ok = curve is not None
        toks = evs = same = 0
        lag, ratio, ovh, srv_dec, bench_dec, bursts = [], [], [], [], [], []
        for ws in waves.values():
            bursts += burst_widths([[r["sent_ns"] / 1e6 + e[0] for e in r["events"] if e[1] or e[2] or e[3]]
                                    for r in ws])
            a = min(r["sent_ns"] for r in ws)
            b = max(r["sent_ns"] + (r["end_ns"] or 0) for r in ws)
            firsts, lasts = [], []
            for r in ws:
                tev = [e[0] for e in r["events"] if e[1] or e[2] or e[3]]  # t_ms of token-bearing events
                if not tev:
                    continue
                firsts.append(r["sent_ns"] + tev[0] * 1e6)
                lasts.append(r["sent_ns"] + tev[-1] * 1e6)
                n = (r.get("usage") or {}).get("completion_tokens") or len(tev)
                toks += n
                evs += len(tev)
                same += sum(1 for x, y in zip(tev, tev[1:]) if y == x)
                tm = r.get("timings") or {}
                span_ms = tev[-1] - tev[0]
                if tm.get("predicted_ms") and len(tev) >= 2:
                    lag.append(span_ms - tm["predicted_ms"])
                    if tm.get("predicted_per_second") and span_ms > 0:
                        bd = (n - 1) / (span_ms / 1000)
                        bench_dec.append(bd)
                        srv_dec.append(tm["predicted_per_second"])
                        ratio.append(bd / tm["predicted_per_second"])
                if tm.get("prompt_ms") is not None:
                    ovh.append(tev[0] - tm["prompt_ms"])
            wall += (b - a) / 1e9
            if firsts:
                dec_wall += (max(lasts) - min(firsts)) / 1e9
            if cpu_ok and curve is not None:
                u = curve.used(a, b)
                ud = curve.used(min(firsts), max(lasts)) if firsts else None
                if u is None or ud is None:
                    cpu_ok = False
                else:
                    cpu += u
                    cpu_dec += ud
        cells[cell] = {
            "requests": len(rs), "waves": len(waves), "wall_s": round(wall, 3), "decode_wall_s": round(dec_wall, 3),
            "client_cpu_s": round(cpu, 3) if cpu_ok else None,
            "client_cpu_pct": round(100 * cpu / wall, 1) if cpu_ok and wall else None,
            "client_cpu_pct_decode": round(100 * cpu_dec / dec_wall, 1) if cpu_ok and dec_wall else None,
            "tokens": toks, "events": evs,
            "tokens_per_s": round(toks / dec_wall, 1) if dec_wall else None,
            "events_per_s": round(evs / dec_wall, 1) if dec_wall else None,
            "same_read_pct": round(100 * same / max(1, evs - len(rs)), 2),
            "lag_ms": _stats(lag), "decode_ratio": _stats(ratio),
            "bench_decode_tok_s": _stats(bench_dec), "server_decode_tok_s": _stats(srv_dec),
            "ttft_minus_server_prompt_ms": _stats(ovh),
            "step_burst_ms": _stats(bursts),
        }
    out: dict[str, Any] = {"cells": cells}
    if cpu_doc:
        out["process"] = {k: cpu_doc.get(k) for k in ("wall_s", "cpu_s", "user_s", "sys_s", "maxrss_kb", "rc")}
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cpu = json.loads(Path(argv[1]).read_text()) if Path(argv[1]).is_file() else None
    doc = analyze(Path(argv[0]), cpu)
    Path(argv[2]).write_text(json.dumps(doc, indent=1))
    for c, s in doc["cells"].items():
        print(f"{c}: cpu {s['client_cpu_pct']}% (decode {s['client_cpu_pct_decode']}%), "
              f"{s['tokens_per_s']} tok/s {s['events_per_s']} ev/s ingested, lag p50 {s['lag_ms']['median']} ms, "
              f"bench/server decode {s['decode_ratio']['median']}, TTFT-prompt_ms {s['ttft_minus_server_prompt_ms']['median']} ms, "
              f"same-read {s['same_read_pct']}%, step burst p50 {s['step_burst_ms']['median']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
