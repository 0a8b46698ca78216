"""bench.sim: a reference OpenAI-compatible serving engine whose timing is known exactly.

It is the oracle bench's accuracy tests measure against; it imports nothing from the rest of bench.
See docs/sim.md for the parameters, the timing model and the truth formulas.

Public API::

    SimConfig                     frozen dataclass of every parameter (units in docs/sim.md)
    load_config(path) -> SimConfig
    create_app(cfg) -> aiohttp.web.Application
    serve(cfg)                    blocking; prints "listening on http://HOST:PORT/v1"
    running_sim(cfg) -> context manager yielding "http://127.0.0.1:PORT/v1"
    expected_* / step_ms / ...    the truth (pure functions, bench.sim.truth)
    tokenize(text) -> list[int]   the sim's tokenizer
"""

from bench.sim.config import SimConfig, load_config
from bench.sim.runner import running_sim, serve
from bench.sim.server import create_app
from bench.sim.text import count_tokens, tokenize
from bench.sim.truth import (
    calls_tool,
    expected_cached_tokens,
    expected_decode_tok_s,
    expected_e2e_ms,
    expected_encode_ms,
    expected_error_count,
    expected_events,
    expected_itl_ms,
    expected_prefill_ms,
    expected_ttft_ms,
    mean_tokens_per_event,
    output_length,
    prefill_rate_tok_s,
    step_ms,
)

__all__ = [
    "SimConfig",
    "load_config",
    "create_app",
    "serve",
    "running_sim",
    "tokenize",
    "count_tokens",
    "step_ms",
    "prefill_rate_tok_s",
    "expected_prefill_ms",
    "expected_itl_ms",
    "expected_decode_tok_s",
    "mean_tokens_per_event",
    "expected_events",
    "expected_ttft_ms",
    "expected_e2e_ms",
    "expected_cached_tokens",
    "expected_error_count",
    "output_length",
    "expected_encode_ms",
    "calls_tool",
]
