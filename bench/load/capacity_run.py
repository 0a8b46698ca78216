"""``bench capacity`` against a live endpoint: one :class:`bench.session.endpoint.Session`, one open-loop point per load of
the search (:mod:`bench.load.capacity`), each point's records and summary in its own folder, live progress.

Folder: ``DIR/capacity.json`` (the search document), ``DIR/records.jsonl`` (set-up probes),
``DIR/points/NN-<id>-t<trial>/records.jsonl`` and ``point.json`` (the point's cell summary).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bench.load.capacity import Point, SearchSettings, point_entry, point_settings, search
from bench.load.openloop import Planned
from bench.load.point import LoadSettings, load_dict, make_plan, run_point
from bench.measure.metrics import request_metrics
from bench.measure.slo import SLO, meets
from bench.records import RecordWriter
from bench.results import save_capacity, write_atomic

if TYPE_CHECKING:
    from bench.session.endpoint import Session

__all__ = ["search_capacity", "Progress", "PER_SLOT_REQUESTS"]

PER_SLOT_REQUESTS = 8


class Progress:
    """Live counters of the point in flight, printed on ``stream``: one rewritten line on a terminal, a plain
    line every ``plain_every_s`` otherwise."""

    def __init__(self, stream: TextIO | None, slo: SLO, *, tty: bool, plain_every_s: float = 5.0) -> None:
        self.stream, self.slo, self.tty, self.every = stream, slo, tty, plain_every_s
        self.sent = self.done = self.ok = self.met = 0
        self.label, self.point_no, self.t_start, self.t_end = "", 0, 0.0, 0.0
        self.cap: int | None = None
        self._last = 0.0

    def begin(self, label: str, span_s: float, cap: int | None = None) -> None:
        self.cap = cap
        self.sent = self.done = self.ok = self.met = 0
        self.point_no += 1
        self.label, self.t_start = label, time.monotonic()
        self.t_end = self.t_start + span_s

    def on_done(self, rec: Any) -> None:
        self.met += meets(rec, request_metrics(rec), self.slo)

    def line(self) -> str:
        left = max(0.0, self.t_end - time.monotonic())
        att = f"{100.0 * self.met / self.done:.0f} %" if self.done else "-"
        busy = self.sent - self.done if self.cap is None else min(self.cap, self.sent - self.done)
        return (f"point {self.point_no} {self.label}: in flight {busy}, sent {self.sent}, done "
                f"{self.done}, SLO met so far {att}, schedule left {left:.0f} s")

    def tick(self) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        elif now - self._last >= self.every:
            self.stream.write(self.line() + "\n")
            self._last = now
        self.stream.flush()

    def end(self, summary: dict[str, Any]) -> None:
        if self.stream is None:
            return
        verdict = "met" if summary.get("slo_met") else "missed"
        sched = summary.get("schedule", {})
        self.stream.write(("\r\x1b[2K" if self.tty else "") + f"point {self.point_no} {self.label}: SLO {verdict}, "
                          f"achieved {sched.get('achieved_rps')} req/s, steady {summary.get('steady')}\n")
        self.stream.flush()


def _concurrency_plan(ls: LoadSettings, cap: int, default_max_tokens: int) -> list[Planned]:
    base = make_plan(replace(ls, mode="rate", rate=1.0, duration_s=None, requests=cap * PER_SLOT_REQUESTS,
                             arrival="constant", max_concurrency=None), default_max_tokens)
    for p in base:
        p.at_s = 0.0
    return base


async def _ticker(progress: Progress) -> None:
    while True:
        await asyncio.sleep(0.5)
        progress.tick()


async def search_capacity(session: Session, ls: LoadSettings, ss: SearchSettings, *, out_dir: Path,
                          progress: Progress | None = None) -> dict[str, Any]:
    """Search the capacity over ``session``; writes ``out_dir/capacity.json`` and each point's folder. Cancelled
    (an interrupt), it writes capacity.json with ``"interrupted": true``, the points finished so far and no
    boundary, then lets the cancellation go on."""
    assert ls.slo, "bench capacity needs an SLO"
    slo = ls.slo_spec
    first = [0]
    finished: list[Point] = []

    async def one(load: float, trial: int, duration_s: float | None = None) -> dict[str, Any]:
        pls = point_settings(ls, load, ss.by, ls.seed + 1000 * trial + len(first), duration_s)
        if ss.by == "concurrency":
            plan = _concurrency_plan(pls, int(load), session.profile.max_tokens)
        else:
            plan = make_plan(pls, session.profile.max_tokens)
        ld = load_dict(pls)
        folder = out_dir / "points" / f"{len(first):02d}-{ld['id']}-t{trial}"
        old, session.writer = session.writer, RecordWriter(folder / "records.jsonl")
        if progress is not None:
            progress.begin(ld["id"], max((p.at_s for p in plan), default=0.0), pls.max_concurrency)
        tick = asyncio.create_task(_ticker(progress)) if progress is not None else None
        try:
            _, s = await run_point(session, pls, plan, slo=slo, tag="measure", first_index=first[0], load=ld,
                                   counters=progress, on_done=progress.on_done if progress else None)
        finally:
            if tick is not None:
                tick.cancel()
            session.writer.close()
            session.writer = old
        first[0] += len(plan)
        first.append(0)
        s["dir"] = str(folder)
        finished.append(Point(load, trial, s))
        write_atomic(folder / "point.json", json.dumps(s, indent=1) + "\n")
        if progress is not None:
            progress.end(s)
        return s

    try:
        doc = await search(ss, one)
    except asyncio.CancelledError:
        doc = {"by": ss.by, "boundary": None, "interval": None, "saturated_at": None, "points": [point_entry(p) for p in finished],
               "interrupted": True,
               "note": f"interrupted after {len(finished)} point(s): no boundary (run the search again)"}
        _write_doc(doc, slo, ls, session, out_dir)
        raise
    doc["interrupted"] = False
    _write_doc(doc, slo, ls, session, out_dir)
    return doc


def not_searched(ls: LoadSettings, ss: SearchSettings, out_dir: Path) -> None:
    """capacity.json of a search interrupted before its first point (while the endpoint was being set up)."""
    doc: dict[str, Any] = {"by": ss.by, "boundary": None, "interval": None, "saturated_at": None, "points": [], "interrupted": True,
           "note": "interrupted before the first point (while the endpoint was being set up)",
           "slo": ls.slo, "load": load_dict(ls)}
    save_capacity(doc, out_dir / "capacity.json")


def _write_doc(doc: dict[str, Any], slo: Any, ls: LoadSettings, session: Session, out_dir: Path) -> None:
    doc.update({"slo": slo.text, "load": load_dict(ls), "endpoint": {"url": session.base, "model": session.model},
                "server": session.server, "run_id": session.run_id})
    save_capacity(doc, out_dir / "capacity.json")  # types checked, atomic, secrets redacted
