"""The per-event cost of bench's client: events/s ingested by one process at 16 streams against ``bench sim``.

    python benchmarks/hotpath.py                       # 16 streams, 3 s waves, every stamp/loop variant
    python benchmarks/hotpath.py --profile             # + a cProfile of the default variant (top 25 by tottime)
    python benchmarks/hotpath.py --streams 16 --seconds 5 --step-ms 0.1 --variants kernel,user,kernel+uvloop
    python benchmarks/hotpath.py --source blast --sims 2      # a source faster than the client
    python benchmarks/hotpath.py --source blast --sims 1 --split   # + CPU per event: framing, SSE, parse, the rest

Method. The sim runs in its own processes (``benchmarks/simproc.py``) with a decode step far shorter than the client
can follow (``--step-ms``, default 0.1 ms: 10,000 events/s per stream asked), so the client is the bottleneck:
the sim writes as fast as its socket buffers drain and the client reads as fast as it can. The measured wave goes
through bench's own path as the runner uses it (``make_http_client`` + ``stream_request``: read, stamp, HTTP
framing, SSE decode, JSON parsing into the record), after a warm-up wave that opens the connections, with the
garbage collector off as in the runner. Reported per variant:

* *events/s*: token events recorded / wall time of the wave (send of the first request to the end of the last);
* *events per CPU-s*: the same events / the client process's CPU seconds in the wave: what one core ingests,
  the figure to compare across machines (it does not depend on how much CPU the sim took from the client).

The streams are spread over ``--sims`` sim processes (default: one per stream, at most cores - 2, at least one),
so that on a machine with spare cores the sims write as fast as they can and reads carry several events each, as
they do for a client that is the slower side. The wall-clock *events/s* can still be bounded by the sims' side
(on the H200 machine, 67,000-78,000 events/s with 8 or 14 sims while the client was 75-98 % busy): *events per
CPU-s* is then the client's capacity. With one sim the sim can be the slower side: reads then carry about one event each and
*events per CPU-s* counts the per-read cost of an unsaturated client. On a small shared machine (2 cores, sim and
client competing) *events/s* is bounded by the sim and *events per CPU-s* is the client's capacity.

``--source blast`` replaces the sims with ``benchmarks/blastserver.py``: the same bytes, pre-rendered and written
many events per write, faster than any client; the client is then the slower side (*client CPU %* near 100) and
*events/s* is what one process ingests, wall-clock, with reads of many events each (the best case; one event per
read is the worst, what the ``fidelity.py`` waves at 20 events/s per stream have).

``--split`` adds, per variant, the client's CPU per event in chunked framing (``ChunkedDecoder.feed``), SSE decoding
(the client's SSE sink: ``bench.transport.sse``), the end-of-stream parse (JSON and records: ``bench.client.events``)
and the rest (event loop, socket reads and stamps, requests): ``process_time_ns`` around each call (one a read, or
64 events for the parse), so the split costs the wave a few thousand clock reads. It also runs on trees from before
issue 30 (their parse is ``_parse_events``), to compare.

Variants: ``kernel`` / ``user`` (stamp source, bench.transport.kernel_stamps or data_received), ``+uvloop`` (the ``fast`` extra's
event loop), ``+h11`` (chunked bodies framed by h11, as before bench.transport.chunked took that over), ``+queue`` (a
kernel-stamped body's reads queued for the reading task, as before bench.transport.http.BodyPump decoded them in the read
callback), ``httpx`` (fast_io off).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import gc
import io
import os
import platform
import pstats
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simproc import SimProcess  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.records import RequestRecord  # noqa: E402

MODEL = "bench-sim"


class BlastProcess(SimProcess):
    """``benchmarks/blastserver.py`` (pre-rendered sim events, many per write) in its own process."""

    COMMAND = [str(Path(__file__).resolve().parent / "blastserver.py")]
RESULTS = Path(__file__).resolve().parent / "results" / "hotpath.md"


class CPUSplit:
    """``--split``: the client's CPU (``process_time_ns``) in each part of the hot path, summed over calls."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> CPUSplit:
        from bench.client import events, request
        from bench.transport import chunked

        parse = "_parse_log" if hasattr(events, "_parse_log") else "_parse_events"  # before issue 30: _parse_events
        for part, owner, name in (("chunked", chunked.ChunkedDecoder, "feed"), ("sse", request._SSESink, "feed"),
                                  ("parse", events, parse), ("parse", events, "_finish")):
            self._wrap(part, owner, name)
        return self

    def _wrap(self, part: str, owner: Any, name: str) -> None:
        real, ns, clock = getattr(owner, name), self.ns, time.process_time_ns
        ns[part] = 0

        def timed(*args: Any) -> Any:
            t0 = clock()
            try:
                return real(*args)
            finally:
                ns[part] += clock() - t0

        self._undo.append((owner, name, real))
        setattr(owner, name, timed)

    def __exit__(self, *exc: object) -> None:
        for owner, name, real in reversed(self._undo):
            setattr(owner, name, real)

    def reset(self) -> None:
        for part in self.ns:
            self.ns[part] = 0

    def per_event(self, events: int, cpu_s: float) -> dict[str, float]:
        """ns per event in each part, and ``rest``: the wave's other CPU."""
        out = {part: ns / events for part, ns in self.ns.items()}
        out["rest"] = cpu_s * 1e9 / events - sum(out.values())
        return out


