"""The run history: a store of every run (:mod:`bench.history.store`), change points over its series
(:mod:`bench.history.changepoints`) and the check of ``bench history check`` (:mod:`bench.history.check`)."""

__all__ = ["runs_text"]


def runs_text(n: int) -> str:
    """``1 run``, ``3 runs``: a count of stored runs as history's messages print it."""
    return f"{n} run" if n == 1 else f"{n} runs"
