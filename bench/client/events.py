"""Chunk parsing: a finished stream's SSE events -> the record's tokens, text, usage and error (pure per event).

JSON is parsed after the stream ends, by one worker task per event loop that yields to the loop after each
:data:`PARSE_BUDGET_S` (1 ms) of work, so the end-of-stream work of requests that finish together never holds up
the reads (and stamps) of the others on the same loop for longer than that. The events come as the read path kept
them (:class:`bench.transport.sse.SSELog`: a stamp and a str per event); :func:`_parse_run` folds the common chunk
inline; every other chunk goes to :func:`_absorb`.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any

from bench.records import Event, RequestRecord
from bench.redaction import redact
from bench.transport.sse import SSEEvent, SSELog


def _json_loader() -> Callable[[str], Any]:
    """orjson's parser where the ``fast`` extra is installed (~3x faster), else json's (the reference; same results,
    both tested)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - exercised where orjson is absent
        return json.loads
    return orjson.loads


_loads = _json_loader()
PARSE_SLICE = 64  # events parsed at a time by the end-of-stream worker
PARSE_BUDGET_S = 0.001  # most end-of-stream work between two yields of that worker to the event loop


class _Deferred:
    """The end-of-stream work of every finished response on one event loop, done by ONE worker task in slices of
    :data:`PARSE_SLICE` events, at most :data:`PARSE_BUDGET_S` of work between two yields to the loop.

    Why one worker: when hundreds of streams end at the same decode step, every one of their tasks is ready in the
    same loop iteration, and the loop polls sockets only between iterations; each parsing its own response there
    (even in slices) would hold every other stream's reads, and their stamps, for the sum of all the parses.
    Queued here, the parses run one slice after another with the loop polling in between, so a read that arrives
    meanwhile is stamped within about one budget (~1 ms) of its arrival. The worker ends when the queue is empty
    (no task outlives the work; the next response starts a new one).
    """

    def __init__(self) -> None:
        self.queue: deque[tuple[RequestRecord, SSELog, asyncio.Future[None]]] = deque()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        perf = time.perf_counter
        t0 = perf()
        while self.queue:
            rec, raw, fut = self.queue.popleft()
            try:
                for i in range(0, max(len(raw), 1), PARSE_SLICE):
                    if _parse_log(rec, raw, i, i + PARSE_SLICE):
                        break
                    if perf() - t0 > PARSE_BUDGET_S:
                        await asyncio.sleep(0)
                        t0 = perf()
                _finish(rec)
            except Exception as e:  # noqa: BLE001 - a bug, never the server's doing: fail the request, not the worker
                _set_error(rec, f"internal error while parsing: {type(e).__name__}: {e}", "protocol")
            if not fut.done():
                fut.set_result(None)
            if perf() - t0 > PARSE_BUDGET_S:
                await asyncio.sleep(0)
                t0 = perf()


_deferred: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deferred] = weakref.WeakKeyDictionary()


