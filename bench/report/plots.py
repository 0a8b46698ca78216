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

from ..errors import ConfigError

__all__ = ["plot_results"]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'bench[plot]' (or pip install matplotlib)") from None
    return plt


def plot_results(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write the figures that the results' cells support; returns the paths written (possibly empty)."""
    plt = _plt()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = results.get("cells", [])
    title = f"{results.get('endpoint', {}).get('model')} ({results.get('profile', {}).get('name')})"
    written: list[Path] = []

    series: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        series[(c["depth"], c["prompt"])].append(c)
    multi = {k: sorted(v, key=lambda c: c["streams"]) for k, v in series.items() if len({c["streams"] for c in v}) > 1}
    if multi:
        fig, ax = plt.subplots(figsize=(8, 5))
        for (depth, prompt), cs in sorted(multi.items()):
            xs = [c["streams"] for c in cs]
            label = f"{prompt}, depth {depth}"
            med = [c["decode_tok_s"]["median"] for c in cs]
            ax.plot(xs, med, marker="o", label=f"per stream: {label}")
            lo = [c["decode_tok_s"]["p10"] for c in cs]
            hi = [c["decode_tok_s"]["p90"] for c in cs]
            if None not in lo and None not in hi:
                ax.fill_between(xs, lo, hi, alpha=0.15)
            ax.plot(xs, [c["aggregate_decode_tok_s"]["median"] for c in cs], marker="s", linestyle="--",
                    label=f"aggregate: {label}")
        ax.set_xscale("log", base=2)
        ticks = sorted({c["streams"] for cs in multi.values() for c in cs})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("decode tok/s")
        ax.set_title(f"Decode vs streams: {title}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        p = out / "decode_vs_streams.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written.append(p)

    one = sorted((c for c in cells if c["streams"] == 1 and c["depth"] > 0), key=lambda c: c["depth"])
    if one:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
        xs = [c["depth"] for c in one]
        labels = [f"{d // 1024}K" if d % 1024 == 0 else str(d) for d in xs]
        a1.plot(xs, [c["ttft_ms"]["median"] for c in one], marker="o", label="TTFT p50")
        a1.set_xlabel("prompt tokens (depth)")
        a1.set_ylabel("TTFT ms")
        a1.set_xscale("log", base=2)
        a1.set_xticks(xs, labels)
        a1.grid(True, alpha=0.3)
        a1b = a1.twinx()
        a1b.plot(xs, [c["prompt_tok_s"]["median"] for c in one], marker="s", color="tab:orange",
                 label="prompt tok/s (uncached / TTFT)")
        a1b.plot(xs, [c["prompt_tok_s_corrected"]["median"] for c in one], marker="^", color="tab:green",
                 linestyle=":", label="prompt tok/s, overhead-corrected")
        a1b.set_ylabel("prompt tok/s")
        h1, l1 = a1.get_legend_handles_labels()
        h2, l2 = a1b.get_legend_handles_labels()
        a1.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
        a1.set_title("Prefill")
        a2.plot(xs, [c["decode_tok_s"]["median"] for c in one], marker="o")
        a2.set_xscale("log", base=2)
        a2.set_xticks(xs, labels)
        a2.set_xlabel("prompt tokens (depth)")
        a2.set_ylabel("decode tok/s after the prompt (p50)")
        a2.grid(True, alpha=0.3)
        a2.set_title("Decode after a long prompt")
        fig.suptitle(title)
        fig.tight_layout()
        p = out / "depth.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written.append(p)
    return written
