"""bench: a speed profiler for live OpenAI-compatible LLM endpoints.

Public API (the CLI is built on it): the streaming client, the per-request record and its metrics.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .client import ClientSettings, RequestSpec, discover_model, make_http_client, normalize_url, stream_request
from .errors import BenchError, ConfigError, EndpointUnreachable, ServerError
from .metrics import RequestMetrics, request_metrics
from .records import Event, RecordWriter, RequestRecord, read_records

__all__ = [
    "BenchError",
    "ClientSettings",
    "ConfigError",
    "EndpointUnreachable",
    "Event",
    "RecordWriter",
    "RequestMetrics",
    "RequestRecord",
    "RequestSpec",
    "ServerError",
    "__version__",
    "discover_model",
    "make_http_client",
    "normalize_url",
    "read_records",
    "request_metrics",
    "stream_request",
]
