"""Plots of a results document (matplotlib, an optional dependency: ``pip install 'bench[plot]'``).

Two figures, written as PNG files:
- ``decode_vs_streams.png``: per-stream (p50, with the p10-p90 band) and aggregate decode tok/s against the number
  of concurrent streams, one line per depth and prompt type;
- ``depth.png``: TTFT p50 and prompt tok/s (uncached prompt tokens / TTFT, and overhead-corrected) against depth,
  with decode tok/s after the prompt, at one stream.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.results import CellResult, Results

__all__ = ["plot_results"]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'bench[plot]' (or pip install matplotlib)") from None
    return plt


def plot_results(results: Results, out_dir: str | Path) -> list[Path]:
    """Write the figures that the results' cells support; returns the paths written (possibly empty)."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{results.endpoint.model} ({results.profile.name})"
    written = [_streams_figure(plt, results.cells, title, out / "decode_vs_streams.png"),
               _depth_figure(plt, results.cells, title, out / "depth.png")]
    return [p for p in written if p is not None]


def _streams_figure(plt: Any, cells: list[CellResult], title: str, path: Path) -> Path | None:
    series: dict[tuple[int, str], list[CellResult]] = defaultdict(list)
    for c in cells:
        series[(c.depth, c.prompt)].append(c)
    multi = {k: sorted(v, key=lambda c: c.streams) for k, v in series.items() if len({c.streams for c in v}) > 1}
    if not multi:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for (depth, prompt), cs in sorted(multi.items()):
        xs = [c.streams for c in cs]
        label = f"{prompt}, depth {depth}"
        ax.plot(xs, [c.stat("decode_tok_s") for c in cs], marker="o", label=f"per stream: {label}")
        lo = [c.stat("decode_tok_s", "p10") for c in cs]
        hi = [c.stat("decode_tok_s", "p90") for c in cs]
        if None not in lo and None not in hi:
            ax.fill_between(xs, lo, hi, alpha=0.15)
        ax.plot(xs, [c.stat("aggregate_decode_tok_s") for c in cs], marker="s", linestyle="--",
                label=f"aggregate: {label}")
    ax.set_xscale("log", base=2)
    ticks = sorted({c.streams for cs in multi.values() for c in cs})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"Decode vs streams: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _depth_figure(plt: Any, cells: list[CellResult], title: str, path: Path) -> Path | None:
    one = sorted((c for c in cells if c.streams == 1 and c.depth > 0 and not c.load), key=lambda c: c.depth)
    if not one:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = [c.depth for c in one]
    labels = [f"{d // 1024}K" if d % 1024 == 0 else str(d) for d in xs]
    a1.plot(xs, [c.stat("ttft_ms") for c in one], marker="o", label="TTFT p50")
    a1.set_xlabel("prompt tokens (depth)")
    a1.set_ylabel("TTFT ms")
    a1b = a1.twinx()
    a1b.plot(xs, [c.stat("prompt_tok_s") for c in one], marker="s", color="tab:orange",
             label="prompt tok/s (uncached / TTFT)")
    a1b.plot(xs, [c.stat("prompt_tok_s_corrected") for c in one], marker="^", color="tab:green",
             linestyle=":", label="prompt tok/s, overhead-corrected")
    a1b.set_ylabel("prompt tok/s")
    h1, l1 = a1.get_legend_handles_labels()
    h2, l2 = a1b.get_legend_handles_labels()
    a1.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    a1.set_title("Prefill")
    a2.plot(xs, [c.stat("decode_tok_s") for c in one], marker="o")
    a2.set_xlabel("prompt tokens (depth)")
    a2.set_ylabel("decode tok/s after the prompt (p50)")
    a2.set_title("Decode after a long prompt")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, labels)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
