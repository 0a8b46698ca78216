"""Open-loop load: arrival schedules, request sizes, trace replay, SLOs and goodput, the open-loop executor and the
capacity search (docs/load.md).

Pure parts (:mod:`.arrivals`, :mod:`.sizes`, :mod:`.traces`, :mod:`.slo`) build or judge plans and records and do
no I/O beyond reading the files they are given; :mod:`.openloop` sends a plan through a
:class:`bench.session.endpoint.Session`; :mod:`.capacity` searches the highest load at which the SLOs hold.
"""
