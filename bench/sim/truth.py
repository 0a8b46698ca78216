"""The truth: pure functions giving the timing the sim produces (docs/sim.md, "Truth formulas").

The engine itself schedules with ``step_ns`` and ``prefill_ns`` below, so these functions and the server
cannot drift apart. "Isolated" means the request is the only one in the engine (batch size 1, nothing queued).
All ``*_ms`` results are floats in milliseconds; ``*_ns`` results are the integer nanoseconds the engine uses
(the ms value rounded to the nearest ns).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from typing import Any

from bench.sim.config import SimConfig

__all__ = [
    "drift_factor",
    "jitter_factor",
    "step_ms",
    "step_ns",
    "prefill_rate_tok_s",
    "expected_prefill_ms",
    "prefill_ns",
    "expected_encode_ms",
    "encode_ns",
    "calls_tool",
    "expected_itl_ms",
    "mean_tokens_per_event",
    "expected_decode_tok_s",
    "expected_events",
    "expected_ttft_ms",
    "expected_e2e_ms",
    "expected_cached_tokens",
    "expected_error_count",
    "fails",
    "output_length",
    "simulate_load",
    "load_arrivals_ns",
    "ttft_quantile_ms",
    "ttft_slo_boundary_rps",
    "tpot_quantile_ms",
    "tpot_slo_boundary_rps",
    "slo_quantile_ms",
    "slo_boundary_rps",
    "saturation_rps",
]


@functools.lru_cache(maxsize=64)
def _drift(seed: int, drift_pct: float) -> float:
    if drift_pct <= 0:
        return 1.0
    return math.exp(drift_pct / 100.0 * random.Random(f"drift/{seed}").gauss(0.0, 1.0))


def drift_factor(cfg: SimConfig) -> float:
    """The instance's speed factor: ``exp(d Z)``, ``d = drift_pct / 100``, ``Z`` one standard normal drawn from
    ``Random(f"drift/{seed}")``; exactly 1.0 when ``drift_pct`` is 0. Every step and prefill time is multiplied
    by it (so a sim with factor 1.02 decodes 1/1.02 as fast as one with factor 1)."""
    return _drift(cfg.seed, float(cfg.drift_pct))


def jitter_factor(cfg: SimConfig, z: float) -> float:
    """The factor of one decode step for the standard normal draw ``z``: ``exp(s z - s^2/2)``, ``s =
    step_jitter_pct / 100`` (its mean over draws is 1, so the mean step stays t(b))."""
    s = cfg.step_jitter_pct / 100.0
    return math.exp(s * z - s * s / 2.0)


def step_ms(cfg: SimConfig, batch: int) -> float:
    """Duration of one decode step with ``batch`` sequences: t(b) = (decode_step_ms + decode_step_ms_per_seq * b)
    * :func:`drift_factor` (1 unless ``drift_pct`` is set); with ``step_jitter_pct`` this is the mean step."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    return (cfg.decode_step_ms + cfg.decode_step_ms_per_seq * batch) * drift_factor(cfg)


def step_ns(cfg: SimConfig, batch: int) -> int:
    return round(step_ms(cfg, batch) * 1e6)


def prefill_rate_tok_s(cfg: SimConfig, prompt_tokens: int) -> float:
    """Prefill speed for a prompt of ``prompt_tokens`` tokens (d):
    prefill_tok_s / (1 + d / prefill_halving_tokens), or prefill_tok_s when prefill_halving_tokens is 0."""
    if cfg.prefill_halving_tokens > 0:
        return cfg.prefill_tok_s / (1.0 + prompt_tokens / cfg.prefill_halving_tokens)
    return cfg.prefill_tok_s


