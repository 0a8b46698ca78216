"""GPU telemetry (docs/gpu-telemetry.md): the pure per-cell summary against hand-computed truth, the NVML sampler
over a fake ``pynvml`` playing a scripted sequence (there is no GPU here: not a recording from hardware), the DCGM
sampler against a fake exporter (a real HTTP server serving Prometheus text whose power and energy series are
known), and ``bench run --gpu-metrics`` end to end against bench's sim."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench.cli import main
from bench.errors import ConfigError, EndpointUnreachable
from bench.measure.gpu import THROTTLE_MASK, summarize_gpu
from bench.results import load_results
from bench.server.gpu import DcgmSampler, GpuSample, NvmlSampler, dcgm_samples, is_local_url, make_sampler
from bench.server.metrics import parse_page

# ---- the pure summary ---------------------------------------------------------------------------------------------


def _window(t0: float, n: int, dt: float, power: dict[str, float], energy0: float = 1e6,
            counter: bool = True, **extra: Any) -> list[GpuSample]:
    """``n`` passes over the GPUs every ``dt`` s from ``t0``, each GPU at constant power, its counter rising with it."""
    out = []
    for k in range(n):
        t = t0 + k * dt
        for g, p in power.items():
            e = energy0 + p * (t - t0) if counter else None
            out.append(GpuSample(t, g, power_w=p, energy_j=e, **extra))
    return out


def test_energy_from_the_counter_and_tokens_per_joule() -> None:
    """Two GPUs at 300 W and 200 W for 1 s: 500 J from the counters, the integral agrees; 1000 tokens -> 2 tok/J."""
    w = _window(100.0, 11, 0.1, {"0": 300.0, "1": 200.0}, sm_clock_mhz=1980.0, util_pct=90.0)
    g = summarize_gpu([w], output_tokens=1000, source="nvml", interval_s=0.1,
                      info={"0": {"name": "H200"}, "1": {"name": "H200"}})
    assert g is not None
    assert g["energy_j"] == pytest.approx(500.0) and g["energy_source"] == "counter"
    assert g["tokens_per_joule"] == pytest.approx(2.0) and g["joules_per_token"] == pytest.approx(0.5)
    assert g["power_w_mean"] == pytest.approx(500.0) and g["power_w_max"] == pytest.approx(500.0)
    assert g["window_s"] == pytest.approx(1.0) and g["samples"] == 11 and g["windows"] == 1
    assert [x["gpu"] for x in g["gpus"]] == ["0", "1"] and g["gpus"][0]["name"] == "H200"
    g0 = g["gpus"][0]
    assert g0["energy_j"] == pytest.approx(300.0) and g0["energy_j_integrated"] == pytest.approx(300.0)
    assert g0["counter_vs_integrated_pct"] == pytest.approx(0.0, abs=1e-6)
    assert g["sm_clock_mhz_p50"] == 1980.0 and g["sm_clock_mhz_p5"] == 1980.0
    assert "joules_per_prompt_token" not in g and g["notes"] == []
    assert len(g["series"]) == 11 and g["series"][-1] == [1.0, 500.0, 1980.0]


def test_windows_add_their_energy_and_never_the_gap_between() -> None:
    """Two 1 s windows 10 s apart (the counter keeps rising in between): 2 x 300 J, not 3300 J."""
    a = _window(0.0, 11, 0.1, {"0": 300.0}, energy0=1e6)
    b = _window(11.0, 11, 0.1, {"0": 300.0}, energy0=1e6 + 300.0 * 11)
    g = summarize_gpu([a, b], output_tokens=600, prompt_tokens=12000)
    assert g is not None
    assert g["energy_j"] == pytest.approx(600.0) and g["window_s"] == pytest.approx(2.0) and g["windows"] == 2
    assert g["tokens_per_joule"] == pytest.approx(1.0)
    assert g["joules_per_prompt_token"] == pytest.approx(600.0 / 12000)


def test_no_counter_integrates_power_and_says_it_is_an_estimate() -> None:
    """Power rising 100 -> 200 W over 1 s and no counter: the trapezoids give 150 J exactly, marked an estimate."""
    w = [GpuSample(k / 10, "0", power_w=100.0 + 10.0 * k) for k in range(11)]
    g = summarize_gpu([w], output_tokens=300)
    assert g is not None
    assert g["energy_j"] == pytest.approx(150.0) and g["energy_source"] == "integrated"
    assert g["tokens_per_joule"] == pytest.approx(2.0)
    assert g["power_w_mean"] == pytest.approx(150.0) and g["power_w_max"] == pytest.approx(200.0)
    assert any("an estimate" in n for n in g["notes"])


@pytest.mark.parametrize("energies", [[5e6] * 6, [5e6, 5e6 + 10, 5e6 + 20, 3.0, 13.0, 23.0]],
                         ids=["stale", "reset"])
def test_a_counter_that_does_not_move_or_resets_is_not_used(energies: list[float]) -> None:
    """An exporter that did not refresh during the cell (or a counter that went back) -> power integrated."""
    w = [GpuSample(k * 0.2, "0", power_w=250.0, energy_j=e) for k, e in enumerate(energies)]
    g = summarize_gpu([w], output_tokens=500)
    assert g is not None and g["energy_source"] == "integrated"
    assert g["energy_j"] == pytest.approx(250.0)  # 250 W x 1 s


def test_counter_and_power_far_apart_is_noted() -> None:
    """The counter says 600 J over 1 s while power reads 300 W: the counter is used, the gap (-50 %) noted."""
    w = [GpuSample(k / 10, "0", power_w=300.0, energy_j=1e6 + 60.0 * k) for k in range(11)]
    g = summarize_gpu([w], output_tokens=600)
    assert g is not None and g["energy_j"] == pytest.approx(600.0) and g["energy_source"] == "counter"
    assert g["gpus"][0]["counter_vs_integrated_pct"] == pytest.approx(-50.0)
    assert any(n.startswith("GPU 0 (-50 %): power integrated") for n in g["notes"])


def test_clock_percentiles_and_throttle_share() -> None:
    """10 samples: SM clocks 1000..1900; 3 capped by power (throttle), 2 idle (not throttle)."""
    reasons = [0x4, 0x4, 0x4, 0x1, 0x1, 0, 0, 0, 0x2, 0]
    w = [GpuSample(k * 0.1, "0", power_w=100.0, sm_clock_mhz=1000.0 + 100 * k, mem_clock_mhz=2619.0,
                   reasons=r) for k, r in enumerate(reasons)]
    g = summarize_gpu([w], output_tokens=10)
    assert g is not None
    assert g["sm_clock_mhz_p50"] == pytest.approx(1450.0) and g["sm_clock_mhz_p5"] == pytest.approx(1045.0)
    assert g["mem_clock_mhz_p50"] == 2619.0
    assert g["throttle_share"] == pytest.approx(0.3)
    assert g["gpus"][0]["reasons"] == {"gpu_idle": 0.2, "applications_clocks_setting": 0.1, "sw_power_cap": 0.3}
    assert THROTTLE_MASK & 0x1 == 0 and THROTTLE_MASK & 0x2 == 0


def test_total_power_max_is_of_simultaneous_readings() -> None:
    """GPU 0 peaks at t=0, GPU 1 at t=1: the total's max is 400 W (never 300 + 300)."""
    w = [GpuSample(0.0, "0", power_w=300.0), GpuSample(0.0, "1", power_w=100.0),
         GpuSample(1.0, "0", power_w=100.0), GpuSample(1.0, "1", power_w=300.0)]
    g = summarize_gpu([w], output_tokens=1)
    assert g is not None and g["power_w_max"] == 400.0 and g["gpus"][0]["power_w_max"] == 300.0


