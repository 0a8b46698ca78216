"""aiohttp application of the sim: the OpenAI-compatible HTTP surface over the Engine."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from time import perf_counter_ns
from typing import Any, NamedTuple

from aiohttp import web

from bench.sim.config import SimConfig
from bench.sim.engine import Engine, Histogram, Seq
from bench.sim.text import chat_prompt, chat_prompt_tokens, output_words, tokenize
from bench.sim.truth import calls_tool, fails

__all__ = ["create_app", "ENGINE_KEY"]

ENGINE_KEY: web.AppKey[Engine] = web.AppKey("bench_sim_engine", Engine)
_TASK_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("bench_sim_task", asyncio.Task)

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_DONE = "data: [DONE]\n\n"
# what llama-server without a multimodal projector answers to an image part (HTTP 500)
NO_IMAGES_MESSAGE = "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
class _BadRequest(Exception):
    pass


def _error_response(status: int, message: str, etype: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": param, "code": status}}
    return web.json_response(body, status=status, dumps=_dumps)


def _nodelay(request: web.Request) -> None:
    tr = request.transport
    sock = tr.get_extra_info("socket") if tr is not None else None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def _get_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise _BadRequest(f"'{key}' must be an integer")
    return v


def _completion_prompt_ids(prompt: Any) -> list[int]:
    """/v1/completions ``prompt``: a string, a list of token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise _BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")


class _Gen(NamedTuple):
    """A generation request as parsed: prompt ids, images in it, output length asked, streaming, usage asked,
    and the tool it could call (None: it offers none, or ``tool_choice`` is ``"none"``)."""

    ids: list[int]
    images: int
    max_tokens: int
    stream: bool
    include_usage: bool
    tool: str | None
    thinks: bool  # chat, and thinking not switched off (chat_template_kwargs.enable_thinking false)