SPLIT: CPUSplit | None = None  # set by --split for the wave: reset when the measured wave starts


def specs(streams: int, tokens: int, tag: str) -> list[RequestSpec]:
    return [RequestSpec(f"{tag}-{i:03d}", "chat", {"messages": [{"role": "user", "content": f"hot {tag} {i}"}],
                                                   "max_tokens": tokens}, {"stream": i}) for i in range(streams)]


async def _wave(bases: list[str], settings: ClientSettings, streams: int, tokens: int,
                prof: cProfile.Profile | None) -> tuple[list[RequestRecord], float, float]:
    """Stream ``i`` goes to ``bases[i % len(bases)]`` (one sim process each)."""
    client = make_http_client(settings, streams)

    def base(i: int) -> str:
        return bases[i % len(bases)]

    try:
        await asyncio.gather(*(stream_request(client, base(i), s, model=MODEL)
                               for i, s in enumerate(specs(streams, 2, "warm"))))
        gc.collect()
        gc.disable()
        if SPLIT is not None:
            SPLIT.reset()
        sp = specs(streams, tokens, "hot")
        cpu0, w0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            recs = await asyncio.gather(*(stream_request(client, base(i), s, model=MODEL) for i, s in enumerate(sp)))
        finally:
            if prof is not None:
                prof.disable()
            gc.enable()
        return list(recs), time.process_time() - cpu0, time.perf_counter() - w0
    finally:
        await client.aclose()


# variant flags that turn one of bench.transport.http's switches off for the wave
OFF_FLAGS = {"h11": "CHUNKED_FRAMING", "queue": "PUMP_BODIES"}


def run_variant(variant: str, base: list[str], streams: int, tokens: int, profile: bool,
                split: bool = False) -> dict[str, Any]:
    """:func:`measure_variant`, with ``--split``'s accounting around it when ``split``."""
    global SPLIT
    if not split:
        return measure_variant(variant, base, streams, tokens, profile)
    with CPUSplit() as SPLIT:
        try:
            r = measure_variant(variant, base, streams, tokens, profile)
        finally:
            acc, SPLIT = SPLIT, None
    return dict(r, split_ns=acc.per_event(max(r["events"], 1), r["cpu_s"]))


def measure_variant(variant: str, base: list[str], streams: int, tokens: int, profile: bool) -> dict[str, Any]:
    """One measured wave with ``variant`` (``kernel``, ``user``, ``httpx``, each optionally ``+uvloop``,
    ``+h11``, ``+queue``)."""
    parts = variant.split("+")
    off = [OFF_FLAGS[p] for p in parts if p in OFF_FLAGS]
    if off:
        from bench.transport import http as fastio

        for name in off:
            setattr(fastio, name, False)
        try:
            return dict(measure_variant("+".join(p for p in parts if p not in OFF_FLAGS), base, streams, tokens,
                                        profile), variant=variant)
        finally:
            for name in off:
                setattr(fastio, name, True)
    stamps = "user" if parts[0] == "user" else "kernel"
    settings = dataclasses.replace(ClientSettings(), stamps=stamps, fast_io=parts[0] != "httpx")
    prof = cProfile.Profile() if profile else None
    coro = _wave(base, settings, streams, tokens, prof)
    if "uvloop" in parts:
        import uvloop

        recs, cpu, wall = uvloop.run(coro)
    else:
        recs, cpu, wall = asyncio.run(coro)
    events = sum(1 for r in recs for e in r.events if e.has_text)
    out = {"variant": variant, "streams": streams, "events": events, "failed": sum(not r.ok for r in recs),
           "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall if wall > 0 else float("nan"),
           "events_per_cpu_s": events / cpu if cpu > 0 else float("nan"),
           "client_cpu_pct": 100.0 * cpu / wall if wall > 0 else float("nan"),
           "stamp_source": sorted({r.stamp_source for r in recs})}
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    return out


