"""GPU telemetry around each measured window: power, energy, clocks, utilisation, memory, temperature, throttling.

Two samplers, one interface (docs/gpu-telemetry.md):

* :class:`NvmlSampler`: the GPUs of this host through NVIDIA's bindings (``nvidia-ml-py``, module ``pynvml``);
  for an endpoint served on this host. Default interval 100 ms.
* :class:`DcgmSampler`: a DCGM exporter's Prometheus page (``DCGM_FI_DEV_POWER_USAGE``,
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, ``DCGM_FI_DEV_SM_CLOCK``...), parsed with the parser of
  :mod:`bench.server.metrics`; for GPUs elsewhere. Default interval 1 s (the exporter refreshes its values every
  ``-c`` ms itself, 30 s by default: sampling it faster only repeats them).

Each samples in a thread of its own at a fixed interval (never in the event loop that stamps the streams)::

    sampler.begin()                 # before a cell's first measured wave: one reading, then the thread starts
    ...
    samples = sampler.end()         # after its last: the thread stops, one more reading; the window's samples
    cell.gpu = summarize_gpu([samples], output_tokens=...)   # bench.measure.gpu

A reading that fails is skipped (``failed`` counts them); the summary is built from those that came.
"""

from __future__ import annotations

import importlib
import ipaddress
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.errors import ConfigError, EndpointUnreachable
from bench.server.metrics import Page, parse_page

__all__ = ["GpuSample", "GpuSampler", "NvmlSampler", "DcgmSampler", "make_sampler", "nvml_module", "is_local_url",
           "dcgm_samples", "NVML_INTERVAL_S", "DCGM_INTERVAL_S", "DCGM_SERIES"]

NVML_INTERVAL_S = 0.1
DCGM_INTERVAL_S = 1.0

# GpuSample field -> (DCGM exporter series, factor to the field's unit)
DCGM_SERIES: dict[str, tuple[tuple[str, float], ...]] = {
    "power_w": (("DCGM_FI_DEV_POWER_USAGE", 1.0),),
    "energy_j": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),),  # mJ
    "sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", 1.0),),
    "mem_clock_mhz": (("DCGM_FI_DEV_MEM_CLOCK", 1.0),),
    "util_pct": (("DCGM_FI_DEV_GPU_UTIL", 1.0),),
    "mem_used_mib": (("DCGM_FI_DEV_FB_USED", 1.0),),
    "temp_c": (("DCGM_FI_DEV_GPU_TEMP", 1.0),),
    "reasons": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0)),
}


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. ``t_s`` on ``time.monotonic()`` (the readings of one pass over the GPUs share it);
    any figure the GPU or the exporter does not give is None. :mod:`bench.measure.gpu` summarizes them."""

    t_s: float
    gpu: str
    power_w: float | None = None
    energy_j: float | None = None  # the GPU's energy counter (since driver load or boot), joules
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    temp_c: float | None = None
    reasons: int | None = None  # clock event reasons, NVML's bit mask


class GpuSampler:
    """Samples every GPU it knows on a fixed interval in a thread, between :meth:`begin` and :meth:`end`.

    Subclasses give :meth:`read` (one pass over the GPUs) and :attr:`info` (per GPU label: name, uuid, host).
    ``devices``: labels to keep (None: every GPU seen).
    """

    source = ""

    def __init__(self, interval_s: float, devices: Sequence[str] | None = None) -> None:
        self.interval_s = interval_s
        self.auto = False  # chosen by --gpu-telemetry auto: cells where no GPU worked get no figures
        self.devices = set(devices) if devices else None
        self.info: dict[str, dict[str, Any]] = {}
        self.failed = 0
        self._samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> list[GpuSample]:
        """One reading of every GPU (all stamped with one ``time.monotonic()``)."""
        raise NotImplementedError

    def check_devices(self, seen: Sequence[str], where: str) -> None:
        """ConfigError when ``--gpu-devices`` names a GPU ``where`` does not have (its figures would silently be
        missing), naming the labels it has."""
        missing = sorted((self.devices or set()) - set(seen))
        if missing:
            have = ", ".join(sorted(seen)) or "none"
            raise ConfigError(f"--gpu-devices {','.join(missing)}: no such GPU at {where} (it has: {have})")

    def take(self) -> None:
        """One reading, kept (a failure is counted and skipped)."""
        try:
            got = self.read()
        except Exception:  # noqa: BLE001 - a reading that fails loses one sample, never the run
            self.failed += 1
            return
        self._samples += [s for s in got if self.devices is None or s.gpu in self.devices]

    def _loop(self) -> None:
        t0 = time.monotonic()
        k = 1
        while not self._stop.wait(max(0.0, t0 + k * self.interval_s - time.monotonic())):
            self.take()
            k = max(k + 1, int((time.monotonic() - t0) / self.interval_s) + 1)  # a slow read skips, never bunches

    def begin(self) -> None:
        """Start a window: one reading now, then one every ``interval_s`` in the sampling thread."""
        self._halt()
        self._samples = []
        self.take()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"bench-gpu-{self.source}", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def end(self) -> list[GpuSample]:
        """End the window: stop the thread, one more reading; the window's samples."""
        self._halt()
        self.take()
        out, self._samples = self._samples, []
        return out

    def close(self) -> None:
        """Stop sampling and release what the sampler holds (idempotent)."""
        self._halt()


