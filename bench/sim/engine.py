"""The simulated engine: FIFO admission, per-request prefill, one global continuous-batching decode loop.

All schedule times are integers from ``time.perf_counter_ns()`` on an ideal timeline: a step that should end
at T ends at T on the timeline even if the process woke late, so the schedule (``sched_ns``) is exactly the
model in docs/sim.md and lateness shows only in ``write_ns``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections import deque
from time import perf_counter_ns
from typing import Any, Protocol

from bench.sim.alarm import alarm_for
from bench.sim.collector import IDLE_GRACE_S, busy_due, collect, idle_due
from bench.sim.config import SimConfig
from bench.sim.truth import encode_ns, jitter_factor, output_length, prefill_ns, step_ns

__all__ = ["Engine", "Seq", "Sink", "EngineStats"]

log = logging.getLogger("bench.sim")

# Sleep on the loop's timer (bench.sim.alarm) until _BUSY_NS before a deadline, then busy-wait; without a timer,
# sleep until _SLEEP_MARGIN_NS before it, then yield with sleep(0) until _BUSY_NS before it, then busy-wait.
_SLEEP_MARGIN_NS = 1_500_000
_BUSY_NS = 100_000

# vLLM-like histogram buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class Histogram:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                break

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for b, c in zip(self.buckets, self.counts):
            acc += c
            out.append((repr(float(b)), acc))
        out.append(("+Inf", self.count))
        return out


class EngineStats:
    """Counters for /metrics."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.errors: dict[str, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(E2E_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)


class Sink(Protocol):
    """Where a streaming sequence's events go (the HTTP response). Methods return False if the client is gone."""

    async def event(self, seq: Seq, sched_ns: int, start: int, ntok: int, final: bool) -> bool: ...

    async def error(self, seq: Seq, sched_ns: int) -> bool: ...


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "no", "prompt_ids", "prompt_tokens", "cached_tokens", "out_len", "finish_reason", "reasoning_tokens",
        "error_after", "arrival_ns", "admit_ns", "prefill_end_ns", "first_sched_ns", "first_write_ns",
        "last_sched_ns", "last_event_ns", "emitted", "events", "sink", "done", "state", "tpe_rng", "images",
        "tool_name",
    )

    def __init__(
        self,
        cfg: SimConfig,
        no: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        reasoning: bool,
        stream_error: bool,
        sink: Sink | None,
        images: int = 0,
        tool_name: str | None = None,
    ) -> None:
        self.no = no
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.cached_tokens = 0
        out_len, finish = output_length(cfg, no, max_tokens)
        self.out_len = out_len
        self.images = images
        self.tool_name = tool_name  # answers with a call of this tool (its output after the reasoning)
        self.finish_reason = "tool_calls" if tool_name is not None else finish
        self.reasoning_tokens = min(cfg.reasoning_tokens, out_len) if reasoning else 0
        # in-stream error: this many tokens go out, then the error replaces the next event
        self.error_after: int | None = min(cfg.error_after_tokens, out_len - 1) if stream_error else None
        self.arrival_ns = 0
        self.admit_ns: int | None = None
        self.prefill_end_ns: int | None = None
        self.first_sched_ns: int | None = None
        self.first_write_ns: int | None = None
        self.last_sched_ns: int | None = None
        self.last_event_ns: int | None = None
        self.emitted = 0
        self.events = 0
        self.sink = sink
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.state = "new"  # new, waiting, prefill, decode, finished, error, aborted
        choices = cfg.tokens_per_event_choices
        self.tpe_rng = random.Random(f"tpe/{cfg.seed}/{no}") if len(choices) > 1 else None

    def truth(self) -> dict[str, Any]:
        """The per-request record reported as ``sim_request``."""
        return {
            "request_no": self.no,
            "arrival_ns": self.arrival_ns,
            "admit_ns": self.admit_ns,
            "prefill_end_ns": self.prefill_end_ns,
            "first_sched_ns": self.first_sched_ns,
            "last_sched_ns": self.last_sched_ns,
            "events": self.events,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "images": self.images,
            "tool_call": self.tool_name is not None,
        }


def _finish(seq: Seq, state: str) -> None:
    seq.state = state
    if not seq.done.done():
        seq.done.set_result(state)


