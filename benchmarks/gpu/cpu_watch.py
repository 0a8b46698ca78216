"""Run a command and sample its CPU time, so a client's CPU use can be read per cell afterwards.

usage: python cpu_watch.py OUT.json [--interval S] -- COMMAND...

Every ``interval`` seconds (default 0.2) it reads ``/proc/PID/stat`` of the command (user + system ticks) and the
CLOCK_MONOTONIC time, the clock behind Python's ``time.perf_counter_ns()`` on Linux, so the samples line up with
bench's record timestamps (``sent_ns`` etc.). Writes ``{"cmd", "clk_tck", "samples": [[t_ns, cpu_s], ...],
"wall_s", "cpu_s", "maxrss_kb", "rc"}`` and exits with the command's exit code. Linux only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


def _cpu_s(pid: int, tck: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / tck  # fields 14 (utime) and 15 (stime), counted from 1
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print(__doc__, file=sys.stderr)
        return 2
    sep = argv.index("--")
    out, opts, cmd = argv[0], argv[1:sep], argv[sep + 1:]
    interval = float(opts[opts.index("--interval") + 1]) if "--interval" in opts else 0.2
    tck = os.sysconf("SC_CLK_TCK")
    t0 = time.monotonic_ns()
    proc = subprocess.Popen(cmd)
    samples: list[list[float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            c = _cpu_s(proc.pid, tck)
            if c is not None:
                samples.append([time.monotonic_ns(), c])
            stop.wait(interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    except KeyboardInterrupt:
        proc.terminate()
        _, status, ru = os.wait4(proc.pid, 0)
    stop.set()
    th.join()
    samples.append([time.monotonic_ns(), ru.ru_utime + ru.ru_stime])  # the total, at exit
    rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc
    doc = {"cmd": cmd, "clk_tck": tck, "interval_s": interval, "samples": samples,
           "wall_s": (time.monotonic_ns() - t0) / 1e9, "cpu_s": ru.ru_utime + ru.ru_stime,
           "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "maxrss_kb": ru.ru_maxrss, "rc": rc}
    with open(out, "w") as fh:
        json.dump(doc, fh)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
