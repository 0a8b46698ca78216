"""SimConfig: every parameter of the reference engine, with units, and its TOML loader.

Units are part of the field names' contract (see docs/sim.md):

* ``*_tok_s``  tokens per second
* ``*_ms``     milliseconds
* ``*_tokens`` token counts
* ``*_prob`` / ``*_rate``  probabilities in [0, 1]
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SimConfig", "load_config", "FIELD_HELP", "ERROR_KINDS", "REASONING_FIELDS"]

ERROR_KINDS = ("429", "503", "stream")
REASONING_FIELDS = ("reasoning_content", "reasoning", "both")
USAGE_MODES = ("final", "every_chunk", "never")


def _f(default: Any, unit: str, help: str) -> Any:
    return field(default=default, metadata={"unit": unit, "help": help})


@dataclass(frozen=True)
class SimConfig:
    """Parameters of the simulated serving engine (immutable).

    See docs/sim.md for the exact timing model these parameters feed.
    """

    # -- identity / network ------------------------------------------------------------------
    model: str = _f("bench-sim", "name", "model id served by /v1/models and echoed in responses")
    host: str = _f("127.0.0.1", "address", "address the sim listens on (an address of this machine; tests' "
                                                  "in-process sims always use 127.0.0.1)")
    port: int = _f(8000, "port", "TCP port the sim listens on; 0 picks a free one")
    reuse_port: bool = _f(
        False, "bool", "SO_REUSEPORT: several sim processes listen on one port and the kernel spreads the "
        "connections over them (a sim that holds more requests/s than one process can serve)",
    )
    seed: int = _f(0, "int", "seed of every random draw (tokens_per_event choices, eos)")
    late_write_ms: float = _f(
        0.0, "ms", "report every token event whose write returned this long after its write_ns stamp (the sim "
        "stalled between stamp and send: preempted on a busy host) as a line `late-write WRITE_NS GAP_NS` on "
        "stderr, and every garbage collection of the sim's process that took this long as `collect GEN START_NS "
        "DUR_NS`; 0 = off",
    )

    # -- prefill -------------------------------------------------------------------------------
    prefill_tok_s: float = _f(
        5000.0, "tokens/s", "prefill speed for uncached prompt tokens at prompt length 0 (> 0)"
    )
    prefill_halving_tokens: float = _f(
        0.0,
        "tokens",
        "prompt length at which the prefill speed halves: rate(d) = prefill_tok_s / (1 + d / this); 0 = constant rate",
    )

    # -- decode --------------------------------------------------------------------------------
    decode_step_ms: float = _f(20.0, "ms", "fixed part of one decode step: t(b) = decode_step_ms + decode_step_ms_per_seq * b")
    decode_step_ms_per_seq: float = _f(0.0, "ms per sequence", "per-sequence part of one decode step (b = batch size)")
    max_running: int = _f(256, "sequences", "most requests admitted (prefilling or decoding) at once; the rest wait FIFO")
    tokens_per_event: int | tuple[int, ...] = _f(
        1,
        "tokens per event",
        "tokens a sequence emits per decode step: an int, or a list of choices drawn uniformly per step (seeded)",
    )
    step_jitter_pct: float = _f(
        0.0, "%",
        "per-step noise: each decode step lasts t(b) * exp(s*Z - s^2/2), s = this / 100, Z a standard normal drawn "
        "per step from a stream seeded by seed (mean factor 1); 0 = every step exactly t(b)",
    )
    drift_pct: float = _f(
        0.0, "%",
        "per-instance drift: one factor exp(d*Z), d = this / 100, Z a standard normal seeded by seed and drawn at "
        "start, multiplies every decode step and prefill time (two instances with different seeds differ like two "
        "server processes); 0 = factor 1",
    )
    reasoning_tokens: int = _f(
        0, "tokens", "first N output tokens of a chat request are streamed as delta.reasoning_content"
    )
    reasoning_field: str = _f(
        "reasoning_content", "'reasoning_content'|'reasoning'|'both'",
        "the delta key reasoning text goes under; 'both' sends the same text under both keys (as some vLLM "
        "versions do)",
    )

    # -- image input and tool calls --------------------------------------------------------------
    images: bool = _f(True, "bool", "accept image_url content parts; off: reject them with HTTP 500 as "
                      "llama-server without a projector (--mmproj) does")
    image_tokens: int = _f(256, "tokens", "prompt tokens each image_url content part adds")
    image_encode_ms: float = _f(0.0, "ms", "encoder time per image, spent after admission and before prefill")
    tool_call_prob: float = _f(
        0.0, "probability per request",
        "chance that a chat request offering tools (tool_choice not 'none') answers with a tool call: its output "
        "after the reasoning goes out as delta.tool_calls argument fragments (seeded per request)",
    )

    # -- prefix cache --------------------------------------------------------------------------
    prefix_cache: bool = _f(False, "bool", "reuse earlier prompts' leading blocks: those tokens skip prefill")
    prefix_block_tokens: int = _f(16, "tokens", "prefix-cache block size; only whole blocks match")
    kv_cache_tokens: int = _f(
        262144, "tokens",
        "KV-cache size reported by /metrics (vllm:kv_cache_usage_perc = prompt + output tokens of admitted "
        "requests / this); reporting only, never limits admission",
    )

    # -- usage -----------------------------------------------------------------------------------
    usage_mode: str = _f(
        "final", "'final'|'every_chunk'|'never'",
        "streamed usage: 'final' = one usage chunk at the end when stream_options.include_usage asks; "
        "'every_chunk' = also a running usage on every token chunk; 'never' = no usage at all",
    )

    # -- output length ---------------------------------------------------------------------------
    default_max_tokens: int = _f(256, "tokens", "output length when the request gives no max_tokens")
    max_model_len: int = _f(262144, "tokens", "prompt + max_tokens above this is rejected with 400")
    eos_prob: float = _f(0.0, "probability per token", "chance that each output token is the last (finish 'stop'); 0 = always run to max_tokens")

    # -- errors --------------------------------------------------------------------------------
    error_rate: float = _f(0.0, "fraction", "every k-th generation request fails, k = round(1 / error_rate); 0 = never")
    error_kind: str = _f("503", "'429'|'503'|'stream'", "how a failing request fails")
    error_after_tokens: int = _f(
        4, "tokens", "error_kind 'stream': tokens sent before the in-stream error (capped at output length - 1)"
    )

    def __post_init__(self) -> None:
        tpe = self.tokens_per_event
        if isinstance(tpe, (list, tuple)):
            tpe = tuple(tpe)
            if len(tpe) == 1:
                tpe = tpe[0]
            object.__setattr__(self, "tokens_per_event", tpe)
        ek = self.error_kind
        if isinstance(ek, int) and not isinstance(ek, bool):
            object.__setattr__(self, "error_kind", str(ek))
        if self.prefill_halving_tokens is None:
            object.__setattr__(self, "prefill_halving_tokens", 0.0)
        self._validate()

    def _validate(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ValueError(f"{name}: {what} (got {getattr(self, name)!r})")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        need(isinstance(self.model, str) and bool(self.model), "model", "must be a non-empty string")
        need(isinstance(self.host, str) and bool(self.host), "host", "must be a non-empty string")
        need(is_int(self.port) and 0 <= self.port <= 65535, "port", "must be an int in 0..65535")
        need(is_int(self.seed), "seed", "must be an int")
        need(is_num(self.prefill_tok_s) and self.prefill_tok_s > 0, "prefill_tok_s", "must be > 0 tokens/s")
        need(is_num(self.prefill_halving_tokens) and self.prefill_halving_tokens >= 0,
             "prefill_halving_tokens", "must be >= 0 tokens (0 = off)")
        need(is_num(self.late_write_ms) and self.late_write_ms >= 0, "late_write_ms", "must be >= 0 ms")
        need(is_num(self.decode_step_ms) and self.decode_step_ms >= 0, "decode_step_ms", "must be >= 0 ms")
        need(is_num(self.decode_step_ms_per_seq) and self.decode_step_ms_per_seq >= 0,
             "decode_step_ms_per_seq", "must be >= 0 ms")
        need(self.decode_step_ms + self.decode_step_ms_per_seq > 0, "decode_step_ms",
             "decode_step_ms + decode_step_ms_per_seq must be > 0 (a step must take time)")
        need(is_num(self.step_jitter_pct) and 0 <= self.step_jitter_pct <= 50, "step_jitter_pct",
             "must be in [0, 50] %")
        need(is_num(self.drift_pct) and 0 <= self.drift_pct <= 50, "drift_pct", "must be in [0, 50] %")
        need(is_int(self.max_running) and self.max_running >= 1, "max_running", "must be an int >= 1")
        tpe = self.tokens_per_event
        if isinstance(tpe, tuple):
            need(len(tpe) > 0 and all(is_int(k) and k >= 1 for k in tpe), "tokens_per_event",
                 "choices must be ints >= 1")
        else:
            need(is_int(tpe) and tpe >= 1, "tokens_per_event", "must be an int >= 1 or a list of them")
        need(is_int(self.reasoning_tokens) and self.reasoning_tokens >= 0, "reasoning_tokens", "must be an int >= 0")
        need(self.reasoning_field in REASONING_FIELDS, "reasoning_field",
             f"must be one of {', '.join(REASONING_FIELDS)}")
        need(isinstance(self.images, bool), "images", "must be true or false")
        need(is_int(self.image_tokens) and self.image_tokens >= 0, "image_tokens", "must be an int >= 0")
        need(is_num(self.image_encode_ms) and self.image_encode_ms >= 0, "image_encode_ms", "must be >= 0 ms")
        need(is_num(self.tool_call_prob) and 0 <= self.tool_call_prob <= 1, "tool_call_prob", "must be in [0, 1]")
        need(isinstance(self.prefix_cache, bool), "prefix_cache", "must be true or false")
        need(is_int(self.prefix_block_tokens) and self.prefix_block_tokens >= 1, "prefix_block_tokens",
             "must be an int >= 1")
        need(is_int(self.kv_cache_tokens) and self.kv_cache_tokens >= 1, "kv_cache_tokens", "must be an int >= 1")
        need(is_int(self.default_max_tokens) and self.default_max_tokens >= 1, "default_max_tokens",
             "must be an int >= 1")
        need(is_int(self.max_model_len) and self.max_model_len >= 1, "max_model_len", "must be an int >= 1")
        need(is_num(self.eos_prob) and 0 <= self.eos_prob < 1, "eos_prob", "must be in [0, 1)")
        need(is_num(self.error_rate) and 0 <= self.error_rate <= 1, "error_rate", "must be in [0, 1]")
        need(self.usage_mode in USAGE_MODES, "usage_mode", f"must be one of {', '.join(USAGE_MODES)}")
        need(self.error_kind in ERROR_KINDS, "error_kind", f"must be one of {', '.join(ERROR_KINDS)}")
        need(is_int(self.error_after_tokens) and self.error_after_tokens >= 0, "error_after_tokens",
             "must be an int >= 0")

    # convenience -------------------------------------------------------------------------------
    @property
    def tokens_per_event_choices(self) -> tuple[int, ...]:
        """tokens_per_event as a tuple of choices (one element when fixed)."""
        tpe = self.tokens_per_event
        return tpe if isinstance(tpe, tuple) else (tpe,)

    @property
    def error_period(self) -> int:
        """k: request number n (1-based, generation requests in arrival order) fails iff n % k == 0; 0 = never."""
        if self.error_rate <= 0:
            return 0
        return max(1, round(1.0 / self.error_rate))

    def replace(self, **changes: Any) -> SimConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: SimConfig | None = None) -> SimConfig:
        """Build from a dict of field values; an unknown key raises ValueError naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise ValueError(f"unknown sim config key {key!r} (known: {', '.join(sorted(names))})")
        return dataclasses.replace(base or cls(), **data)


FIELD_HELP: dict[str, tuple[str, str]] = {
    f.name: (f.metadata["unit"], f.metadata["help"]) for f in dataclasses.fields(SimConfig)
}


def load_config(path: str) -> SimConfig:
    """Read a TOML parameter file (top-level keys = SimConfig fields; a ``[sim]`` table is also accepted).

    Raises ValueError naming any unknown key, or describing an invalid value.
    """
    with open(path, "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path} is not valid TOML: {e}") from None
    if set(data) == {"sim"} and isinstance(data["sim"], dict):
        data = data["sim"]
    for key, value in data.items():
        if isinstance(value, dict):
            raise ValueError(f"unknown sim config key {key!r} (tables are not fields)")
    return SimConfig.from_mapping(data)
