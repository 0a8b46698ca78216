"""The per-request record: what one streaming request sent and received, with arrival times.

A :class:`RequestRecord` is raw data, not metrics: times are nanoseconds on the ``time.perf_counter_ns()`` clock of
the process that made the request. ``metrics.request_metrics`` turns a record into numbers. Records are written
as JSON lines (:class:`RecordWriter`), one per finished request, so an interrupted run loses nothing finished.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.redaction import mask_spans, redact, redact_obj, secrets

__all__ = ["Event", "RequestRecord", "RecordWriter", "read_records", "cut_record", "CUT_INTERRUPTED"]


@dataclass(slots=True)
class Event:
    """One parsed server-sent event of a response.

    Attributes:
        t_ns: arrival time in ns, relative to the record's ``sent_ns`` (so it is a latency).
        content: answer text this event carried (chat ``delta.content`` or completions ``text``).
        reasoning: reasoning text (``delta.reasoning`` or ``delta.reasoning_content``).
        tool: tool-call argument text (``delta.tool_calls[].function.arguments``, names included).
        sched_ns: the server's scheduled send time when it reports one (``bench sim``), absolute ns, else None.
        write_ns: the server's actual write time when it reports one (``bench sim``), absolute ns, else None.
        tokens: tokens the server says this event carried (``bench sim``), else None.
    """

    t_ns: int
    content: str = ""
    reasoning: str = ""
    tool: str = ""
    sched_ns: int | None = None
    write_ns: int | None = None
    tokens: int | None = None

    @property
    def has_text(self) -> bool:
        """True when the event carried generated text of any kind (a "token-bearing" event)."""
        return bool(self.content or self.reasoning or self.tool)


@dataclass(slots=True)
class RequestRecord:
    """Everything bench knows about one request. Times in ns on ``perf_counter_ns``; durations derive from them.

    Attributes:
        request_id: unique id within a run.
        endpoint: ``"chat"`` or ``"completions"``.
        model: model name sent.
        queued_ns: when the request was handed to the client (absolute ns).
        sent_ns: just before the request went out, after any client-side queueing (absolute ns).
        end_ns: when the response ended (last byte, error or cut), relative to ``sent_ns``; None if never sent.
        status: HTTP status, None when no response came.
        events: parsed data events in arrival order (token-bearing and not; ``[DONE]`` excluded).
        done: a ``data: [DONE]`` arrived.
        finish_reason: the last ``finish_reason`` seen, or None.
        usage: the ``usage`` object as the server sent it, or None.
        timings: llama.cpp's ``timings`` object, or None.
        error: one-line description of the failure, or None. Never contains the API key (:meth:`redact`).
        error_kind: short class of failure: ``http_4xx``/``http_5xx``/``http_429``, ``stream_error``,
            ``incomplete``, ``no_tokens``, ``connect``, ``timeout``, ``protocol``, ``bad_json``, ``cancelled``,
            ``worker_lost`` (a Ray node running the request was lost, bench.session.ray_actors).
        meta: what the run attached (cell, stream index, prompt target tokens...); free-form, JSON-safe.
        stamp_source: where the arrival stamps came from: ``"kernel"`` (the kernel's receive time of each read,
            bench.transport.kernel_stamps) or ``"user"`` (``perf_counter_ns()`` when Python got the read).
        images: ``image_url`` parts the request carried (chat), 0 without images.
        image_bytes: their decoded size in bytes (base64 data URLs; 0 for images sent by address).
        tool_forced: the request's ``tool_choice`` obliged a tool call (``required`` or a named function).
        tool_calls: the tool calls the answer made, assembled from the streamed fragments: ``{"id", "name",
            "arguments"}`` per call index, in order (what a chat client sends back in its next turn).
        scheduled_ns: open-loop modes (``rate``, ``trace``, ``sessions``): when the schedule said to send it
            (absolute ns, the clock of ``queued_ns``/``sent_ns``); None in concurrency mode. ``sent_ns -
            scheduled_ns`` is the send lag (docs/load.md).
    """

    request_id: str
    endpoint: str
    model: str
    queued_ns: int = 0
    sent_ns: int = 0
    end_ns: int | None = None
    status: int | None = None
    events: list[Event] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    stamp_source: str = "user"
    scheduled_ns: int | None = None
    images: int = 0
    image_bytes: int = 0
    tool_forced: bool = False
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """A success: no recorded error. The client sets ``error`` for every failure kind."""
        return self.error is None

    def _first_ms(self, attr: str) -> float | None:
        return next((e.t_ns / 1e6 for e in self.events if getattr(e, attr)), None)

    @property
    def ttft_reasoning_ms(self) -> float | None:
        """Send -> the first event carrying reasoning text (``reasoning_content`` or ``reasoning``); None if none
        came (docs/metrics.md)."""
        return self._first_ms("reasoning")

    @property
    def ttft_content_ms(self) -> float | None:
        """Send -> the first event carrying answer content; None if none came (the same as ``ttfc_ms``)."""
        return self._first_ms("content")

    @property
    def ttft_tool_ms(self) -> float | None:
        """Send -> the first event carrying a tool-call fragment (name or arguments); None if none came."""
        return self._first_ms("tool")

    @property
    def queue_ms(self) -> float:
        """Client-side queueing before send, in ms."""
        return (self.sent_ns - self.queued_ns) / 1e6 if self.sent_ns and self.queued_ns else 0.0

    def redact(self) -> None:
        """Remove every registered secret (:mod:`bench.redaction`) from what the server could have put in the
        record: error, model, finish reason, usage, timings, meta, and the generated text, where a key echoed as
        output is usually spread over many events (each of its characters becomes ``*``). A no-op (no cost) when
        no secret is registered; idempotent."""
        if not secrets():
            return
        if self.error is not None:
            self.error = redact(self.error)
        self.model = redact(self.model)
        if self.finish_reason is not None:
            self.finish_reason = redact(self.finish_reason)
        self.usage = redact_obj(self.usage)
        self.timings = redact_obj(self.timings)
        self.meta = redact_obj(self.meta)
        self.tool_calls = redact_obj(self.tool_calls) or []
        for attr in ("content", "reasoning", "tool"):
            masked = mask_spans([getattr(e, attr) for e in self.events])
            if masked is not None:
                for e, text in zip(self.events, masked):
                    setattr(e, attr, text)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict, redacted (:meth:`redact`); events become compact lists ``[t_ms, content, reasoning,
        tool, sched_ns, write_ns, tokens]`` to keep files small."""
        self.redact()
        d = {name: _copied(getattr(self, name)) if name != "events" else None for name in _RECORD_FIELDS}  # as asdict
        d["events"] = [
            [round(e.t_ns / 1e6, 6), e.content, e.reasoning, e.tool, e.sched_ns, e.write_ns, e.tokens]
            for e in self.events
        ]
        d["ok"] = self.ok
        d["node"] = self.meta.get("node")  # the Ray node that sent it (None without --ray), as readers look for it
        for k in _DERIVED:
            v = getattr(self, k)
            d[k] = None if v is None else round(v, 6)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_dict`. Raises KeyError/TypeError on a malformed dict."""
        d = dict(d)
        d.pop("ok", None)
        d.pop("node", None)  # written from meta.node
        for k in _DERIVED:
            d.pop(k, None)
        evs = [Event(int(round(e[0] * 1e6)), e[1], e[2], e[3], e[4], e[5], e[6]) for e in d.pop("events")]
        return cls(events=evs, **d)


_DERIVED = ("ttft_reasoning_ms", "ttft_content_ms", "ttft_tool_ms")  # written for readers of records.jsonl
_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
_ATOMS = frozenset({str, int, float, bool, type(None)})


CUT_INTERRUPTED = "in flight when the run was interrupted"  # why a record was cut, when it was the interrupt


def cut_record(request_id: str, endpoint: str, model: str, scheduled_ns: int | None, meta: dict[str, Any],
               why: str) -> RequestRecord:
    """The record of a request cut in flight (a drain ran out, the run was interrupted): an error of kind
    ``cancelled`` saying ``cut: WHY``; counted as cut, never as a success."""
    rec = RequestRecord(request_id, endpoint, model, queued_ns=scheduled_ns or 0, meta=meta, scheduled_ns=scheduled_ns)
    rec.error = f"cut: {why}"
    rec.error_kind = "cancelled"
    return rec


def _copied(v: Any) -> Any:
    """``v`` as :func:`dataclasses.asdict` gives a field's value (a deep copy; a dataclass becomes a dict), for the
    JSON-like values of a record without asdict's per-object overhead: a record's ``to_dict`` took ~40 µs with two
    events and ~650 µs with a hundred (asdict made each event a dict only for it to be replaced)."""
    c = v.__class__
    if c in _ATOMS:
        return v
    if c is dict:
        return {_copied(k): _copied(x) for k, x in v.items()}
    if c is list:
        return [_copied(x) for x in v]
    return asdict(v) if is_dataclass(v) and not isinstance(v, type) else _asdict_value(v)


def _asdict_value(v: Any) -> Any:
    """Anything else, through asdict itself (a throwaway dataclass holding it), so the result is asdict's."""
    return asdict(_Holder(v))["v"]


@dataclass(slots=True)
class _Holder:
    v: Any


class RecordWriter:
    """Appends records to a JSON-lines file, flushing after each line so a stopped run keeps every finished one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot write {self.path}: {e.strerror or e}") from None
        self._size = os.fstat(self._fd).st_size
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        """Write one record as one line, in one system call; a line the disk cannot take is cut back out, so the
        file never holds a torn line.

        Raises:
            ConfigError: the disk is full or the file cannot be written (one line naming the file).
        """
        line = (json.dumps(rec.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            n = os.write(self._fd, line)
            if n != len(line):
                raise OSError(28, "No space left on device (short write)")
        except OSError as e:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise ConfigError(f"cannot write {self.path}: {e.strerror or e} ({self.count} records kept)") from None
        self._size += len(line)
        self.count += 1

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike[str]) -> list[RequestRecord]:
    """Read a JSON-lines records file; a truncated last line (a killed run) is skipped."""
    out: list[RequestRecord] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(RequestRecord.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError, IndexError):
                continue
    return out
