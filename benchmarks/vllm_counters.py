"""bench's records of a ``bench capacity`` (or ``bench run``) folder beside a vLLM server's own counters (issue 26
item 5): per point, the ``server_metrics`` bench scraped around it against the usage of every request of the point;
over the whole command, two ``/metrics`` pages saved before and after it against every record in the folder; and
vLLM's TTFT histogram (``vllm:time_to_first_token_seconds``) against bench's TTFTs counted into the same buckets.

    curl -s http://127.0.0.1:8011/metrics > before.txt
    bench capacity http://127.0.0.1:8011/v1 ... --out cap
    curl -s http://127.0.0.1:8011/metrics > after.txt
    PYTHONPATH=. python benchmarks/vllm_counters.py cap --before before.txt --after after.txt

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure.metrics import request_metrics
from bench.records import read_records
from bench.server.metrics import Snapshot, _histogram_delta, parse_page, summarize_snapshots

TTFT = "vllm:time_to_first_token_seconds"


def _sums(recs: list[Any]) -> dict[str, Any]:
    ok = [r for r in recs if r.ok]
    ttft = [m.ttft_ms for m in (request_metrics(r) for r in ok) if m.ttft_ms is not None]
    return {"n": len(recs), "ok": len(ok), "prompt": sum(r.usage["prompt_tokens"] for r in ok),
            "completion": sum(r.usage["completion_tokens"] for r in ok), "ttft": ttft}


def _pct(xs: list[float], q: float) -> str:
    return f"{np.percentile(xs, q):,.0f}" if xs else "-"


def _g(d: dict[str, Any], k: str) -> str:
    v = d.get(k)
    return "-" if v is None else f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def point_rows(folder: Path) -> list[str]:
    rows = ["| point | sent / ok | vLLM requests | vLLM prompt tok | bench prompt tok | vLLM gen tok | bench gen tok "
            "| TTFT ms p50 / p90: vLLM histogram | bench, all requests | bench, window |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for pj in sorted(folder.glob("points/*/point.json")):
        p = json.loads(pj.read_text())
        sm = p.get("server_metrics") or {}
        b = _sums(read_records(pj.parent / "records.jsonl"))
        win = ((p.get("latency") or {}).get("ttft_ms") or {}).get("from_send") or {}
        rows.append(f"| {pj.parent.name} | {b['n']} / {b['ok']} | {_g(sm, 'requests')} | {_g(sm, 'prompt_tokens')} "
                    f"| {b['prompt']:,} | {_g(sm, 'generation_tokens')} | {b['completion']:,} "
                    f"| {_g(sm, 'server_ttft_ms_p50')} / {_g(sm, 'server_ttft_ms_p90')} "
                    f"| {_pct(b['ttft'], 50)} / {_pct(b['ttft'], 90)} | {_g(win, 'median')} / {_g(win, 'p90')} |")
    return rows


def whole_rows(folder: Path, before: Path, after: Path) -> tuple[list[str], list[str]]:
    snaps = [Snapshot(0.0, parse_page(before.read_text())), Snapshot(1.0, parse_page(after.read_text()))]
    d = summarize_snapshots("vllm", snaps)
    recs = [r for f in sorted(folder.rglob("records.jsonl")) for r in read_records(f)]
    b = _sums(recs)
    rows = ["| over the whole command | requests | prompt tokens | generation tokens | TTFT count |",
            "|---|---|---|---|---|",
            f"| vLLM's counters (after - before) | {_g(d, 'requests')} | {_g(d, 'prompt_tokens')} "
            f"| {_g(d, 'generation_tokens')} | {_g(d, 'server_ttft_count')} |",
            f"| bench's records (successful, of {b['n']}) | {b['ok']:,} | {b['prompt']:,} | {b['completion']:,} "
            f"| {len(b['ttft']):,} |"]
    h = _histogram_delta(snaps, TTFT)
    hist = ["| TTFT <= | vLLM's histogram (cumulative) | bench's TTFTs, same buckets |", "|---|---|---|"]
    for le, count in (h or {}).get("buckets", []):
        mine = sum(1 for t in b["ttft"] if t <= le * 1000)
        if count or mine:
            hist.append(f"| {'+Inf' if np.isinf(le) else f'{le * 1000:g} ms'} | {count:,.0f} | {mine:,} |")
    return rows, hist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    a = ap.parse_args()
    print("\n".join(point_rows(a.folder)))
    if a.before and a.after:
        rows, hist = whole_rows(a.folder, a.before, a.after)
        print("\n" + "\n".join(rows) + "\n\n" + "\n".join(hist))


if __name__ == "__main__":
    main()
