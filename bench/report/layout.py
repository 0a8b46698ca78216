"""Plain-text layout for narrow terminals: ``label: value`` fields packed into lines (the stacked tables of
:mod:`bench.report.export` and :mod:`bench.report.verdicts`)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

__all__ = ["pack_fields"]


def pack_fields(fields: Sequence[tuple[str, str]], width: int, *, split_long: bool = False) -> list[str]:
    """``label: value`` fields for a narrow terminal, joined with ``; `` and wrapped between fields, each line
    indented by two. A field wider than ``width`` stands on its own line whole, or with ``split_long`` has its
    label on one line and its value under it, wrapped at spaces (never inside a number)."""
    out: list[str] = []
    line = ""
    for h, v in fields:
        field = f"{h}: {v}"
        if line and len(line) + 2 + len(field) <= width:
            line += "; " + field
            continue
        if line:
            out.append(line)
        line = "  " + field
        if split_long and len(line) > width:
            out += textwrap.wrap(f"{h}:", width, initial_indent="  ", subsequent_indent="  ")
            out += textwrap.wrap(v, width, initial_indent="    ", subsequent_indent="    ", break_long_words=False)
            line = ""
    if line:
        out.append(line)
    return out
