"""Which Prometheus series of each serving engine mean what to bench (the one table; docs/server-metrics.md).

Each backend maps bench's names to the series that carry them. A series is named as the text exposition writes
it minus a final ``_total`` (the parser of ``prometheus_client`` adds or drops that suffix by the family's type, so
bench compares names without it). Several series under one bench name are alternatives, newest spelling first:
the first one present on the page is used (vLLM renamed ``gpu_cache_usage_perc`` to ``kv_cache_usage_perc``, for
example). ``*_created`` series are never read.

Kinds:

* ``counter``: a monotonically rising count; bench takes its delta over a cell (summed over every label set:
  vLLM's ``engine`` and ``finished_reason``, SGLang's ``is_streaming`` and ``cache_source``, data-parallel ranks).
* ``gauge``: a level sampled at each scrape; ``agg`` says how label sets combine at one scrape (``sum`` for request
  counts over engines, ``max`` for a usage fraction: the fullest engine is the one that queues).
* ``histogram``: the base name of ``_bucket``/``_sum``/``_count`` series; bench takes bucket deltas over the cell.
* ``hist_sum`` / ``hist_count``: a counter read from a histogram's ``_sum`` / ``_count`` (TGI counts tokens only
  as histograms of per-request lengths).

``scale`` turns the series' unit into bench's: fractions (0..1) become percent, seconds stay seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Series", "BACKENDS", "PREFIXES", "COUNTER_KEYS", "GAUGE_KEYS", "HISTOGRAM_KEYS", "backend_of_names",
           "QUERIES_ARE_PROMPT_PLUS_HITS"]


@dataclass(frozen=True, slots=True)
class Series:
    """One server series that carries one bench quantity.

    Attributes:
        name: series name without a final ``_total`` (for histograms: the base name).
        kind: ``counter``, ``gauge``, ``histogram``, ``hist_sum`` or ``hist_count``.
        scale: multiplier from the server's unit to bench's.
        agg: gauges only: how label sets combine at one scrape, ``sum`` or ``max``.
    """

    name: str
    kind: str
    scale: float = 1.0
    agg: str = "sum"


def _c(name: str) -> Series:
    return Series(name, "counter")


def _g(name: str, scale: float = 1.0, agg: str = "sum") -> Series:
    return Series(name, "gauge", scale, agg)


def _h(name: str) -> Series:
    return Series(name, "histogram")


# bench's names, by kind
COUNTER_KEYS = ("prompt_tokens", "generation_tokens", "requests", "preemptions", "prefix_cache_hits",
                "prefix_cache_queries", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
GAUGE_KEYS = ("kv_cache_usage_pct", "requests_running", "requests_waiting", "prefix_cache_hit_rate_gauge",
              "spec_accept_rate_gauge", "spec_accept_length_gauge")
HISTOGRAM_KEYS = ("ttft", "itl", "queue", "e2e")

VLLM: dict[str, tuple[Series, ...]] = {
    "prompt_tokens": (_c("vllm:prompt_tokens"),),
    "generation_tokens": (_c("vllm:generation_tokens"),),
    "requests": (_c("vllm:request_success"),),
    "preemptions": (_c("vllm:num_preemptions"),),
    "prefix_cache_hits": (_c("vllm:prefix_cache_hits"), _c("vllm:gpu_prefix_cache_hits")),
    "prefix_cache_queries": (_c("vllm:prefix_cache_queries"), _c("vllm:gpu_prefix_cache_queries")),
    "spec_drafts": (_c("vllm:spec_decode_num_drafts"),),
    "spec_draft_tokens": (_c("vllm:spec_decode_num_draft_tokens"),),
    "spec_accepted_tokens": (_c("vllm:spec_decode_num_accepted_tokens"),),
    "kv_cache_usage_pct": (_g("vllm:kv_cache_usage_perc", 100.0, "max"), _g("vllm:gpu_cache_usage_perc", 100.0, "max")),
    "requests_running": (_g("vllm:num_requests_running"),),
    "requests_waiting": (_g("vllm:num_requests_waiting"),),
    "prefix_cache_hit_rate_gauge": (_g("vllm:gpu_prefix_cache_hit_rate", 1.0, "max"),),
    "ttft": (_h("vllm:time_to_first_token_seconds"),),
    "itl": (_h("vllm:inter_token_latency_seconds"), _h("vllm:time_per_output_token_seconds")),
    "queue": (_h("vllm:request_queue_time_seconds"),),
    "e2e": (_h("vllm:e2e_request_latency_seconds"),),
}

SGLANG: dict[str, tuple[Series, ...]] = {
    "prompt_tokens": (_c("sglang:prompt_tokens"),),
    "generation_tokens": (_c("sglang:generation_tokens"),),
    "requests": (_c("sglang:num_requests"),),
    "preemptions": (_c("sglang:num_retracted_requests"),),
    # SGLang counts cached prompt tokens; every prompt token was looked up, so queries are the prompt tokens
    "prefix_cache_hits": (_c("sglang:cached_tokens"),),
    "prefix_cache_queries": (_c("sglang:prompt_tokens"),),
    "kv_cache_usage_pct": (_g("sglang:token_usage", 100.0, "max"),),
    "requests_running": (_g("sglang:num_running_reqs"),),
    "requests_waiting": (_g("sglang:num_queue_reqs"),),
    "prefix_cache_hit_rate_gauge": (_g("sglang:cache_hit_rate", 1.0, "max"),),
    "spec_accept_rate_gauge": (_g("sglang:spec_accept_rate", 1.0, "max"),),
    "spec_accept_length_gauge": (_g("sglang:spec_accept_length", 1.0, "max"),),
    "ttft": (_h("sglang:time_to_first_token_seconds"),),
    "itl": (_h("sglang:inter_token_latency_seconds"), _h("sglang:time_per_output_token_seconds")),
    "queue": (_h("sglang:queue_time_seconds"),),
    "e2e": (_h("sglang:e2e_request_latency_seconds"),),
}

TGI: dict[str, tuple[Series, ...]] = {
    "prompt_tokens": (Series("tgi_request_input_length", "hist_sum"),),
    "generation_tokens": (Series("tgi_request_generated_tokens", "hist_sum"),),
    "requests": (_c("tgi_request_success"), _c("tgi_request_count")),
    "requests_running": (_g("tgi_batch_current_size"),),
    "requests_waiting": (_g("tgi_queue_size"),),
    "itl": (_h("tgi_request_mean_time_per_token_duration"),),
    "queue": (_h("tgi_request_queue_duration"),),
    "e2e": (_h("tgi_request_duration"),),
}

LLAMACPP: dict[str, tuple[Series, ...]] = {
    # llama.cpp counts the prompt tokens it evaluated; those reused from a slot's cache are counted apart
    # (prompt_tokens_cached), so its prefix-cache queries are the sum of both (QUERIES_ARE_PROMPT_PLUS_HITS)
    "prompt_tokens": (_c("llamacpp:prompt_tokens"),),
    "generation_tokens": (_c("llamacpp:tokens_predicted"),),
    "prefix_cache_hits": (_c("llamacpp:prompt_tokens_cached"),),
    "spec_drafts": (_c("llamacpp:spec_decode_num_drafts"),),
    "spec_draft_tokens": (_c("llamacpp:spec_decode_num_draft_tokens"), _c("llamacpp:tokens_drafted")),
    "spec_accepted_tokens": (_c("llamacpp:spec_decode_num_accepted_tokens"), _c("llamacpp:tokens_drafted_accepted")),
    "kv_cache_usage_pct": (_g("llamacpp:kv_cache_usage_ratio", 100.0, "max"),),
    "requests_running": (_g("llamacpp:requests_processing"),),
    "requests_waiting": (_g("llamacpp:requests_deferred"),),
}

BACKENDS: dict[str, dict[str, tuple[Series, ...]]] = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "tgi": TGI,
    "llama.cpp": LLAMACPP,
}

# backends whose prompt-token counter leaves out cached tokens: prefix-cache queries = prompt tokens + hits
QUERIES_ARE_PROMPT_PLUS_HITS = frozenset({"llama.cpp"})

# a page is this backend's when one of its series starts with this; bench's sim speaks vLLM's names
PREFIXES: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("tgi_", "tgi"),
    ("llamacpp:", "llama.cpp"),
)


def backend_of_names(names: set[str] | frozenset[str]) -> str | None:
    """The backend whose prefix most series on a page carry, or None when none of them does."""
    counts = {b: sum(1 for n in names if n.startswith(p)) for p, b in PREFIXES}
    best = max(counts.items(), key=lambda kv: kv[1])
    return best[0] if best[1] > 0 else None
