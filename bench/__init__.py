"""bench: a speed profiler for live OpenAI-compatible LLM endpoints.

Public API (the CLI is built on it): the streaming client, the per-request record and its metrics, the run loops
(run, gate, ab), the results document and its loader.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .client import ClientSettings, RequestSpec, discover_model, make_http_client, normalize_url, stream_request
from .errors import BenchError, ConfigError, EndpointUnreachable, ServerError
from .metrics import RequestMetrics, request_metrics
from .records import Event, RecordWriter, RequestRecord, read_records
from .results import CellResult, Results, load_results
from .runloop import run_ab, run_gate, run_profile

__all__ = [
    "BenchError",
    "CellResult",
    "ClientSettings",
    "ConfigError",
    "EndpointUnreachable",
    "Event",
    "RecordWriter",
    "RequestMetrics",
    "RequestRecord",
    "RequestSpec",
    "Results",
    "ServerError",
    "__version__",
    "discover_model",
    "load_results",
    "make_http_client",
    "normalize_url",
    "read_records",
    "request_metrics",
    "run_ab",
    "run_gate",
    "run_profile",
    "stream_request",
]
