"""The per-event cost of bench's client: events/s ingested by one process at 16 streams against ``bench sim``.

    python benchmarks/hotpath.py                       # 16 streams, 3 s waves, every stamp/loop variant
    python benchmarks/hotpath.py --profile             # + a cProfile of the default variant (top 25 by tottime)
    python benchmarks/hotpath.py --streams 16 --seconds 5 --step-ms 0.1 --variants kernel,user,kernel+uvloop
    python benchmarks/hotpath.py --source blast --sims 2      # a source faster than the client
    python benchmarks/hotpath.py --source blast --sims 1 --split   # + CPU per event: framing, SSE, parse, the rest
    python benchmarks/hotpath.py --source blast --sims 1 --rate 15000 --variants kernel --procs 8   # one host

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
many events per write; when the client is the slower side (*client CPU %* near 100), *events/s* is what one
process ingests, wall-clock, with reads of many events each (the best case; one event per read is the worst, what
the ``fidelity.py`` waves at 20 events/s per stream have). One blast process is not always faster than the
client: with ``--sims 1`` the client was 69-83 % busy (an H200 device machine, the 2-core VM), and ``--sims 2``
fed it 12-14 % more events/s on the VM (benchmarks/results/hotpath-blast-sims-2026-12-06-vm.md). A row whose
client was under ``SOURCE_BOUND_PCT`` % busy is followed by a note: it waited on its source (or, on a small
shared machine, for a core), so that row is not the client's limit.

``--split`` adds, per variant, the client's CPU per event in chunked framing (``ChunkedDecoder.feed``), SSE decoding
(the client's SSE sink: ``bench.transport.sse``), the end-of-stream parse (JSON and records: ``bench.client.events``)
and the rest (event loop, socket reads and stamps, requests): ``process_time_ns`` around each call (one a read, or
64 events for the parse), so the split costs the wave a few thousand clock reads. It also runs on trees from before
issue 30 (their parse is ``_parse_events``), to compare.

``--procs N`` runs N client processes at once (the first variant), each with ``--sims`` sources of its own; their
measured waves start together (a barrier after every process's warm-up), and the host's *events/s* is all their
events over the span from the first wave's start to the last one's end (``perf_counter`` is CLOCK_MONOTONIC, one
clock for every process), printed with the share of that span during which every wave ran.

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

from simproc import BlastProcess, SimProcess  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.records import RequestRecord  # noqa: E402

MODEL = "bench-sim"

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
BARRIER: Any = None  # --procs: every process's measured wave starts when all have warmed up


def specs(streams: int, tokens: int, tag: str) -> list[RequestSpec]:
    return [RequestSpec(f"{tag}-{i:03d}", "chat", {"messages": [{"role": "user", "content": f"hot {tag} {i}"}],
                                                   "max_tokens": tokens}, {"stream": i}) for i in range(streams)]


async def _wave(bases: list[str], settings: ClientSettings, streams: int, tokens: int,
                prof: cProfile.Profile | None) -> tuple[list[RequestRecord], float, float, float]:
    """Stream ``i`` goes to ``bases[i % len(bases)]`` (one sim process each). Returns the measured wave's records,
    CPU seconds, and its start and end on ``perf_counter`` (CLOCK_MONOTONIC: one clock for every process)."""
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
        if BARRIER is not None:
            BARRIER.wait(timeout=120)
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
        return list(recs), time.process_time() - cpu0, w0, time.perf_counter()
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

        recs, cpu, t0, t1 = uvloop.run(coro)
    else:
        recs, cpu, t0, t1 = asyncio.run(coro)
    wall = t1 - t0
    events = sum(1 for r in recs for e in r.events if e.has_text)
    out = {"variant": variant, "streams": streams, "events": events, "failed": sum(not r.ok for r in recs),
           "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall if wall > 0 else float("nan"),
           "events_per_cpu_s": events / cpu if cpu > 0 else float("nan"),
           "client_cpu_pct": 100.0 * cpu / wall if wall > 0 else float("nan"),
           "stamp_source": sorted({r.stamp_source for r in recs}), "t0": t0, "t1": t1}
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


def _sources(stack: contextlib.ExitStack, a: argparse.Namespace) -> list[str]:
    """Start ``a.sims`` sources (bench sim, or the blast server) for this process; their base URLs."""
    source = BlastProcess if a.source == "blast" else SimProcess
    return [stack.enter_context(source(decode_step_ms=a.step_ms, max_running=max(64, a.streams), prefill_tok_s=1e8,
                                       tokens_per_event=1)).base for _ in range(a.sims)]


def _proc_child(i: int, a: argparse.Namespace, variant: str, tokens: int, barrier: Any, q: Any) -> None:
    """One of ``--procs`` client processes: its own sources, a warm-up, then the measured wave at the barrier."""
    global BARRIER
    BARRIER = barrier
    try:
        with contextlib.ExitStack() as stack:
            r = run_variant(variant, _sources(stack, a), a.streams, tokens, False)
        q.put((i, r))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        barrier.abort()
        q.put((i, {"error": f"{type(e).__name__}: {e}"}))


def run_procs(a: argparse.Namespace, variant: str, tokens: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``--procs N``: N client processes at once, each with ``--sims`` sources of its own, their measured waves
    started together (a barrier after every warm-up); the host's figures over the union of the waves."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, q = ctx.Barrier(a.procs), ctx.Queue()
    procs = [ctx.Process(target=_proc_child, args=(i, a, variant, tokens, barrier, q)) for i in range(a.procs)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    rows = [dict(got[i], proc=i + 1) for i in range(a.procs)]
    bad = [r["error"] for r in rows if "error" in r]
    if bad:
        raise SystemExit(f"hotpath --procs: a process failed: {bad[0]}")
    return rows, host_figures(rows)


def host_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over processes' waves on one clock: all events / (last end - first start) (the host's rate, wall clock),
    the share of that span during which every wave ran (``overlap``), and the processes' CPU over that span."""
    t0, t1 = min(r["t0"] for r in rows), max(r["t1"] for r in rows)
    span = t1 - t0
    both = max(0.0, min(r["t1"] for r in rows) - max(r["t0"] for r in rows))
    events = sum(r["events"] for r in rows)
    return {"procs": len(rows), "events": events, "span_s": span, "events_per_s": events / span,
            "overlap": both / span, "sum_of_rates": sum(r["events_per_s"] for r in rows),
            "cpu_s": sum(r["cpu_s"] for r in rows), "failed": sum(r["failed"] for r in rows)}