def test_no_samples_no_section() -> None:
    assert summarize_gpu([], output_tokens=5) is None and summarize_gpu([[]], output_tokens=5) is None


def test_idle_gpu_is_noted_not_warned() -> None:
    w = _window(0.0, 3, 0.1, {"0": 300.0}, util_pct=95.0) + _window(0.0, 3, 0.1, {"1": 60.0}, util_pct=0.0)
    g = summarize_gpu([w], output_tokens=10)
    assert g is not None and any("GPU 1 showed 0 % utilisation" in n for n in g["notes"])
    g = summarize_gpu([_window(0.0, 3, 0.1, {"0": 60.0}, util_pct=0.0)], output_tokens=10)
    assert g is not None and any("no GPU showed any utilisation" in n for n in g["notes"])


# ---- NVML: a fake pynvml playing a scripted sequence ----------------------------------------------------------------


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


class FakeNvml:
    """``pynvml``'s calls bench makes, each GPU's figures stepping through a scripted sequence: the k-th call of a
    figure for a GPU answers entry k (the last entry once past the end). GPU 1 has no temperature sensor."""

    NVMLError = _NVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, seq: dict[int, dict[str, list[Any]]]) -> None:
        self.seq = seq
        self.calls: dict[tuple[int, str], int] = {}
        self.shut = False

    def _next(self, h: int, key: str) -> Any:
        k = self.calls.get((h, key), 0)
        self.calls[(h, key)] = k + 1
        vals = self.seq[h][key]
        return vals[min(k, len(vals) - 1)]

    def nvmlDeviceGetCount(self) -> int:
        return len(self.seq)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._next(h, "power_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return int(self._next(h, "energy_mj"))

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return int(self._next(h, "sm_mhz" if kind == self.NVML_CLOCK_SM else "mem_mhz"))

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return type("U", (), {"gpu": self._next(h, "util"), "memory": 0})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("M", (), {"used": 40 * 2**30, "total": 141 * 2**30})()

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self.calls[(h, "temp")] = self.calls.get((h, "temp"), 0) + 1
        if h == 1:
            raise _NotSupported("not supported")
        return 61

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._next(h, "reasons"))

    def nvmlShutdown(self) -> None:
        self.shut = True