def _offered_tool(body: dict[str, Any]) -> str | None:
    """The name of the tool a request could call: the one ``tool_choice`` names, else the first of ``tools``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str) and name:
            return name
    first = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) and name else "tool"


def _parse_generate(cfg: SimConfig, body: dict[str, Any], chat: bool) -> _Gen:
    """The generation request in ``body``; raises _BadRequest."""
    images = 0
    if chat:
        ids, images = chat_prompt(body.get("messages"), cfg.image_tokens)
    else:
        if "prompt" not in body:
            raise _BadRequest("'prompt' is required")
        ids = _completion_prompt_ids(body["prompt"])
    mt = _get_int(body, "max_completion_tokens")
    if mt is None:
        mt = _get_int(body, "max_tokens")
    max_tokens = cfg.default_max_tokens if mt is None else mt
    if max_tokens < 1:
        raise _BadRequest("'max_tokens' must be >= 1")
    n = _get_int(body, "n")
    if n not in (None, 1):
        raise _BadRequest("bench sim supports only n = 1")
    if len(ids) + max_tokens > cfg.max_model_len:
        raise _BadRequest(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len ({cfg.max_model_len})"
        )
    stream = bool(body.get("stream"))
    so = body.get("stream_options")
    include_usage = stream and isinstance(so, dict) and bool(so.get("include_usage"))
    kwargs = body.get("chat_template_kwargs")
    off = isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False
    return _Gen(ids, images, max_tokens, stream, include_usage, _offered_tool(body) if chat else None,
                chat and not off)


def _reasoning_keys(cfg: SimConfig) -> tuple[str, ...]:
    return ("reasoning_content", "reasoning") if cfg.reasoning_field == "both" else (cfg.reasoning_field,)


def _tool_fragment(seq: Seq, first: bool, text: str) -> dict[str, Any]:
    """One streamed ``delta.tool_calls`` entry: the first carries the call's id and the function's name."""
    if first:
        return {"index": 0, "id": f"call_{seq.no:08x}", "type": "function",
                "function": {"name": seq.tool_name, "arguments": text}}
    return {"index": 0, "function": {"arguments": text}}


def _delta(seq: Seq, start: int, ntok: int, rkeys: tuple[str, ...]) -> str:
    """The ``delta`` of one chat event carrying output tokens ``start .. start+ntok-1``: reasoning (under each of
    ``rkeys``) while in the reasoning phase, then content, or tool-call argument fragments for a tool call."""
    no, r_end = seq.no, seq.reasoning_tokens
    nr = max(0, min(r_end, start + ntok) - start)
    parts = []
    if nr:
        text = _dumps(output_words(no, start, nr))
        parts += [f'"{k}":{text}' for k in rkeys]
    if ntok > nr:
        words = output_words(no, start + nr, ntok - nr)
        if seq.tool_name is not None:
            parts.append('"tool_calls":' + _dumps([_tool_fragment(seq, start + nr == r_end, words)]))
        else:
            parts.append('"content":' + _dumps(words))
    return '"delta":{' + ",".join(parts) + "}"


def _usage(seq: Seq) -> dict[str, Any]:
    return {
        "prompt_tokens": seq.prompt_tokens,
        "completion_tokens": seq.emitted,
        "total_tokens": seq.prompt_tokens + seq.emitted,
        "prompt_tokens_details": {"cached_tokens": seq.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": min(seq.reasoning_tokens, seq.emitted)},
    }


# ------------------------------------------------------------------------------------------------
# the streaming sink: formats and writes one sequence's SSE events (called from the step loop)
# ------------------------------------------------------------------------------------------------
class StreamSink:
    """Writes SSE events straight to the connection's transport (one ``transport.write`` per event, framed as
    an HTTP/1.1 chunk when the response is chunked): the step loop never awaits a slow client. The last write
    (the one ending in ``[DONE]``) carries the chunked body's terminator too (``ended``): written by the handler
    after it, the terminator came one loop pass later, in a send of its own, and a client waiting for it to reuse
    the connection waited that long (one opening a new connection when it waited too long)."""

    __slots__ = ("writer", "transport", "chunked", "chat", "head", "obj_head", "include_usage", "every_chunk",
                 "rkeys", "ended", "late_ns")

    def __init__(self, writer: Any, transport: Any, chat: bool, rid: str, created: int, model: str,
                 include_usage: bool, usage_mode: str = "final",
                 rkeys: tuple[str, ...] = ("reasoning_content",), late_ms: float = 0.0) -> None:
        self.rkeys = rkeys
        self.late_ns = int(late_ms * 1e6)  # SimConfig.late_write_ms: 0 = no check
        self.writer = writer
        self.transport = transport
        self.chunked = bool(getattr(writer, "chunked", False))
        self.chat = chat
        self.include_usage = include_usage and usage_mode != "never"
        self.every_chunk = usage_mode == "every_chunk"
        obj = "chat.completion.chunk" if chat else "text_completion"
        # everything before the per-event part of a chunk
        self.obj_head = (
            f'{{"id":{_dumps(rid)},"object":"{obj}","created":{created},"model":{_dumps(model)},"choices":'
        )
        self.head = self.obj_head + '[{"index":0,'
        self.ended = False  # the terminator of the chunked body went out with the last event

    async def write(self, text: str, last: bool = False) -> bool:
        """One write; ``last``: the body's last (a chunked body's terminator follows in the same write)."""
        tr = self.transport
        if tr is None or tr.is_closing():
            return False
        data = text.encode("utf-8")
        try:
            if self.chunked:
                tr.write(b"%x\r\n%b\r\n%b" % (len(data), data, b"0\r\n\r\n" if last else b""))
                self.ended = last
            else:
                tr.write(data)
        except (ConnectionError, RuntimeError):
            return False
        return True

    def role_chunk(self, admitted_ns: int) -> str:
        """The role-only first chunk; its ``sim`` stamps say when the request arrived: body read, parsed
        and tokenized (``sched_ns``), so a client can split its TTFT into upload + parsing and the engine's part."""
        stamps = f'"sim":{{"sched_ns":{admitted_ns},"write_ns":{perf_counter_ns()},"tokens":0}}'
        return f'data: {self.head}"delta":{{"role":"assistant","content":""}},"finish_reason":null}}],{stamps}}}\n\n'

    async def event(self, seq: Seq, sched_ns: int, start: int, ntok: int, final: bool) -> bool:
        no = seq.no
        if self.chat:
            choice = _delta(seq, start, ntok, self.rkeys) + ',"finish_reason":null}]'
        else:
            choice = '"text":' + _dumps(output_words(no, start, ntok)) + ',"logprobs":null,"finish_reason":null}]'
        tail = self._final(seq) if final else ""
        usage = ',"usage":' + _dumps(_usage(seq)) if self.every_chunk else ""
        write_ns = perf_counter_ns()
        data = (
            f'data: {self.head}{choice}{usage},"sim":{{"sched_ns":{sched_ns},"write_ns":{write_ns},"tokens":{ntok}}}}}\n\n'
            f"{tail}"
        )
        if seq.first_write_ns is None:
            seq.first_write_ns = write_ns
        ok = await self.write(data, last=final)
        if self.late_ns and (gap := perf_counter_ns() - write_ns) >= self.late_ns:
            print(f"late-write {write_ns} {gap}", file=sys.stderr, flush=True)  # the sim's stall, not the client's
        return ok

    def _final(self, seq: Seq) -> str:
        truth = _dumps(seq.truth())
        if self.chat:
            choice = f'"delta":{{}},"finish_reason":"{seq.finish_reason}"}}]'
        else:
            choice = f'"text":"","logprobs":null,"finish_reason":"{seq.finish_reason}"}}]'
        out = f'data: {self.head}{choice},"sim_request":{truth}}}\n\n'
        if self.include_usage:
            out += f'data: {self.obj_head}[],"usage":{_dumps(_usage(seq))}}}\n\n'
        return out + _DONE

    async def error(self, seq: Seq, sched_ns: int) -> bool:
        err = {"error": {"message": f"bench sim: simulated error in stream (request {seq.no})",
                         "type": "server_error", "code": 500}}
        return await self.write(f"data: {_dumps(err)}\n\n{_DONE}", last=True)


