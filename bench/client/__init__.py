"""One OpenAI request -> one :class:`bench.records.RequestRecord`: the streaming client.

Modules: :mod:`bench.client.endpoint` (URLs, settings, the httpx client, model discovery, error text),
:mod:`bench.client.request` (send, read the stream with arrival stamps, record failures as data),
:mod:`bench.client.events` (chunk parsing after the stream ends), :mod:`bench.client.turns` (bursts of work spread
over event-loop iterations), :mod:`bench.client.images` (images as data URLs for chat requests).
"""

from bench.client.endpoint import (
                                   KEY_REFUSED,
                                   ClientSettings,
                                   RequestSpec,
                                   StreamTap,
                                   discover_model,
                                   error_from_body,
                                   exc_line,
                                   make_http_client,
                                   normalize_url,
                                   release_idle,
                                   root_url,
)
from bench.client.images import ImageSet, body_images, image_rejection
from bench.client.request import DONE_GRACE_S, require_ok, stream_request

__all__ = [
    "DONE_GRACE_S",
    "KEY_REFUSED",
    "ClientSettings",
    "RequestSpec",
    "StreamTap",
    "ImageSet",
    "body_images",
    "image_rejection",
    "discover_model",
    "error_from_body",
    "exc_line",
    "make_http_client",
    "normalize_url",
    "release_idle",
    "require_ok",
    "root_url",
    "stream_request",
]