def _sequence(n: int = 2000) -> dict[int, dict[str, list[Any]]]:
    """GPU 0: 700 W, +70 J per reading, SM clock 1980 except every 4th reading 1755 MHz under the power cap; GPU 1:
    350 W, +35 J per reading, 1980 MHz, no throttling."""
    return {
        0: {"power_mw": [700_000] * n, "energy_mj": [9_000_000 + 70_000 * k for k in range(n)],
            "sm_mhz": [1755 if k % 4 == 3 else 1980 for k in range(n)], "mem_mhz": [2619] * n, "util": [100] * n,
            "reasons": [0x4 if k % 4 == 3 else 0 for k in range(n)]},
        1: {"power_mw": [350_000] * n, "energy_mj": [1_000_000 + 35_000 * k for k in range(n)],
            "sm_mhz": [1980] * n, "mem_mhz": [2619] * n, "util": [100] * n, "reasons": [0] * n},
    }


def test_nvml_sampler_against_the_fake_sequence() -> None:
    """Units converted (mW, mJ, bytes), unsupported figures asked once; energy and tok/J exactly the sequence's."""
    nv = FakeNvml(_sequence())
    s = NvmlSampler(nv, interval_s=0.01)
    assert s.info == {"0": {"name": "NVIDIA H200", "uuid": "GPU-fake-0"},
                      "1": {"name": "NVIDIA H200", "uuid": "GPU-fake-1"}}
    s.begin()
    time.sleep(0.1)  # some readings on the interval (how many does not matter: the truth follows the count)
    samples = s.end()
    s.close()
    assert nv.shut
    n = sum(1 for x in samples if x.gpu == "0")
    assert n >= 2 and n == sum(1 for x in samples if x.gpu == "1")
    assert nv.calls[(1, "temp")] == 1 and nv.calls[(0, "temp")] == n
    g = summarize_gpu([samples], output_tokens=4200, source=s.source, interval_s=s.interval_s, info=s.info)
    assert g is not None
    e = (n - 1) * (70 + 35)
    assert g["energy_j"] == pytest.approx(e) and g["energy_source"] == "counter"
    assert g["tokens_per_joule"] == pytest.approx(round(4200 / e, 5))
    assert g["joules_per_token"] == pytest.approx(round(e / 4200, 5))
    assert g["power_w_mean"] == pytest.approx(1050.0)
    g0, g1 = g["gpus"]
    assert g0["temp_c_max"] == 61 and g1["temp_c_max"] is None and g0["mem_used_mib_max"] == 40 * 1024
    capped = sum(1 for k in range(n) if k % 4 == 3)
    assert g0["throttle_share"] == pytest.approx(round(capped / n, 4)) and g1["throttle_share"] == 0
    assert g0["sm_clock_mhz_p50"] == 1980.0


def test_nvml_devices_filter_and_a_failing_read() -> None:
    nv = FakeNvml(_sequence(10))
    s = NvmlSampler(nv, interval_s=10.0, devices=["1"])
    s.begin()
    samples = s.end()
    assert {x.gpu for x in samples} == {"1"} and len(samples) == 2
    nv.seq[0]["power_mw"] = []  # an IndexError inside a read: the reading is skipped and counted
    s.take()
    assert s.failed == 1


def test_nvml_reasons_fall_back_to_the_old_call() -> None:
    """A driver without nvmlDeviceGetCurrentClocksEventReasons: the old ...ThrottleReasons answers."""
    nv = FakeNvml(_sequence(10))

    def missing(h: int) -> int:
        raise _NotSupported("function not found")

    nv.nvmlDeviceGetCurrentClocksEventReasons = missing  # type: ignore[method-assign]
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40  # type: ignore[attr-defined]
    s = NvmlSampler(nv, interval_s=10.0)
    assert {x.reasons for x in s.read()} == {0x40}


def test_make_sampler_choices() -> None:
    assert make_sampler("off", None, "http://127.0.0.1:8000/v1", nvml=FakeNvml(_sequence(3))) is None
    assert make_sampler("auto", None, "http://203.0.113.9:8000/v1", nvml=FakeNvml(_sequence(3))) is None
    s = make_sampler("auto", None, "http://localhost:8000/v1", nvml=FakeNvml(_sequence(3)))
    assert isinstance(s, NvmlSampler) and s.interval_s == 0.1
    s.close()
    with pytest.raises(ConfigError, match="choose one"):
        make_sampler("nvml", "http://127.0.0.1:9/metrics", "http://127.0.0.1:8000/v1")
    assert is_local_url("http://127.0.0.1:1/v1") and is_local_url("http://[::1]:1/v1")
    assert not is_local_url("http://203.0.113.9:1/v1")