class Engine:
    """Scheduler state plus the global step loop (run ``await engine.run()`` as one task)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.stats = EngineStats()
        self.requests_seen = 0  # generation requests numbered in arrival order (1-based)
        self.waiting: deque[Seq] = deque()
        self.prefilling: list[tuple[int, int, Seq]] = []  # heap of (prefill_end_ns, no, seq)
        self.decoding: list[Seq] = []
        self.step_end: int | None = None  # end of the step in progress; None = idle
        self.step_batch: list[Seq] = []
        self._cache: set[int] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._choices = cfg.tokens_per_event_choices
        # per-step jitter: one standard normal per step from its own seeded stream (None when off: no draws at all)
        self._jitter = random.Random(f"jitter/{cfg.seed}") if cfg.step_jitter_pct > 0 else None

    # -- bookkeeping -------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def next_request_no(self) -> int:
        self.requests_seen += 1
        return self.requests_seen

    def _kick(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- admission -----------------------------------------------------------------------------------
    def submit(self, seq: Seq, arrival_ns: int) -> None:
        """Hand a request to the engine at time ``arrival_ns`` (perf_counter_ns, normally "now")."""
        if self._closed:
            _finish(seq, "aborted")
            return
        seq.arrival_ns = arrival_ns
        if not self.waiting and self.num_running < self.cfg.max_running:
            self._admit(seq, arrival_ns)
        else:
            seq.state = "waiting"
            self.waiting.append(seq)
        if self.step_end is None:
            self._kick()

    def _cache_lookup_insert(self, ids: list[int]) -> int:
        """Cached tokens for ``ids``; then remember all of its whole blocks."""
        b = self.cfg.prefix_block_tokens
        n = len(ids)
        nblocks = n // b
        self.stats.prefix_queries += n
        matched = 0
        h = 0
        hit = True
        for i in range(nblocks):
            h = hash((h, tuple(ids[i * b:(i + 1) * b])))
            if hit and h in self._cache:
                matched += 1
            else:
                hit = False
                self._cache.add(h)
        cached = min(matched, (n - 1) // b if n > 0 else 0) * b
        self.stats.prefix_hits += cached
        return cached

    def _admit(self, seq: Seq, t: int) -> None:
        cfg = self.cfg
        seq.admit_ns = t
        if cfg.prefix_cache:
            seq.cached_tokens = self._cache_lookup_insert(seq.prompt_ids)
        seq.prompt_ids = []  # not needed any more
        seq.prefill_end_ns = (t + encode_ns(cfg, seq.images)
                              + prefill_ns(cfg, seq.prompt_tokens - seq.cached_tokens, seq.prompt_tokens))
        seq.state = "prefill"
        self.stats.queue.observe((t - seq.arrival_ns) / 1e9)
        heapq.heappush(self.prefilling, (seq.prefill_end_ns, seq.no, seq))

    def _admit_waiting(self, t: int) -> None:
        while self.waiting and self.num_running < self.cfg.max_running:
            seq = self.waiting.popleft()
            if seq.state == "aborted":
                continue
            self._admit(seq, t)

    def abort(self, seq: Seq) -> None:
        """Drop a request (client gone); its slot frees at the next step boundary."""
        if seq.state == "waiting":
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
            _finish(seq, "aborted")
        elif seq.state in ("new", "prefill", "decode"):
            seq.state = "aborting"

    # -- the step loop --------------------------------------------------------------------------------
    def _start_step(self, t: int) -> None:
        """Form the step that starts at ``t``: decoding sequences plus those whose prefill ended by ``t``."""
        pf = self.prefilling
        while pf and pf[0][0] <= t:
            seq = heapq.heappop(pf)[2]
            if seq.state == "aborting":
                _finish(seq, "aborted")
                continue
            seq.state = "decode"
            self.stats.prompt_tokens += seq.prompt_tokens
            self.decoding.append(seq)
        if self.decoding:
            self.step_batch = list(self.decoding)
            dur = step_ns(self.cfg, len(self.step_batch))
            if self._jitter is not None:
                dur = round(dur * jitter_factor(self.cfg, self._jitter.gauss(0.0, 1.0)))
            self.step_end = t + dur
        else:
            self.step_batch = []
            self.step_end = None

    async def _end_step(self, t: int) -> None:
        """Emit every batch member's event for the step that ends at ``t``; retire finished sequences."""
        choices = self._choices
        finished = False
        for seq in self.step_batch:
            if seq.state != "decode":  # aborted meanwhile
                if seq.state == "aborting":
                    self.stats.success["abort"] += 1
                    _finish(seq, "aborted")
                finished = True
                continue
            k = choices[0] if seq.tpe_rng is None else seq.tpe_rng.choice(choices)
            if seq.error_after is not None and seq.emitted >= seq.error_after:
                await self._stream_error(seq, t)
                finished = True
                continue
            finished = await self._emit(seq, t, k) or finished
        if finished or any(s.state != "decode" for s in self.decoding):
            self.decoding = [s for s in self.decoding if s.state == "decode"]
        self._admit_waiting(t)

    async def _stream_error(self, seq: Seq, t: int) -> None:
        """The simulated in-stream error of ``seq`` at ``t``."""
        ok = True
        if seq.sink is not None:
            try:
                ok = await seq.sink.error(seq, t)
            except Exception:  # noqa: BLE001 - a broken client must not stop the loop
                ok = False
        self.stats.errors["stream"] = self.stats.errors.get("stream", 0) + 1
        seq.last_sched_ns = t
        _finish(seq, "error" if ok else "aborted")

    async def _emit(self, seq: Seq, t: int, k: int) -> bool:
        """One event of ``k`` tokens (fewer at the end) for ``seq`` at ``t``; True when ``seq`` is done."""
        stats, sink = self.stats, seq.sink
        limit = seq.out_len if seq.error_after is None else seq.error_after
        k = min(k, limit - seq.emitted)
        start = seq.emitted
        seq.emitted += k
        final = seq.emitted >= seq.out_len
        seq.events += 1
        if seq.first_sched_ns is None:
            seq.first_sched_ns = t
        prev, seq.last_sched_ns = seq.last_sched_ns, t
        ok = True
        if sink is not None:
            try:
                ok = await sink.event(seq, t, start, k, final)
            except Exception:  # noqa: BLE001
                log.exception("sim: writing an event failed")
                ok = False
        now = perf_counter_ns()
        if prev is None:
            if seq.first_write_ns is None:  # a sink records the exact write time itself
                seq.first_write_ns = now if sink is not None else t
            stats.ttft.observe((seq.first_write_ns - seq.arrival_ns) / 1e9)
        else:
            stats.itl.observe((t - prev) / 1e9)
        stats.generation_tokens += k
        if not ok:
            stats.success["abort"] += 1
            _finish(seq, "aborted")
            return True
        if final:
            stats.success[seq.finish_reason] = stats.success.get(seq.finish_reason, 0) + 1
            stats.e2e.observe(((now if sink is not None else t) - seq.arrival_ns) / 1e9)
            _finish(seq, "finished")
            return True
        return False

    async def _wait_until(self, deadline: int, interruptible: bool) -> bool:
        """Sleep until ``deadline`` (perf_counter_ns). Returns True if woken early by a new arrival."""
        loop = asyncio.get_running_loop()
        alarm = alarm_for(loop)
        while True:
            rem = deadline - perf_counter_ns()
            if rem <= 0:
                return False
            if alarm is not None and rem > _BUSY_NS:  # sleep on the timer (bench.sim.alarm) to _BUSY_NS before
                fut: asyncio.Future[None] = loop.create_future()
                if interruptible:
                    self._waiter = fut
                alarm.wake_at(deadline - _BUSY_NS, fut)
                try:
                    await fut
                finally:
                    self._waiter = None
                if interruptible and perf_counter_ns() < deadline - _BUSY_NS:
                    return True
                continue
            if rem > _SLEEP_MARGIN_NS:
                fut = loop.create_future()
                if interruptible:
                    self._waiter = fut
                h = loop.call_later((rem - _SLEEP_MARGIN_NS) / 1e9, _wake, fut)
                try:
                    await fut
                finally:
                    h.cancel()
                    self._waiter = None
                if interruptible and perf_counter_ns() < deadline - _SLEEP_MARGIN_NS:
                    return True
                continue
            if rem > _BUSY_NS:
                if interruptible:
                    self._waiter = loop.create_future()
                await asyncio.sleep(0)
                if interruptible:
                    w, self._waiter = self._waiter, None
                    if w is not None and w.done():
                        return True
                continue
            while perf_counter_ns() < deadline:
                pass
            return False

    async def _quiet_for(self, seconds: float | None) -> bool:
        """Wait until a request arrives or ``seconds`` pass (None: until a request arrives); True when none did."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = fut
        try:
            await asyncio.wait([fut], timeout=seconds)
        finally:
            self._waiter = None
        return not fut.done()

    async def run(self) -> None:
        """The global step loop. Never returns until cancelled."""
        while True:
            try:
                if self.step_end is not None:
                    t = self.step_end
                    if busy_due():  # rare (bench.sim.collector); the last step's writes go out first
                        await asyncio.sleep(0)
                        collect()
                    await self._wait_until(t, interruptible=False)
                    await self._end_step(t)
                    self._start_step(t)
                elif self.prefilling:
                    t = self.prefilling[0][0]
                    if await self._wait_until(t, interruptible=True):
                        continue
                    self._start_step(t)
                elif await self._quiet_for(IDLE_GRACE_S if idle_due() else None):
                    collect()  # idle for IDLE_GRACE_S: the full collection goes here (bench.sim.collector)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep serving; log the bug
                log.exception("sim: step loop error")
                await asyncio.sleep(0.001)

    def close(self) -> None:
        """Abort everything in flight (server shutdown)."""
        self._closed = True
        for seq in list(self.waiting):
            _finish(seq, "aborted")
        self.waiting.clear()
        for _, _, seq in self.prefilling:
            _finish(seq, "aborted")
        self.prefilling.clear()
        for seq in self.decoding:
            _finish(seq, "aborted")
        self.decoding.clear()
        self.step_batch = []
        self.step_end = None
        self._kick()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
