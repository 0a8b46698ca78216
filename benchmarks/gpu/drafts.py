"""Drafts on vs off, explained by the server: decode at 1..4 streams with the acceptance rate from /metrics.

For each stream count N: scrape the server's /metrics (bench.server.metrics), run WAVES waves of N concurrent
streaming requests of MAX_TOKENS tokens (ignore_eos, a unique prose prompt each), scrape again; then print one row:
bench's per-stream and aggregate decode tok/s and tokens per event beside the server's acceptance rate and mean
accepted length (from its counters) and the same rate from llama-server's per-response timings. Run it once per
server configuration (drafts off, a small draft model, the model as its own draft) with a LABEL each.

    python benchmarks/gpu/drafts.py URL LABEL OUT.json [--streams 1,2,3,4] [--max-tokens 256] [--waves 3]

It measures what run_h200.sh's `drafts` step does (docs/gpu.md), as one script; it runs against any server,
e.g. `bench sim --tokens-per-event 2,4` (no spec counters there: those columns stay empty).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.client import ClientSettings, RequestSpec, discover_model, make_http_client, stream_request
from bench.measure.metrics import request_metrics
from bench.measure.summary import wave_aggregate_decode
from bench.server.metrics import cross_checks, detect_metrics, spec_from_timings

PROSE = ("Write a long, detailed story about a lighthouse keeper on a remote island who, one stormy night, finds a "
         "message in a bottle, and tell what he does in the days after.")


async def cell(client: Any, url: str, model: str, n: int, max_tokens: int, waves: int) -> dict[str, Any]:
    scraper = await detect_metrics(client, url, interval_s=1.0)
    if scraper is not None:
        await scraper.begin()
    recs, aggs = [], []
    for w in range(waves):
        specs = [RequestSpec(f"s{n}-w{w}-{i}", "chat", {
            "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:12]}] {PROSE}"}],
            "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
            for i in range(n)]
        wave = list(await asyncio.gather(*(stream_request(client, url, s, model=model) for s in specs)))
        a = wave_aggregate_decode(wave, [request_metrics(r) for r in wave])
        if a is not None:
            aggs.append(a)
        recs.extend(wave)
    sm = await scraper.end() if scraper is not None else {}
    ms = [request_metrics(r) for r in recs if r.ok]
    dec = [m.decode_tok_s for m in ms if m.decode_tok_s]
    tpe = [m.tokens_per_event for m in ms if m.tokens_per_event]
    summary = {"id": f"decode-s{n}", "depth": 0, "requests_failed": len(recs) - len(ms),
               "output_tokens_total": sum(m.output_tokens for m in ms)}
    return {
        "streams": n, "requests_ok": len(ms), "requests_failed": len(recs) - len(ms),
        "decode_tok_s_p50": round(statistics.median(dec), 2) if dec else None,
        "aggregate_decode_tok_s": round(statistics.median(aggs), 2) if aggs else None,
        "tokens_per_event": round(statistics.mean(tpe), 3) if tpe else None,
        "server_metrics": sm, "spec_timings": spec_from_timings(recs),
        "warnings": cross_checks(sm, summary, prefix_cache_expected=False) if sm else [],
    }


def row(label: str, c: dict[str, Any]) -> str:
    sm, st = c["server_metrics"], c["spec_timings"] or {}

    def f(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    return (f"| {label} | {c['streams']} | {f(c['decode_tok_s_p50'], '.1f')} | {f(c['aggregate_decode_tok_s'], '.1f')} "
            f"| {f(c['tokens_per_event'])} | {f(sm.get('spec_acceptance_rate'), '.3f')} "
            f"| {f(sm.get('spec_mean_accepted_length'))} | {f(st.get('acceptance_rate'), '.3f')} "
            f"| {f(sm.get('kv_cache_usage_pct_max'), '.1f')} | {sm.get('generation_tokens', '-')} |")


HEAD = ("| config | streams | decode tok/s p50 | aggregate tok/s | tokens/event | acceptance (/metrics) "
        "| mean accepted length | acceptance (timings) | KV % max | server gen tokens |\n"
        "|---|---|---|---|---|---|---|---|---|---|")


async def main_async(a: argparse.Namespace) -> int:
    streams = [int(x) for x in a.streams.split(",")]
    out: dict[str, Any] = {"label": a.label, "url": a.url, "max_tokens": a.max_tokens, "waves": a.waves, "cells": []}
    async with make_http_client(ClientSettings(read_timeout_s=300.0), max(streams)) as client:
        model = await discover_model(client, a.url)
        out["model"] = model
        print(HEAD)
        for n in streams:
            c = await cell(client, a.url, model, n, a.max_tokens, a.waves)
            out["cells"].append(c)
            print(row(a.label, c), flush=True)
            for w in c["warnings"]:
                print(f"  warning: {w}", file=sys.stderr)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("label")
    p.add_argument("out")
    p.add_argument("--streams", default="1,2,3,4")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--waves", type=int, default=3)
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