async def _end_stream(resp: web.StreamResponse, sink: StreamSink) -> None:
    """End the response; where the sink's last write carried the terminator, aiohttp writes nothing more."""
    if sink.ended:
        sink.writer.chunked = False
    try:
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass


# ------------------------------------------------------------------------------------------------
# handlers
# ------------------------------------------------------------------------------------------------
class _Handlers:
    def __init__(self, cfg: SimConfig, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{
                "id": self.cfg.model,
                "object": "model",
                "created": self.created,
                "owned_by": "bench-sim",
                "root": self.cfg.model,
                "parent": None,
                "max_model_len": self.cfg.max_model_len,
            }],
        })

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error_response(400, "body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error_response(400, "body must be a JSON object", "invalid_request_error")
        try:
            if isinstance(body.get("content"), str):
                ids = tokenize(body["content"])
            elif isinstance(body.get("prompt"), str):
                ids = tokenize(body["prompt"])
            elif "messages" in body:
                ids = chat_prompt_tokens(body["messages"], self.cfg.image_tokens)
            else:
                raise _BadRequest("give 'content' or 'prompt' (a string) or 'messages'")
        except (_BadRequest, ValueError) as e:
            return _error_response(400, str(e), "invalid_request_error")
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.cfg.max_model_len})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=_prometheus(self.cfg, self.engine).encode("utf-8"),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        cfg, engine = self.cfg, self.engine
        try:
            body = await request.json()
        except ValueError:
            return _error_response(400, "body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error_response(400, "body must be a JSON object", "invalid_request_error")
        try:
            gen = _parse_generate(cfg, body, chat)
        except (_BadRequest, ValueError) as e:
            return _error_response(400, str(e), "invalid_request_error")
        if gen.images and not cfg.images:
            return _error_response(500, NO_IMAGES_MESSAGE, "server_error")
        ids, max_tokens, stream, include_usage = gen.ids, gen.max_tokens, gen.stream, gen.include_usage

        no = engine.next_request_no()
        failing = fails(cfg, no)
        if failing and cfg.error_kind != "stream":
            engine.stats.errors[cfg.error_kind] = engine.stats.errors.get(cfg.error_kind, 0) + 1
            if cfg.error_kind == "429":
                return _error_response(429, f"bench sim: simulated rate limit (request {no})", "rate_limit_error")
            return _error_response(503, f"bench sim: simulated overload (request {no})", "service_unavailable")

        tool = gen.tool if gen.tool is not None and calls_tool(cfg, no) else None
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{no:08x}"
        created = int(time.time())
        _nodelay(request)

        if not stream:
            seq = Seq(cfg, no, ids, max_tokens, reasoning=gen.thinks, stream_error=failing, sink=None, images=gen.images,
                      tool_name=tool)
            engine.submit(seq, perf_counter_ns())
            await self._await_done(seq)
            if seq.state == "error":
                return _error_response(500, f"bench sim: simulated error (request {no})", "server_error")
            if seq.state != "finished":
                return _error_response(503, "bench sim: request aborted (server shutting down)", "service_unavailable")
            return web.json_response(self._whole(seq, rid, created, chat), dumps=_dumps)

        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
        })
        writer = await resp.prepare(request)
        sink = StreamSink(writer, request.transport, chat, rid, created, cfg.model, include_usage, cfg.usage_mode,
                          _reasoning_keys(cfg), cfg.late_write_ms)
        seq = Seq(cfg, no, ids, max_tokens, reasoning=gen.thinks, stream_error=failing, sink=sink, images=gen.images,
                  tool_name=tool)
        arrival = perf_counter_ns()
        if chat and not await sink.write(sink.role_chunk(arrival)):
            return resp
        engine.submit(seq, arrival)
        await self._await_done(seq)
        await _end_stream(resp, sink)
        return resp

    async def _await_done(self, seq: Seq) -> None:
        try:
            await asyncio.shield(seq.done)
        except asyncio.CancelledError:
            self.engine.abort(seq)
            raise

    def _whole(self, seq: Seq, rid: str, created: int, chat: bool) -> dict[str, Any]:
        r = seq.reasoning_tokens
        if chat:
            answer = output_words(seq.no, r, seq.emitted - r)
            msg: dict[str, Any] = {"role": "assistant", "content": answer}
            if seq.tool_name is not None:
                msg["content"] = None
                msg["tool_calls"] = [{"id": f"call_{seq.no:08x}", "type": "function",
                                      "function": {"name": seq.tool_name, "arguments": answer}}]
            if r:
                for key in _reasoning_keys(self.cfg):
                    msg[key] = output_words(seq.no, 0, r)
            choice: dict[str, Any] = {"index": 0, "message": msg, "logprobs": None,
                                      "finish_reason": seq.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": output_words(seq.no, 0, seq.emitted), "logprobs": None,
                      "finish_reason": seq.finish_reason}
            obj = "text_completion"
        out = {"id": rid, "object": obj, "created": created, "model": self.cfg.model, "choices": [choice],
               "usage": _usage(seq), "sim_request": seq.truth()}
        if self.cfg.usage_mode == "never":
            del out["usage"]
        return out