# ---- NVML ---------------------------------------------------------------------------------------------------------


def nvml_module() -> Any | None:
    """``pynvml`` (from ``nvidia-ml-py``) initialised, or None when it is not installed or finds no driver."""
    try:
        nv = importlib.import_module("pynvml")
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...: no NVML here
        return None
    return nv


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSampler(GpuSampler):
    """This host's GPUs through NVML. ``nvml``: an initialised ``pynvml``-like module (tests pass a fake one).

    Figures a GPU does not support (``NVMLError``) are left out for that GPU after the first try.
    """

    source = "nvml"

    def __init__(self, nvml: Any, interval_s: float = NVML_INTERVAL_S, devices: Sequence[str] | None = None) -> None:
        super().__init__(interval_s, devices)
        self.nv = nvml
        self.handles = [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        self._off: set[tuple[str, str]] = set()
        # the reasons call's new name first (drivers from 535 on), its old one where the driver lacks the new one
        reasons = [f for f in (getattr(nvml, n, None) for n in ("nvmlDeviceGetCurrentClocksEventReasons",
                                                                  "nvmlDeviceGetCurrentClocksThrottleReasons")) if f]
        self._calls: dict[str, Any] = {
            "power_w": self._power_w,
            "energy_j": lambda h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,  # mJ
            "sm_clock_mhz": lambda h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": lambda h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            "util_pct": lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_used_mib": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            "temp_c": lambda h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
        }
        if reasons:
            self._calls["reasons"] = lambda h: self._first(reasons, h)
        for label, h in self.handles:
            self.info[label] = {"name": self._get(label, "name", lambda x: _text(nvml.nvmlDeviceGetName(x)), h),
                                "uuid": self._get(label, "uuid", lambda x: _text(nvml.nvmlDeviceGetUUID(x)), h)}

    def _power_w(self, h: Any) -> float:
        """Instantaneous board power (``NVML_FI_DEV_POWER_INSTANT``) where the driver has it: on Ampere and newer
        ``nvmlDeviceGetPowerUsage`` is a 1-second average, which lags every change of load and made the integrated
        power disagree with the energy counter by 2.6-17.8 % on the H200
        (benchmarks/results/gpu-energy-2026-12-02-h200.md); else that average."""
        nv = self.nv
        fid = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if fid is not None and hasattr(nv, "nvmlDeviceGetFieldValues") and ("", "instant") not in self._off:
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
                if v.nvmlReturn == 0:
                    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(v.valueType)
                    if kind is not None:
                        return float(getattr(v.value, kind)) / 1000.0  # mW
            except nv.NVMLError:
                pass
            self._off.add(("", "instant"))  # not answered: the average from now on
        return float(nv.nvmlDeviceGetPowerUsage(h)) / 1000.0  # mW

    def _first(self, calls: Sequence[Any], h: Any) -> int:
        """The first of ``calls`` that answers (an ``NVMLError`` of the last one is raised)."""
        for call in calls[:-1]:
            try:
                return int(call(h))
            except self.nv.NVMLError:
                pass
        return int(calls[-1](h))

    def _get(self, label: str, key: str, call: Any, h: Any) -> Any:
        if (label, key) in self._off:
            return None
        try:
            return call(h)
        except self.nv.NVMLError:
            self._off.add((label, key))  # not supported here (or lost): not asked again
            return None

    def read(self) -> list[GpuSample]:
        t = time.monotonic()
        return [GpuSample(t, label, **{k: self._get(label, k, c, h) for k, c in self._calls.items()})
                for label, h in self.handles]

    def close(self) -> None:
        super().close()
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down twice, or a driver gone: nothing left to release
            pass


# ---- DCGM exporter ------------------------------------------------------------------------------------------------


def _gpu_key(labels: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    d = dict(labels)
    gpu = d.get("gpu")
    return (d.get("Hostname", ""), gpu) if gpu is not None else None


def dcgm_samples(page: Page, t_s: float) -> tuple[list[GpuSample], dict[str, dict[str, Any]]]:
    """The samples of one DCGM exporter page (one per GPU, labelled by its ``gpu`` label, ``host/gpu`` when the
    page has several hosts) and what the labels say of each GPU. Pure."""
    fields: dict[tuple[str, str], dict[str, Any]] = {}
    info: dict[tuple[str, str], dict[str, Any]] = {}
    for field, names in DCGM_SERIES.items():
        for name, factor in names:
            got = False
            for labels, v in page.get(name, ()):
                key = _gpu_key(labels)
                if key is None:
                    continue
                got = True
                d = dict(labels)
                info.setdefault(key, {"name": d.get("modelName"), "uuid": d.get("UUID"), "host": d.get("Hostname")})
                fields.setdefault(key, {}).setdefault(field, int(v) if field == "reasons" else v * factor)
            if got:
                break
    hosts = {h for h, _ in fields}
    label = (lambda k: f"{k[0]}/{k[1]}") if len(hosts) > 1 else (lambda k: k[1])
    samples = [GpuSample(t_s, label(k), **f) for k, f in fields.items()]
    return samples, {label(k): {x: y for x, y in v.items() if y} for k, v in info.items()}


class DcgmSampler(GpuSampler):
    """A DCGM exporter's page at ``url``, scraped in the sampling thread (its own HTTP client)."""

    source = "dcgm"

    def __init__(self, url: str, interval_s: float = DCGM_INTERVAL_S, devices: Sequence[str] | None = None,
                 client: httpx.Client | None = None, verify: Any = True) -> None:
        super().__init__(interval_s, devices)
        self.url = url
        self.client = client or httpx.Client(timeout=httpx.Timeout(max(2.0, 2 * interval_s), connect=5.0),
                                             verify=verify)

    def fetch(self) -> Page:
        """The exporter's page, parsed. Raises httpx.HTTPError or ValueError when it does not come or parse."""
        r = self.client.get(self.url, headers={"Accept": "text/plain"})
        r.raise_for_status()
        return parse_page(r.text)

    def read(self) -> list[GpuSample]:
        page = self.fetch()
        samples, info = dcgm_samples(page, time.monotonic())
        self.info.update(info)
        return samples

    def check(self) -> None:
        """Scrape once before the run: the URL must answer with DCGM exporter text carrying power.

        Raises:
            EndpointUnreachable: nothing answers at the URL.
            ConfigError: it answers, but not with a DCGM exporter page (or one without ``DCGM_FI_DEV_POWER_USAGE``).
        """
        try:
            page = self.fetch()
        except httpx.TransportError as e:
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise EndpointUnreachable(f"--gpu-metrics {self.url}: no answer ({why})") from None
        except httpx.HTTPStatusError as e:
            raise ConfigError(f"--gpu-metrics {self.url}: HTTP {e.response.status_code}") from None
        except ValueError:
            raise ConfigError(f"--gpu-metrics {self.url}: not Prometheus text (give the DCGM exporter's /metrics, "
                              "e.g. http://host:9400/metrics)") from None
        samples, _ = dcgm_samples(page, time.monotonic())
        if not any(s.power_w is not None for s in samples):
            raise ConfigError(f"--gpu-metrics {self.url}: no DCGM_FI_DEV_POWER_USAGE series with a gpu label (is it a "
                              "DCGM exporter?)")
        self.check_devices([s.gpu for s in samples], self.url)

    def close(self) -> None:
        super().close()
        self.client.close()


# ---- choosing -----------------------------------------------------------------------------------------------------


def is_local_url(url: str) -> bool:
    """Whether ``url``'s host is this machine: loopback, this host's name, or an address this host's name resolves
    to (a GPU sampled through NVML here is then the endpoint's)."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if not host:
        return False
    try:
        if ipaddress.ip_address(host).is_loopback or host == "0.0.0.0":
            return True
    except ValueError:
        if host in ("localhost", socket.gethostname(), socket.getfqdn()):
            return True
    try:
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
        theirs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(mine & theirs) or any(ipaddress.ip_address(a).is_loopback for a in theirs)


def make_sampler(mode: str, metrics_url: str | None, base_url: str, *, interval_s: float | None = None,
                 devices: Sequence[str] | None = None, nvml: Any = None, verify: Any = True) -> GpuSampler | None:
    """The sampler the flags ask for (``--gpu-telemetry nvml|off|auto``, ``--gpu-metrics URL``), or None.

    ``--gpu-metrics`` wins over auto (a DCGM exporter named on purpose); ``auto`` samples NVML only when NVML is
    present and the endpoint runs on this host (:func:`is_local_url`), and its cells where no GPU worked get no
    figures (a local endpoint that does not use the GPUs: bench's sim, a CPU build). ``nvml``: the module to use;
    ``verify``: the exporter's TLS verification (the run's ``--ca-bundle`` / ``--insecure`` context).

    Raises:
        ConfigError: ``nvml`` asked for where NVML is missing, both flags at once, a bad exporter page.
        EndpointUnreachable: the exporter does not answer.
    """
    if metrics_url and mode == "nvml":
        raise ConfigError("--gpu-telemetry nvml and --gpu-metrics both given: choose one source of GPU figures")
    if metrics_url:
        d = DcgmSampler(metrics_url, interval_s or DCGM_INTERVAL_S, devices, verify=verify)
        try:
            d.check()
        except BaseException:
            d.close()
            raise
        return d
    if mode == "off" or (mode == "auto" and not is_local_url(base_url)):
        return None
    nv = nvml if nvml is not None else nvml_module()
    if nv is None:
        if mode == "nvml":
            raise ConfigError("--gpu-telemetry nvml: NVML is not available here (pip install nvidia-ml-py, and an "
                              "NVIDIA driver); --gpu-metrics URL reads a DCGM exporter instead")
        return None
    s = NvmlSampler(nv, interval_s or NVML_INTERVAL_S, devices)
    s.auto = mode == "auto"
    try:
        s.check_devices([label for label, _ in s.handles], "this host (NVML)")
    except ConfigError:
        s.close()
        raise
    if not s.handles:
        s.close()
        if mode == "nvml":
            raise ConfigError("--gpu-telemetry nvml: NVML sees no GPU on this host")
        return None
    return s
