"""How many streams one bench process and one host read, stamped right: ``bench run --workers auto`` (or N, or
``--ray ADDRESS``) against ``bench sim`` processes sharing one port, measured against the sims' own write times.

    python benchmarks/scale_streams.py --streams 256                        # this VM: one sim, workers auto
    python benchmarks/scale_streams.py --streams 16384 --sims 12 --waves 3  # issue 30's target on 16 cores
    python benchmarks/scale_streams.py --streams 64 --ray 10.1.2.2:6379 --url http://10.1.2.1:PORT/v1  # sims of yours

Method. ``--sims K`` sim processes listen on one port of 127.0.0.1 with ``--reuse-port`` (SO_REUSEPORT: the
kernel spreads the connections over them), each with 20 events/s per stream (``--step-ms 50``), one token per
event, prefill 1e8 tok/s (so a stream is its decode), and as many admitted requests as there are streams. Then the
real command runs, as a user runs it: ``python -m bench run URL --profile quick --depths 0 --streams S --repeats
S x W --max-tokens T --workers auto --out DIR --json`` (W measured waves of S streams, after bench's warm-up wave;
``T = seconds x 20`` tokens). Every token event the sims write carries ``write_ns`` (their ``perf_counter_ns``,
CLOCK_MONOTONIC: one clock with bench's on one host), so from records.jsonl, per measured wave:

* *err* p50 / p99 / max ms: bench's arrival stamp (``sent_ns + t_ns``, moved onto the driver's clock when read
  by a Ray actor) - the sim's ``write_ns``, over every token event; the goal (issue 30): p99 < 1 ms, max < 5 ms;
  *max* leaves out the events a sim wrote late by itself;
* *sim stalls*: token events whose write returned ``LATE_WRITE_MS`` or more after the sim stamped them (the sims
  run with ``--late-write-ms``: a sim preempted between its stamp and its send delays that event, whatever the
  client does; on a busy host this is the sims' share of the error), and the max error over all events;
* *events/s per host*: token events read / the wave's span (first send to last byte) on this host (with
  ``--ray``: per node, by each record's ``meta.node``); *per process*: that / the processes that read them
  (``run.workers``, or the node's actors);
* *aggregate err %*: the wave's aggregate decode (bench.measure.summary.wave_aggregate_decode, from bench's
  stamps) against the same definition on the sims' write times (goal: within 0.5 %); *decode err %*: the median
  per-stream decode against the sims' nominal 1000 / step ms.

Placement (``--sim-cpus``, ``--client-cpus``, Linux): the sims and bench share the host's cores, so a reader
preempted by a sim reads its event a whole gap late, and the kernel hands it over merged with the next (one
50-ms step in *max*). Pinning the two to disjoint CPU sets (``os.sched_setaffinity``, inherited by bench's
worker processes) measures the client as it runs beside a server on another host; both sets are printed with the
table.

Prints a table, then three lines: the sims' garbage collections of ``LATE_WRITE_MS`` or more that began while a
measured wave ran (how many, the full ones, the longest: bench.sim.collector keeps full ones for idle moments),
the events over the worst-event goal not flagged by the sims and how many of them were read together with their
stream's next event (:func:`merged_reads`: one read, one stamp), and the failed requests by kind, with any other
line the sims wrote to stderr. ``--out FILE.md`` also writes it
all with the date, machine and command (``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure.metrics import request_metrics  # noqa: E402
from bench.measure.summary import wave_aggregate_decode  # noqa: E402
from bench.records import RequestRecord, read_records  # noqa: E402

GOAL_P99_MS, GOAL_MAX_MS, GOAL_AGG_PCT = 1.0, 5.0, 0.5
LATE_WRITE_MS = 0.5  # a sim's write that returned this long after its stamp: the sim's stall, set apart


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sims:
    """The sims' URL and what they said of their own stalls (``--late-write-ms``: an event whose write returned
    late after its stamp was delayed by the sim, whatever the client did)."""

    def __init__(self, url: str, logs: list[Path]) -> None:
        self.url, self.logs = url, logs

    def late_writes(self) -> set[int]:
        """``write_ns`` of every event a sim wrote late."""
        out: set[int] = set()
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("late-write "):
                    out.add(int(line.split()[1]))
        return out

    def other_lines(self, k: int = 5) -> list[str]:
        """The first ``k`` lines the sims wrote to stderr that are neither late writes nor collections."""
        return [line for log in self.logs for line in log.read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith(("late-write ", "collect "))][:k]

    def pauses(self, waves: list[tuple[int, int]]) -> str:
        """The sims' garbage collections of ``LATE_WRITE_MS`` or more that began while a measured wave ran
        (``waves``: each one's first send and last byte, ns), as a line: how many, the full ones (generation 2),
        the longest (bench.sim.collector)."""
        if not self.logs:
            return "sim collections: not known (a server of yours)"
        got = [(int(g), int(d) / 1e6) for log in self.logs for line in log.read_text(errors="replace").splitlines()
               if line.startswith("collect ") for _, g, t, d in [line.split()]
               if any(a <= int(t) <= b for a, b in waves)]
        full = [d for g, d in got if g == 2]
        return (f"sim collections of {LATE_WRITE_MS} ms or more while measured waves ran: {len(got)}, full "
                f"{len(full)}; longest {max((d for _, d in got), default=0.0):.1f} ms, longest full "
                f"{max(full, default=0.0):.1f} ms")


@contextlib.contextmanager
def sims(k: int, streams: int, step_ms: float, logdir: Path, cpus: set[int] | None = None) -> Iterator[Sims]:
    """``k`` sims sharing one port of 127.0.0.1, each reporting writes late by ``LATE_WRITE_MS`` into a log under
    ``logdir``, on the CPUs ``cpus`` (None: any)."""
    port = _free_port()
    argv = [sys.executable, "-m", "bench.sim", "--host", "127.0.0.1", "--port", str(port), "--reuse-port",
            "--decode-step-ms", str(step_ms), "--prefill-tok-s", "1e8", "--max-running", str(max(64, streams)),
            "--late-write-ms", str(LATE_WRITE_MS)]
    logs = [logdir / f"sim{i}.err" for i in range(k)]
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                              preexec_fn=_pin(cpus)) for log in logs]
    try:
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if "listening on" not in line:
                raise RuntimeError(f"bench sim did not start: {line!r}")
        yield Sims(f"http://127.0.0.1:{port}/v1", logs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def cpu_list(text: str | None) -> set[int] | None:
    """``"0-11,14"`` -> {0, ..., 11, 14}; None or "" -> None (no pinning). Raises ValueError on a bad list or a
    CPU this process may not run on."""
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi or lo)
        if first > last:
            raise ValueError(f"bad CPU range {part!r}")
        out.update(range(first, last + 1))
    allowed = os.sched_getaffinity(0)
    if not out <= allowed:
        raise ValueError(f"CPUs {sorted(out - allowed)} are not available here (allowed: {sorted(allowed)})")
    return out


def _pin(cpus: set[int] | None) -> Any:
    """A ``preexec_fn`` that pins the child to ``cpus`` (None: no function)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _aggregate_on_writes(recs: list[RequestRecord]) -> float | None:
    firsts: list[int] = []
    lasts: list[int] = []
    toks = 0.0
    for r in recs:
        tev = [e for e in r.events if e.has_text and e.write_ns is not None]
        m = request_metrics(r)
        if not r.ok or len(tev) < 2 or m.output_tokens <= m.first_event_tokens:
            continue
        firsts.append(int(tev[0].write_ns or 0))
        lasts.append(int(tev[-1].write_ns or 0))
        toks += m.output_tokens - m.first_event_tokens
    span = (max(lasts) - min(firsts)) / 1e9 if firsts else 0.0
    return toks / span if span > 0 else None


def failures(recs: list[RequestRecord]) -> str:
    """The failed requests by kind, with one message of each kind (a line)."""
    kinds: dict[str, list[str]] = defaultdict(list)
    for r in recs:
        if r.error is not None:
            kinds[r.error_kind or "other"].append(r.error)
    if not kinds:
        return "failed requests: none"
    return "failed requests: " + "; ".join(f"{k} {len(v)} (e.g. {v[0][:120]})" for k, v in sorted(kinds.items()))


def by_wave(recs: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    """The records of each measured wave (``meta["wave"]``)."""
    waves: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in recs:
        waves[int(r.meta.get("wave", 0))].append(r)
    return waves


def wave_spans(recs: list[RequestRecord]) -> list[tuple[int, int]]:
    """Each wave's first send and last byte (ns, bench's clock)."""
    return [(min(r.sent_ns for r in w), max(r.sent_ns + (r.end_ns or 0) for r in w)) for w in by_wave(recs).values()]


def wave_rows(recs: list[RequestRecord], step_ms: float, procs_of: dict[str, int],
              late: set[int] | None = None) -> list[dict[str, Any]]:
    """One row per (wave, host): the figures of the module docstring; ``late``: the ``write_ns`` of events the
    sims wrote late (their own stalls), counted and left out of *max*."""
    late = late or set()
    rows = []
    for w, wrecs in sorted(by_wave(recs).items()):
        ms = [request_metrics(r) for r in wrecs]
        agg, truth = wave_aggregate_decode(wrecs, ms), _aggregate_on_writes(wrecs)
        dec = [m.decode_tok_s for m in ms if m.ok and m.decode_tok_s]
        by_host: dict[str, list[RequestRecord]] = defaultdict(list)
        for r in wrecs:
            by_host[str(r.meta.get("node", "this host"))].append(r)
        for host, hrecs in sorted(by_host.items()):
            stamped = [(r.sent_ns + e.t_ns - e.write_ns, e.write_ns) for r in hrecs for e in r.events
                       if e.has_text and e.write_ns is not None]
            err = [d / 1e6 for d, _ in stamped]
            mine = [d / 1e6 for d, w in stamped if w not in late]
            start = min(r.sent_ns for r in hrecs)
            end = max(r.sent_ns + (r.end_ns or 0) for r in hrecs)
            span = (end - start) / 1e9
            per_host = len(err) / span if span > 0 else 0.0
            e = np.asarray(err) if err else np.zeros(1)
            rows.append({
                "wave": w, "host": host[:12], "streams": len(hrecs), "failed": sum(not m.ok for m in ms),
                "events": len(err), "span_s": round(span, 2), "per_host": per_host,
                "per_process": per_host / max(1, procs_of.get(host, 1)), "procs": procs_of.get(host, 1),
                "p50": float(np.percentile(e, 50)), "p99": float(np.percentile(e, 99)),
                "max_all": float(e.max()), "max": max(mine, default=0.0), "sim_late": len(err) - len(mine),
                "agg_err_pct": None if agg is None or not truth else (agg / truth - 1) * 100,
                "decode_err_pct": (float(np.median(dec)) / (1000.0 / step_ms) - 1) * 100 if dec else None,
            })
    return rows


def _fmt_cpus(cpus: set[int] | None) -> str:
    return "any" if cpus is None else ",".join(str(c) for c in sorted(cpus))


def _procs(res: dict[str, Any], recs: list[RequestRecord]) -> dict[str, int]:
    nodes = (res.get("run") or {}).get("nodes")
    if nodes:
        return {n["node_id"]: int(n["actors"]) for n in nodes}
    return {"this host": int(res["run"].get("workers") or 1)}


def merged_reads(recs: list[RequestRecord], late: set[int] | None = None) -> str:
    """Of the token events more than ``GOAL_MAX_MS`` late that the sims did not flag (their own stalls), how many
    carry the same arrival stamp as their stream's next event: read in one read with it, so stamped when the later
    one came (a reader that did not read for a whole step: the error is the step, not the kernel's)."""
    late = late or set()
    over = merged = 0
    for r in recs:
        evs = [(e, e.write_ns) for e in r.events if e.has_text and e.write_ns is not None]
        for (e, w), nxt in zip(evs, [*(x for x, _ in evs[1:]), None]):
            if (r.sent_ns + e.t_ns - w) / 1e6 > GOAL_MAX_MS and w not in late:
                over += 1
                merged += nxt is not None and nxt.t_ns == e.t_ns
    return (f"events over {GOAL_MAX_MS:g} ms not flagged by the sims: {over:,}; of them read together with their "
            f"stream's next event (one stamp for both): {merged:,}")


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:+.{nd}f}" if nd == 3 else f"{x:.{nd}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| wave | host | streams | procs | events | span s | events/s per host | events/s per process | "
            "err p50 / p99 / max ms | sim stalls: events, max ms | aggregate err % vs writes | decode err % vs step | "
            "failed | goal |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        ok = r["p99"] < GOAL_P99_MS and r["max"] < GOAL_MAX_MS and r["agg_err_pct"] is not None \
            and abs(r["agg_err_pct"]) <= GOAL_AGG_PCT and not r["failed"]
        out.append(f"| {r['wave']} | {r['host']} | {r['streams']:,} | {r['procs']} | {r['events']:,} | "
                   f"{r['span_s']} | {r['per_host']:,.0f} | {r['per_process']:,.0f} | {r['p50']:.2f} / "
                   f"{r['p99']:.2f} / {r['max']:.2f} | {r['sim_late']:,}, {r['max_all']:.2f} | "
                   f"{_fmt(r['agg_err_pct'], 3)} | "
                   f"{_fmt(r['decode_err_pct'], 3)} | {r['failed']} | {'met' if ok else 'not met'} |")
    return head + "\n".join(out) + "\n"


def run(a: argparse.Namespace, url: str, out: Path) -> tuple[int, dict[str, Any], list[RequestRecord], str]:
    tokens = max(8, int(a.seconds * 1000.0 / a.step_ms))
    cmd = [sys.executable, "-m", "bench", "run", url, "--profile", "quick", "--depths", "0", "--streams",
           str(a.streams), "--repeats", str(a.streams * a.waves), "--max-tokens", str(tokens), "--workers",
           str(a.workers), "--out", str(out), "--json"]
    if a.ray:
        cmd += ["--ray", a.ray]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, preexec_fn=_pin(a.client_cpus))
    shown = "python -m bench " + shlex.join(cmd[3:])
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        return p.returncode, {}, [], shown
    res = json.loads(p.stdout)
    recs = [r for r in read_records(out / "records.jsonl") if r.meta.get("phase") == "measure"]
    return 0, res, recs, shown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--waves", type=int, default=2, help="measured waves [2]")
    ap.add_argument("--seconds", type=float, default=3.0, help="about how long each stream lasts [3]")
    ap.add_argument("--step-ms", type=float, default=50.0, help="the sims' decode step (50: 20 events/s)")
    ap.add_argument("--sims", type=int, default=1, help="sim processes sharing the port [1]")
    ap.add_argument("--workers", default="auto", help="bench run --workers [auto]")
    ap.add_argument("--ray", default=None, metavar="ADDRESS", help="bench run --ray ADDRESS (per node figures)")
    ap.add_argument("--url", default=None, help="a server already running (no sims started here)")
    ap.add_argument("--sim-cpus", default=None, metavar="LIST", help="pin the sims to these CPUs, e.g. 12-15")
    ap.add_argument("--client-cpus", default=None, metavar="LIST", help="pin bench (and its workers) to these CPUs")
    ap.add_argument("--out", default="", help="also write the table to this Markdown file")
    a = ap.parse_args(argv)
    try:
        a.sim_cpus, a.client_cpus = cpu_list(a.sim_cpus), cpu_list(a.client_cpus)
    except ValueError as e:
        ap.error(str(e))
    placement = (f"sims on CPUs {_fmt_cpus(a.sim_cpus)}, bench on CPUs {_fmt_cpus(a.client_cpus)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="scale-") as d, \
            (contextlib.nullcontext(Sims(a.url, [])) if a.url else
             sims(a.sims, a.streams, a.step_ms, Path(d), a.sim_cpus)) as sv:
        rc, res, recs, shown = run(a, sv.url, Path(d) / "run")
        late, said = sv.late_writes(), sv.other_lines()
        pauses = sv.pauses(wave_spans(recs))
    if rc:
        print(f"scale_streams: bench run exited {rc}", file=sys.stderr)
        return rc
    rows = wave_rows(recs, a.step_ms, _procs(res, recs), late)
    text = table(rows)
    sizing = (res["run"].get("sizing") or {})
    print(text)
    failed = (merged_reads(recs, late) + "\n" + failures(recs)
              + "".join(f"\nsim stderr: {line[:200]}" for line in said))
    print(f"workers: {res['run'].get('workers')} (auto: {res['run'].get('workers_auto')}); {placement}; "
          f"{time.time() - t0:.0f} s\n{pauses}\n{failed}")
    if a.out:
        me = " ".join(shlex.quote(x) for x in sys.argv)
        Path(a.out).write_text(
            f"# scale_streams: {a.streams:,} streams x {1000.0 / a.step_ms:g} events/s\n\n"
            f"Written by `python {me}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC), which ran `{shown}` against "
            f"{'the server at ' + a.url if a.url else f'{a.sims} sim process(es) on one port (SO_REUSEPORT)'}. "
            f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.platform()}; load average at start {load} (a shared box: "
            f"other processes ran meanwhile); {placement}. Columns: benchmarks/scale_streams.py's docstring.\n\n"
            + text +
            f"\nworkers: {res['run'].get('workers')} (auto: {res['run'].get('workers_auto')}); sizing: "
            f"{json.dumps(sizing)[:600]}\n\n{pauses}\n\n{failed}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
