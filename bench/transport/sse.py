"""Server-sent events decoding with arrival timestamps.

bench owns this small decoder rather than using a library because of its timing rule: every event must be stamped
with the arrival time of the network read that *completes* it, taken before any parsing. Libraries that iterate
lines or events hide the reads. The decoder follows the WHATWG HTML "server-sent events" parsing rules:

- lines end in LF, CRLF or CR (a CR at the end of one read and an LF at the start of the next are one line end);
- a line starting with ``:`` is a comment (keep-alive ping) and is ignored;
- ``field: value`` with one optional space after the colon stripped; a line with no colon is a field with an empty
  value; fields ``data`` (appended, joined by LF), ``event``, ``id`` (ignored if it holds NUL), ``retry`` (ASCII
  digits only: ``str.isdigit`` would accept ``²`` or ``٣``, which ``int`` then rejects); other fields are ignored;
- an empty line dispatches the event; an event with no ``data`` is not dispatched (``id:``/``retry:``-only blocks);
- a UTF-8 byte-order mark at the very start is dropped; UTF-8 sequences split across reads are decoded correctly;
  invalid UTF-8 becomes U+FFFD.

Fast paths, same rules in fewer steps: text with LF-only line ends skips the CR search (``_feed_lf``), and its
one-line ``data: `` blocks are dispatched without the line loop; when no event is open (the previous read ended
between events, or inside the first line of the next one), a read's text with no CR is split at once into the data
of the whole events up to its last empty line, if every block there is one ``data: `` line (``_plain``: what
servers send; a read of many events then costs a few C-level passes), and only the rest goes through the line rules.

:meth:`SSEDecoder.feed_log` keeps a stream's events in an :class:`SSELog` (a stamp and a str per event, no object),
which is what bench's client reads with: a read of many events costs a few C-level list operations beyond the split.

Nothing a server sends makes the decoder raise (``tests/transport/test_sse.py`` checks it, and checks it against a reference
implementation of the rules, on random streams cut at random points).

At the end of the stream, the spec discards an event not terminated by an empty line; :meth:`SSEDecoder.close`
returns it instead, flagged ``complete=False``, so the client can record what a non-conforming server sent.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "SSELog"]


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event.

    Attributes:
        t_ns: arrival time (``time.perf_counter_ns()``) of the read that completed the event.
        data: the data field, lines joined with LF.
        event: the event type (``"message"`` when the server sent no ``event:`` field).
        id: the last event id seen, or ``None``.
        complete: ``False`` only for a trailing event the stream ended without terminating.
    """

    t_ns: int
    data: str
    event: str = "message"
    id: str | None = None
    complete: bool = True


class SSELog:
    """A stream's events as the read path keeps them, flat: the i-th event arrived with the read stamped
    ``t_ns[i]`` and carried ``data[i]``. Events whose type is not ``message`` (``event: ping``, ``error``...) are
    also in ``other`` (whole), at the indexes ``other_at`` (ascending). Event ids and the ``complete`` flag are not
    kept (bench's client uses neither). A read of ``k`` events adds ``k`` stamps (one int) and ``k`` strs: no
    object per event."""

    __slots__ = ("t_ns", "data", "other_at", "other")

    def __init__(self) -> None:
        self.t_ns: list[int] = []
        self.data: list[str] = []
        self.other_at: list[int] = []
        self.other: list[SSEEvent] = []

    def __len__(self) -> int:
        return len(self.data)

    def add(self, events: list[SSEEvent]) -> None:
        """Append decoded events."""
        for i, ev in enumerate(events, len(self.data)):
            if ev.event != "message":
                self.other_at.append(i)
                self.other.append(ev)
        self.t_ns += [ev.t_ns for ev in events]
        self.data += [ev.data for ev in events]

    def events(self) -> list[SSEEvent]:
        """The events as :class:`SSEEvent` objects (``message`` ones without their id, as complete)."""
        out = [SSEEvent(t, d) for t, d in zip(self.t_ns, self.data, strict=True)]
        for i, ev in zip(self.other_at, self.other, strict=True):
            out[i] = ev
        return out


