"""Streams beyond the server's slots: a warning when a cell asks for more concurrent streams than the server decodes
at once, and detection of queueing from the records when the server does not say how many slots it has (pure).

With 8 streams against llama-server ``-np 4``, four requests of each wave wait for a free slot: their TTFT holds a
whole request's time of waiting, and per-stream decode and TTFT no longer describe 8 concurrent streams. When the
server reports its slots (``server["slots"]``, from :func:`bench.server.info.discover_server`),
:func:`slot_warnings` compares. When it does not (vLLM, SGLang, ...), :func:`detect_queueing` looks at each wave:
a request whose first token arrives after another request of its wave has already *finished* was waiting for a
slot (a continuous-batching server starts every request it has room for at once, so without queueing no request's
first token comes after another's end). Its TTFT then comes in steps of about one request's time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.measure.metrics import RequestMetrics, ok_metrics_by_wave
from bench.records import RequestRecord
from bench.warns import warning

__all__ = ["slot_warnings", "detect_queueing", "queueing_from_metrics", "queueing_summary", "waves_of_cell",
           "QUEUED_SHARE_WARN"]

QUEUED_SHARE_WARN = 0.10  # warn when at least this share of requests queued (and in at least half the waves)
_AFTER_END = 0.9  # a first token at >= 90 % of another request's end-to-end time counts as "after it ended"


def _streams_and_id(cell: Mapping[str, Any] | int) -> tuple[int, str]:
    if isinstance(cell, Mapping):
        return int(cell.get("streams") or 0), str(cell.get("id") or "cell")
    return int(cell), "cell"


def slot_warnings(cell: Mapping[str, Any] | int, server: Mapping[str, Any] | None) -> list[str]:
    """A warning when the cell's streams exceed the server's slots; empty when they do not or slots are unknown.

    ``cell``: a cell summary (its ``streams`` and ``id``) or a stream count. ``server``: the results' server dict.
    The warning contains the word ``slots`` and both numbers, and names the fix.
    """
    streams, cid = _streams_and_id(cell)
    slots = (server or {}).get("slots")
    if not isinstance(slots, int) or isinstance(slots, bool) or slots <= 0 or streams <= slots:
        return []
    return [warning("slots-exceeded", cid, streams=streams, slots=slots, waiting=streams - slots)]


def _queued_in_wave(pairs: Sequence[tuple[float, float]]) -> int:
    """How many requests of one wave (``(ttft_ms, e2e_ms)`` each) got their first token after another ended."""
    n = 0
    for i, (ttft, _) in enumerate(pairs):
        others = [e2e for j, (_, e2e) in enumerate(pairs) if j != i]
        if others and ttft >= _AFTER_END * min(others):
            n += 1
    return n


def detect_queueing(waves: Sequence[Sequence[tuple[float, float]]], streams: int) -> dict[str, Any] | None:
    """Queueing seen in the records: per wave, the requests whose first token came after another request's end.

    ``waves``: per measured wave, ``(ttft_ms, e2e_ms)`` of its successful requests. Returns None when no wave has 2
    or more requests; else ``{"queued_requests", "requests", "queued_share", "waves_with_queueing", "waves",
    "est_slots", "step_ms", "detected"}``: ``est_slots`` the median number of requests per wave that did not wait,
    ``step_ms`` the median TTFT of the waiting ones minus the wave's fastest TTFT (about one request's time), and
    ``detected`` true when at least :data:`QUEUED_SHARE_WARN` of the requests waited, in at least half the waves.
    """
    usable = [list(w) for w in waves if len(w) >= 2]
    if not usable or streams < 2:
        return None
    queued, total, hit, free, steps = 0, 0, 0, [], []
    for w in usable:
        q = _queued_in_wave(w)
        queued, total = queued + q, total + len(w)
        free.append(len(w) - q)
        if q:
            hit += 1
            first = min(t for t, _ in w)
            limit = _AFTER_END * min(e for _, e in w)
            steps += [t - first for t, _ in w if t >= limit]
    free.sort()
    steps.sort()
    share = queued / total
    return {
        "queued_requests": queued, "requests": total, "queued_share": round(share, 3),
        "waves_with_queueing": hit, "waves": len(usable), "est_slots": free[len(free) // 2],
        "step_ms": round(steps[len(steps) // 2], 1) if steps else None,
        "detected": share >= QUEUED_SHARE_WARN and 2 * hit >= len(usable),
    }


def queueing_from_metrics(metrics: Sequence[RequestMetrics], waves: Sequence[Sequence[str]],
                          streams: int) -> dict[str, Any] | None:
    """:func:`detect_queueing` from the metrics of a cell's measured requests and its waves (request ids per
    wave)."""
    per_wave = [[(m.ttft_ms, m.e2e_ms) for m in ms if m.ttft_ms is not None and m.e2e_ms is not None]
                for ms in ok_metrics_by_wave(metrics, waves)]
    return detect_queueing(per_wave, streams)


def waves_of_cell(records: Sequence[RequestRecord], cell_id: str) -> list[list[str]]:
    """Request ids per measured wave of one cell, from the records' ``meta`` (``cell``, ``phase``, ``wave``)."""
    waves: dict[int, list[str]] = {}
    for r in records:
        m = r.meta or {}
        if m.get("cell") == cell_id and m.get("phase") == "measure" and isinstance(m.get("wave"), int):
            waves.setdefault(m["wave"], []).append(r.request_id)
    return [waves[k] for k in sorted(waves)]


def queueing_summary(cell: Mapping[str, Any], metrics: Sequence[RequestMetrics], waves: Sequence[Sequence[str]],
                     server: Mapping[str, Any] | None) -> dict[str, Any]:
    """The cell's ``queueing`` dict: ``{"streams", "slots", "source", "detection", "warnings"}`` (``metrics``: of
    the cell's measured requests; ``waves``: their ids per wave).

    With the server's slot count known, ``source`` is ``"server"`` and the warning is :func:`slot_warnings`'s;
    otherwise ``source`` is ``"records"`` and a warning is given when :func:`detect_queueing` detects queueing.
    """
    streams, cid = _streams_and_id(cell)
    slots = (server or {}).get("slots")
    out: dict[str, Any] = {"streams": streams, "slots": slots, "source": None, "detection": None, "warnings": []}
    if isinstance(slots, int) and slots > 0:
        out["source"] = "server"
        out["warnings"] = slot_warnings(cell, server)
        return out
    det = queueing_from_metrics(metrics, waves, streams)
    out["detection"] = det
    if det is not None:
        out["source"] = "records"
        if det["detected"]:
            out["warnings"].append(warning("queueing-seen", cid, queued=det["queued_requests"],
                                           requests=det["requests"], step=det["step_ms"], slots=det["est_slots"],
                                           streams=streams))
    return out
