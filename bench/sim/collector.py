"""When the sim's process runs Python's full garbage collection: never in the middle of serving.

Why: a full (generation 2) collection walks every live object. With 4,096 streams open it paused the sim's
process for 37-81 ms (benchmarks/results/scale_streams-sim-gc-2026-12-05-vm.md), and a token event stamped
just before the pause went out that much after its ``write_ns``: the sim, not the client, made the worst event of
a 16,384-stream run. The young generations (0 and 1) stay automatic: they hold few objects (1-2.6 ms with
4,096 streams on the 2-core VM; up to 14.4 ms on a 16-core H100 host with 3,277 streams per sim).

Rule (:func:`install`, in ``bench sim``'s own process only; a sim run in a thread of a test process leaves
that process's collector alone): what exists once the server listens is frozen (``gc.freeze``: never scanned
again) and automatic full collections are off. The engine runs a full collection when it has had nothing to run
or prefill for :data:`IDLE_GRACE_S` and objects reached generation 2 since the last one (:func:`idle_due`);
while busy, only after :data:`BUSY_FULL_AFTER` young (generation 1) collections without an idle moment
(:func:`busy_due`, checked between steps), so memory stays bounded under load that never pauses (kept-alive
connections make no cyclic garbage; each new connection leaves about 1 KB to collect).
"""

from __future__ import annotations

import gc

__all__ = ["install", "idle_due", "busy_due", "collect", "report", "BUSY_FULL_AFTER", "IDLE_GRACE_S"]

BUSY_FULL_AFTER = 2_000
"""Generation-1 collections (each after about 7,000 net allocations) a busy sim lets pass before it runs a full
collection anyway."""

IDLE_GRACE_S = 0.2
"""How long the engine stays idle before its full collection: the writes it queued reach a slow reader first, and
a wave that follows at once finds the process awake."""

_installed = False


def install() -> None:
    """Freeze what exists and turn automatic full collections off (the module docstring's rule)."""
    global _installed
    gc.collect()
    gc.freeze()
    young0, young1, _ = gc.get_threshold()
    gc.set_threshold(young0, young1, 2**31 - 1)  # generation 2: only collect() below
    _installed = True


def idle_due() -> bool:
    """Installed, and generation 2 has grown since the last full collection: the engine, idle, should
    :func:`collect` (after yielding once, so the writes its loop queued go out first)."""
    return _installed and gc.get_count()[2] > 0


def busy_due() -> bool:
    """Installed, and :data:`BUSY_FULL_AFTER` young collections passed without a full one."""
    return _installed and gc.get_count()[2] >= BUSY_FULL_AFTER


def collect() -> None:
    """A full collection."""
    gc.collect()


def report(min_ms: float) -> None:
    """Print every collection (any generation) that took ``min_ms`` or more as a line ``collect GEN START_NS DUR_NS``
    on stderr (``bench sim --late-write-ms``: the sim's own pauses, told apart from the client's)."""
    import sys
    from time import perf_counter_ns

    start = [0]
    floor = int(min_ms * 1e6)

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            start[0] = perf_counter_ns()
        elif (dur := perf_counter_ns() - start[0]) >= floor:
            print(f"collect {info['generation']} {start[0]} {dur}", file=sys.stderr, flush=True)

    gc.callbacks.append(timed)
