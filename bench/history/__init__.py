"""The run history: a store of every run (:mod:`bench.history.store`), change points over its series
(:mod:`bench.history.changepoints`) and the check of ``bench history check`` (:mod:`bench.history.check`)."""
