"""The border: where what a server sends enters bench, redacted of the API key before anything reads it.

A hostile or careless server can echo the request's ``Authorization`` value anywhere: a model id or owner, a
``/props`` build string, a ``/metrics`` label, an error body, the streamed text. Everything bench reads from a
server crosses one of two borders, and each redacts it (:mod:`bench.redaction`: the key verbatim, in any letter
case, split by whitespace, JSON-escaped or cut off) before any code parses, transforms, stores or prints it:

* **read whole** (every call but the generation stream: ``/v1/models``, ``/props``, ``/version``, ``/slots``,
  ``/get_model_info``, ``/get_server_info``, ``/metrics``, ``/tokenize``, their error bodies): bench's httpx
  client (:func:`bench.client.make_http_client`) passes each such response through :func:`admit_response` the
  moment it is read: its body and header values are redacted in place, so ``r.json()``, ``r.text`` and
  ``r.content`` only ever see the redacted body (a lower-cased ``owned_by`` never becomes a leaked
  ``backend``);
* **streamed** (the generation stream, read piece by piece with arrival stamps): a key may be split over reads,
  so the stream is redacted as a whole when the client finishes its record (:meth:`bench.records.RequestRecord.
  redact`: content, model, usage, timings, error; each masked character keeps the text's length). Response
  headers are redacted on arrival (:func:`admit_headers`). The raw reads ``bench check`` and ``bench record``
  keep are redacted with the case or report they end up in (:func:`admit`).

With no key registered (the common case: a local server) every function here returns its input unchanged.
"""

from __future__ import annotations

from typing import Any

import httpx

from bench.redaction import find_spans, redact, redact_obj, secrets

__all__ = ["admit", "admit_body", "admit_headers", "admit_response"]


def admit(obj: Any) -> Any:
    """A JSON-like value from a server (or built from one), every string in it redacted, keys included."""
    return redact_obj(obj)


def admit_body(body: bytes) -> bytes:
    """A response body, redacted: decoded as UTF-8 (undecodable bytes kept as they are) only when it holds a key."""
    if not secrets() or not body:
        return body
    text = body.decode("utf-8", "surrogateescape")
    if not find_spans(text):
        return body
    return redact(text).encode("utf-8", "surrogateescape")


def admit_headers(headers: httpx.Headers) -> httpx.Headers:
    """Response headers with every value redacted (the same object when none held a key)."""
    if not secrets():
        return headers
    items = headers.multi_items()
    clean = [(k, redact(v)) for k, v in items]
    return headers if clean == items else httpx.Headers(clean)


def admit_response(response: httpx.Response, streamed: bool) -> httpx.Response:
    """``response`` with its headers redacted and, when it was read whole (``streamed`` False), its body too."""
    if not secrets():
        return response
    response.headers = admit_headers(response.headers)
    if not streamed:
        body = response.content
        clean = admit_body(body)
        if clean is not body:
            response._content = clean  # what .content, .text and .json() read (httpx caches the decoded body here)
    return response
