"""Roofline arithmetic against hand-computed values: two models x two accelerators, KV at depth, MoE, prefill,
tensor parallelism, the server's own model size, and bad flags naming themselves."""

from __future__ import annotations

import pytest

from bench.cli.report import roofline_spec_from_options
from bench.errors import ConfigError
from bench.measure.roofline import (
    HARDWARE,
    apply_roofline,
    build_spec,
    complete_spec,
    decode_limit,
    parse_bandwidth,
    parse_bytes,
    parse_count,
    parse_flops,
    prefill_limit,
    roofline_for_cell,
)

# The H200 run of ../shared/gpu/README.md: a Llama-3-8B-shaped F16 GGUF whose weights are 14.77 GB
# (7.385e9 parameters x 2 bytes; SmolLM2's 49152-token vocabulary makes it 7.4B rather than 8.0B).
GPU_8B = {"model_params": "7.385b", "weight_bits": 16}
KV_8B = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x head size 128 x 2 bytes = 131072 B/token


def _cell(depth: int, streams: int, decode: float | None, agg: float | None = None, prompt_tok_s: float | None = None,
          prompt_tokens: float | None = None, output_tokens: float | None = 128) -> dict:
    return {"id": f"d{depth}-s{streams}", "depth": depth, "streams": streams, "max_tokens": 128,
            "decode_tok_s": {"median": decode}, "aggregate_decode_tok_s": {"median": agg},
            "prompt_tok_s": {"median": prompt_tok_s}, "prompt_tokens": {"median": prompt_tokens},
            "output_tokens": {"median": output_tokens}}


def test_h200_8b_f16_matches_the_gpu_readme() -> None:
    # 4.8e12 B/s / 14.77e9 B = 324.98 tok/s; llama-bench tg128 214 tok/s -> 214 / 324.98 = 65.85 %
    spec = build_spec(hardware_name="h200", **GPU_8B)
    assert spec is not None and spec.weight_bytes == pytest.approx(14.77e9)
    r = roofline_for_cell(_cell(0, 1, 214.0, prompt_tokens=0, output_tokens=0), spec)
    assert r["decode_tok_s_limit"] == pytest.approx(324.98, abs=0.01)
    assert r["decode_pct_of_limit"] == pytest.approx(65.8, abs=0.05)
    assert set(r) == {"decode_tok_s_limit", "decode_pct_of_limit", "prefill_tok_s_limit", "prefill_pct_of_limit"}


def test_same_check_from_the_bandwidth_flag() -> None:
    spec = roofline_spec_from_options(bandwidth="4.8TB/s", model_params="7.385b", weight_bits=16.0)
    r = roofline_for_cell(_cell(0, 1, 214.0, prompt_tokens=0, output_tokens=0), spec)
    assert r["decode_tok_s_limit"] == pytest.approx(324.98, abs=0.01)
    assert set(r) == {"decode_tok_s_limit", "decode_pct_of_limit"}  # no FLOP/s: no prefill keys


def test_8b_on_rtx4090_and_8b_nominal() -> None:
    # 1008e9 / 14.77e9 = 68.25 tok/s; "8b" at 16 bits is 16.0e9 B: 4.8e12 / 16e9 = 300 tok/s
    spec = build_spec(hardware_name="rtx4090", **GPU_8B)
    assert spec is not None
    assert decode_limit(spec, 0)[0] == pytest.approx(68.246, abs=0.001)
    nominal = build_spec(hardware_name="h200", model_params="8b", weight_bits=16)
    assert nominal is not None and decode_limit(nominal, 0)[0] == pytest.approx(300.0)


def test_70b_q4_on_h100_and_b200() -> None:
    # 70e9 x 4 bits = 35e9 B: H100 3.35e12 / 35e9 = 95.714; B200 8e12 / 35e9 = 228.571
    h100 = build_spec(hardware_name="h100", model_params="70b", weight_bits=4)
    b200 = build_spec(hardware_name="b200", model_params="70B", weight_bits=4)
    assert h100 is not None and b200 is not None
    assert decode_limit(h100, 0)[0] == pytest.approx(95.714, abs=0.001)
    assert decode_limit(b200, 0)[0] == pytest.approx(228.571, abs=0.001)
    # prefill, no attention term: B200 bf16 2.25e15 / (2 x 70e9) = 16071.4 tok/s
    assert prefill_limit(b200, 4096) == pytest.approx(16071.4, abs=0.1)


