"""bench.client.turns: bursts of per-request work spread over event-loop iterations.

The clock is a fake one that each task's "work" advances, so what is checked does not depend on this machine's
speed: how many turns go per loop iteration (counted by a callback that re-schedules itself once per
iteration), that every waiter goes, in order, and that cancelled waiters are skipped.
"""

from __future__ import annotations

import asyncio

from bench.client.turns import Turns, take_turn


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def _iterations(counter: list[int], stop: asyncio.Event) -> None:
    """Counts loop iterations: a callback that re-schedules itself runs once per iteration."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        counter[0] += 1
        if not stop.is_set():
            loop.call_soon(tick)

    loop.call_soon(tick)


def _burst(n: int, work_s: float, slice_s: float = 0.001) -> tuple[list[int], list[int], Turns]:
    """``n`` tasks ready at once, each taking a turn and then doing ``work_s`` of (fake) work. Returns the order
    they went in and the loop iteration each went in."""
    clock = FakeClock()
    order: list[int] = []
    went_at: list[int] = []

    async def main() -> Turns:
        turns = Turns(asyncio.get_running_loop(), slice_s=slice_s, clock=clock)
        counter, stop = [0], asyncio.Event()
        await _iterations(counter, stop)

        async def one(i: int) -> None:
            await turns.turn()
            order.append(i)
            went_at.append(counter[0])
            clock.t += work_s

        await asyncio.gather(*(one(i) for i in range(n)))
        stop.set()
        return turns

    turns = asyncio.run(main())
    return order, went_at, turns


def test_a_burst_goes_in_slices_and_in_order() -> None:
    order, went_at, turns = _burst(200, work_s=0.0003)
    assert order == list(range(200))  # first come, first served
    per_iter: dict[int, int] = {}
    for it in went_at:
        per_iter[it] = per_iter.get(it, 0) + 1
    # 1 ms slices of 0.3 ms pieces: the first iteration lets 4 go (0, 0.3, 0.6, 0.9 ms), later ones a batch that
    # doubles while an iteration took less than a slice and halves when it took more: never more than 2 slices
    assert max(per_iter.values()) <= 7
    assert len(per_iter) >= 200 * 0.0003 / 0.002  # the work was spread over many iterations
    assert turns.waited == 196 and not turns.queue


def test_small_work_is_not_held_back() -> None:
    order, went_at, turns = _burst(16, work_s=0.00001)  # 16 x 10 µs: well within one slice
    assert order == list(range(16)) and len(set(went_at)) == 1 and turns.waited == 0


def test_cancelled_waiters_are_skipped() -> None:
    clock = FakeClock()

    async def main() -> list[int]:
        turns = Turns(asyncio.get_running_loop(), clock=clock)
        went: list[int] = []

        async def one(i: int) -> None:
            await turns.turn()
            went.append(i)
            clock.t += 0.002  # each piece is longer than a slice: one per iteration after the first

        tasks = [asyncio.ensure_future(one(i)) for i in range(6)]
        await asyncio.sleep(0)
        tasks[3].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return went

    assert asyncio.run(main()) == [0, 1, 2, 4, 5]


def test_take_turn_lets_a_lone_caller_go_at_once() -> None:
    """One request at a time (the common small run) never waits, and each loop has its own turns."""
    from bench.client import turns as mod

    async def main() -> Turns:
        for _ in range(5):
            await take_turn()
            await asyncio.sleep(0.002)  # more than a slice between two callers
        return mod._turns[asyncio.get_running_loop()]

    a, b = asyncio.run(main()), asyncio.run(main())
    assert a is not b and a.waited == 0 and b.waited == 0


def test_the_batch_follows_its_own_work_not_the_reads_around_it() -> None:
    """Each iteration also spends 5 ms on other callbacks (the reads of streams already running): the batch still
    grows to about a slice of its own work (0.1 ms pieces), instead of falling to one turn per iteration."""
    clock = FakeClock()
    went_at: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        turns = Turns(loop, clock=clock)
        counter, done = [0], asyncio.Event()

        def reads() -> None:  # one per iteration, after the batch
            counter[0] += 1
            clock.t += 0.005
            if not done.is_set():
                loop.call_soon(reads)

        loop.call_soon(reads)

        async def one() -> None:
            await turns.turn()
            went_at.append(counter[0])
            clock.t += 0.0001

        await asyncio.gather(*(one() for _ in range(200)))
        done.set()

    asyncio.run(main())
    per_iter: dict[int, int] = {}
    for it in went_at:
        per_iter[it] = per_iter.get(it, 0) + 1
    assert len(went_at) == 200 and len(per_iter) < 40  # one per iteration would take 190 or more
    assert max(per_iter.values()) <= 2 * 10 + 1  # about a slice (10 pieces), never two


def test_a_scheduled_send_goes_at_once_and_its_end_takes_a_turn() -> None:
    """Sends of an open-loop schedule (scheduled_task) never queue behind a burst; their ends do, and sends of a
    plain task (a wave) do."""
    import time

    from bench.client import turns as T

    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        t = T._turns[loop] = Turns(loop, slice_s=0.001)
        t.started = time.perf_counter() - 1.0  # this iteration's slice is spent: a waiting caller queues

        async def send_then_end() -> tuple[int, int]:
            await take_turn(send=True)
            at_send = t.waited
            await take_turn()
            return at_send, t.waited

        sched = T.scheduled_task(send_then_end())
        (at_send, after_end) = await sched
        t.started = time.perf_counter() - 1.0
        waited_before = t.waited
        await asyncio.create_task(take_turn(send=True))
        return at_send, after_end, t.waited - waited_before

    at_send, after_end, wave_send = asyncio.run(main())
    assert at_send == 0  # the scheduled send did not queue
    assert after_end == 1  # its end did
    assert wave_send == 1  # a wave's send does