# ------------------------------------------------------------------------------------------------
# /metrics
# ------------------------------------------------------------------------------------------------
def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _kv_tokens(engine: Engine) -> int:
    """Prompt plus emitted tokens of every admitted (prefilling or decoding) request: the KV cache they hold."""
    return sum(s.prompt_tokens + s.emitted for _, _, s in engine.prefilling) + sum(
        s.prompt_tokens + s.emitted for s in engine.decoding)


def _prometheus(cfg: SimConfig, engine: Engine) -> str:
    st = engine.stats
    m = f'model_name="{_label(cfg.model)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{{{labels}}} {float(value)!r}")

    def hist(name: str, help: str, h: Histogram) -> None:
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} histogram")
        for le, c in h.cumulative():
            lines.append(f'{name}_bucket{{{m},le="{le}"}} {float(c)!r}')
        lines.append(f"{name}_sum{{{m}}} {float(h.sum)!r}")
        lines.append(f"{name}_count{{{m}}} {float(h.count)!r}")

    metric("vllm:num_requests_running", "gauge", "Requests admitted (prefilling or decoding).",
           [(m, engine.num_running)])
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting in the FIFO queue.", [(m, engine.num_waiting)])
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache use, 0..1: held tokens / kv_cache_tokens.",
           [(m, min(1.0, _kv_tokens(engine) / cfg.kv_cache_tokens))])
    metric("vllm:prompt_tokens_total", "counter", "Prompt tokens processed (counted when prefill ends).",
           [(m, st.prompt_tokens)])
    metric("vllm:generation_tokens_total", "counter", "Output tokens emitted.", [(m, st.generation_tokens)])
    metric("vllm:request_success_total", "counter", "Finished requests by finish reason.",
           [(f'{m},finished_reason="{r}"', c) for r, c in st.success.items()])
    metric("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           [(m, st.prefix_queries)])
    metric("vllm:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
           [(m, st.prefix_hits)])
    hist("vllm:time_to_first_token_seconds", "Arrival to first token event write (server clock).", st.ttft)
    hist("vllm:inter_token_latency_seconds", "Scheduled gap between consecutive events of a request.", st.itl)
    hist("vllm:e2e_request_latency_seconds", "Arrival to last event write (server clock).", st.e2e)
    hist("vllm:request_queue_time_seconds", "Arrival to admission.", st.queue)
    metric("bench_sim:request_errors_total", "counter", "Simulated errors by kind.",
           [(f'{m},kind="{k}"', c) for k, c in sorted(st.errors.items())] or [(f'{m},kind="none"', 0)])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# the app
# ------------------------------------------------------------------------------------------------
def create_app(cfg: SimConfig) -> web.Application:
    """The sim as an aiohttp Application. Its step loop starts with the app and stops on shutdown."""
    app = web.Application(client_max_size=256 * 1024 * 1024)
    engine = Engine(cfg)
    h = _Handlers(cfg, engine)
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/chat/completions", h.chat)
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_get("/v1/models", h.models)
    app.router.add_post("/tokenize", h.tokenize)
    app.router.add_get("/health", h.health)
    app.router.add_get("/metrics", h.metrics)

    async def start(app: web.Application) -> None:
        app[_TASK_KEY] = asyncio.get_running_loop().create_task(engine.run(), name="bench-sim-step-loop")

    async def shutdown(app: web.Application) -> None:
        engine.close()

    async def cleanup(app: web.Application) -> None:
        task = app.get(_TASK_KEY)
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    app.on_startup.append(start)
    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(cleanup)
    return app
