"""Where in a wave bench's late stamps are: one fidelity wave in this process, its late events located.

    python benchmarks/fidelity_where.py --streams 2048 --seconds 2.5 --repeats 3
    python benchmarks/fidelity_where.py --streams 2048 --queue      # reads queued for the task (no BodyPump)

Method: the wave of ``benchmarks/fidelity.py``'s part 1 (``bench sim`` in its own process, 50 ms decode step,
one token per event, a warm-up wave first, the garbage collector off), then every token event whose error
(bench's arrival stamp - the sim's ``write_ns``) is over ``--late-ms`` (5 ms) is counted by its index in its
stream and by when the sim wrote it (100 ms bins from the first send). For those events it also prints how long
after its kernel stamp bench read that read (``fidelity.stamp_pairs``: user stamp - kernel stamp): a late event that was
read promptly was late before bench could read it (the bytes reached the socket late); one read late was held up
by bench's own event loop. Errors that are whole multiples of the step are events the kernel handed over in one
read with a later event (the socket was not read within one gap).

This is the diagnosis behind bench.client.turns (the first and last events of a wave of 2,048 streams were coalesced
while the loop built and sent requests or finished responses): ``benchmarks/results/fidelity-2048-*-h200.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fidelity  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from simproc import SimProcess  # noqa: E402

from bench.client import ClientSettings
from bench.records import RequestRecord  # noqa: E402
from bench.transport import http as fastio  # noqa: E402
from bench.transport import kernel_stamps as kstamp  # noqa: E402

STEP_MS = 50.0


def wave(streams: int, seconds: float) -> list[RequestRecord]:
    tokens = round(seconds * 1000 / STEP_MS)
    with SimProcess(decode_step_ms=STEP_MS, max_running=max(4096, streams), prefill_tok_s=1e7,
                    tokens_per_event=1) as sim:
        recs, _cpu, _wall = asyncio.run(fidelity._inprocess(sim.base, fidelity.specs_for(streams, 1, "warm"),
                                                            fidelity.specs_for(streams, tokens, "m"),
                                                            ClientSettings()))
    return recs


def report(recs: list[RequestRecord], pairs: dict[int, int], late_ms: float) -> list[str]:
    t0 = min(r.sent_ns for r in recs)
    by_index: collections.Counter[int] = collections.Counter()
    by_time: collections.Counter[int] = collections.Counter()
    late: list[float] = []
    read_lag: list[float] = []
    n = 0
    for r in recs:
        for i, e in enumerate(r.events):
            if e.write_ns is None:
                continue
            n += 1
            a = r.sent_ns + e.t_ns
            err = (a - e.write_ns) / 1e6
            if err <= late_ms:
                continue
            late.append(err)
            by_index[min(i, 10)] += 1
            by_time[(e.write_ns - t0) // 100_000_000] += 1
            if a in pairs:
                read_lag.append((pairs[a] - a) / 1e6)
    send_span = (max(r.sent_ns for r in recs) - t0) / 1e6
    out = [f"{len(recs)} streams, sends over {send_span:.0f} ms; {n} events, {len(late)} late "
           f"({100 * len(late) / max(n, 1):.2f} %, error > {late_ms:g} ms)"]
    if late:
        late.sort()
        out += [f"  late errors ms: min {late[0]:.1f}, median {late[len(late) // 2]:.1f}, max {late[-1]:.1f}",
                f"  by event index (10 = 10 or more): {dict(sorted(by_index.items()))}",
                f"  by write time, 100 ms bins from the first send: {dict(sorted(by_time.items()))}"]
    if read_lag:
        read_lag.sort()
        out.append(f"  their reads, user stamp - kernel stamp ms: median {read_lag[len(read_lag) // 2]:.2f}, "
                   f"max {read_lag[-1]:.2f}")
    out.append(f"  stamp sources: {dict(collections.Counter(r.stamp_source for r in recs))}; "
               f"clock {kstamp.CLOCK.report()}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=2.5, help="decode time of the wave (s)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--late-ms", type=float, default=5.0, help="an event is late above this error (ms)")
    ap.add_argument("--queue", action="store_true", help="reads queued for the reading task (PUMP_BODIES off)")
    a = ap.parse_args(argv)
    fastio.PUMP_BODIES = not a.queue
    for _ in range(a.repeats):
        with fidelity.stamp_pairs() as pairs:
            recs = wave(a.streams, a.seconds)
        print("\n".join(report(recs, pairs, a.late_ms)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