class SSEDecoder:
    """Incremental SSE decoder: feed it raw bytes with their arrival time, get the events they complete.

    Usage::

        dec = SSEDecoder()
        for t_ns, chunk in reads:
            for ev in dec.feed(chunk, t_ns):
                ...
        tail = dec.close(t_end_ns)   # list with at most one unterminated event

    or ``dec.feed_log(chunk, t_ns, log)`` with an :class:`SSELog` ``log``, then ``log.add(dec.close(t_end_ns))``.

    ``retry`` holds the last valid ``retry:`` value in ms (unused by bench; kept for completeness).
    """

    __slots__ = ("_utf8", "_buf", "_skip_lf", "_data", "_has_data", "_event", "_last_id", "retry", "_started")

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._skip_lf = False
        self._data: list[str] = []
        self._has_data = False
        self._event = ""
        self._last_id: str | None = None
        self.retry: int | None = None
        self._started = False

    def feed(self, chunk: bytes, t_ns: int) -> list[SSEEvent]:
        """Decode one read. Returns the events this read completed (possibly none), all stamped ``t_ns``."""
        buf = self._text(chunk)
        values, start = self._plain(buf)
        last_id = self._last_id
        return self._feed_rest(buf, start, t_ns, [SSEEvent(t_ns, v, "message", last_id) for v in values])

    def feed_log(self, chunk: bytes, t_ns: int, log: SSELog) -> int:
        """:meth:`feed` into ``log`` (no object per event on the fast path); returns how many events it added."""
        buf = self._text(chunk)
        values, start = self._plain(buf)
        n = len(values)
        if n:
            log.data += values
            log.t_ns += [t_ns] * n
        evs = self._feed_rest(buf, start, t_ns, [])
        if not evs:
            return n
        log.add(evs)
        return n + len(evs)

    def _plain(self, buf: str) -> tuple[list[str], int]:
        """The fast path: the data of the whole events at the start of ``buf`` (up to its last empty line) when no
        event is open, ``buf`` has no CR and every block there is one ``data: `` line (what servers send), and
        where the rest of ``buf`` starts; else no events and 0. The first block is checked before the split, so a
        server whose events have other lines (``event:``, ``id:``, several ``data:``) costs a few ``find`` calls."""
        if buf[:6] != "data: " or self._has_data or self._event or "\r" in buf:
            return [], 0
        end = buf.rfind("\n\n")
        if end < 0 or buf.find("\n") != buf.find("\n\n"):
            return [], 0
        values = buf[6:end].split("\n\ndata: ")
        for v in values:
            if "\n" in v:  # a block of several lines, or empty lines between blocks
                return [], 0
        return values, end + 2

    def _feed_rest(self, buf: str, start: int, t_ns: int, out: list[SSEEvent]) -> list[SSEEvent]:
        """``buf`` from ``start`` on by the line rules, its events appended to ``out``."""
        if start:
            buf = buf[start:]
            if "\n" not in buf:  # what is left of the read is empty or a partial line (the usual case)
                self._buf = buf
                return out
        return self._feed_lf(buf, t_ns, out) if "\r" not in buf else self._feed_cr(buf, t_ns, out)

    def _text(self, chunk: bytes) -> str:
        """The read's text through the incremental decoder, after the BOM rule, a pending CR and a partial line."""
        text = self._utf8.decode(chunk)
        if not self._started and text:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf and text:
            if text[0] == "\n":
                text = text[1:]
            self._skip_lf = False
        return self._buf + text if self._buf else text

    def _feed_cr(self, buf: str, t_ns: int, out: list[SSEEvent]) -> list[SSEEvent]:
        """The general line rules (LF, CR or CRLF line ends)."""
        start = 0
        n = len(buf)
        while start < n:
            # next line end: LF, CR, or CRLF
            lf = buf.find("\n", start)
            cr = buf.find("\r", start, lf if lf >= 0 else n)
            if cr >= 0:
                end, nxt = cr, cr + 1
                if nxt < n:
                    if buf[nxt] == "\n":
                        nxt += 1
                else:
                    self._skip_lf = True  # CR ends this read: an LF starting the next read belongs to it
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            ev = self._line(buf[start:end], t_ns)
            if ev is not None:
                out.append(ev)
            start = nxt
        self._buf = buf[start:]
        return out

    def _feed_lf(self, buf: str, t_ns: int, out: list[SSEEvent]) -> list[SSEEvent]:
        """LF-only text: whole events (blocks ended by an empty line) first; a block that is one ``data: `` line,
        with nothing pending, is dispatched directly (the event every server sends), any other by the line rules."""
        blocks = buf.split("\n\n")
        rest = blocks.pop()
        line_of = self._line
        for blk in blocks:
            if blk[:6] == "data: " and "\n" not in blk and not self._has_data and not self._event:
                out.append(SSEEvent(t_ns, blk[6:], "message", self._last_id))
                continue
            for line in blk.split("\n"):  # an empty first line ends an event the last read left open
                ev = line_of(line, t_ns)
                if ev is not None:
                    out.append(ev)
            ev = line_of("", t_ns)
            if ev is not None:
                out.append(ev)
        lines = rest.split("\n")
        self._buf = lines.pop()
        for line in lines:
            ev = line_of(line, t_ns)
            if ev is not None:
                out.append(ev)
        return out

    def close(self, t_ns: int) -> list[SSEEvent]:
        """End of stream: returns the unterminated trailing event, if any, with ``complete=False``."""
        rest = self._utf8.decode(b"", final=True)
        if rest:
            self._buf += rest
        if self._buf:
            self._line(self._buf, t_ns)
            self._buf = ""
        if self._has_data:
            ev = SSEEvent(t_ns, "\n".join(self._data), self._event or "message", self._last_id, complete=False)
            self._reset()
            return [ev]
        return []

    def _reset(self) -> None:
        self._data = []
        self._has_data = False
        self._event = ""

    def _line(self, line: str, t_ns: int) -> SSEEvent | None:
        if not line:
            if not self._has_data:
                self._event = ""
                return None
            ev = SSEEvent(t_ns, "\n".join(self._data), self._event or "message", self._last_id)
            self._reset()
            return ev
        if line[0] == ":":
            return None
        colon = line.find(":")
        if colon < 0:
            field, value = line, ""
        else:
            field = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == " ":
                value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\x00" not in value:
                self._last_id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():
                self.retry = int(value)
        return None