def test_kv_at_depth_matches_llama_bench_at_32k() -> None:
    # depth 32768 + half of 128 output tokens = 32832 tokens x 131072 B = 4.3034e9 B read per step besides the
    # weights: 4.8e12 / (14.77e9 + 4.3034e9) = 251.66 tok/s; llama-bench tg128 @ d32768 153 tok/s = 60.8 %
    spec = build_spec(hardware_name="h200", kv_bytes_per_token=str(KV_8B), **GPU_8B)
    assert spec is not None and spec.kv_bytes_per_token == 131072
    r = roofline_for_cell(_cell(32768, 1, 153.0, prompt_tokens=32768), spec)
    assert r["decode_tok_s_limit"] == pytest.approx(251.66, abs=0.01)
    assert r["decode_pct_of_limit"] == pytest.approx(60.8, abs=0.05)


def test_aggregate_at_four_streams() -> None:
    # 4 streams, each 1000 prompt + 64 output tokens of KV: 4 x 1064 x 131072 B = 0.5578e9 B + 14.77e9 B of
    # weights per step, 4 tokens per step: 4 x 4.8e12 / 15.328e9 = 1252.62 tok/s aggregate (313.16 per stream)
    spec = build_spec(hardware_name="h200", kv_bytes_per_token="128KiB", **GPU_8B)
    assert spec is not None
    per, agg = decode_limit(spec, 1064, streams=4)
    assert per == pytest.approx(313.156, abs=0.001) and agg == pytest.approx(1252.62, abs=0.01)
    r = roofline_for_cell(_cell(0, 4, 300.0, agg=1000.0, prompt_tokens=1000), spec)
    assert r["decode_tok_s_limit"] == pytest.approx(1252.62, abs=0.01)
    assert r["decode_pct_of_limit"] == pytest.approx(79.8, abs=0.05)  # 1000 / 1252.62, the aggregate


def test_prefill_with_attention_matches_pp4096() -> None:
    # 2 x 7.385e9 + 2 x 32 layers x 4096 x 4096 tokens = 14.77e9 + 1.0737e9 FLOPs per token;
    # 989e12 / 15.8437e9 = 62422.1 tok/s; llama-bench pp4096 23.7k tok/s = 38.0 %
    spec = build_spec(hardware_name="h200", layers=32, attn_dim=4096, **GPU_8B)
    assert spec is not None
    r = roofline_for_cell(_cell(4096, 1, 200.0, prompt_tok_s=23700.0, prompt_tokens=4096), spec)
    assert r["prefill_tok_s_limit"] == pytest.approx(62422.1, abs=0.1)
    assert r["prefill_pct_of_limit"] == pytest.approx(38.0, abs=0.05)
    # depth 0: a tiny prompt, no prefill share
    assert roofline_for_cell(_cell(0, 1, 200.0, prompt_tok_s=500.0, prompt_tokens=20), spec)["prefill_pct_of_limit"] is None


def test_moe_active_params_and_fp8() -> None:
    # 47b total, 13b active, 16 bits: 26e9 B per step; H100 3.35e12 / 26e9 = 128.846 tok/s
    spec = build_spec(hardware_name="h100", model_params="47b", active_params="13b", weight_bits=16)
    assert spec is not None and decode_limit(spec, 0)[0] == pytest.approx(128.846, abs=0.001)
    assert spec.flops == HARDWARE["h100"].bf16_flops
    fp8 = build_spec(hardware_name="h100", model_params="8b", weight_bits=8)
    assert fp8 is not None and fp8.flops == HARDWARE["h100"].fp8_flops


def test_devices_sum_bandwidth_and_flops() -> None:
    spec = build_spec(hardware_name="h200", devices=2, **GPU_8B)
    assert spec is not None and spec.bandwidth == 9.6e12 and spec.flops == 2 * 989e12
    assert decode_limit(spec, 0)[0] == pytest.approx(649.97, abs=0.01)


def test_model_from_the_server() -> None:
    spec = build_spec(hardware_name="h200")
    assert spec is not None and spec.weight_bytes is None
    server = {"model_meta": {"n_params": 7385000000, "size": 14770000000, "n_embd": 4096}}
    full = complete_spec(spec, server)
    assert full.weight_bytes == 14.77e9 and full.active_params == 7.385e9 and full.model_source == "server"
    res = {"server": server, "cells": [_cell(0, 1, 214.0, prompt_tokens=0, output_tokens=0)]}
    apply_roofline(res, spec)
    assert res["cells"][0]["roofline"]["decode_pct_of_limit"] == pytest.approx(65.8, abs=0.05)
    assert res["roofline_spec"]["hardware"] == "h200"
    bare = {"server": {}, "cells": [_cell(0, 1, 214.0)]}
    apply_roofline(bare, spec)
    assert "roofline" not in bare["cells"][0] and "--model-params" in bare["warnings"][0]