def machine() -> str:
    import os

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} cores {model}, Linux {platform.release()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0, help="about how long each measured wave lasts")
    ap.add_argument("--step-ms", type=float, default=0.1, help="the sim's decode step (shorter than the client)")
    ap.add_argument("--rate", type=float, default=3000.0, help="expected events/s per stream, sizes max_tokens")
    ap.add_argument("--variants", default="kernel,user,kernel+uvloop,httpx")
    ap.add_argument("--source", choices=("sim", "blast"), default="sim", help="what writes the streams: bench sim "
                    "(default), or benchmarks/blastserver.py (the same bytes pre-rendered, many events per write: "
                    "faster than the client, so events/s is what one process ingests when it is the slower side)")
    ap.add_argument("--sims", default="auto", help="sim processes the streams are spread over (auto: enough that "
                    "the client, not the sim, is the bottleneck: one per stream, at most cores - 2, at least 1)")
    ap.add_argument("--profile", action="store_true", help="cProfile the first variant")
    ap.add_argument("--split", action="store_true", help="CPU per event in chunked framing, SSE decoding, the "
                    "end-of-stream parse and the rest, per variant (the script's docstring)")
    ap.add_argument("--out", default=str(RESULTS), help="markdown table to write ('' = none)")
    a = ap.parse_args(argv)
    tokens = max(16, int(a.seconds * a.rate))
    rows = []
    a.sims = max(1, min(a.streams, (os.cpu_count() or 1) - 2)) if a.sims == "auto" else max(1, int(a.sims))
    with contextlib.ExitStack() as stack:
        source = BlastProcess if a.source == "blast" else SimProcess
        sims = [stack.enter_context(source(decode_step_ms=a.step_ms, max_running=max(64, a.streams),
                                               prefill_tok_s=1e8, tokens_per_event=1)) for _ in range(a.sims)]
        for i, v in enumerate(x.strip() for x in a.variants.split(",") if x.strip()):
            r = run_variant(v, [s.base for s in sims], a.streams, tokens, a.profile and i == 0, a.split)
            rows.append(r)
            print(f"{v:16s} {r['events']:8d} events  {r['events_per_s']:9.0f} events/s  "
                  f"{r['events_per_cpu_s']:9.0f} events per CPU-s  client CPU {r['client_cpu_pct']:3.0f} %  "
                  f"failed {r['failed']}  {r['stamp_source']}", flush=True)
            if "split_ns" in r:
                print("    CPU per event (ns): " + "  ".join(f"{k} {v:.0f}" for k, v in r["split_ns"].items()))
            if "profile" in r:
                print(r["profile"])
    if a.out:
        write_md(Path(a.out), rows, a)
    return 0


def write_md(path: Path, rows: list[dict[str, Any]], a: argparse.Namespace) -> None:
    lines = [f"# Hot path: events ingested by one bench process ({a.streams} streams)", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}.",
             f"`python benchmarks/hotpath.py --streams {a.streams} --seconds {a.seconds} --step-ms {a.step_ms} "
             f"--source {a.source} --sims {a.sims} --variants {a.variants}` (method: the script's docstring).", "",
             "| variant | stamps | events | events/s | events per CPU-s | client CPU % | failed |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {','.join(r['stamp_source'])} | {r['events']} | {r['events_per_s']:.0f} | "
                     f"{r['events_per_cpu_s']:.0f} | {r['client_cpu_pct']:.0f} | {r['failed']} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