def expected_prefill_ms(cfg: SimConfig, uncached_tokens: int, prompt_tokens: int | None = None) -> float:
    """Prefill time = uncached_tokens / prefill_rate_tok_s(cfg, prompt_tokens), in ms (closed form; the rate is
    taken at the whole prompt length d, not integrated token by token). ``prompt_tokens`` defaults to
    ``uncached_tokens`` (no cache hit)."""
    d = uncached_tokens if prompt_tokens is None else prompt_tokens
    if uncached_tokens <= 0:
        return 0.0
    return uncached_tokens / prefill_rate_tok_s(cfg, d) * 1000.0 * drift_factor(cfg)


def prefill_ns(cfg: SimConfig, uncached_tokens: int, prompt_tokens: int) -> int:
    return round(expected_prefill_ms(cfg, uncached_tokens, prompt_tokens) * 1e6)


def expected_encode_ms(cfg: SimConfig, images: int) -> float:
    """Image encoding before prefill: ``images * image_encode_ms`` ms, times :func:`drift_factor` (never cached)."""
    return max(0, images) * cfg.image_encode_ms * drift_factor(cfg)


def encode_ns(cfg: SimConfig, images: int) -> int:
    return round(expected_encode_ms(cfg, images) * 1e6)


def calls_tool(cfg: SimConfig, request_no: int) -> bool:
    """Whether chat request ``request_no``, when it offers tools (``tool_choice`` not ``"none"``), answers with a
    tool call: ``Random(f"tool/{seed}/{request_no}").random() < tool_call_prob`` (whatever ``tool_choice`` says, so
    a forced call can be missing)."""
    if cfg.tool_call_prob <= 0:
        return False
    return random.Random(f"tool/{cfg.seed}/{request_no}").random() < cfg.tool_call_prob


def expected_itl_ms(cfg: SimConfig, batch: int = 1) -> float:
    """Time between two consecutive events of one sequence while ``batch`` sequences decode together: t(batch)."""
    return step_ms(cfg, batch)


def mean_tokens_per_event(cfg: SimConfig) -> float:
    """Mean tokens per event before the output-length cap (choices are drawn uniformly)."""
    ch = cfg.tokens_per_event_choices
    return sum(ch) / len(ch)


def expected_decode_tok_s(cfg: SimConfig, batch: int = 1) -> float:
    """Per-sequence decode speed with ``batch`` sequences decoding: mean_tokens_per_event * 1000 / t(batch).
    (Aggregate engine throughput is ``batch`` times this.)"""
    return mean_tokens_per_event(cfg) * 1000.0 / step_ms(cfg, batch)


def expected_events(cfg: SimConfig, output_tokens: int) -> int:
    """Token-bearing events for ``output_tokens`` tokens; exact only when tokens_per_event is fixed."""
    if isinstance(cfg.tokens_per_event, tuple):
        raise ValueError("expected_events needs a fixed tokens_per_event")
    return math.ceil(output_tokens / cfg.tokens_per_event)


def expected_ttft_ms(cfg: SimConfig, prompt_tokens: int, cached_tokens: int = 0, images: int = 0) -> float:
    """Isolated request: arrival (server clock) -> first token event = image encoding + prefill + t(1).
    ``prompt_tokens`` includes the ``image_tokens`` of each image."""
    return (expected_encode_ms(cfg, images) + expected_prefill_ms(cfg, prompt_tokens - cached_tokens, prompt_tokens)
            + step_ms(cfg, 1))


