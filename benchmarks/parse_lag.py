"""Does the end-of-stream work of early finishers delay the stamps of the streams still running?

``python benchmarks/parse_lag.py [--streams 256] [--step-ms 50] [--rounds 2]``

N streams against ``bench sim`` (its own process), all of one output length, so they finish at the same decode
step: the sim writes their final events over a few ms, and the parsing of the first finishers runs while the final
events of the others arrive. Stamp error = bench's arrival stamp - the sim's ``write_ns`` (one clock), over every
token event and over each stream's final event. Event-loop lag from :class:`bench.session.loop_lag.LagMonitor`. Each round
runs the client twice: parsing each finished response in one go (``PARSE_SLICE`` = infinite, as before issue 12)
and in slices of ``bench.client.request.PARSE_SLICE`` events with a yield between them (now).
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
from simproc import SimProcess

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.client import events as client_mod
from bench.session.loop_lag import LagMonitor


async def wave(base: str, n: int, seed: int, tokens: int) -> tuple[list[float], list[float], dict]:
    specs = [RequestSpec(f"r{i}-{seed}", "completions", {"prompt": f"{i} go", "max_tokens": tokens})
             for i in range(n)]
    async with make_http_client(ClientSettings(), n) as client:
        await stream_request(client, base, RequestSpec("warm", "completions", {"prompt": "x", "max_tokens": 2}),
                             model="bench-sim")
        mon = LagMonitor()
        mon.start()
        recs = await asyncio.gather(*(stream_request(client, base, s, model="bench-sim") for s in specs))
        lag = mon.stop()
    assert all(r.ok for r in recs), [r.error for r in recs if not r.ok][:3]
    per = [[(r.sent_ns + e.t_ns - e.write_ns) / 1e6 for e in r.events if e.write_ns is not None] for r in recs]
    errs = [x for p in per for x in p]
    final = [p[-1] for p in per if p]
    return errs, final, lag


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    sim = SimProcess(decode_step_ms=a.step_ms, max_running=a.streams + 8, prefill_tok_s=1e6)
    budget = client_mod.PARSE_BUDGET_S
    try:
        print(f"{a.streams} streams x {a.tokens} tokens, decode step {a.step_ms:g} ms\n")
        print("| parsing | events | stamp err p50 / p99 / max ms | final events p50 / max ms | "
              "loop lag p50 / p99 / max ms |")
        print("|---|---|---|---|---|")
        for r in range(a.rounds):
            for name, b in (("in one go (before)", float("inf")), (f"yield every {budget * 1e3:g} ms (now)", budget)):
                client_mod.PARSE_BUDGET_S = b
                errs, final, lag = asyncio.run(wave(sim.base, a.streams, r, a.tokens))
                p50, p99, mx = np.percentile(errs, [50, 99, 100])
                f50, fmx = np.percentile(final, [50, 100])
                print(f"| {name} | {len(errs)} | {p50:.2f} / {p99:.2f} / {mx:.2f} | {f50:.2f} / {fmx:.2f} | "
                      f"{lag['p50_ms']:.2f} / {lag['p99_ms']:.2f} / {lag['max_ms']:.2f} |", flush=True)
    finally:
        client_mod.PARSE_BUDGET_S = budget
        sim.close()


if __name__ == "__main__":
    main()
