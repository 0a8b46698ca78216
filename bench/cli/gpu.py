"""The GPU telemetry options of ``bench run`` (docs/gpu-telemetry.md) and the sampler they ask for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from bench.errors import ConfigError

__all__ = ["gpu_options", "GPU_KEYS", "pop_gpu_options", "no_gpu_in_open_loop", "gpu_sampler", "sampler_from_options",
           "no_gpu_options"]

GPU_KEYS = ("gpu_telemetry", "gpu_metrics", "gpu_interval", "gpu_devices")
_F = TypeVar("_F", bound=Callable[..., Any])


def gpu_options(f: Any) -> Any:
    """``--gpu-telemetry``, ``--gpu-metrics``, ``--gpu-interval``, ``--gpu-devices`` (values reach the command in
    its ``**extra``; :func:`pop_gpu_options` takes them out)."""
    f = click.option("--gpu-devices", metavar="LIST", default=None,
                     help="GPUs to sample, comma list of their labels (NVML index, or the exporter's gpu label); "
                     "default every GPU seen.")(f)
    f = click.option("--gpu-interval", type=click.FloatRange(min=0.01), default=None, metavar="SECONDS",
                     help="GPU sampling interval (default 0.1 s for NVML, 1 s for a DCGM exporter).")(f)
    f = click.option("--gpu-metrics", metavar="URL", default=None,
                     help="Scrape a DCGM exporter (its /metrics, e.g. http://gpu-host:9400/metrics) for the GPUs' "
                     "power, energy and clocks during each cell.")(f)
    f = click.option("--gpu-telemetry", type=click.Choice(["auto", "nvml", "off"]), default="auto",
                     show_default=True, help="GPU power, energy per token and clocks per cell through NVML "
                     "(nvidia-ml-py) on this host; auto: when NVML is present and the endpoint runs on this host.")(f)
    return f


def no_gpu_options(command: str) -> Callable[[_F], _F]:
    """Hidden ``--gpu-*`` flags for a command that does not sample GPUs yet: given, they are refused with one line
    saying so (exit 3), not click's bare "No such option"."""
    def refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            raise ConfigError(f"{command} does not sample GPUs yet: --{str(param.name).replace('_', '-')} applies "
                              "to bench run (concurrency cells) and bench gate")

    def deco(f: _F) -> _F:
        for key in GPU_KEYS:
            f = click.option(f"--{key.replace('_', '-')}", key, hidden=True, expose_value=False, default=None,
                             callback=refuse)(f)
        return f
    return deco


def pop_gpu_options(extra: dict[str, Any]) -> dict[str, Any]:
    """The GPU options, taken out of a command's ``**extra``."""
    return {k: extra.pop(k, None) for k in GPU_KEYS}


def no_gpu_in_open_loop(opts: dict[str, Any]) -> None:
    """Open-loop runs do not sample GPUs yet: refuse a GPU source asked for on purpose (auto stays quiet)."""
    if opts.get("gpu_metrics") or opts.get("gpu_telemetry") == "nvml":
        raise ConfigError("--gpu-metrics / --gpu-telemetry nvml: GPU figures are measured per concurrency cell; "
                          "open-loop runs (--rate, --trace, --sessions) do not sample GPUs yet")


@contextmanager
def gpu_sampler(opts: dict[str, Any], base_url: str, settings: Any = None) -> Iterator[Any]:
    """The GPU sampler the options ask for (:func:`sampler_from_options`), closed on exit; None when none."""
    sampler = sampler_from_options(opts, base_url, settings)
    try:
        yield sampler
    finally:
        if sampler is not None:
            sampler.close()


def sampler_from_options(opts: dict[str, Any], base_url: str, settings: Any = None) -> Any:
    """The GPU sampler (:func:`bench.server.gpu.make_sampler`) for the options of :func:`pop_gpu_options`, or None.
    ``settings``: the run's ClientSettings, whose TLS context (``--ca-bundle``, ``--insecure``) an https exporter
    is read with.

    Raises:
        ConfigError: a bad combination, NVML asked for where it is missing, a page that is no DCGM exporter's.
        EndpointUnreachable: ``--gpu-metrics`` does not answer.
    """
    from bench.server.gpu import make_sampler

    devices = [d.strip() for d in opts["gpu_devices"].split(",") if d.strip()] if opts["gpu_devices"] else None
    if opts["gpu_devices"] is not None and not devices:
        raise ConfigError("--gpu-devices: give a comma list of GPU labels, e.g. 0,1")
    url = opts["gpu_metrics"]
    if url is not None and not url.startswith(("http://", "https://")):
        raise ConfigError(f"--gpu-metrics {url}: give an http(s):// URL of a DCGM exporter's /metrics")
    ctx = settings.ssl_context() if settings is not None else None
    sampler = make_sampler(opts["gpu_telemetry"] or "auto", url, base_url, interval_s=opts["gpu_interval"],
                           devices=devices, verify=ctx if ctx is not None else True)
    if sampler is None and (devices or opts["gpu_interval"] is not None):
        _no_source_for(opts, base_url)
    return sampler


def _no_source_for(opts: dict[str, Any], base_url: str) -> None:
    """``--gpu-devices`` / ``--gpu-interval`` given where no GPU source samples: refused with ``--gpu-telemetry
    off``; with ``auto``, a note saying why nothing samples (they were silently ignored)."""
    from bench.report.console import say
    from bench.server.gpu import is_local_url

    flags = " / ".join(f for f, k in (("--gpu-devices", "gpu_devices"), ("--gpu-interval", "gpu_interval"))
                       if opts[k] is not None)
    if opts["gpu_telemetry"] == "off":
        raise ConfigError(f"{flags} with --gpu-telemetry off: nothing samples GPUs (drop one of them)")
    why = ("NVML sees no GPU on this host, or is not installed" if is_local_url(base_url)
           else "the endpoint is not on this host")
    say(f"note: no GPU source ({why}): {flags} ignored; --gpu-telemetry nvml or --gpu-metrics URL names one",
        soft_wrap=True)