# ---- DCGM: a fake exporter ------------------------------------------------------------------------------------------

_DCGM_HEAD = """# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
"""
POWER_W = {0: 300.0, 1: 150.0}  # each scrape adds this many joules to the GPU's counter


def dcgm_page(k: int, slow_clock: int = 1410, every: int = 2, t_s: float | None = None) -> str:
    """The exporter's page at its k-th scrape: GPU 0 at 300 W, GPU 1 at 150 W; counters rise 300 J and 150 J per
    scrape (with ``t_s``: per second of ``t_s``, as a real GPU's); GPU 1's SM clock ``slow_clock`` with the
    power-cap reason in every ``every``-th scrape (the odd ones by default), 1980 otherwise."""
    lines = [_DCGM_HEAD]
    for g, p in POWER_W.items():
        lab = (f'gpu="{g}",UUID="GPU-{g}aaa",device="nvidia{g}",modelName="NVIDIA H200",Hostname="dgx1",'
               'DCGM_FI_DRIVER_VERSION="575.57.08"')
        slow = g == 1 and k % every == every - 1 and slow_clock < 1980
        sm = slow_clock if slow else 1980
        lines += [f"DCGM_FI_DEV_SM_CLOCK{{{lab}}} {sm}", f"DCGM_FI_DEV_MEM_CLOCK{{{lab}}} 2619",
                  f"DCGM_FI_DEV_GPU_UTIL{{{lab}}} 97", f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} 55",
                  f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} {p:.3f}", f"DCGM_FI_DEV_FB_USED{{{lab}}} 81920",
                  f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{lab}}} {int(5e9 + (k if t_s is None else t_s) * p * 1000)}",
                  f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{lab}}} {4 if slow else 0}"]
    return "\n".join(lines) + "\n"


@contextmanager
def fake_exporter(body: Any = dcgm_page, tls: tuple[str, str] | None = None) -> Iterator[tuple[str, list[int]]]:
    """A real HTTP server on a free port serving ``body(k)`` at /metrics (k: scrapes so far); yields its URL.
    ``tls``: (cert, key) to serve https."""
    hits = [0]

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            text = body(hits[0]).encode()
            hits[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    if tls is not None:
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*tls)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{srv.server_address[1]}/metrics", hits
    finally:
        srv.shutdown()
        srv.server_close()


def test_dcgm_page_to_samples() -> None:
    samples, info = dcgm_samples(parse_page(dcgm_page(3)), 7.0)
    by = {s.gpu: s for s in samples}
    assert set(by) == {"0", "1"} and by["0"].power_w == 300.0 and by["1"].sm_clock_mhz == 1410.0
    assert by["0"].energy_j == pytest.approx((5e9 + 3 * 300_000) / 1000) and by["1"].reasons == 4
    assert by["0"].mem_used_mib == 81920 and by["0"].temp_c == 55
    assert info["0"] == {"name": "NVIDIA H200", "uuid": "GPU-0aaa", "host": "dgx1"}


def test_dcgm_sampler_energy_is_the_exporters() -> None:
    with fake_exporter() as (url, hits):
        s = DcgmSampler(url, interval_s=0.02)
        s.check()
        s.begin()
        time.sleep(0.15)
        samples = s.end()
        s.close()
    n = sum(1 for x in samples if x.gpu == "0")
    assert n >= 2 and hits[0] == n + 1  # the check's scrape, then the window's
    g = summarize_gpu([samples], output_tokens=900, source="dcgm", info=s.info)
    assert g is not None
    assert g["energy_j"] == pytest.approx((n - 1) * 450.0) and g["energy_source"] == "counter"
    assert g["tokens_per_joule"] == pytest.approx(round(900 / ((n - 1) * 450.0), 5))
    assert g["power_w_mean"] == pytest.approx(450.0) and [x["gpu"] for x in g["gpus"]] == ["0", "1"]


def test_gpu_devices_naming_a_gpu_that_is_not_there_is_refused() -> None:
    """``--gpu-devices 7`` against an exporter with GPUs 0 and 1 ran with no GPU figures and no word."""
    with fake_exporter() as (url, _):
        with pytest.raises(ConfigError, match=r"--gpu-devices 7: no such GPU at .*\(it has: 0, 1\)"):
            make_sampler("auto", url, "http://127.0.0.1:8000/v1", devices=["1", "7"])
        s = make_sampler("auto", url, "http://127.0.0.1:8000/v1", devices=["1"])
        assert s is not None
        s.close()
    with pytest.raises(ConfigError, match=r"--gpu-devices 2: no such GPU at this host \(NVML\)"):
        make_sampler("nvml", None, "http://127.0.0.1:8000/v1", nvml=FakeNvml(_sequence(3)), devices=["2"])