def expected_e2e_ms(cfg: SimConfig, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
    """Isolated request with fixed tokens_per_event: arrival -> last event = prefill + events * t(1)."""
    return expected_prefill_ms(cfg, prompt_tokens - cached_tokens, prompt_tokens) + expected_events(
        cfg, output_tokens
    ) * step_ms(cfg, 1)


def expected_cached_tokens(cfg: SimConfig, prompt_tokens: int, matched_tokens: int | None = None) -> int:
    """cached_tokens for a prompt of ``prompt_tokens`` whose first ``matched_tokens`` tokens (default: all of
    them, i.e. an exact repeat) equal an earlier admitted prompt's: whole blocks only, and never the whole
    prompt: min(floor(matched / B), floor((prompt_tokens - 1) / B)) * B with B = prefix_block_tokens."""
    if not cfg.prefix_cache or prompt_tokens <= 0:
        return 0
    b = cfg.prefix_block_tokens
    m = prompt_tokens if matched_tokens is None else min(matched_tokens, prompt_tokens)
    return min(m // b, (prompt_tokens - 1) // b) * b


def fails(cfg: SimConfig, request_no: int) -> bool:
    """Whether generation request number ``request_no`` (1-based, arrival order) gets the configured error."""
    k = cfg.error_period
    return k > 0 and request_no % k == 0


def expected_error_count(cfg: SimConfig, n_requests: int) -> int:
    """Errors among the first ``n_requests`` generation requests: n // k (k = round(1 / error_rate))."""
    k = cfg.error_period
    return n_requests // k if k else 0


def output_length(cfg: SimConfig, request_no: int, max_tokens: int) -> tuple[int, str]:
    """(completion tokens, finish_reason) of generation request ``request_no`` asking for ``max_tokens``.

    With eos_prob = 0: (max_tokens, "length"). Otherwise one draw U = Random(f"eos/{seed}/{request_no}").random()
    gives a geometric length L = 1 + floor(ln(1 - U) / ln(1 - eos_prob)) (each token is the last with probability
    eos_prob); the result is (L, "stop") if L <= max_tokens, else (max_tokens, "length")."""
    if cfg.eos_prob <= 0:
        return max_tokens, "length"
    u = random.Random(f"eos/{cfg.seed}/{request_no}").random()
    n = 1 + int(math.log(1.0 - u) / math.log(1.0 - cfg.eos_prob))
    if n <= max_tokens:
        return n, "stop"
    return max_tokens, "length"


# -- load: queueing at max_running, batch-dependent steps, and the rate at which an SLO breaks -------------------

def _end_step_sim(t: int, batch: list[list[int]], tpe: int, first: list[int | None],
                  last: list[int | None]) -> list[list[int]]:
    """Emit one event per batch member at ``t``; return those still decoding. A member is [no, remaining]."""
    alive = []
    for s in batch:
        if first[s[0]] is None:
            first[s[0]] = t
        s[1] -= min(tpe, s[1])
        last[s[0]] = t
        if s[1] > 0:
            alive.append(s)
    return alive


def simulate_load(cfg: SimConfig, arrivals_ns: list[int], prompt_tokens: int, output_tokens: int) -> dict[str, list[Any]]:
    """Deterministic replay of the engine's scheduler (engine.py: FIFO admission up to ``max_running``, prefill on
    admission, one decode step of t(b) for every decoding sequence, back to back) for requests arriving at
    ``arrivals_ns`` (sorted, server clock), each ``prompt_tokens`` long (no cache) asking ``output_tokens``, with a
    fixed ``tokens_per_event`` and ``eos_prob = 0``. Returns per request ``admit_ns``, ``first_ns`` (first event,
    its scheduled time) and ``last_ns``; TTFT on the server = first_ns - arrival."""
    if isinstance(cfg.tokens_per_event, tuple) or cfg.eos_prob > 0:
        raise ValueError("simulate_load needs a fixed tokens_per_event and eos_prob = 0")
    tpe, mr = int(cfg.tokens_per_event), cfg.max_running
    n = len(arrivals_ns)
    admit: list[int | None] = [None] * n
    first: list[int | None] = [None] * n
    last: list[int | None] = [None] * n
    pf_ns = prefill_ns(cfg, prompt_tokens, prompt_tokens)
    waiting: list[int] = []  # FIFO of request numbers (head index below)
    head, i = 0, 0
    prefilling: list[tuple[int, int]] = []  # heap of (end, no)
    decoding: list[list[int]] = []
    step_end: int | None = None

    def admit_one(no: int, t: int) -> None:
        admit[no] = t
        heapq.heappush(prefilling, (t + pf_ns, no))

    def start_step(t: int) -> int | None:
        while prefilling and prefilling[0][0] <= t:
            decoding.append([heapq.heappop(prefilling)[1], output_tokens])
        return t + step_ns(cfg, len(decoding)) if decoding else None

    while i < n or head < len(waiting) or prefilling or decoding:
        nxt = arrivals_ns[i] if i < n else None
        event_t = step_end if step_end is not None else (prefilling[0][0] if prefilling else None)
        if nxt is not None and (event_t is None or nxt <= event_t):  # ties: the arrival first
            if head == len(waiting) and len(prefilling) + len(decoding) < mr:
                admit_one(i, nxt)
            else:
                waiting.append(i)
            i += 1
            continue
        assert event_t is not None
        if step_end is not None:
            decoding[:] = _end_step_sim(event_t, decoding, tpe, first, last)
            while head < len(waiting) and len(prefilling) + len(decoding) < mr:
                admit_one(waiting[head], event_t)
                head += 1
        step_end = start_step(event_t)
    return {"admit_ns": admit, "first_ns": first, "last_ns": last}


def load_arrivals_ns(rate: float, duration_s: float, kind: str = "constant", seed: int = 0,
                     burstiness: float = 1.0) -> list[int]:
    """Arrival times (ns from 0) at ``rate`` req/s over ``duration_s``: ``constant`` gaps of 1/rate, ``poisson``
    (exponential gaps) or ``gamma`` (gaps of shape ``burstiness`` and mean 1/rate), from ``random.Random(seed)``.
    The random gaps are a unit-rate stream divided by ``rate``, so one seed gives the same stream at every rate."""
    out, t, rng = [], 0.0, random.Random(seed)
    while t < duration_s:
        out.append(round(t * 1e9))
        if kind == "constant":
            t += 1.0 / rate
        elif kind == "gamma":
            t += rng.gammavariate(burstiness, 1.0 / burstiness) / rate
        else:
            t += rng.expovariate(1.0) / rate
    return out


def slo_quantile_ms(cfg: SimConfig, metric: str, rate: float, prompt_tokens: int, output_tokens: int, *,
                    q: float = 90.0, horizon_s: float = 120.0, kind: str = "constant", seed: int = 0,
                    burstiness: float = 1.0) -> float:
    """Server-side percentile ``q`` (nearest rank) of ``metric`` over the requests arriving in the second half of
    a ``horizon_s`` run at ``rate`` (the first half brings the engine to its steady state). ``metric``: ``ttft``
    (first event - arrival) or ``tpot`` ((last event - first event) / (output_tokens - 1), as bench computes it
    with one token per event)."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be ttft or tpot, got {metric!r}")
    if metric == "tpot" and output_tokens < 2:
        raise ValueError("tpot needs output_tokens >= 2")
    arr = load_arrivals_ns(rate, horizon_s, kind, seed, burstiness)
    sim = simulate_load(cfg, arr, prompt_tokens, output_tokens)
    half = horizon_s / 2 * 1e9
    if metric == "ttft":
        vals = sorted((f - a) / 1e6 for a, f in zip(arr, sim["first_ns"]) if a >= half and f is not None)
    else:
        vals = sorted((z - f) / 1e6 / (output_tokens - 1)
                      for a, f, z in zip(arr, sim["first_ns"], sim["last_ns"]) if a >= half and f is not None)
    return float(vals[max(0, math.ceil(q / 100 * len(vals)) - 1)])


def ttft_quantile_ms(cfg: SimConfig, rate: float, prompt_tokens: int, output_tokens: int, *, q: float = 90.0,
                     horizon_s: float = 120.0, kind: str = "constant", seed: int = 0, burstiness: float = 1.0) -> float:
    """:func:`slo_quantile_ms` of TTFT."""
    return slo_quantile_ms(cfg, "ttft", rate, prompt_tokens, output_tokens, q=q, horizon_s=horizon_s, kind=kind,
                           seed=seed, burstiness=burstiness)


def tpot_quantile_ms(cfg: SimConfig, rate: float, prompt_tokens: int, output_tokens: int, *, q: float = 90.0,
                     horizon_s: float = 120.0, kind: str = "constant", seed: int = 0, burstiness: float = 1.0) -> float:
    """:func:`slo_quantile_ms` of TPOT."""
    return slo_quantile_ms(cfg, "tpot", rate, prompt_tokens, output_tokens, q=q, horizon_s=horizon_s, kind=kind,
                           seed=seed, burstiness=burstiness)


def slo_boundary_rps(cfg: SimConfig, metric: str, limit_ms: float, prompt_tokens: int, output_tokens: int, *,
                     q: float = 90.0, horizon_s: float = 120.0, kind: str = "constant", seed: int = 0,
                     burstiness: float = 1.0, lo: float = 0.1, hi: float = 10_000.0, rel_tol: float = 1e-4) -> float:
    """The highest rate (req/s) at which the steady-state server ``metric`` p``q`` stays <= ``limit_ms``: bisection
    over :func:`slo_quantile_ms` (monotone in the rate for constant arrivals; for random arrivals each rate sees
    the same unit-rate stream, and a long ``horizon_s`` makes the quantile that of the stationary distribution)."""
    def ok(rate: float) -> bool:
        return slo_quantile_ms(cfg, metric, rate, prompt_tokens, output_tokens, q=q, horizon_s=horizon_s,
                               kind=kind, seed=seed, burstiness=burstiness) <= limit_ms

    if not ok(lo):
        raise ValueError(f"the SLO fails even at {lo} req/s")
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def ttft_slo_boundary_rps(cfg: SimConfig, limit_ms: float, prompt_tokens: int, output_tokens: int, *,
                          q: float = 90.0, horizon_s: float = 120.0, kind: str = "constant", seed: int = 0,
                          lo: float = 0.1, hi: float = 10_000.0, rel_tol: float = 1e-4,
                          burstiness: float = 1.0) -> float:
    """:func:`slo_boundary_rps` of TTFT."""
    return slo_boundary_rps(cfg, "ttft", limit_ms, prompt_tokens, output_tokens, q=q, horizon_s=horizon_s,
                            kind=kind, seed=seed, burstiness=burstiness, lo=lo, hi=hi, rel_tol=rel_tol)


def tpot_slo_boundary_rps(cfg: SimConfig, limit_ms: float, prompt_tokens: int, output_tokens: int, *,
                          q: float = 90.0, horizon_s: float = 120.0, kind: str = "constant", seed: int = 0,
                          lo: float = 0.1, hi: float = 10_000.0, rel_tol: float = 1e-4,
                          burstiness: float = 1.0) -> float:
    """:func:`slo_boundary_rps` of TPOT."""
    return slo_boundary_rps(cfg, "tpot", limit_ms, prompt_tokens, output_tokens, q=q, horizon_s=horizon_s,
                            kind=kind, seed=seed, burstiness=burstiness, lo=lo, hi=hi, rel_tol=rel_tol)


def saturation_rps(cfg: SimConfig, prompt_tokens: int, output_tokens: int) -> float:
    """Upper bound of the engine's request throughput with a full batch: max_running slots, each held for the
    prefill plus ceil(output / tokens_per_event) steps of t(max_running) (the wait for the next step start
    after the prefill makes the real figure a little lower; :func:`simulate_load` has it exactly)."""
    if isinstance(cfg.tokens_per_event, tuple):
        raise ValueError("saturation_rps needs a fixed tokens_per_event")
    hold_ms = expected_prefill_ms(cfg, prompt_tokens) + expected_events(cfg, output_tokens) * step_ms(
        cfg, cfg.max_running)
    return cfg.max_running / hold_ms * 1000.0
