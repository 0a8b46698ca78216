"""A source faster than any client: chat-completion streams of pre-rendered events, many per write.

    python benchmarks/blastserver.py --port 0      # prints "listening on http://127.0.0.1:PORT/v1"
    python benchmarks/blastserver.py --port 8000 --reuse-port   # several processes on one port

Also the cheap server of ``benchmarks/schedule_accuracy.py --server blast``: a short answer (``max_tokens`` 1) is
one write, so a request costs this process a few tens of microseconds and the client's send lag is measured with
the server side nearly free. It answers ``GET .../models`` (a client's model probe) and 404 to anything else but
``POST .../completions``.

For ``benchmarks/hotpath.py --source blast``: ``bench sim`` writes every event on its own, from Python, after
building it, so a few sim processes cannot write faster than one bench client reads (on the H200 machine 14 of
them wrote ~77,000 events/s in all). This server sends the same bytes a sim stream would (a role chunk, one
content chunk per token with the sim's ``sim`` stamps, a final chunk with ``finish_reason`` and ``usage``,
``data: [DONE]``; chunked transfer encoding, keep-alive), rendered ahead in blocks of :data:`BLOCK` events and
written one block per write, so one process writes several hundred thousand events a second and the client is the
slower side. The stamps in it are the block's render time: it measures the client's speed, not its stamps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

BLOCK = 64  # events per write
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_OBJ = '{"id":"chatcmpl-blast","object":"chat.completion.chunk","created":1,"model":"bench-sim","choices":[{"index":0,'


def _chunk(data: str) -> bytes:
    b = f"data: {data}\n\n".encode()
    return b"%x\r\n%b\r\n" % (len(b), b)


def _event(i: int, now: int) -> bytes:
    return _chunk(f'{_OBJ}"delta":{{"content":" w{i % 997}"}},"finish_reason":null}}],'
                  f'"sim":{{"sched_ns":{now},"write_ns":{now},"tokens":1}}}}')


ROLE = _chunk(_OBJ + '"delta":{"role":"assistant","content":""},"finish_reason":null}]}')


def _blocks(tokens: int) -> list[bytes]:
    """The response in writes: the head and role chunk with the first block, the end with the last (a short
    answer is one write)."""
    out, parts = HEAD + ROLE, []
    for start in range(0, tokens, BLOCK):
        now = time.perf_counter_ns()
        out += b"".join(_event(i, now) for i in range(start, min(start + BLOCK, tokens)))
        if start + BLOCK < tokens:
            parts.append(out)
            out = b""
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
    parts.append(out + _chunk(_OBJ + '"delta":{},"finish_reason":"length"}],"usage":' + json.dumps(usage) + "}")
                 + _chunk("[DONE]") + b"0\r\n\r\n")
    return parts


def _json(status: bytes, doc: object) -> bytes:
    body = json.dumps(doc).encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
            % (len(body), body))


MODELS = _json(b"200 OK", {"object": "list", "data": [{"id": "bench-sim", "object": "model", "owned_by": "blast"}]})
NOT_FOUND = _json(b"404 Not Found", {"error": {"message": "not served by blastserver", "type": "not_found"}})


def _request(buf: bytes) -> tuple[int, bytes, bytes] | None:
    """(bytes used, request head, body) of the first whole request in ``buf``, or None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head, length = buf[:end], 0
    i = head.lower().find(b"content-length:")
    if i >= 0:
        length = int(head[i + 15:].split(b"\r\n", 1)[0])
    if len(buf) < end + 4 + length:
        return None
    return end + 4 + length, head, buf[end + 4:end + 4 + length]


class _Conn(asyncio.Protocol):
    """One connection: requests answered in order as they arrive; a long answer's blocks wait for the transport's
    flow control (``pause_writing``) in a task, a short one goes out at once."""

    def __init__(self) -> None:
        self.buf, self.busy, self.paused = b"", False, False
        self.resume: asyncio.Future[None] | None = None
        self.tr: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._serve()

    def _serve(self) -> None:
        while not self.busy and self.tr is not None and (req := _request(self.buf)) is not None:
            used, head, body = req
            self.buf = self.buf[used:]
            target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if head.startswith(b"GET ") and target.endswith(b"/models"):
                self.tr.write(MODELS)  # what a client asks before a run (bench's model probe)
            elif not head.startswith(b"POST ") or not target.endswith(b"/completions"):
                self.tr.write(NOT_FOUND)
            else:
                parts = _blocks(int(json.loads(body or b"{}").get("max_tokens") or 16))
                if len(parts) == 1:
                    self.tr.write(parts[0])
                else:
                    self.busy = True
                    asyncio.get_running_loop().create_task(self._long(parts))

    async def _long(self, parts: list[bytes]) -> None:
        for part in parts:
            if self.tr is None:
                return
            self.tr.write(part)
            while self.paused:
                self.resume = asyncio.get_running_loop().create_future()
                await self.resume
        self.busy = False
        self._serve()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.resume is not None and not self.resume.done():
            self.resume.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.tr = None
        self.resume_writing()


async def _main(port: int, reuse_port: bool) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Conn, "127.0.0.1", port, backlog=4096, reuse_port=reuse_port or None)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT: several processes on one port")
    a, _ = ap.parse_known_args(argv)  # the flags hotpath passes a sim (--decode-step-ms ...) mean nothing here
    try:
        asyncio.run(_main(a.port, a.reuse_port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
