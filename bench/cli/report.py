"""``bench report`` (one self-contained HTML file of one or several runs) and the roofline options of ``bench run``.

:func:`roofline_options` adds ``--hardware``, ``--bandwidth``, ``--flops``, ``--model-params``, ``--weight-bits``,
``--active-params``, ``--kv-bytes-per-token``, ``--devices``, ``--layers``, ``--attn-dim`` to a command;
:func:`roofline_spec_from_options` turns their values into a :class:`bench.measure.roofline.RooflineSpec` (or None when
no roofline was asked for). The library code is :mod:`bench.measure.roofline` and :mod:`bench.report.html`.
"""

from __future__ import annotations

from typing import Any

import click

__all__ = ["report", "roofline_options", "roofline_spec_from_options", "ROOFLINE_KEYS"]

ROOFLINE_KEYS = ("hardware", "bandwidth", "flops", "model_params", "weight_bits", "active_params",
                 "kv_bytes_per_token", "devices", "layers", "attn_dim")


def roofline_options(f: Any) -> Any:
    """The roofline options (docs/roofline.md); values reach the command as the keyword arguments
    :data:`ROOFLINE_KEYS`."""
    opts = [
        click.option("--hardware", default=None, help="Accelerator from bench's table for the roofline: h200, "
                     "h100, h100-pcie, b200, gb10 (DGX Spark), rtx4090, rtx5090, m1..m4[-pro|-max|-ultra]."),
        click.option("--bandwidth", default=None, help="Memory bandwidth of one device for the roofline, e.g. "
                     "4.8TB/s (overrides --hardware's)."),
        click.option("--flops", default=None, help="Dense FLOP/s of one device, e.g. 989T (overrides --hardware's; "
                     "without any, no prefill limit)."),
        click.option("--model-params", default=None, help="Model parameters, e.g. 8b, 135m (default: what the "
                     "server reports, llama.cpp's n_params)."),
        click.option("--weight-bits", type=float, default=None, help="Bits per weight: 16 (F16/BF16), 8 (FP8), "
                     "about 4.5 for Q4_K_M; needed with --model-params."),
        click.option("--active-params", default=None, help="Parameters used per token (MoE), e.g. 3b "
                     "(default: all of them)."),
        click.option("--kv-bytes-per-token", default=None, help="KV-cache bytes per token of context, all layers, "
                     "e.g. 128KiB (Llama-3-8B F16: 2 x 32 layers x 8 KV heads x 128 x 2 B); default 0."),
        click.option("--devices", type=int, default=1, show_default=True, help="Devices with tensor parallelism "
                     "(bandwidth and FLOP/s summed, communication ignored)."),
        click.option("--layers", type=int, default=None, help="Transformer layers, for prefill's attention FLOPs."),
        click.option("--attn-dim", type=int, default=None, help="Attention width (heads x head size), for "
                     "prefill's attention FLOPs (default with --layers: the server's n_embd)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def roofline_spec_from_options(**kw: Any) -> Any:
    """A :class:`bench.measure.roofline.RooflineSpec` from the option values (other keywords are ignored), or None when
    neither ``--hardware`` nor ``--bandwidth`` was given. Raises ConfigError naming the flag on a bad value."""
    from bench.measure.roofline import build_spec

    return build_spec(hardware_name=kw.get("hardware"), bandwidth=kw.get("bandwidth"), flops=kw.get("flops"),
                      model_params=kw.get("model_params"), weight_bits=kw.get("weight_bits"),
                      active_params=kw.get("active_params"), kv_bytes_per_token=kw.get("kv_bytes_per_token"),
                      devices=1 if kw.get("devices") is None else int(kw["devices"]), layers=kw.get("layers"),
                      attn_dim=kw.get("attn_dim"))


@click.command()
@click.argument("inputs", nargs=-1, required=False, type=click.Path())
@click.option("-o", "--out", "out_file", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write, e.g. report.html (.html or .htm; never one of "
              "the inputs).")
@click.option("--title", default=None, help="Page title (default: the results folders' names).")
@click.option("--images", "images_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the main figures as PNG and SVG into this folder (kaleido + Chromium).")
@click.option("--history", "history_db", metavar="DB", default=None, help="Add trends over this run history "
              "(bench history; a file or postgresql://...): per cell and figure, change points, allowance band. "
              "Alone (no INPUTS), the page holds the trends only.")
def report(inputs: tuple[str, ...], out_file: str, title: str | None, images_dir: str | None,
           history_db: str | None) -> None:
    """Write one self-contained HTML report of one or several runs (opens offline; docs/report.md).

    INPUTS: results.json files (records.jsonl and capacity.json beside them are read), capacity.json, gate.json
    and ab.json files, or the folders bench run / capacity / gate / ab wrote (a folder means its results.json,
    else capacity.json, else ab.json with a/ and b/, else gate.json). Several results are drawn side by side.

    \b
    Examples:
      bench report bench-results/20261201-quick/results.json -o report.html
      bench report before/results.json after/results.json gate.json \\
          -o ab.html --images img/
      bench report cap/ -o capacity.html
          a bench capacity --out folder
      bench report --history bench-history.db -o trends.html
    """
    from pathlib import Path

    from bench.report.console import say
    from bench.report.html import check_out, write_images, write_report

    if not inputs and not history_db:
        raise click.UsageError("give results files, or --history DB, or both")
    check_out(out_file, inputs)  # never over a run's own files or a history store
    p = _history_report(history_db, inputs, out_file, title) if history_db else write_report(inputs, out_file, title)
    say(f"report: {p} ({Path(p).stat().st_size / 1e6:.1f} MB, opens offline)")
    if images_dir and inputs:
        for q in write_images(inputs, images_dir):
            click.echo(str(q))


def _history_report(db: str, inputs: tuple[str, ...], out_file: str, title: str | None) -> Any:
    """``bench report --history DB``: the trends page alone, or the report of INPUTS with the trends after it."""
    from bench.cli.history import open_existing, trend_views, trends_page
    from bench.report.html import require_plotly, write_report
    from bench.report.trends import trend_page, trend_section
    from bench.results import write_atomic

    require_plotly()
    with open_existing(db, "--history") as store:
        views = trend_views(store)  # one per setup (profile, model, endpoint): their series never mixed
        if not inputs:
            page = (trend_page(store, title) if len(views) == 1
                    else trends_page(views, title or f"bench trends: {store.where}"))
            return write_atomic(out_file, page)
        sections = [trend_section(v) for v in views]
    return write_report(inputs, out_file, title, extra_sections=sections)