def test_dcgm_check_refuses_what_is_not_an_exporter() -> None:
    with fake_exporter(lambda k: "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n") as (url, _):
        with pytest.raises(ConfigError, match="DCGM_FI_DEV_POWER_USAGE"):
            make_sampler("auto", url, "http://127.0.0.1:8000/v1")
    with fake_exporter(lambda k: "<html>not metrics{{{</html>") as (url, _):
        with pytest.raises(ConfigError, match="not Prometheus text"):
            DcgmSampler(url).check()
    with pytest.raises(EndpointUnreachable):
        DcgmSampler("http://127.0.0.1:9/metrics").check()


def test_https_exporter_is_read_with_the_runs_tls_settings(tls_cert) -> None:
    """An https exporter with a private CA: refused by default (one line naming the certificate), read with
    --ca-bundle's context."""
    from bench.cli.gpu import sampler_from_options
    from bench.client import ClientSettings

    opts = {"gpu_telemetry": "auto", "gpu_interval": None, "gpu_devices": None}
    with fake_exporter(tls=tls_cert) as (url, _):
        with pytest.raises(EndpointUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            sampler_from_options({**opts, "gpu_metrics": url}, "http://203.0.113.9:1/v1")
        s = sampler_from_options({**opts, "gpu_metrics": url}, "http://203.0.113.9:1/v1",
                                 ClientSettings(ca_bundle=tls_cert[0]))
        assert isinstance(s, DcgmSampler) and len(s.read()) == 2
        s.close()


# ---- bench run --gpu-metrics, end to end ----------------------------------------------------------------------------


def test_run_with_gpu_metrics(tmp_path, capsys) -> None:
    """Each cell of results.json has ``gpu`` from the fake exporter: energy = (scrapes - 1) x 450 J, tokens per
    joule = the cell's output tokens over it; the CSV and the table carry it."""
    from bench.sim import SimConfig, running_sim

    with fake_exporter() as (murl, _), running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=200_000.0)) as url:
        rc = main(["run", url, "--profile", "quick", "--depths", "0,1k", "--streams", "1,2", "--repeats", "2",
                   "--max-tokens", "16", "--gpu-metrics", murl, "--gpu-interval", "0.02", "--out", str(tmp_path),
                   "--json"])
    assert rc == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert len(res["cells"]) == 4
    for cell in res["cells"]:
        g = cell["gpu"]
        n = g["gpus"][0]["samples"]
        assert g["source"] == "dcgm" and [x["gpu"] for x in g["gpus"]] == ["0", "1"]
        assert g["energy_j"] == pytest.approx((n - 1) * 450.0) and g["energy_source"] == "counter"
        assert g["power_w_mean"] == pytest.approx(450.0)
        assert g["output_tokens"] == 16 * cell["requests_ok"]
        assert g["tokens_per_joule"] == pytest.approx(round(g["output_tokens"] / g["energy_j"], 5))
        assert g["joules_per_token"] == pytest.approx(round(g["energy_j"] / g["output_tokens"], 5))
        assert g["sm_clock_mhz_p50"] == 1980.0 and g["gpus"][0]["throttle_share"] == 0
        assert ("joules_per_prompt_token" in g) == (cell["depth"] > 0)
    assert load_results(tmp_path / "results.json").cells[0].gpu is not None
    head, first = (tmp_path / "results.csv").read_text().splitlines()[:2]
    col = head.split(",").index("gpu_tokens_per_joule")
    assert float(first.split(",")[col]) == res["cells"][0]["gpu"]["tokens_per_joule"]
    from bench.report.console import results_text

    assert "tok/J" in results_text(load_results(tmp_path / "results.json"), width=250)
    from bench.report.html import write_report
    from tests.paths import script

    et = script("benchmarks/gpu/energy_table.py")
    md = et.table([tmp_path])
    # the fake exporter's counter rises per scrape, its power is per second: they agree only as far as the scrapes
    # are 1/50 s apart, so each row says yes or no against the 2 % bound (the H200 check reads this column)
    assert md.count("-prose | ") == 4 and md.count(" (yes) |") + md.count(" (**no**) |") == 4
    worst = max(abs(g["counter_vs_integrated_pct"]) for g in res["cells"][0]["gpu"]["gpus"])
    assert et.agreement(res["cells"][0]["gpu"]) == worst
    page = write_report([tmp_path / "results.json"], tmp_path / "report.html").read_text()
    assert "GPU power, clocks and energy per token" in page and "GPU power and SM clock during" in page
    from bench.report.export import three_digits  # as results.md prints it

    assert f"<td>{three_digits(res['cells'][0]['gpu']['tokens_per_joule'])}</td>" in page


