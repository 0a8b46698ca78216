"""Command line of the sim: ``python -m bench.sim [--config FILE] [--FIELD VALUE ...]`` (also ``bench sim``)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import sys
from typing import Any, NoReturn

from bench.sim.config import ERROR_KINDS, FIELD_HELP, REASONING_FIELDS, SimConfig, load_config
from bench.sim.runner import serve

__all__ = ["main", "build_parser", "config_from_args", "EXIT_BAD_INPUT"]

EXIT_BAD_INPUT = 3  # a bad flag or config, as every bench command (bench.errors.EXIT_BAD_INPUT; the sim imports no bench)


def _tokens_per_event(s: str) -> int | tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in s.replace(" ", "").split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or comma-separated ints, got {s!r}") from None
    if not parts:
        raise argparse.ArgumentTypeError("empty tokens_per_event")
    return parts[0] if len(parts) == 1 else parts


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage itself is in --help) and exits 3, bench's bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (--help lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bench sim",
        description="Reference OpenAI-compatible serving engine with exactly known timing (docs/sim.md). "
        "Flags override values from --config.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML parameter file (see profiles/sim-default.toml)")
    for f in dataclasses.fields(SimConfig):
        unit, help_ = FIELD_HELP[f.name]
        flags = [f"--{f.name.replace('_', '-')}"]
        if "_" in f.name and not isinstance(f.default, bool):
            flags.append(f"--{f.name}")  # underscore spelling accepted too
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{help_} [{unit}; default {f.default!r}]".replace("%", "%%")}
        # short metavars: each flag is listed in its two spellings, and the help fits 80 columns
        if f.name == "tokens_per_event":
            kw.update(type=_tokens_per_event, metavar="K[,K...]")
        elif f.name in ("error_kind", "reasoning_field"):
            names = ERROR_KINDS if f.name == "error_kind" else REASONING_FIELDS
            kw.update(choices=names, metavar="NAME")  # the help's unit field lists the names
        elif isinstance(f.default, bool):
            kw.update(action=argparse.BooleanOptionalAction)
        elif isinstance(f.default, int):
            kw.update(type=int, metavar="N")
        elif isinstance(f.default, float):
            kw.update(type=float, metavar="X")
        p.add_argument(*flags, **kw)
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    base = load_config(args.config) if getattr(args, "config", None) else SimConfig()
    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimConfig) if hasattr(args, f.name)}
    return dataclasses.replace(base, **changes)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default sys.argv[1:]), start the sim and serve until interrupted. Returns an exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except (ValueError, OSError) as e:
        said = f"--config {e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
        print(f"bench sim: {said}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not 0 <= cfg.port <= 65535:
        print(f"bench sim: --port {cfg.port} is out of range (0-65535; 0 picks a free port)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        serve(cfg)
    except OSError as e:
        why = e.strerror or str(e)
        cure = ("--host: an address of this machine, e.g. 127.0.0.1" if e.errno == errno.EADDRNOTAVAIL
                else "another --port, or --port 0 for a free one")
        print(f"bench sim: cannot listen on {cfg.host}:{cfg.port}: {why} ({cure})", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