async def _parse_sliced(rec: RequestRecord, raw: SSELog) -> None:
    """Parse ``raw`` into ``rec`` and apply the success rules (:func:`_finish`), through the loop's
    :class:`_Deferred` worker: off the path that stamps reads."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    d = _deferred.get(loop)
    if d is not None and not d.task.done():
        d.queue.append((rec, raw, fut))  # the running worker takes it (it checks the queue after every item)
    else:
        d = _Deferred()
        d.queue.append((rec, raw, fut))
        _deferred[loop] = d
    await fut


def _parse_events(rec: RequestRecord, raw: list[SSEEvent]) -> bool:
    """:func:`_parse_log` of decoded events (all of them)."""
    log = SSELog()
    log.add(raw)
    return _parse_log(rec, log, 0, len(log))


def _parse_log(rec: RequestRecord, log: SSELog, start: int, stop: int) -> bool:
    """Turn the events ``start:stop`` of ``log`` into :class:`Event` objects and fill usage/finish/error fields.
    Only ``message`` events carry chunks (:func:`_parse_run`); other types are ignored except ``error``. Returns
    True at ``[DONE]`` (the response is complete there: what follows is ignored)."""
    if rec.done:
        return True
    at = log.other_at
    k = bisect_left(at, start) if at else 0
    i = start
    while i < stop:
        j = at[k] if k < len(at) and at[k] < stop else stop  # the next event that is not a message, or the end
        if i < j and _parse_run(rec, log.t_ns[i:j], log.data[i:j]):
            return True
        if j >= stop:
            break
        _no_chunk(rec, log.other[k])
        k += 1
        i = j + 1
    return rec.done


def _parse_run(rec: RequestRecord, stamps: list[int], datas: list[str]) -> bool:
    """``message`` events (each one's arrival stamp and data) into ``rec``; True at ``[DONE]``.

    The common chunk is folded in here, with no call and the fewest lookups: one choice, index 0, and either a
    non-empty ``delta`` without tool calls whose content and reasoning are strs or null, or (completions) no
    ``delta`` and a str ``text``; no ``error`` or ``timings``. Every other chunk goes to :func:`_absorb`, the
    reference, which gives the same record for the common chunk too (tests/client/test_client.py checks that)."""
    sent = rec.sent_ns
    loads = _loads
    append = rec.events.append
    for t, data in zip(stamps, datas, strict=True):
        try:
            obj = loads(data)
        except (ValueError, RecursionError):  # also a keep-alive or [DONE]: rare, so not checked for first
            _not_json(rec, data)
            if rec.done:
                return True
            continue
        if obj.__class__ is not dict:  # the loaders give plain dicts, lists and strs: exact-type checks suffice
            _set_error(rec, f"event is not a JSON object: {_one_line(data)[:120]}", "bad_json")
            continue
        choices = obj.get("choices")
        if choices.__class__ is list and len(choices) == 1 and "error" not in obj and "timings" not in obj:
            ch = choices[0]
            delta = ch.get("delta") if ch.__class__ is dict and ch.get("index", 0) == 0 else False
            if delta.__class__ is dict and delta and "text" not in ch:
                text = delta.get("content") or ""  # a falsy value adds no text, whatever its type
                if len(delta) == 1 and text:
                    r1 = r2 = ""  # content is its only key
                else:
                    r1, r2 = delta.get("reasoning_content") or "", delta.get("reasoning") or ""
                    if r1 == r2:  # the same text under both keys (some vLLM versions): counted once
                        r2 = ""
                    text = None if delta.get("tool_calls") else text  # tool calls: the general path
            elif delta is None and "message" not in ch:
                text, r1, r2 = ch.get("text"), "", ""
            else:
                text, r1, r2 = None, "", ""  # not the common chunk
            if text.__class__ is str and r1.__class__ is str and r2.__class__ is str:
                fr, usage, sim = ch.get("finish_reason"), obj.get("usage"), obj.get("sim")
                if fr:
                    rec.finish_reason = str(fr)[:100]
                if usage and usage.__class__ is dict:  # some servers send usage on every chunk
                    rec.usage = usage
                if sim.__class__ is dict:
                    s, w, n = sim.get("sched_ns"), sim.get("write_ns"), sim.get("tokens")
                    append(Event(t - sent, text, r1 + r2, "", s if s.__class__ is int else None,
                                 w if w.__class__ is int else None, n if n.__class__ is int else None))
                else:
                    append(Event(t - sent, text, r1 + r2))
                continue
        _absorb(rec, obj, t - sent)
    return False


def _no_chunk(rec: RequestRecord, sse: SSEEvent) -> None:
    """An event that is not a ``message``: an ``error`` event fails the request, others (ping) are ignored."""
    if sse.event == "error":
        _set_error(rec, f"error event: {_one_line(sse.data)}", "stream_error")


def _not_json(rec: RequestRecord, data: str) -> None:
    """A ``message`` whose data is not JSON: a keep-alive (empty), ``[DONE]``, or a failure."""
    text = data.strip()
    if text == "[DONE]":
        rec.done = True
    elif text:
        _set_error(rec, f"event is not JSON: {_one_line(data)[:120]}", "bad_json")


def _one_line(s: str) -> str:
    return " ".join(redact(s).split())[:300]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _absorb(rec: RequestRecord, obj: dict[str, Any], t_rel: int) -> None:
    """Fold one parsed chunk (streaming or whole) into the record, as one :class:`Event` built once; fields of
    the wrong type are ignored, and so are choices whose ``index`` is not 0."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            code = err.get("code") or err.get("type") or ""
            text = f"error in stream: {code} {err.get('message') or ''}".strip()
        else:
            text = f"error in stream: {err}"
        _set_error(rec, _one_line(text), "stream_error")
        return
    content = reasoning = tool = ""
    choices = obj.get("choices")
    if choices.__class__ is list:
        for ch in choices:
            if ch.__class__ is dict and ch.get("index", 0) == 0:
                c, r, t = _absorb_choice(rec, ch)
                content, reasoning, tool = content + c, reasoning + r, tool + t
    usage = obj.get("usage")
    if usage and usage.__class__ is dict:
        rec.usage = usage
    timings = obj.get("timings")
    if timings and timings.__class__ is dict:
        rec.timings = timings
    sim = obj.get("sim")
    if sim.__class__ is dict:
        rec.events.append(Event(t_rel, content, reasoning, tool, _int(sim.get("sched_ns")),
                                _int(sim.get("write_ns")), _int(sim.get("tokens"))))
    else:
        rec.events.append(Event(t_rel, content, reasoning, tool))


def _int(v: Any) -> int | None:
    return v if v.__class__ is int else None  # not bool (a subclass of int), not None


def _absorb_choice(rec: RequestRecord, ch: dict[str, Any]) -> tuple[str, str, str]:
    """One choice's (content, reasoning, tool) text, noting its ``finish_reason`` on the record: exact-type checks
    (the JSON loaders give plain dicts, lists and strs)."""
    content = reasoning = tool = ""
    delta = ch.get("delta") or ch.get("message")
    if delta.__class__ is dict:
        c = delta.get("content")
        if c.__class__ is str:
            content = c
        r = delta.get("reasoning_content")
        if r.__class__ is str:
            reasoning = r
        r = delta.get("reasoning")
        if r.__class__ is str and r != reasoning:  # the same text under both keys is counted once
            reasoning += r
        calls = delta.get("tool_calls")
        if calls.__class__ is list:
            for tc in calls:
                fn = tc.get("function") if tc.__class__ is dict else None
                if fn.__class__ is dict:
                    tool += _text(fn.get("name")) + _text(fn.get("arguments"))
                    _add_tool_call(rec, tc, fn)
    c = ch.get("text")
    if c.__class__ is str:
        content += c
    fr = ch.get("finish_reason")
    if fr:
        rec.finish_reason = str(fr)[:100]
    return content, reasoning, tool


def _add_tool_call(rec: RequestRecord, tc: dict[str, Any], fn: dict[str, Any]) -> None:
    """Fold one ``tool_calls`` entry into ``rec.tool_calls``: the call of its ``index`` (its id and name when they
    come, its argument fragments appended)."""
    idx = tc.get("index", len(rec.tool_calls) if tc.get("id") else max(len(rec.tool_calls) - 1, 0))
    idx = idx if idx.__class__ is int and 0 <= idx < 64 else 0
    while len(rec.tool_calls) <= idx:
        rec.tool_calls.append({"id": "", "name": "", "arguments": ""})
    call = rec.tool_calls[idx]
    if tc.get("id").__class__ is str and tc["id"]:
        call["id"] = tc["id"]
    call["name"] += _text(fn.get("name"))
    call["arguments"] += _text(fn.get("arguments"))


def _parse_whole(rec: RequestRecord, body: bytes, t_abs: int) -> None:
    """A non-streaming JSON answer (server ignored ``stream``): one event at the time the body completed."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        _set_error(rec, "response is not JSON", "bad_json")
        return
    if not isinstance(obj, dict):
        _set_error(rec, "response is not a JSON object", "bad_json")
        return
    _absorb(rec, obj, t_abs - rec.sent_ns)
    rec.done = True


def _finish(rec: RequestRecord) -> None:
    """Apply the success rules once everything is parsed, then redact the record."""
    if rec.error is None:
        if not rec.done and rec.finish_reason is None:
            _set_error(rec, "stream ended without finish_reason or [DONE]", "incomplete")
        elif not any(e.has_text for e in rec.events):
            _set_error(rec, "no tokens generated", "no_tokens")
    rec.redact()


def _set_error(rec: RequestRecord, msg: str, kind: str) -> None:
    if rec.error is None:  # the first failure is the cause; later ones are consequences
        rec.error = redact(msg)
        rec.error_kind = kind