def test_gpu_flags_bad_input_is_one_line_exit_3(tmp_path, capsys) -> None:
    from bench.sim import running_sim

    with running_sim() as url:
        assert main(["run", url, "--gpu-metrics", "ftp://x", "--out", str(tmp_path / "a")]) == 3
        assert "--gpu-metrics ftp://x" in capsys.readouterr().err
        assert main(["run", url, "--gpu-telemetry", "nvml", "--gpu-metrics", "http://127.0.0.1:9/m",
                     "--out", str(tmp_path / "b")]) == 3
        assert main(["run", url, "--rate", "1", "--duration", "1", "--gpu-metrics", "http://127.0.0.1:9/m",
                     "--out", str(tmp_path / "c")]) == 3
        err = capsys.readouterr().err
        assert "choose one" in err and "open-loop" in err and "Traceback" not in err


# ---- per-wave tokens per joule and the gate -------------------------------------------------------------------------


def test_wave_tokens_per_joule_interpolates_the_counter() -> None:
    """300 W for 10 s sampled every 0.1 s; waves [1, 3] s with 1200 tokens and [4.05, 9.05] s with 1500: 600 J and
    1500 J -> 2.0 and 1.0 tok/J (a wave boundary between two samples is interpolated)."""
    from bench.measure.gpu import wave_tokens_per_joule

    w = _window(0.0, 101, 0.1, {"0": 300.0})
    g = summarize_gpu([w], output_tokens=2700, interval_s=0.1)
    assert g is not None
    assert wave_tokens_per_joule(g, [w], [(1.0, 3.0, 1200), (4.05, 9.05, 1500)]) == pytest.approx([2.0, 1.0])
    # a wave shorter than 10 sampling intervals: no per-wave figures (too coarse to gate on)
    assert wave_tokens_per_joule(g, [w], [(1.0, 3.0, 1200), (4.0, 4.5, 10)]) is None
    # power integrated (no counter): no per-wave figures either
    w2 = _window(0.0, 101, 0.1, {"0": 300.0}, counter=False)
    g2 = summarize_gpu([w2], output_tokens=2700, interval_s=0.1)
    assert g2 is not None and wave_tokens_per_joule(g2, [w2], [(1.0, 3.0, 1200)]) is None


def test_comparison_notes_name_clock_and_throttle_changes() -> None:
    from bench.measure.gpu import comparison_notes
    from bench.results import CellResult

    def cell(cid: str, sm: float, share: float) -> CellResult:
        return CellResult(id=cid, gpu={"sm_clock_mhz_p50": sm, "mem_clock_mhz_p50": 2619.0, "throttle_share": share})

    base = [cell("a", 1980.0, 0.0), cell("b", 1980.0, 0.0), CellResult(id="c")]
    cand = [cell("a", 1950.0, 0.04), cell("b", 1755.0, 0.30), cell("c", 1000.0, 1.0)]
    notes = comparison_notes(base, cand)
    assert len(notes) == 2  # a: -1.5 % and +4 points are within the bounds; c: no baseline figures
    assert notes[0].startswith("b: GPU: SM clock p50 1980 MHz in the baseline, 1755 MHz in the candidate (-11.4 %")
    assert notes[1].startswith("b: GPU: throttled") and "30%" in notes[1]


GATE_GPU_PROFILE = """
name = "gate-gpu"
max_tokens = 64
requests = 6
warmup = 0
overhead_probes = 1
gate_budget_waves = 0
[[sweep]]
depths = [0]
streams = [2]
[[gate]]
metric = "tokens_per_joule"
cell = "*"
max_drop_pct = 50
"""


