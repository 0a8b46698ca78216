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

Fast paths, same rules in fewer steps: a read with LF-only line ends skips the CR search (``_feed_lf``); a read
that ends with an empty line and has no CR, after a read that left nothing pending (it ended in LF with no event
open, so there is no partial line, no pending CR, no byte held by the UTF-8 decoder, and the BOM rule is behind), is
decoded in one go (``bytes.decode``) and split into whole events (``_feed_clean``). In both, a block that is one
``data: `` line (the event servers send) is dispatched without the line loop.

Nothing a server sends makes the decoder raise (``tests/transport/test_sse.py`` checks it, and checks it against a reference
implementation of the rules, on random streams cut at random points).

At the end of the stream, the spec discards an event not terminated by an empty line; :meth:`SSEDecoder.close`
returns it instead, flagged ``complete=False``, so the client can record what a non-conforming server sent.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent"]


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


class SSEDecoder:
    """Incremental SSE decoder: feed it raw bytes with their arrival time, get the events they complete.

    Usage::

        dec = SSEDecoder()
        for t_ns, chunk in reads:
            for ev in dec.feed(chunk, t_ns):
                ...
        tail = dec.close(t_end_ns)   # list with at most one unterminated event

    ``retry`` holds the last valid ``retry:`` value in ms (unused by bench; kept for completeness).
    """

    __slots__ = ("_utf8", "_buf", "_skip_lf", "_data", "_has_data", "_event", "_last_id", "retry", "_started",
                 "_clean")

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
        self._clean = False  # nothing pending: see feed

    def feed(self, chunk: bytes, t_ns: int) -> list[SSEEvent]:
        """Decode one read. Returns the events this read completed (possibly none), all stamped ``t_ns``."""
        if self._clean and chunk[-1:] == b"\n":
            # nothing pending and the read ends in a whole character: one-shot decoding gives what the incremental
            # decoder would (it holds no bytes); the BOM rule, a pending CR and a partial line do not apply
            buf = chunk.decode("utf-8", "replace")
            if "\r" not in buf:
                if buf.find("\n") == len(buf) - 2 and buf[:6] == "data: ":  # one one-line event: what servers send
                    return [SSEEvent(t_ns, buf[6:-2], "message", self._last_id)]
                if buf[-2:] == "\n\n":
                    return self._feed_clean(buf, t_ns)  # ends with an empty line: leaves nothing pending
        else:
            buf = self._text(chunk)
        out = self._feed_lf(buf, t_ns, []) if "\r" not in buf else self._feed_cr(buf, t_ns)
        # a read ending in LF leaves no partial line, no pending CR and no bytes in the UTF-8 decoder
        self._clean = chunk[-1:] == b"\n" and not (self._has_data or self._event)
        return out

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

    def _feed_cr(self, buf: str, t_ns: int) -> list[SSEEvent]:
        """The general line rules (LF, CR or CRLF line ends)."""
        out: list[SSEEvent] = []
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

    def _feed_clean(self, text: str, t_ns: int) -> list[SSEEvent]:
        """LF-only text that ends with an empty line, read with nothing pending. When every block (the text between
        empty lines) is one ``data: `` line, the events are those lines' values (what servers send); otherwise the
        LF-only rules of :meth:`_feed_lf` apply (the text ends with an empty line, so nothing is left pending)."""
        if text[:6] == "data: ":
            values = text[6:-2].split("\n\ndata: ")
            for v in values:
                if "\n" in v:  # a block of several lines, or empty lines between blocks
                    break
            else:
                last_id = self._last_id
                return [SSEEvent(t_ns, v, "message", last_id) for v in values]
        return self._feed_lf(text, t_ns, [])  # some block is not one data: line: the LF-only rules

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
