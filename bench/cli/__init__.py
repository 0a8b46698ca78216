"""The ``bench`` command line: click only (parse, call the library, print). Entry point: :func:`main`."""

from bench.cli.app import main

__all__ = ["main"]