def test_no_roofline_without_hardware() -> None:
    assert roofline_spec_from_options(model=None, devices=1) is None


@pytest.mark.parametrize("kw, flag", [
    ({"bandwidth": "fast"}, "--bandwidth"),
    ({"bandwidth": "4.8XB/s"}, "--bandwidth"),
    ({"hardware": "h900"}, "--hardware"),
    ({"hardware": "h200", "flops": "-3T"}, "--flops"),
    ({"hardware": "h200", "model_params": "8q", "weight_bits": 16}, "--model-params"),
    ({"hardware": "h200", "model_params": "8b"}, "--weight-bits"),
    ({"hardware": "h200", "model_params": "8b", "weight_bits": 0}, "--weight-bits"),
    ({"hardware": "h200", "model_params": "8b", "weight_bits": 16, "active_params": "9b"}, "--active-params"),
    ({"hardware": "h200", "kv_bytes_per_token": "lots"}, "--kv-bytes-per-token"),
    ({"hardware": "h200", "weight_bits": 16}, "--weight-bits"),
    ({"hardware": "h200", "devices": 0}, "--devices"),
    ({"model_params": "8b", "weight_bits": 16}, "--bandwidth"),
])
def test_bad_values_name_the_flag(kw, flag) -> None:
    with pytest.raises(ConfigError) as e:
        roofline_spec_from_options(**kw)
    assert flag in str(e.value) and "\n" not in str(e.value)


def test_units() -> None:
    assert parse_bandwidth("4.8TB/s") == 4.8e12 and parse_bandwidth("273 GB/s") == 273e9
    assert parse_flops("989T") == 989e12 and parse_flops("2.25PFLOPS") == 2.25e15
    assert parse_count("135m", "--model-params") == 135e6 and parse_count("7.38e9", "--model-params") == 7.38e9
    assert parse_bytes("128KiB", "x") == 131072 and parse_bytes("128k", "x") == 131072
    assert parse_bytes("160kB", "x") == 160000
    assert build_spec(hardware_name="DGX-Spark") is not None


@pytest.mark.engine
def test_llama_server_reports_its_model_size(llama_server) -> None:
    """llama.cpp's /v1/models meta (n_params, size) reaches server info and fills the roofline's model part."""
    import asyncio

    import httpx

    from bench.server.info import discover_server

    async def go() -> dict:
        async with httpx.AsyncClient() as c:
            return await discover_server(c, llama_server)

    info = asyncio.run(go())
    meta = info["model_meta"]
    assert 1e8 < meta["n_params"] < 2e8 and meta["size"] > 5e7  # SmolLM2-135M, a 4-bit GGUF
    spec = complete_spec(build_spec(hardware_name="gb10"), info)
    assert decode_limit(spec, 0)[0] == pytest.approx(273e9 / meta["size"])


def test_run_rejects_a_bad_roofline_flag_before_running(capsys) -> None:
    from bench.cli.app import main

    assert main(["run", "http://127.0.0.1:9/v1", "--bandwidth", "fast"]) == 3
    err = capsys.readouterr().err
    assert "--bandwidth" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_model_size_flag_far_from_the_servers_count_is_warned_about() -> None:
    from bench.measure.roofline import model_size_note

    server = {"model_meta": {"n_params": 7.385e9, "size": 14.77e9}}
    mine = roofline_spec_from_options(bandwidth="4.8TB/s", model_params="13b", weight_bits=16.0)
    note = model_size_note(mine, server)
    assert note is not None and "13B parameters" in note and "7.38B" in note and "--model-params" in note
    assert model_size_note(roofline_spec_from_options(bandwidth="4.8TB/s", model_params="7.385b",
                                                      weight_bits=16.0), server) is None
    assert model_size_note(mine, {}) is None  # the server said nothing
    from_server = roofline_spec_from_options(bandwidth="4.8TB/s")
    assert model_size_note(from_server, server) is None  # nothing given by flag: nothing to check
