"""Writes tests/cases/extra/*.json: bench's own stream cases, more of the kinds in shared/cases.

Run from the repo root: ``python tests/cases/make_extra.py``. The JSON files are committed; this script is how
they were made (deterministic).
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "extra"
W = [" the", " of", " and", " to", " in", " is", " that", " it", " was", " for"]
cases = []


def chat(delta, finish=None, extra=None):
    o = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if extra:
        o.update(extra)
    return o


def sse(o, nl="\n"):
    return "data: " + json.dumps(o) + nl + nl


def usage(p, c, **k):
    return {"usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, **k}}


def done(at):
    return {"at_ms": at, "data": "data: [DONE]\n\n"}


def case(id, about, events, expect, endpoint="chat", status=200, headers=None):
    cases.append(dict(id=id, about=about, endpoint=endpoint, status=status,
                      headers=headers or {"content-type": "text/event-stream"}, events=events, expect=expect))


# --- line endings and framing -------------------------------------------------------------------------------
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"content": w}), "\r")} for i, w in enumerate(W)]
ev += [{"at_ms": 210, "data": sse(chat({}, "stop", usage(3, 10)), "\r")}, {"at_ms": 211, "data": "data: [DONE]\r\r"}]
case("cr-line-endings", "every line ends in a lone CR (allowed by the SSE spec)", ev,
     {"ok": True, "ttft_ms": [75, 125], "output_tokens": 10, "chunks": 10})

ev = [{"at_ms": 100, "data": "data: " + json.dumps(chat({"content": " the"})) + "\r"}, {"at_ms": 140, "data": "\n\r\n"}]
ev += [{"at_ms": 150 + 10 * i, "data": sse(chat({"content": w}), "\r\n")} for i, w in enumerate(W[1:])]
ev += [{"at_ms": 250, "data": sse(chat({}, "stop", usage(3, 10)))}, done(251)]
case("crlf-split-across-writes", "a CRLF split between two writes: the event completes at the blank line 40 ms later",
     ev, {"ok": True, "ttft_ms": [115, 165], "output_tokens": 10})

o = json.dumps(chat({"content": " the"}), indent=1)
ev = [{"at_ms": 100, "data": "".join("data: " + line + "\n" for line in o.split("\n")) + "\n"}]
ev += [{"at_ms": 110 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[1:5])]
ev += [{"at_ms": 200, "data": sse(chat({}, "stop", usage(3, 5)))}, done(201)]
case("multiline-data", "the first event's JSON is spread over several data: lines (joined with LF by the spec)", ev,
     {"ok": True, "ttft_ms": [75, 125], "output_tokens": 5})

ev = [{"at_ms": 100, "data": "\ufeff" + sse(chat({"content": " hi"}))}]
ev += [{"at_ms": 110 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(["\u00e9t\u00e9", " \u65e5\u672c", " \u2603"])]
ev += [{"at_ms": 200, "data": sse(chat({}, "stop", usage(3, 4)))}, done(201)]
case("bom-and-unicode", "a UTF-8 byte-order mark opens the stream; tokens hold accented and CJK text", ev,
     {"ok": True, "ttft_ms": [75, 125], "output_tokens": 4, "chunks": 4})

ev = [{"at_ms": 50, "data": "event: ping\n\n"}, {"at_ms": 80, "data": ": ping\r\n\r\n"}, {"at_ms": 90, "data": "data:\n\n"}]
ev += [{"at_ms": 100 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[:5])]
ev += [{"at_ms": 160, "data": sse(chat({}, "stop", usage(3, 5)))}, done(161)]
case("pings-and-empty-data", "an event-only block, a CRLF comment and an empty data field before the first token", ev,
     {"ok": True, "ttft_ms": [75, 125], "output_tokens": 5})

# --- errors and broken streams ------------------------------------------------------------------------------
ev = [{"at_ms": 100, "data": sse(chat({"content": " the"}))},
      {"at_ms": 150, "data": "event: error\ndata: {\"message\": \"model overloaded\", \"code\": 503}\n\n"}]
case("sse-error-event", "one token, then an SSE 'event: error' and the stream ends", ev,
     {"ok": False, "error": "overloaded", "output_tokens": 1})
case("http-500-html", "HTTP 500 with an HTML error page",
     [{"at_ms": 5, "data": "<!DOCTYPE html><html><head><title>500 Internal Server Error</title></head>"
                            "<body><h1>Internal Server Error</h1></body></html>"}],
     {"ok": False, "error": "500 Internal Server Error", "ttft_ms": None}, status=500, headers={"content-type": "text/html"})
case("http-503-text", "HTTP 503 with a plain-text body from a proxy",
     [{"at_ms": 5, "data": "upstream connect error or disconnect/reset before headers"}],
     {"ok": False, "error": "503"}, status=503, headers={"content-type": "text/plain"})
case("http-400-json", "HTTP 400 with an OpenAI-style JSON error (an unsupported field)",
     [{"at_ms": 5, "data": json.dumps({"object": "error", "message": "min_tokens is not supported",
                                         "type": "BadRequestError", "code": 400})}],
     {"ok": False, "error": "min_tokens"}, status=400, headers={"content-type": "application/json"})
case("http-307-redirect", "HTTP 307 to another URL: httpx follows no redirect; a failed request that says so",
     [{"at_ms": 5, "data": ""}], {"ok": False, "error": "307"}, status=307,
     headers={"content-type": "text/plain", "location": "http://elsewhere/v1/chat/completions"})
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[:4])]
ev += [{"at_ms": 145, "data": 'data: {"id":"c","object":"chat.comp'}, {"at_ms": 160, "close": True}]
case("cut-mid-event", "four tokens, then the connection drops in the middle of an event", ev,
     {"ok": False, "output_tokens": 4, "output_tokens_estimated": True})
ev = [{"at_ms": 100, "data": sse(chat({"content": " the"}))},
      {"at_ms": 110, "data": "data: Internal error: CUDA out of memory\n\n"}, done(120)]
case("non-json-data", "a plain-text data line in the middle of a stream (a crashed worker's message)", ev,
     {"ok": False, "error": "not JSON"})

# --- what counts as a token -----------------------------------------------------------------------------------
ev = [{"at_ms": 10, "data": sse(chat({"role": "assistant", "content": None}))},
      {"at_ms": 200, "data": sse(chat({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                       "function": {"name": "get_weather", "arguments": ""}}]}))}]
for i, a in enumerate(['{"', 'city', '":"', 'Paris', '"}']):
    ev.append({"at_ms": 220 + 20 * i, "data": sse(chat({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}))})
ev += [{"at_ms": 330, "data": sse(chat({}, "tool_calls", usage(40, 6)))}, done(331)]
case("tool-call-arguments", "a tool call: the name at 200 ms, then arguments streamed; no content at all", ev,
     {"ok": True, "ttft_ms": [175, 225], "ttfc_ms": None, "output_tokens": 6, "chunks": 6})
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[:5])]
ev += [{"at_ms": 160, "data": sse(chat({}, "stop", usage(3, 5)))}]
case("finish-without-done", "a finish_reason and usage, then a clean end with no [DONE] (some servers never send it)",
     ev, {"ok": True, "output_tokens": 5})
body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how are you?"},
                     "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}
case("ignores-stream-flag", "the server ignores stream:true and answers with one JSON body after 300 ms",
     [{"at_ms": 300, "data": json.dumps(body)}],
     {"ok": True, "ttft_ms": [275, 325], "output_tokens": 7, "chunks": 1, "decode_tok_s": None},
     headers={"content-type": "application/json"})
r = random.Random(1)
ev, t, n = [], 100, 0
for _i in range(50):
    k = r.choice([1, 2, 3, 4])
    n += k
    ev.append({"at_ms": t, "data": sse(chat({"content": "".join(r.choice(W) for _ in range(k))}))})
    t += 10
ev += [{"at_ms": t, "data": sse(chat({}, "length"))}, done(t + 1)]
case("spec-decode-varying-no-usage",
     f"speculative decoding with 1-4 tokens per event ({n} in all) and no usage: estimate from the text, not the events",
     ev, {"ok": True, "output_tokens": n, "output_tokens_estimated": True, "chunks": 50, "ttft_ms": [75, 125]})
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W)]
ev += [{"at_ms": 200, "data": sse(chat({}, "length", {"timings": {"cache_n": 0, "prompt_n": 500, "prompt_ms": 80.0,
                                                                "predicted_n": 10, "predicted_ms": 90.0}}))}, done(201)]
case("llamacpp-timings-no-usage", "llama.cpp timings but no usage object: counts come from timings, not estimates", ev,
     {"ok": True, "output_tokens": 10, "output_tokens_estimated": False, "prompt_tokens": 500,
      "prefill_tok_s": [6249, 6251]})
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"reasoning_content": w}))} for i, w in enumerate(W)]
ev += [{"at_ms": 300 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[:5])]
ev += [{"at_ms": 400, "data": sse(chat({}, "stop", usage(3, 15)))}, done(401)]
case("reasoning-no-details", "10 reasoning_content tokens then 5 content tokens; usage has no completion_tokens_details",
     ev, {"ok": True, "ttft_ms": [75, 125], "ttfc_ms": [275, 325], "output_tokens": 15, "reasoning_tokens": 10,
          "reasoning_tokens_estimated": True})
ev = [{"at_ms": 100 + 10 * i, "data": sse(chat({"reasoning_content": w, "reasoning": w}))} for i, w in enumerate(W)]
ev += [{"at_ms": 300 + 10 * i, "data": sse(chat({"content": w}))} for i, w in enumerate(W[:5])]
ev += [{"at_ms": 400, "data": sse(chat({}, "stop"))}, done(401)]
case("reasoning-both-keys", "the same reasoning text under reasoning_content and reasoning (some vLLM versions), "
     "then 5 content tokens, no usage: each reasoning token counted once", ev,
     {"ok": True, "ttft_ms": [75, 125], "ttfc_ms": [275, 325], "output_tokens": 15, "output_tokens_estimated": True,
      "reasoning_tokens": 10, "reasoning_tokens_estimated": True})

if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for c in cases:
        (OUT / f"{c['id']}.json").write_text(json.dumps(c, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")
