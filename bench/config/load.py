"""Open-loop load settings as one typed object: the ``[load]`` profile table and the open-loop flags of
``bench run`` and ``bench capacity`` (docs/profiles.md, docs/load.md), checked when they are read."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.config.sizes import SizeDist, parse_size
from bench.config.slo import SLO, parse_slo
from bench.errors import ConfigError

__all__ = ["LoadSettings", "MODES"]

MODES = ("concurrency", "rate", "trace", "sessions")


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """Open-loop settings (profile keys and flags: docs/profiles.md, docs/load.md)."""

    mode: str = "rate"
    rate: float | None = None
    duration_s: float | None = None
    requests: int | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    ramp_s: float = 0.0
    exact_count: bool = False  # exactly rate x duration arrivals: capacity probes only (docs/load.md), no profile key
    max_concurrency: int | None = None
    input_tokens: str = "128"
    output_tokens: str | None = None
    dataset: str | None = None
    trace: str | None = None
    block_tokens: int = 512
    speed: float = 1.0
    seed: int = 0
    warmup_s: float | None = None
    cooldown_s: float | None = None
    drain_s: float = 60.0
    slo: str | None = None
    prompt: str = "prose"
    users: int = 4
    turns: int = 3
    think_s: float = 1.0
    stagger_s: float = 0.5
    # the spec strings above, parsed once when the settings are made (a bad one raises ConfigError naming its flag)
    slo_spec: SLO | None = field(default=None, init=False, repr=False, compare=False)
    input_sizes: SizeDist | None = field(default=None, init=False, repr=False, compare=False)
    output_sizes: SizeDist | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "slo_spec", parse_slo(self.slo) if self.slo else None)
        object.__setattr__(self, "input_sizes", parse_size(self.input_tokens, "--input-tokens"))
        if self.output_tokens is not None:
            object.__setattr__(self, "output_sizes", parse_size(self.output_tokens, "--output-tokens"))

    def check(self) -> None:
        """Raise ConfigError naming the flag of the first bad value."""
        if self.mode not in MODES[1:]:
            raise ConfigError(f"mode: {self.mode!r} is not an open-loop mode (rate, trace, sessions)")
        if self.mode == "sessions" and not (self.users >= 1 and self.turns >= 1 and self.think_s >= 0
                                            and self.stagger_s >= 0):
            raise ConfigError("--sessions and --turns must be >= 1, --think and stagger_s >= 0")
        if self.mode == "trace" and not self.trace:
            raise ConfigError("--trace FILE is needed in trace mode")
        if self.mode == "rate" and self.burstiness != 1.0 and self.arrival != "gamma":
            raise ConfigError(f"--burstiness {self.burstiness:g} applies to --arrival gamma only (--arrival "
                              f"{self.arrival} ignores it): add --arrival gamma, or leave --burstiness out")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        for name in ("warmup_s", "cooldown_s"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"{name} must be >= 0 s, got {v}")
        if not self.drain_s >= 0:
            raise ConfigError(f"--drain must be >= 0 s, got {self.drain_s}")

    def at(self, load: float, *, by: str = "rate", seed: int | None = None) -> LoadSettings:
        """A copy at another load (``by="rate"``: requests/s; ``"concurrency"``: the cap, at an unbounded rate)."""
        if by == "rate":
            return replace(self, rate=load, seed=self.seed if seed is None else seed)
        return replace(self, max_concurrency=int(load), seed=self.seed if seed is None else seed)
