"""A source faster than any client: chat-completion streams of pre-rendered events, many per write.

    python benchmarks/blastserver.py --port 0      # prints "listening on http://127.0.0.1:PORT/v1"

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


async def _answer(writer: asyncio.StreamWriter, tokens: int) -> None:
    writer.write(HEAD + _chunk(_OBJ + '"delta":{"role":"assistant","content":""},"finish_reason":null}]}'))
    for start in range(0, tokens, BLOCK):
        now = time.perf_counter_ns()
        writer.write(b"".join(_event(i, now) for i in range(start, min(start + BLOCK, tokens))))
        await writer.drain()
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
    writer.write(_chunk(_OBJ + '"delta":{},"finish_reason":"length"}],"usage":' + json.dumps(usage) + "}")
                 + _chunk("[DONE]") + b"0\r\n\r\n")
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = json.loads(await reader.readexactly(length) or b"{}")
            await _answer(writer, int(body.get("max_tokens") or 16))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    a, _ = ap.parse_known_args(argv)  # the flags hotpath passes a sim (--decode-step-ms ...) mean nothing here
    try:
        asyncio.run(_main(a.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