def test_gate_on_tokens_per_joule_and_a_clock_change(tmp_path, capsys) -> None:
    """A baseline with the exporter at 1980 MHz, a candidate where GPU 1 runs at 1410 MHz in every other scrape:
    the gate gates tokens_per_joule from its per-wave samples and says the clocks differ beside its verdict."""
    from bench.sim import SimConfig, running_sim

    prof = tmp_path / "gate-gpu.toml"
    prof.write_text(GATE_GPU_PROFILE)
    t0 = time.monotonic()
    with running_sim(SimConfig(decode_step_ms=20.0, prefill_tok_s=100_000.0)) as url:  # waves of ~1.3 s
        with fake_exporter(lambda k: dcgm_page(k, slow_clock=1980, t_s=time.monotonic() - t0)) as (murl, _):
            assert main(["run", url, "-p", str(prof), "--gpu-metrics", murl, "--gpu-interval", "0.02",
                         "--out", str(tmp_path / "base")]) == 0
        with fake_exporter(lambda k: dcgm_page(k, slow_clock=1000, every=1, t_s=time.monotonic() - t0)) as (murl, _):
            code = main(["gate", url, "-p", str(prof), "--baseline", str(tmp_path / "base" / "results.json"),
                         "--gpu-metrics", murl, "--gpu-interval", "0.02", "--out", str(tmp_path / "cand"),
                         "--markdown", str(tmp_path / "gate.md")])
    err = capsys.readouterr().err
    base = load_results(tmp_path / "base" / "results.json").cells[0]
    # one per wave of 2 streams: 128 tokens over 450 W x the wave's span (the counter rises with time here); the
    # span bench uses also holds the building of the wave's prompts, so it is a little longer than the requests'
    from bench.records import read_records

    recs = [r for r in read_records(tmp_path / "base" / "records.jsonl") if r.meta.get("phase") == "measure"]
    truth = []
    for w in range(3):
        rs = [r for r in recs if r.meta["wave"] == w]
        span_s = (max(r.sent_ns + (r.end_ns or 0) for r in rs) - min(r.sent_ns for r in rs)) / 1e9
        truth.append(128 / (450.0 * span_s))
    assert base.samples["tokens_per_joule"] == pytest.approx(truth, rel=0.05)
    doc = json.loads((tmp_path / "cand" / "gate.json").read_text())
    v = doc["verdicts"][0]
    assert v["metric"] == "tokens_per_joule" and v["verdict"] != "regression" and code in (0, 2)
    # GPU 1 at 1000 MHz under the power cap throughout: its clock and its throttle share are named, GPU 0's not
    assert doc["gpu_notes"] == [
        "d0-s2-prose: GPU 1: SM clock p50 1980 MHz in the baseline, 1000 MHz in the candidate (-49.5 %, beyond 2 %): "
        "the GPUs ran at other clocks, so a speed difference may be theirs, not the change's; check power limit, "
        "clock cap and temperature (docs/gpu-telemetry.md)",
        "d0-s2-prose: GPU 1: throttled (power cap, thermal or hardware slowdown) in 100% of the candidate's samples "
        "against 0% of the baseline's (beyond 5%): a speed difference may be the GPUs', not the change's; check "
        "power limit, cooling and clocks (docs/gpu-telemetry.md)"]
    assert "GPU 1: SM clock p50 1980 MHz in the baseline" in err and "Traceback" not in err
    assert "- **GPUs**: d0-s2-prose: GPU 1: SM clock p50 1980 MHz" in (tmp_path / "gate.md").read_text()


@pytest.mark.parametrize("util", [100, 0])
def test_auto_samples_nvml_for_a_local_endpoint(util, tmp_path, capsys, monkeypatch) -> None:
    """--gpu-telemetry auto (the default) with NVML present and a loopback endpoint samples NVML (here the fake):
    energy = (readings - 1) x 105 J per cell, exactly the sequence's. A cell where no GPU worked (utilisation 0:
    the sim does not use them) gets no figures in auto mode."""
    from bench.sim import SimConfig, running_sim

    seq = _sequence()
    for g in seq.values():
        g["util"] = [util] * len(g["util"])
    monkeypatch.setattr("bench.server.gpu.nvml_module", lambda: FakeNvml(seq))
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=200_000.0)) as url:
        rc = main(["run", url, "--profile", "quick", "--depths", "0", "--streams", "1,2", "--repeats", "2",
                   "--max-tokens", "16", "--gpu-interval", "0.01", "--out", str(tmp_path), "--json"])
    assert rc == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    if util == 0:
        assert all("gpu" not in c for c in cells)
        return
    for c in cells:
        g = c["gpu"]
        n = g["gpus"][0]["samples"]
        assert g["source"] == "nvml" and g["gpus"][0]["uuid"] == "GPU-fake-0"
        assert g["energy_j"] == pytest.approx((n - 1) * 105.0) and g["power_w_mean"] == pytest.approx(1050.0)
        assert g["tokens_per_joule"] == pytest.approx(round(16 * c["requests_ok"] / g["energy_j"], 5))


