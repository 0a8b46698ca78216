"""Service-level objectives as typed settings: the SLO string of ``--slo`` and the ``slo`` profile key, parsed once
into an :class:`SLO` of :class:`Objective` (pure). Scoring requests against them is :mod:`bench.measure.slo`.

An SLO string is a list of objectives joined by ``,`` or ``and``:

* percentile form ``ttft_p90=2s``, ``tpot_p90=60ms``, ``e2e_p99=30s``, ``itl_max=200ms``: metric ``ttft``, ``tpot``,
  ``itl`` or ``e2e``; statistic ``p50``..``p99`` (any whole percentile 1-99, also ``p99.9``) or ``max``; value with
  unit ``ms`` or ``s``;
* per-request form ``ttft_ms <= 2000``, ``tpot_ms <= 60``, ``e2e_s <= 30`` (or ``ttft <= 2s``): the bound every
  request must meet; it is the objective ``<metric>_max``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.errors import ConfigError

__all__ = ["Objective", "SLO", "parse_slo", "METRICS"]

METRICS = ("ttft", "tpot", "itl", "e2e")
_PCT = re.compile(r"^(ttft|tpot|itl|e2e)_(p\d{1,2}(?:\.\d+)?|max)\s*=\s*(\d+(?:\.\d+)?)\s*(ms|s)$")
_REQ = re.compile(r"^(ttft|tpot|itl|e2e)(?:_(ms|s))?\s*<=\s*(\d+(?:\.\d+)?)\s*(ms|s)?$")


@dataclass(frozen=True, slots=True)
class Objective:
    """One objective: ``stat`` (``"p90"``, ``"max"``) of ``metric`` must be <= ``limit_ms``."""

    metric: str
    stat: str
    limit_ms: float

    @property
    def key(self) -> str:
        """Its name in results: ``ttft_p90``, ``tpot_max``."""
        return f"{self.metric}_{self.stat}"

    @property
    def q(self) -> float:
        """The percentile (100 for max)."""
        return 100.0 if self.stat == "max" else float(self.stat[1:])


@dataclass(frozen=True, slots=True)
class SLO:
    """A set of objectives (at most one per metric and statistic)."""

    objectives: tuple[Objective, ...]

    @property
    def text(self) -> str:
        """Canonical form: ``ttft_p90=2000ms,tpot_p90=60ms``."""
        return ",".join(f"{o.key}={o.limit_ms:g}ms" for o in self.objectives)


def _one(item: str, flag: str) -> Objective:
    s = item.strip().lower()
    m = _PCT.match(s)
    if m:
        metric, stat, num, unit = m.groups()
        if stat != "max" and not 0 < float(stat[1:]) < 100:
            raise ConfigError(f"{flag}: {item!r}: the percentile must be in p1..p99.9 (or max)")
    else:
        m = _REQ.match(s)
        if not m:
            raise ConfigError(f"{flag}: {item!r} is not an objective (ttft_p90=2s, tpot_p90=60ms, e2e_max=30s or "
                              "ttft_ms <= 2000; metrics ttft, tpot, itl, e2e; units ms or s)")
        metric, u1, num, u2 = m.groups()
        if (u1 is None) == (u2 is None):
            raise ConfigError(f"{flag}: {item!r}: give the unit once (ttft_ms <= 2000 or ttft <= 2s)")
        stat, unit = "max", u1 or u2
    limit = float(num) * (1000.0 if unit == "s" else 1.0)
    if not limit > 0:
        raise ConfigError(f"{flag}: {item!r}: the threshold must be > 0")
    return Objective(metric, stat, limit)


def parse_slo(text: str, flag: str = "--slo") -> SLO:
    """Parse an SLO string (module docstring). Raises ConfigError naming ``flag``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{flag}: empty SLO (e.g. ttft_p90=2s,tpot_p90=60ms)")
    items = [p for part in text.split(",") for p in re.split(r"\s+and\s+", part.strip()) if p.strip()]
    objs: list[Objective] = []
    for it in items:
        o = _one(it, flag)
        if any(x.key == o.key for x in objs):
            raise ConfigError(f"{flag}: {o.key} is given twice")
        objs.append(o)
    return SLO(tuple(objs))
