"""``bench capacity`` against a live endpoint: one :class:`bench.session.endpoint.Session`, one open-loop point per load of
the search (:mod:`bench.load.capacity`), each point's records and summary in its own folder, live progress.

Folder: ``DIR/capacity.json`` (the search document), ``DIR/records.jsonl`` (set-up probes),
``DIR/points/NN-<id>-t<trial>/records.jsonl`` and ``point.json`` (the point's cell summary).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.load.capacity import DEFINITIONS, SearchSettings, search
from bench.load.capacity_points import point_settings
from bench.load.openloop import Planned
from bench.load.point import LoadSettings, load_dict, make_plan, point_requests, run_point
from bench.records import RecordWriter
from bench.report.progress import CapacityProgress as Progress
from bench.results import save_capacity, write_atomic

if TYPE_CHECKING:
    from bench.session.endpoint import Session

__all__ = ["search_capacity", "Progress", "PER_SLOT_REQUESTS"]

PER_SLOT_REQUESTS = 8


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
    (an interrupt), it writes capacity.json with ``"interrupted": true``, the points finished so far (phases and
    saturation as in a whole search), the bracket they show (``method.finished_bracket``) and no boundary, interval
    or level, then lets the cancellation go on. ``cut_point``: the point an interrupt (or, ``--by concurrency``,
    the time budget) cut, else null."""
    assert ls.slo, "bench capacity needs an SLO"
    slo = ls.slo_spec
    assert slo is not None
    first = [0]
    current: list[dict[str, Any]] = []  # the point being measured (its folder has records.jsonl, no point.json yet)

    async def one(load: float, trial: int, duration_s: float | None = None,
                       refine_s: float | None = None) -> dict[str, Any]:
        pls = point_settings(ls, load, ss.by, ls.seed + 1000 * trial + len(first), duration_s, refine_s)
        if ss.by == "concurrency":
            plan = _concurrency_plan(pls, int(load), session.profile.max_tokens)
        else:
            plan = make_plan(pls, session.profile.max_tokens)
        ld = load_dict(pls)
        folder = out_dir / "points" / f"{len(first):02d}-{ld['id']}-t{trial}"
        current[:] = [{"load": load, "trial": trial, "dir": str(folder)}]
        old, session.writer = session.writer, RecordWriter(folder / "records.jsonl")
        if progress is not None:
            progress.begin(ld["id"], max((p.at_s for p in plan), default=0.0), pls.max_concurrency)
        tick = asyncio.create_task(_ticker(progress)) if progress is not None else None
        try:
            run, s = await run_point(session, pls, plan, slo=slo, tag="measure", first_index=first[0], load=ld,
                                   counters=progress, on_done=progress.on_done if progress else None)
        finally:
            if tick is not None:
                tick.cancel()
            session.writer.close()
            session.writer = old
        first[0] += len(plan)
        first.append(0)
        s["dir"] = str(folder)
        current.clear()
        write_atomic(folder / "point.json", json.dumps(s, indent=1) + "\n")
        if ss.by == "rate":
            s["requests"] = point_requests(run, plan, pls, slo)  # for the search only: not in point.json
        if progress is not None:
            progress.end(s)
        return s

    def interrupted(doc: dict[str, Any]) -> None:
        doc.update({"interrupted": True, "cut_point": _cut_point(current)})
        if current:
            doc["note"] += "; the point in progress is cut_point (its records only)"
        _write_doc(doc, slo, ls, session, out_dir)

    doc = await search(ss, one, on_interrupt=interrupted)
    doc.update({"interrupted": False, "cut_point": _cut_point(current)})  # a point the time budget cut
    _write_doc(doc, slo, ls, session, out_dir)
    return doc


def _cut_point(current: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The point an interrupt cut: its load, trial and folder, and how many finished records that folder kept (no
    point.json: it has no window or statistics)."""
    if not current:
        return None
    recs = Path(current[0]["dir"]) / "records.jsonl"
    n = sum(1 for line in recs.read_text(encoding="utf-8").splitlines() if line.strip()) if recs.exists() else 0
    return {**current[0], "records": n}


def search_load(ls: LoadSettings, by: str) -> dict[str, Any]:
    """capacity.json's ``load``: the settings every point shares (arrival, sizes, seed, the refine points'
    ``duration_s``), under the id ``search-by-rate`` or ``search-by-concurrency``: the load itself is what each
    point varies (a rate search's settings have no rate, and ``load_id`` would call them ``concurrency``)."""
    return {**load_dict(ls), "id": f"search-by-{by}"}


def not_searched(ls: LoadSettings, ss: SearchSettings, out_dir: Path) -> None:
    """capacity.json of a search interrupted before its first point (while the endpoint was being set up)."""
    doc: dict[str, Any] = {"by": ss.by, "definition": DEFINITIONS[ss.by], "boundary": None, "interval": None,
                           "safe": None, "confidence": None, "saturated_at": None, "method": None,
                           "note": "interrupted before the first point (while the endpoint was being set up)",
                           "time_budget_s": ss.time_budget_s, "elapsed_s": None, "points": [], "interrupted": True,
                           "cut_point": None, "slo": ls.slo, "load": search_load(ls, ss.by)}
    save_capacity(doc, out_dir / "capacity.json")


def _write_doc(doc: dict[str, Any], slo: Any, ls: LoadSettings, session: Session, out_dir: Path) -> None:
    doc.update({"slo": slo.text, "load": search_load(ls, doc.get("by") or "rate"),
                "endpoint": {"url": session.base, "model": session.model}, "server": session.server,
                "run_id": session.run_id})
    save_capacity(doc, out_dir / "capacity.json")  # types checked, atomic, secrets redacted