def test_run_against_a_static_exporter_page(tmp_path, capsys) -> None:
    """An exporter whose values do not change during the run (its collect interval longer than the cells): the
    counter is not taken for zero energy; power is integrated (450 W x the window), marked an estimate."""
    from bench.sim import SimConfig, running_sim

    with fake_exporter(lambda k: dcgm_page(0)) as (murl, _), running_sim(SimConfig(decode_step_ms=2.0)) as url:
        rc = main(["run", url, "--profile", "quick", "--depths", "0", "--streams", "2", "--repeats", "2",
                   "--max-tokens", "16", "--gpu-metrics", murl, "--gpu-interval", "0.02", "--out", str(tmp_path),
                   "--json"])
    assert rc == 0
    g = json.loads(capsys.readouterr().out)["cells"][0]["gpu"]
    assert g["energy_source"] == "integrated" and g["gpus"][0]["energy_counter_changes"] == 0
    # window_s is rounded to the ms (up to 0.5 ms off: 0.225 J at 450 W, reached exactly when the window ends in
    # 0.5 ms, as in CI once: 23.175 J over 0.0515 s stored as 0.051), energy_j to the mJ
    assert g["energy_j"] == pytest.approx(450.0 * g["window_s"], abs=450.0 * 0.0005 + 0.002)
    assert g["tokens_per_joule"] == pytest.approx(32 / g["energy_j"], rel=1e-3)
    assert any("an estimate" in n for n in g["notes"])


class FakeNvmlInstant(FakeNvml):
    """A driver with the instantaneous power field: it answers 900 W where the 1-s average says 700 W (GPU 0);
    GPU 1's field read fails, so that GPU and every later read fall back to the average."""

    NVML_FI_DEV_POWER_INSTANT = 186

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[Any]:
        assert ids == [186]
        value = type("V", (), {"uiVal": 900_000})()
        return [type("F", (), {"nvmlReturn": 0 if h == 0 else 999, "valueType": 1, "value": value})()]


def test_nvml_power_is_the_instant_field_where_the_driver_has_it() -> None:
    s = NvmlSampler(FakeNvmlInstant(_sequence()), interval_s=0.01)
    first = {x.gpu: x.power_w for x in s.read()}
    assert first == {"0": 900.0, "1": 350.0}  # GPU 0 instant; GPU 1's field failed: the average
    assert {x.gpu: x.power_w for x in s.read()} == {"0": 700.0, "1": 350.0}  # once failed, the average for all
    s.close()
    plain = NvmlSampler(FakeNvml(_sequence()), interval_s=0.01)  # no field at all: the average
    assert {x.gpu: x.power_w for x in plain.read()} == {"0": 700.0, "1": 350.0}
    plain.close()


def test_tokens_per_joule_keeps_three_digits_below_one() -> None:
    """0.0142 and 0.0122 tok/J must not both print as 0.01 (a helper saw that on a small model's DCGM run)."""
    from bench.report.export import gpu_field

    class C:
        def __init__(self, v: float) -> None:
            self.gpu = {"tokens_per_joule": v, "energy_source": "counter"}

    assert [gpu_field(C(v)) for v in (0.01422, 0.01219, 0.312, 3.206, 12.34, 250.0)] == \
        ["0.0142", "0.0122", "0.312", "3.21", "12.3", "250"]
    from bench.report.gpu import _ratio  # the HTML report's GPU table prints them the same way (it had 0.081)

    assert [_ratio(v) for v in (0.08129, 12.298, None)] == ["0.0813", "12.3", "-"]


def test_gpu_device_flags_where_nothing_samples(monkeypatch, capsys) -> None:
    """--gpu-devices / --gpu-interval were silently ignored where no source samples: with auto a note says why,
    with --gpu-telemetry off they are refused."""
    from bench.cli.gpu import sampler_from_options

    monkeypatch.setattr("bench.server.gpu.nvml_module", lambda: None)
    opts = {"gpu_telemetry": "auto", "gpu_metrics": None, "gpu_interval": None, "gpu_devices": "0"}
    assert sampler_from_options(opts, "http://127.0.0.1:8000/v1") is None
    err = capsys.readouterr().err
    assert "no GPU source (NVML sees no GPU on this host" in err and "--gpu-devices ignored" in err
    assert sampler_from_options({**opts, "gpu_devices": None, "gpu_interval": 0.5}, "http://203.0.113.9:1/v1") is None
    assert "(the endpoint is not on this host): --gpu-interval ignored" in capsys.readouterr().err
    assert sampler_from_options({**opts, "gpu_devices": None}, "http://127.0.0.1:8000/v1") is None
    assert capsys.readouterr().err == ""  # nothing asked for, nothing said
    with pytest.raises(ConfigError, match="--gpu-devices with --gpu-telemetry off"):
        sampler_from_options({**opts, "gpu_telemetry": "off"}, "http://127.0.0.1:8000/v1")


def test_bench_ab_refuses_gpu_flags_in_one_line(capsys) -> None:
    """bench ab does not sample GPUs: its --gpu-* flags were click's bare "No such option" (exit 2)."""
    from bench.cli.app import main

    for flag in (["--gpu-telemetry", "nvml"], ["--gpu-metrics", "http://127.0.0.1:9/metrics"], ["--gpu-devices", "0"]):
        assert main(["ab", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", *flag]) == 3
        err = capsys.readouterr().err
        assert f"bench ab does not sample GPUs yet: {flag[0]} applies" in err and len(err.strip().splitlines()) == 1
