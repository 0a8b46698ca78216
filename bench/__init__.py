"""bench: a speed profiler for live OpenAI-compatible LLM endpoints.

The face of the library (the CLI is built on it), loaded lazily: ``import bench`` costs nothing until a name is used.

* settings: :func:`load_profile` (a shipped profile by name, or a TOML file) -> :class:`Profile`;
  :class:`LoadSettings` for open-loop runs; :class:`ClientSettings` (timeouts, TLS, the API key's variable);
* runs (coroutines): :func:`run_profile` (closed-loop cells in waves), :func:`run_load` (one open-loop point:
  ``--rate``, ``--trace``, ``--sessions``), :func:`run_capacity` (the capacity search),
  :func:`run_gate` and :func:`run_ab`;
* one request: :func:`stream_request` -> :class:`RequestRecord` -> :func:`request_metrics`;
* documents: :func:`load_results` -> :class:`Results` (``results.json``, validated), :func:`load_capacity` ->
  :class:`Capacity`, :func:`load_gate` -> :class:`Gate`, :func:`read_records`.

Example (docs/architecture.md, run as a test)::

    import asyncio, bench
    profile = bench.load_profile("quick")
    results = asyncio.run(bench.run_profile("http://127.0.0.1:8000/v1", profile, bench.ClientSettings(),
                                            out_dir=None))
    print(results.cells[0].id, results.cells[0].decode_tok_s["median"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bench.version import __version__

if TYPE_CHECKING:
    from bench.client import (
        ClientSettings,
        RequestSpec,
        discover_model,
        make_http_client,
        normalize_url,
        stream_request,
    )
    from bench.config.load import LoadSettings
    from bench.config.profile import Cell, Profile, load_profile
    from bench.driver import run_ab, run_capacity, run_gate, run_load, run_profile
    from bench.errors import BenchError, ConfigError, EndpointUnreachable, ServerError
    from bench.measure.metrics import RequestMetrics, request_metrics
    from bench.records import Event, RecordWriter, RequestRecord, read_records
    from bench.results import Capacity, CellResult, Gate, Results, load_capacity, load_gate, load_results

_WHERE = {
    "BenchError": "bench.errors", "ConfigError": "bench.errors", "EndpointUnreachable": "bench.errors",
    "ServerError": "bench.errors",
    "Cell": "bench.config.profile", "Profile": "bench.config.profile", "load_profile": "bench.config.profile",
    "LoadSettings": "bench.config.load",
    "ClientSettings": "bench.client", "RequestSpec": "bench.client",
    "discover_model": "bench.client", "make_http_client": "bench.client",
    "normalize_url": "bench.client", "stream_request": "bench.client",
    "Event": "bench.records", "RecordWriter": "bench.records", "RequestRecord": "bench.records",
    "read_records": "bench.records",
    "RequestMetrics": "bench.measure.metrics", "request_metrics": "bench.measure.metrics",
    "CellResult": "bench.results", "Results": "bench.results", "load_results": "bench.results",
    "Capacity": "bench.results", "Gate": "bench.results", "load_capacity": "bench.results", "load_gate": "bench.results",
    "run_ab": "bench.driver", "run_gate": "bench.driver", "run_profile": "bench.driver",
    "run_load": "bench.driver", "run_capacity": "bench.driver",
}

__all__ = [
    "BenchError",
    "Capacity",
    "Cell",
    "CellResult",
    "ClientSettings",
    "ConfigError",
    "EndpointUnreachable",
    "Event",
    "Gate",
    "LoadSettings",
    "Profile",
    "RecordWriter",
    "RequestMetrics",
    "RequestRecord",
    "RequestSpec",
    "Results",
    "ServerError",
    "__version__",
    "discover_model",
    "load_capacity",
    "load_gate",
    "load_profile",
    "load_results",
    "make_http_client",
    "normalize_url",
    "read_records",
    "request_metrics",
    "run_ab",
    "run_capacity",
    "run_gate",
    "run_load",
    "run_profile",
    "stream_request",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used (PEP 562)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