SOURCE_BOUND_PCT = 90  # a client less busy than this waited on its source (the note after its row)


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
    ap.add_argument("--procs", type=int, default=1, help="client processes at once, each with its own --sims "
                    "sources, their measured waves started together: the host's events/s over the union of the "
                    "waves (the first variant only; size the waves with --rate, e.g. 15000 with --source blast)")
    ap.add_argument("--out", default=str(RESULTS), help="markdown table to write ('' = none)")
    a = ap.parse_args(argv)
    tokens = max(16, int(a.seconds * a.rate))
    rows = []
    a.sims = max(1, min(a.streams, (os.cpu_count() or 1) - 2)) if a.sims == "auto" else max(1, int(a.sims))
    if a.procs > 1:
        return main_procs(a, tokens)
    with contextlib.ExitStack() as stack:
        bases = _sources(stack, a)
        for i, v in enumerate(x.strip() for x in a.variants.split(",") if x.strip()):
            r = run_variant(v, bases, a.streams, tokens, a.profile and i == 0, a.split)
            rows.append(r)
            print(f"{v:16s} {r['events']:8d} events  {r['events_per_s']:9.0f} events/s  "
                  f"{r['events_per_cpu_s']:9.0f} events per CPU-s  client CPU {r['client_cpu_pct']:3.0f} %  "
                  f"failed {r['failed']}  {r['stamp_source']}", flush=True)
            if r["client_cpu_pct"] < SOURCE_BOUND_PCT:
                print(f"    note: the client was {r['client_cpu_pct']:.0f} % busy: it waited on its source (or for a "
                      "core), so this is not its limit (more --sims)")
            if "split_ns" in r:
                print("    CPU per event (ns): " + "  ".join(f"{k} {v:.0f}" for k, v in r["split_ns"].items()))
            if "profile" in r:
                print(r["profile"])
    if a.out:
        write_md(Path(a.out), rows, a)
    return 0


def main_procs(a: argparse.Namespace, tokens: int) -> int:
    """``--procs N``: the per-process rows and the host's line; the Markdown with both."""
    variant = next(x.strip() for x in a.variants.split(",") if x.strip())
    rows, host = run_procs(a, variant, tokens)
    for r in rows:
        print(f"proc {r['proc']:2d} {variant:12s} {r['events']:8d} events  {r['events_per_s']:9.0f} events/s  "
              f"{r['events_per_cpu_s']:9.0f} events per CPU-s  client CPU {r['client_cpu_pct']:3.0f} %  "
              f"wave {r['t1'] - r['t0']:.2f} s  failed {r['failed']}", flush=True)
    print(f"host: {host['procs']} processes, {host['events']} events in {host['span_s']:.2f} s = "
          f"{host['events_per_s']:.0f} events/s (all waves running together {100 * host['overlap']:.0f} % of that "
          f"span; sum of the processes' own rates {host['sum_of_rates']:.0f}), failed {host['failed']}", flush=True)
    if a.out:
        write_md(Path(a.out), rows, a, host)
    return 0


def write_md(path: Path, rows: list[dict[str, Any]], a: argparse.Namespace,
             host: dict[str, Any] | None = None) -> None:
    what = f"{a.procs} bench processes at once, {a.streams} streams each" if host else f"one bench process ({a.streams} streams)"
    lines = [f"# Hot path: events ingested by {what}", "",
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}.",
             f"`python benchmarks/hotpath.py --streams {a.streams} --seconds {a.seconds} --step-ms {a.step_ms} "
             f"--source {a.source} --sims {a.sims} --variants {a.variants}"
             + (f" --rate {a.rate:g} --procs {a.procs}" if host else "") + "` (method: the script's docstring).", "",
             "| " + ("process | " if host else "") + "variant | stamps | events | events/s | events per CPU-s | "
             "client CPU % | failed |", "|---" * (8 if host else 7) + "|"]
    for r in rows:
        lines.append("| " + (f"{r['proc']} | " if host else "") + f"{r['variant']} | {','.join(r['stamp_source'])} | "
                     f"{r['events']} | {r['events_per_s']:.0f} | {r['events_per_cpu_s']:.0f} | "
                     f"{r['client_cpu_pct']:.0f} | {r['failed']} |")
    slow = [r for r in rows if r["client_cpu_pct"] < SOURCE_BOUND_PCT]
    if slow:
        lines += ["", f"{len(slow)} of {len(rows)} rows had the client under {SOURCE_BOUND_PCT} % busy: it waited on "
                  "its source (or for a core), so those rows are not its limit (more --sims)."]
    if host:
        lines += ["", f"Host: {host['procs']} processes, {host['events']} events from the first wave's start to the "
                  f"last one's end ({host['span_s']:.3f} s): **{host['events_per_s']:.0f} events/s**; all waves ran "
                  f"together for {100 * host['overlap']:.0f} % of that span; the processes' own rates sum to "
                  f"{host['sum_of_rates']:.0f}; failed {host['failed']}."]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
