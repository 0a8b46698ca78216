"""Test hosts for people: the namespaces, Ray cluster and sim of tests/hosts.py, kept up for a command or until
Ctrl-C, then torn down (needs root and ``pip install -e '.[ray]'``).

    sudo .venv/bin/python benchmarks/hosts.py                       # prints the addresses, waits for Ctrl-C
    sudo .venv/bin/python benchmarks/hosts.py -- bench run {sim} --ray {ray} --workers 3 --streams 6 --out /tmp/r

In the command, ``{sim}`` is the sim's base URL (on the host's bridge address), ``{ray}`` the head's address and
``{host}`` the host's bridge address; the command runs on the host (the driver's side) and its exit code is this
script's. ``--nodes N`` namespaces (the head in the first), ``--cpus C`` CPUs each offers, ``--sim-flag k=v``
(repeatable) sets a sim flag (default: 20 ms decode steps, 1M tok/s prefill).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.hosts import Hosts, HostsUnavailable  # noqa: E402  (the repository root is on sys.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3, help="namespaces (the Ray head in the first) [3]")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs each namespace's Ray node offers [1]")
    ap.add_argument("--sim-flag", action="append", default=[], metavar="K=V", help="a bench sim flag (repeatable)")
    ap.add_argument("--no-ray", action="store_true", help="namespaces and the sim only")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...: run it, then tear down")
    args = ap.parse_args(argv)
    flags: dict[str, object] = {"decode_step_ms": 20.0, "prefill_tok_s": 1e6}
    for kv in args.sim_flag:
        k, sep, v = kv.partition("=")
        if not sep:
            print(f"hosts: --sim-flag needs K=V, got {kv!r}", file=sys.stderr)
            return 2
        flags[k.replace("-", "_")] = v
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    h = Hosts(args.nodes, ray=not args.no_ray, sim_flags=flags, num_cpus=args.cpus)
    try:
        h.start()
    except HostsUnavailable as e:
        print(f"hosts: {e}", file=sys.stderr)
        return 3
    try:
        print(f"host (driver, sim) {h.host_ip}; namespaces " + ", ".join(f"{n} {ip}" for n, ip in zip(h.ns, h.ips)))
        print(f"sim   {h.sim_url}")
        if h.ray_address:
            print(f"ray   {h.ray_address}  (head in {h.ns[0]}; the host runs a --num-cpus 0 node for the driver)")
            print(f"try   bench run {h.sim_url} --ray {h.ray_address} --workers {args.nodes} --streams 6")
        sys.stdout.flush()
        if cmd:
            subst = {"sim": h.sim_url, "ray": h.ray_address, "host": h.host_ip}
            argv2 = [a.format(**subst) for a in cmd]
            print("run   " + shlex.join(argv2), flush=True)
            return subprocess.run(argv2).returncode
        print("up; Ctrl-C tears it down", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    finally:
        h.close()
        print("torn down", file=sys.stderr)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # torn down on SIGTERM as on Ctrl-C
    sys.exit(main())
